"""This rank's device: pinning (command-line path only), its name, the precision's dtype."""
from __future__ import annotations

import os
from dataclasses import dataclass

PRECISIONS = ("fp32", "fp16", "bf16")


@dataclass
class Device:
    kind: str                  # "GPU" or "CPU": picks the default sizes
    tf_name: str               # where tf.device() places the kernel
    name: str                  # for the report: "GPU 1: NVIDIA A100-SXM4-80GB", "CPU: ... (1 thread)"
    tf32: bool = False         # fp32 matmuls/convolutions run on TF32 tensor cores


def cores() -> int:
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)


def pin(local_rank: int, local_size: int) -> None:
    """Pin this rank as the harness does, before TensorFlow starts its runtime: GPU = rank
    among the node's ranks modulo the node's GPUs; threads = cores / ranks on the node, so
    that ranks sharing a node do not fight for its cores. The harness pins its own ranks;
    only `python -m kernels.<kernel>` calls this."""
    import tensorflow as tf
    threads = max(1, min(cores(), (os.cpu_count() or 1) // local_size))
    tf.config.threading.set_intra_op_parallelism_threads(threads)
    tf.config.threading.set_inter_op_parallelism_threads(1 if threads == 1 else 2)
    gpus = tf.config.list_physical_devices("GPU")
    if gpus:
        gpu = gpus[local_rank % len(gpus)]
        tf.config.set_visible_devices([gpu], "GPU")
        tf.config.experimental.set_memory_growth(gpu, True)


def current() -> Device:
    """The device TensorFlow places this rank's ops on (its first visible GPU, else the CPU)."""
    import tensorflow as tf
    gpus = tf.config.get_visible_devices("GPU")
    if gpus:
        details = tf.config.experimental.get_device_details(gpus[0])
        index = gpus[0].name.rsplit(":", 1)[-1]          # physical index, as pinned
        # TF32 needs Ampere (compute capability 8.0) or newer; TensorFlow enables it by default.
        tf32 = (details.get("compute_capability") or (0, 0)) >= (8, 0) \
            and tf.config.experimental.tensor_float_32_execution_enabled()
        return Device("GPU", "/GPU:0", f"GPU {index}: {details.get('device_name', 'unknown')}", tf32)
    threads = tf.config.threading.get_intra_op_parallelism_threads() or cores()
    return Device("CPU", "/CPU:0", f"CPU: {cpu_model()} ({threads} thread{'s' * (threads > 1)})")


def cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            return next(line.split(":", 1)[1].strip() for line in f if line.startswith("model name"))
    except (OSError, StopIteration):
        import platform
        return platform.processor() or "unknown"


def dtype(precision: str):
    import tensorflow as tf
    if precision not in PRECISIONS:
        raise ValueError(f"precision {precision!r}: expected one of {', '.join(PRECISIONS)}")
    return {"fp32": tf.float32, "fp16": tf.float16, "bf16": tf.bfloat16}[precision]
