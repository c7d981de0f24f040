"""The reference for bench/ewa.py: a bare Horovod training loop of the ewa model.

    mpirun -np 2 python bench/bare_ewa.py --steps 40 --batch 4 --samples 400 --side 96

The harness's Faster-RCNN (harness.frameworks.tensorflow.faster_rcnn, the backbone detector.config_for
picks for the size, or --backbone), SGD with momentum 0.9 at a constant learning rate,
DistributedGradientTape, `--steps` steps; one step runs before the clock. Threads per
rank as the harness sets them. Timed from a barrier to the end of the last step, max
over ranks; rank 0 prints one JSON line.

--feed chooses where the batches come from:
  tensors  4 batches of the synthetic set, read once and kept as tensors (the ideal)
  numpy    TensorFlow's ewa.batches every step: h5py reads of this rank's rows, normalise, flip,
           numpy arrays into the step (what the harness does)
  tfdata   the same generator through tf.data.Dataset.from_generator + prefetch(2)
           (HPCAI500_EWA_PREFETCH=2): reading overlaps the step, on a tf.data thread
--no-allreduce  a plain GradientTape: the same compute on every rank, no gradient
           all-reduce (the replicas drift apart; only the time matters). The step time
           with and without gives the all-reduce's share of a step.
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

import common  # noqa: E402  (bench/, the script's own folder, is on the path)


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, required=True)
    p.add_argument("--batch", type=int, default=4)
    p.add_argument("--samples", type=int, default=400)
    p.add_argument("--side", type=int, default=96)
    p.add_argument("--backbone", default=None)
    p.add_argument("--cache", required=True, help="the synthetic data's cache directory")
    p.add_argument("--feed", choices=("tensors", "numpy", "tfdata"), default="tensors")
    p.add_argument("--no-allreduce", action="store_true")
    a = p.parse_args()

    from mpi4py import MPI
    import horovod.tensorflow as hvd
    import tensorflow as tf
    from harness.frameworks.tensorflow import ewa as tf_ewa
    from harness.frameworks.tensorflow import faster_rcnn
    from harness.workloads import Dataset, detector, ewa

    hvd.init()
    threads = max(1, (os.cpu_count() or 1) // hvd.local_size())  # as harness.train.setup_devices
    tf.config.threading.set_intra_op_parallelism_threads(threads)
    tf.config.threading.set_inter_op_parallelism_threads(1 if threads == 1 else 2)
    comm = MPI.COMM_WORLD
    data = ewa.load(Dataset.parse(f"synthetic:{a.samples}:{a.side}"), a.cache, hvd.local_rank(), comm.Barrier)
    cfg = detector.config_for(data.height, data.width, data.max_boxes, a.backbone)

    # this rank's rows: a seeded shuffle, rank r takes every size-th, repeated as needed
    rng = np.random.default_rng(0)
    need = (a.steps + 1) * a.batch * hvd.size()
    order = np.concatenate([rng.permutation(data.n_train) for _ in range(need // data.n_train + 1)])
    rows = order[:need][hvd.rank()::hvd.size()]

    def feed():
        if a.feed == "tensors":
            fixed = [tf.nest.map_structure(tf.constant, b) for _, b in
                     zip(range(4), ewa.batches(data, rows, a.batch, training=True, seed=1))]
            return (fixed[s % len(fixed)] for s in range(a.steps + 1))
        # numpy, or the same generator through tf.data (TensorFlow's ewa.batches does the wrapping)
        os.environ[ewa.PREFETCH_ENV] = "2" if a.feed == "tfdata" else "0"
        return tf_ewa.batches(data, rows, a.batch, training=True, seed=1)

    tf.keras.utils.set_random_seed(7)
    model = faster_rcnn.build(cfg)
    opt = tf.keras.optimizers.SGD(learning_rate=0.01, momentum=0.9)
    hvd.broadcast_variables(model.variables, root_rank=0)

    step = common.bare_step(model, opt, faster_rcnn.loss, distributed=not a.no_allreduce)

    batches = feed()
    first = time.perf_counter()
    step(*next(batches)).numpy()   # trace, optimise, first negotiation: before the clock
    first = time.perf_counter() - first
    comm.Barrier()
    start = time.perf_counter()
    losses = [step(x, y) for x, y in batches]
    losses[-1].numpy()  # wait for the last step
    seconds = comm.allreduce(time.perf_counter() - start, op=MPI.MAX)
    if hvd.rank() == 0:
        samples = len(losses) * a.batch * hvd.size()
        grad_bytes = sum(int(np.prod(v.shape)) * 4 for v in model.trainable_variables)
        print(json.dumps({"steps": len(losses), "samples": samples, "seconds": seconds,
                          "samples_per_s": samples / seconds, "step_s": seconds / len(losses),
                          "backbone": cfg.backbone, "gradient_bytes": grad_bytes,
                          "first_step_s": first, "final_loss": float(losses[-1])}), flush=True)


if __name__ == "__main__":
    main()
