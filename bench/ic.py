"""The ic workload's throughput: harness against a bare Horovod loop, and the input
pipeline against the training step.

    .venv/bin/python bench/ic.py [--runs 2]   # ~10 min on a quiet 2-core machine

Full ResNet-50 v1.5 at small sizes for this CPU: M=1, P=2, B=16 on 2 ranks, data
`synthetic:640:32` (512 training JPEGs of 32x32), 2 epochs = 32 steps of 32 images.
* Harness: hpcai500.py on a copy of HPCAI500.dat (line 7 = ic); throughput =
  samples_trained / train_seconds from results.json (the clock includes reading,
  decoding and augmenting the JPEGs, as MLPerf's does).
* Bare Horovod (this script with --bare, under mpirun): the same model (TensorFlow's
  ic.build_model),
  loss + weight decay, SGD with momentum 0.875, DistributedGradientTape, batch, ranks,
  step count and threads per rank, on random batches held in memory as tensors; one
  step before the clock, then barrier, timed, max over ranks.
* Input pipeline alone (--pipeline, one process, the thread settings of one of 2
  ranks): images/s read, decoded, cropped, flipped and batched by TensorFlow's ic.batches on a
  bootstrap resample, nothing trained. Set against the training step's images/s per
  rank (bare loop / ranks): the pipeline keeps up if it is the faster of the two.
Runs alternate harness / bare, RUNS times each; medians compared. See bench/README.md
on noise: this machine is shared.
"""
import argparse
import json
import os
import sys
import time

import common

RUNS, B, SIDE, SAMPLES, EPOCHS = 2, 16, 32, 640, 2
DATASET = f"synthetic:{SAMPLES}:{SIDE}"


def main(runs: int = RUNS) -> None:
    print(f"machine: {common.machine()}")
    dat = common.make_dat("ic", l7="ic", l8=DATASET, l9=1, l10=1, l11=2, l13=1, l14=B, l15=EPOCHS, l30=0)
    rows, harness, bare, loads = common.alternate(
        dat, lambda steps: ("bench/ic.py", "--bare", "--steps", str(steps)), runs, EPOCHS, digits=1)
    print(f"\nper run (ResNet-50 v1.5, M=1, P=2, B={B}, {DATASET}, {EPOCHS} epochs; other load = "
          f"cores used by other processes during the run):")
    print(common.table(["run", "what", "steps", "images", "seconds", "images/s", "other load"], rows))
    h, b = common.median(harness), common.median(bare)
    print(f"\nratio harness/bare = {h / b:.3f} (medians {h:.1f} / {b:.1f} images/s; goal >= 0.98)")

    out, load = common.quietest(lambda: common.mpirun("bench/ic.py", "--pipeline", np=1))
    p = json.loads(out.strip().splitlines()[-1])
    step = b / common.NP
    print("\ninput pipeline against the training step (images/s, one rank):")
    print(common.table(["what", "images/s", "other load"],
                       [["input pipeline alone (read + decode + crop + flip + batch)",
                         f"{p['images_per_s']:.0f}", f"{load:.2f}"],
                        ["training step alone (bare loop / ranks)", f"{step:.1f}", "-"]]))
    print(f"pipeline / step = {p['images_per_s'] / step:.1f}: "
          f"{'the pipeline keeps up' if p['images_per_s'] > step else 'the pipeline is the bottleneck'}")
    if max(loads + [load]) > common.QUIET:
        print(f"warning: other processes used up to {max(loads + [load]):.2f} cores during a run: noisy figures")


def _data(node_rank: int = 0, node_barrier=lambda: None):
    """(the workload, its TensorFlow module, the data)."""
    from harness.frameworks.tensorflow import ic as tf_ic
    from harness.workloads import Dataset, ic
    return ic, tf_ic, ic.load(Dataset.parse(DATASET), os.path.join(common.WORK, ".data"), node_rank, node_barrier)


def _threads(local_size: int) -> None:
    import tensorflow as tf  # as harness.train.setup_devices
    threads = max(1, (os.cpu_count() or 1) // local_size)
    tf.config.threading.set_intra_op_parallelism_threads(threads)
    tf.config.threading.set_inter_op_parallelism_threads(1 if threads == 1 else 2)


def bare_loop(steps: int) -> None:
    """A bare Horovod loop of the harness's ResNet-50, batch and image size."""
    import numpy as np
    from mpi4py import MPI
    import horovod.tensorflow as hvd
    import tensorflow as tf
    hvd.init()
    ic, tf_ic, data = _data(hvd.local_rank(), MPI.COMM_WORLD.Barrier)  # no TF op: threads can still be set
    _threads(hvd.local_size())
    rng = np.random.default_rng(hvd.rank())
    shape = (B, data.side, data.side, 3)
    batches = [(tf.constant(rng.standard_normal(shape, dtype=np.float32)),
                tf.constant(rng.integers(0, data.num_classes, B, dtype=np.int64))) for _ in range(4)]
    model = tf_ic.build_model(data)
    opt = tf.keras.optimizers.SGD(learning_rate=0.01 * hvd.size(), momentum=ic.MOMENTUM)
    hvd.broadcast_variables(model.variables, root_rank=0)

    step = common.bare_step(model, opt, tf_ic.loss)

    step(*batches[0]).numpy()
    MPI.COMM_WORLD.Barrier()
    start = time.perf_counter()
    losses = [step(*batches[s % len(batches)]) for s in range(steps)]
    losses[-1].numpy()
    seconds = MPI.COMM_WORLD.allreduce(time.perf_counter() - start, op=MPI.MAX)
    if hvd.rank() == 0:
        samples = steps * B * hvd.size()
        print(json.dumps({"steps": steps, "samples": samples, "seconds": seconds,
                          "samples_per_s": samples / seconds}), flush=True)


def pipeline(batches: int = 48) -> None:
    """Images/s of TensorFlow's ic.batches alone (training transform), threads as one of 2 ranks."""
    import numpy as np
    _, tf_ic, data = _data()
    _threads(common.NP)
    rows = np.random.default_rng(0).integers(0, data.n_train, batches * B)
    for _ in tf_ic.batches(data, rows[:2 * B], B, training=True, seed=0):  # warm: build the pipeline once
        pass
    start = time.perf_counter()
    n = sum(int(x.shape[0]) for x, _ in tf_ic.batches(data, rows, B, training=True, seed=1))
    seconds = time.perf_counter() - start
    print(json.dumps({"images": n, "seconds": seconds, "images_per_s": n / seconds}), flush=True)


if __name__ == "__main__":
    os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    sys.path.insert(0, common.ROOT)
    p = argparse.ArgumentParser()
    p.add_argument("--bare", action="store_true")
    p.add_argument("--pipeline", action="store_true")
    p.add_argument("--steps", type=int, default=32)
    p.add_argument("--runs", type=int, default=RUNS, help=f"harness/bare pairs (default {RUNS})")
    a = p.parse_args()
    if a.bare:
        bare_loop(a.steps)
    elif a.pipeline:
        pipeline()
    else:
        main(a.runs)
