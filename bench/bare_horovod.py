"""The reference for bench/overhead.py: a bare Horovod TensorFlow training loop.

    mpirun -np 2 python bench/bare_horovod.py --steps 750 --batch 32 --side 16

The harness's digits model, SGD with momentum 0.9 at a constant learning rate,
DistributedGradientTape, `--steps` steps over a few random batches made once in
memory (no sampler, no indexing, no LR schedule, no per-step loss kept). Threads per
rank as the harness sets them. Timed from a barrier to the end of the last step, max
over ranks; rank 0 prints one JSON line.
"""
import argparse
import json
import os
import sys
import time

os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import numpy as np  # noqa: E402


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, required=True)
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--side", type=int, default=16)
    a = p.parse_args()

    from mpi4py import MPI
    import horovod.tensorflow as hvd
    import tensorflow as tf
    from harness.workloads import Data, digits

    hvd.init()
    threads = max(1, (os.cpu_count() or 1) // hvd.local_size())  # as harness.train.setup_devices
    tf.config.threading.set_intra_op_parallelism_threads(threads)
    tf.config.threading.set_inter_op_parallelism_threads(1 if threads == 1 else 2)

    rng = np.random.default_rng(hvd.rank())
    shape = (a.batch, a.side, a.side, 1)
    batches = [(tf.constant(rng.random(shape, dtype=np.float32)),
                tf.constant(rng.integers(0, 10, a.batch, dtype=np.int64))) for _ in range(8)]
    model = digits.build_model(Data(np.zeros(shape, np.float32), None, None, None, 10, "random"))
    opt = tf.keras.optimizers.SGD(learning_rate=0.05 * hvd.size(), momentum=0.9)
    hvd.broadcast_variables(model.variables, root_rank=0)

    @tf.function
    def step(x, y):
        with tf.GradientTape() as tape:
            loss = tf.reduce_mean(digits.loss(y, model(x, training=True)))
        tape = hvd.DistributedGradientTape(tape)
        grads = tape.gradient(loss, model.trainable_variables)
        opt.apply_gradients(zip(grads, model.trainable_variables))
        return loss

    step(*batches[0]).numpy()  # trace and create the optimizer's slots before the clock
    MPI.COMM_WORLD.Barrier()
    start = time.perf_counter()
    for s in range(a.steps):
        loss = step(*batches[s % len(batches)])
    loss.numpy()  # wait for the last step
    seconds = MPI.COMM_WORLD.allreduce(time.perf_counter() - start, op=MPI.MAX)
    if hvd.rank() == 0:
        samples = a.steps * a.batch * hvd.size()
        print(json.dumps({"steps": a.steps, "samples": samples, "seconds": seconds,
                          "samples_per_s": samples / seconds}), flush=True)


if __name__ == "__main__":
    main()
