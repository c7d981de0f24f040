"""TensorFlow's interface: TensorFlow behind the framework interface (harness/frameworks.Framework): tf.keras
models, Horovod's gradient exchange on each job's sub-communicator.

The package holds the training step (train.py), LARS and LAMB (optimizers.py), the
int8 and torus exchanges (communication.py), the Keras walker of Table 3 (flops.py) and
the workloads' Keras members, one module a workload (models.py: the model, its loss,
input signature and predict, and TensorFlow's own feed where it differs from the
workload's numpy one; resnet.py, deeplab.py and faster_rcnn.py are the Keras networks
they build). The roofline micro-kernels are TensorFlow's too but live in the top-level
kernels/ (the benchmark's own folder, with its command line); `roofline` reaches them.
This interface is the one door through which the harness reaches all of it, so that a
run that names no TensorFlow test never imports TensorFlow or Horovod; no module outside
this package imports either.
"""
from __future__ import annotations

import os

from harness import communication, gpus
from harness.frameworks.tensorflow import communication as tf_communication
from harness.frameworks.tensorflow import facts, flops, models, train

NAME = facts.NAME
setup_devices = train.setup_devices


def software() -> dict:
    import horovod
    import tensorflow as tf
    return {"tensorflow": tf.__version__, "horovod": horovod.__version__, "horovod_build": horovod_build()}


def horovod_build() -> dict:
    """What Horovod says it was built with (`horovodrun --check-build`'s answers): its
    controllers, CUDA, and NCCL's version code (0: no NCCL; 22105 = 2.21.5), which decide
    what carries a GPU tensor's all-reduce (facts.library)."""
    import horovod.tensorflow as hvd
    return {"mpi": bool(hvd.mpi_built()), "gloo": bool(hvd.gloo_built()), "cuda": bool(hvd.cuda_built()),
            "nccl": int(hvd.nccl_built() or 0)}


def precision_problem(precision: str) -> str | None:
    """gpus.bf16_problem on the GPU this rank pinned (train.setup_devices made it the only one
    TensorFlow sees), from its compute capability; None on a CPU, and where TensorFlow does not
    say the capability (nothing to refuse on)."""
    import tensorflow as tf
    seen = tf.config.get_visible_devices("GPU")
    if not seen:
        return None
    details = tf.config.experimental.get_device_details(seen[0])
    capability = details.get("compute_capability")
    if not capability:
        return None
    gpu = f"GPU {details.get('device_name', '?')} (compute capability {capability[0]}.{capability[1]})"
    return gpus.bf16_problem(precision, gpu, tuple(capability) >= gpus.AMPERE)


def roofline(precision: str, quick: bool) -> dict:
    import kernels
    return kernels.roofline(precision, quick=quick)


def open_job(spec) -> "Job":
    return Job(spec)


class Job:
    """One job's Horovod world (hvd.init on the job's communicator: its all-reduces never
    leave the job), with line 22's torus process sets registered at init."""

    def __init__(self, spec):
        import horovod.tensorflow as hvd
        self.spec, self.hvd = spec, hvd
        # Horovod reads its all-reduce algorithm from the environment at init
        os.environ["HOROVOD_HIERARCHICAL_ALLREDUCE"] = "1" if spec.allreduce == "hierarchical" else "0"
        self.torus = tf_communication.Torus.of(
            communication.job_grid(spec.ranks, spec.node_of_rank), spec.comm.rank,
            hvd) if spec.allreduce == "torus" else None
        hvd.init(comm=spec.comm, process_sets=list(self.torus.sets) if self.torus else None)

    def build(self, workload, data, seed: int, job: int, precision: str):
        return train.build(workload, data, seed, job, precision)

    def train(self, workload, data, model, indices, recipe, **hooks):
        return train.train(workload, data, model, indices, recipe, torus=self.torus, **hooks)

    def predict(self, workload, model, data, rows):
        return models.get(workload.NAME).predict(model, data, rows)

    def count(self, workload, model, data) -> flops.FlopCount:
        return flops.count(model)

    def exchange(self) -> str:
        spec, hvd = self.spec, self.hvd
        return communication.exchange(spec.comm_precision, spec.allreduce, spec.comm.size,
                                      self.torus and self.torus.grid,
                                      facts.library(spec.allreduce, bool(spec.gpus_on_node), bool(hvd.nccl_built()),
                                                    hvd.mpi_enabled()),
                                      facts.RING)

    def close(self) -> None:
        import tensorflow as tf
        self.hvd.shutdown()
        tf.keras.backend.clear_session()

    def abandon(self) -> None:
        """The job lost a rank (harness/elastic.py): Horovod has shut itself down on the
        failed all-reduce; shutting it down again is local, as is clearing the session."""
        self.close()
