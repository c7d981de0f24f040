"""The reference for bench/overhead.py: a bare Horovod TensorFlow training loop.

    mpirun -np 2 python bench/bare_horovod.py --steps 750 --batch 32 --side 16

The harness's digits model, SGD with momentum 0.9 at a constant learning rate,
DistributedGradientTape, `--steps` steps over a few random batches made once in
memory as tensors; one step runs before the clock. Threads per rank as the harness sets
them. Timed from a barrier to the end of the last step, max over ranks; rank 0 prints
one JSON line.

To find where the harness loses time, add its habits one at a time:
  --index  batches fancy-indexed from a numpy array every step (the harness's sampler path)
  --lr     the warm-up + cosine LR assigned inside the step, step number as tf.constant
  --cold   trace only (get_concrete_function) before the clock, as the harness does
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
    for flag in ("--index", "--lr", "--cold"):
        p.add_argument(flag, action="store_true")
    a = p.parse_args()

    from mpi4py import MPI
    import horovod.tensorflow as hvd
    import tensorflow as tf
    from harness.train import learning_rate
    from harness.frameworks.tensorflow import digits
    from harness.workloads import Data

    hvd.init()
    threads = max(1, (os.cpu_count() or 1) // hvd.local_size())  # as harness.train.setup_devices
    tf.config.threading.set_intra_op_parallelism_threads(threads)
    tf.config.threading.set_inter_op_parallelism_threads(1 if threads == 1 else 2)

    rng = np.random.default_rng(hvd.rank())
    shape = (a.batch, a.side, a.side, 1)
    batches = [(tf.constant(rng.random(shape, dtype=np.float32)),
                tf.constant(rng.integers(0, 10, a.batch, dtype=np.int64))) for _ in range(8)]
    if a.index:  # 8000 samples in memory, a shuffled order, numpy fancy indexing per step
        x_all = rng.random((8000, *shape[1:]), dtype=np.float32)
        y_all = rng.integers(0, 10, len(x_all), dtype=np.int64)
        order = np.concatenate([rng.permutation(len(x_all)) for _ in range(a.steps * a.batch // len(x_all) + 1)])
    model = digits.build_model(Data(np.zeros(shape, np.float32), None, None, None, 10, "random"))
    peak = 0.05 * hvd.size()
    opt = tf.keras.optimizers.SGD(learning_rate=peak, momentum=0.9)
    hvd.broadcast_variables(model.variables, root_rank=0)

    @tf.function
    def step(x, y, i):
        if a.lr:
            opt.learning_rate.assign(learning_rate(i, a.steps, a.steps // 3, peak))
        with tf.GradientTape() as tape:
            loss = tf.reduce_mean(digits.loss(y, model(x, training=True)))
        tape = hvd.DistributedGradientTape(tape)
        grads = tape.gradient(loss, model.trainable_variables)
        opt.apply_gradients(zip(grads, model.trainable_variables))
        return loss

    zero = tf.constant(0)
    if a.cold:  # trace (and create the optimizer's slots) only: the first run is on the clock
        step.get_concrete_function(tf.TensorSpec(shape, tf.float32), tf.TensorSpec(shape[:1], tf.int64),
                                   tf.TensorSpec((), tf.int32))
    else:
        step(*batches[0], zero).numpy()
    MPI.COMM_WORLD.Barrier()
    start = time.perf_counter()
    losses = []
    for s in range(a.steps):
        if a.index:
            idx = order[s * a.batch:(s + 1) * a.batch]
            x, y = x_all[idx], y_all[idx]
        else:
            x, y = batches[s % len(batches)]
        losses.append(step(x, y, tf.constant(s) if a.lr else zero))
    losses[-1].numpy()  # wait for the last step
    seconds = MPI.COMM_WORLD.allreduce(time.perf_counter() - start, op=MPI.MAX)
    if hvd.rank() == 0:
        samples = a.steps * a.batch * hvd.size()
        print(json.dumps({"steps": a.steps, "samples": samples, "seconds": seconds,
                          "samples_per_s": samples / seconds}), flush=True)


if __name__ == "__main__":
    main()
