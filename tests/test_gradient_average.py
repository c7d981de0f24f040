"""The linear scaling rule (LR = base x P) is right only if a job's ranks *average* their
gradients. One real step of harness.train.train on 2 ranks under mpirun, checked
against the update computed by hand in numpy: a sum instead of a mean would double it."""
import json

import numpy as np

from tests.conftest import ROOT, mpirun

SCRIPT = r'''
import os, sys, json
sys.path.insert(0, os.environ["ROOT"])
os.environ["TF_USE_LEGACY_KERAS"] = "1"
import numpy as np
import tensorflow as tf
import horovod.tensorflow as hvd
from mpi4py import MPI
from harness import train

X = np.arange(16, dtype=np.float32).reshape(8, 2) / 10.0
Y = np.array([1, -1, 2, 0, 3, 1, -2, 0.5], np.float32)


class Linear:      # a workload of one Dense(1) without bias, mean squared error
    MOMENTUM = 0.9
    @staticmethod
    def build_model(data):
        return tf.keras.Sequential([tf.keras.layers.Input((2,)),
                                    tf.keras.layers.Dense(1, use_bias=False, kernel_initializer="ones")])
    @staticmethod
    def loss(y, out):
        return tf.square(out[:, 0] - y)
    @staticmethod
    def input_signature(data, batch):
        return tf.TensorSpec((batch, 2), tf.float32), tf.TensorSpec((batch,), tf.float32)
    @staticmethod
    def batches(data, rows, batch, *, training, seed):
        for s in range(len(rows) // batch):
            yield X[rows[s * batch:(s + 1) * batch]], Y[rows[s * batch:(s + 1) * batch]]


world = MPI.COMM_WORLD
hvd.init(comm=world)
model = Linear.build_model(None)
recipe = train.Recipe(batch=4, epochs=1, base_lr=0.1, warmup_epochs=0)
res = train.train(Linear, None, model, np.arange(8), recipe, seed=1, job=0, world_barrier=world.Barrier)
if world.rank == 0:
    print("W=" + json.dumps(model.trainable_variables[0].numpy().ravel().tolist()).replace(" ", ""),
          res.steps_per_epoch)
'''


def test_one_step_on_two_ranks_uses_the_mean_gradient(tmp_path):
    script = tmp_path / "one_step.py"
    script.write_text(SCRIPT)
    p = mpirun(2, [], tmp_path, timeout=180, env={"ROOT": str(ROOT)}, program=(str(script),))
    assert p.returncode == 0, p.stderr[-3000:]
    line = next(l for l in p.stdout.splitlines() if l.startswith("W="))
    w = np.array(json.loads(line.split()[0][2:]))
    assert line.split()[1] == "1"           # one step: 8 samples = P x B

    x = np.arange(16, dtype=np.float64).reshape(8, 2) / 10.0
    y = np.array([1, -1, 2, 0, 3, 1, -2, 0.5])
    w0 = np.ones(2)
    grad = (2 * (x @ w0 - y)[:, None] * x).mean(axis=0)   # mean over all 8 samples of both ranks
    lr = 0.1 * 2                                         # base x P; cosine at step 0 = peak
    np.testing.assert_allclose(w, w0 - lr * grad, rtol=1e-5)   # momentum's first step is plain SGD
    assert not np.allclose(w, w0 - 2 * lr * grad, rtol=1e-3)  # a sum would land here
