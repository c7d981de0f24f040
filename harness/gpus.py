"""The GPU each rank pinned, named once at set-up so that every reader agrees on it: the
shared-GPU check (harness/plan.shared_gpu_problem), the telemetry sampler (harness/telemetry)
and the report.

A rank's framework numbers its GPUs as CUDA does: CUDA_VISIBLE_DEVICES applied (indices, or
GPU-/MIG- UUIDs) and CUDA_DEVICE_ORDER (fastest first unless PCI_BUS_ID). NVML numbers
every GPU of the node in PCI order and ignores both. So neither "local rank % GPUs seen" nor
the framework's index names a GPU across ranks: under Slurm's --gpus-per-task=1 or a bind
script that sets CUDA_VISIBLE_DEVICES per local rank, every rank sees one GPU and calls it 0.
What does: the GPU's PCI bus id, which CUDA's driver API gives for the framework's index
(cuDeviceGetPCIBusId, the call behind cudaDeviceGetPCIBusId, with which NCCL finds
"Duplicate GPU detected": same host, same bus id), and NVML's UUID of that bus id.

Why the driver API (ctypes, libcuda.so.1) and not each framework's own getter: TensorFlow has
no public one (get_device_details gives a name and compute capability only), PyTorch's
device properties gained uuid and PCI fields late in 2.x; the driver is what both runtimes
sit on, numbers devices as they do, and is present wherever either sees a GPU. Unproven on a
GPU (no device machine has run this): bench/gpu_check.sh should compare it with nvidia-smi.

Pure functions (visible_entry, bus_id, identity, nccl_identity, nvml_key, bf16_problem) with the driver
and NVML at the edges (driver_bus_id, pinned, handle). No MPI.
"""
from __future__ import annotations

import ctypes
import os

BUS_ID_LENGTH = 64    # bytes of the buffer cuDeviceGetPCIBusId fills ("0000:07:00.0" and a NUL; 13 needed)


def nvml():
    """pynvml, initialised, or None. Imported lazily: the package or the driver may be
    missing (CPU nodes), and tests swap the module in sys.modules."""
    try:
        import pynvml
        pynvml.nvmlInit()
        return pynvml
    except Exception:  # ImportError, NVMLError_LibraryNotFound / DriverNotLoaded, OSError
        return None


def visible_entry(index: int, visible: str | None) -> str:
    """The CUDA_VISIBLE_DEVICES entry (`visible`: its value, None where unset) of the device
    a framework numbers `index`: "3" for index 1 of "2,3", a "GPU-..." or "MIG-..." UUID as
    written, str(index) where the variable is unset (every GPU visible, CUDA's order)."""
    if visible is None:
        return str(index)
    entries = [v.strip() for v in visible.split(",") if v.strip()]
    return entries[index] if index < len(entries) else str(index)


def bus_id(text: str | None) -> str | None:
    """A PCI bus id in one form, "dddd:bb:dd.f" in lower-case hex: CUDA writes the domain in
    4 digits ("0000:07:00.0"), NVML in 8 ("00000000:07:00.0"); None for None or a malformed id."""
    if not text:
        return None
    try:
        domain, bus, rest = text.strip().split(":")
        device, function = rest.split(".")
        return f"{int(domain, 16):04x}:{int(bus, 16):02x}:{int(device, 16):02x}.{int(function, 16):x}"
    except ValueError:
        return None


def identity(gpu: dict) -> str:
    """The physical GPU a pinned record (`pinned`) names, as NCCL tells GPUs apart: its PCI
    bus id (two MIG slices of one GPU are one GPU to NCCL); else NVML's UUID; else the
    CUDA_VISIBLE_DEVICES entry ("cuda:3"), which tells apart ranks bound to different
    indices or UUIDs but, with no driver answer, cannot see two names of one GPU."""
    return gpu.get("bus_id") or gpu.get("uuid") or f"cuda:{gpu['visible']}"


def nccl_identity(record: dict) -> str | None:
    """What the shared-GPU check compares for a framework's set-up record on one rank
    (setup_devices: its "gpu", the pinned GPU or None, and "nccl", whether its jobs' GPU
    tensors go through NCCL on this build): the GPU's identity, or None where sharing is
    allowed (a CPU, or an exchange that is not NCCL's)."""
    return identity(record["gpu"]) if record.get("nccl") and record.get("gpu") else None


def nvml_key(gpu: dict) -> tuple[str, object]:
    """How NVML finds a pinned GPU: ("uuid", u), ("bus_id", b) or ("index", n). NVML's own
    UUID where set-up found it; a MIG entry by its UUID (NVML answers for the slice: its
    power and energy are the whole GPU's, shared with other slices, so no figure is taken
    from the parent); the bus id; a GPU- entry; last, an index entry, which is NVML's index
    only where CUDA_DEVICE_ORDER=PCI_BUS_ID or the node's GPUs are all one model (CUDA's
    default order, fastest first, then ties in PCI order)."""
    entry = gpu["visible"]
    if gpu.get("uuid"):
        return "uuid", gpu["uuid"]
    if entry.startswith("MIG-"):
        return "uuid", entry
    if gpu.get("bus_id"):
        return "bus_id", gpu["bus_id"]
    if entry.startswith("GPU-"):
        return "uuid", entry
    return "index", int(entry)


def handle(nv, gpu: dict):
    """NVML's handle of a pinned GPU (nvml_key)."""
    kind, value = nvml_key(gpu)
    if kind == "uuid":
        return nv.nvmlDeviceGetHandleByUUID(value)
    if kind == "bus_id":
        return nv.nvmlDeviceGetHandleByPciBusId(value)
    return nv.nvmlDeviceGetHandleByIndex(value)


AMPERE = (8, 0)   # compute capability of the first GPUs with TF32 and bf16 tensor cores


def bf16_problem(precision: str, gpu: str | None, native_bf16: bool) -> str | None:
    """Why a rank cannot train `precision` on its device, or None: bf16 on a GPU (`gpu`: its
    name and compute capability; None: a CPU, where the frameworks' bf16 runs) without bf16
    tensor cores (`native_bf16`: Ampere, 8.0, or newer), where a framework would emulate it or
    fail, and its figures would say nothing of the GPU. Pure; each framework asks its GPU
    (Framework.precision_problem)."""
    if precision != "bf16" or gpu is None or native_bf16:
        return None
    return f"{gpu} has no bf16 tensor cores (Ampere, compute capability 8.0, or newer)"


def driver_bus_id(index: int, lib=None) -> str | None:
    """The PCI bus id of the device CUDA numbers `index` in this process, from CUDA's driver
    API (`lib`: libcuda.so.1, or a stand-in); None without a driver or on any error. The
    frameworks have called cuInit already when they saw a GPU: no context is made here."""
    try:
        lib = lib if lib is not None else ctypes.CDLL("libcuda.so.1")
        device, text = ctypes.c_int(), ctypes.create_string_buffer(BUS_ID_LENGTH)
        if lib.cuInit(0) or lib.cuDeviceGet(ctypes.byref(device), index):
            return None
        if lib.cuDeviceGetPCIBusId(text, BUS_ID_LENGTH, device):
            return None
        return bus_id(text.value.decode(errors="replace"))
    except Exception:  # OSError (no libcuda), AttributeError (no such symbol), a stand-in's own
        return None


def pinned(index: int, environ=None, lib=None) -> dict:
    """The record of the GPU a framework pinned, `index` in its (CUDA's) numbering, made
    once at set-up and kept for the run (a renumbering of ranks after a loss does not move
    a GPU): {"index", "visible": its CUDA_VISIBLE_DEVICES entry, "bus_id" (the driver's),
    "uuid" and "nvml_index" (NVML's, None without NVML)}."""
    environ = os.environ if environ is None else environ
    gpu = {"index": index, "visible": visible_entry(index, environ.get("CUDA_VISIBLE_DEVICES")),
           "bus_id": driver_bus_id(index, lib), "uuid": None, "nvml_index": None}
    nv = nvml()
    if nv is None:
        return gpu
    try:
        h = handle(nv, gpu)
        uuid = nv.nvmlDeviceGetUUID(h)
        gpu["uuid"] = uuid.decode() if isinstance(uuid, bytes) else uuid
        gpu["nvml_index"] = nv.nvmlDeviceGetIndex(h)
    except Exception:  # noqa: BLE001 - NVMLError (no such device, MIG index), a bad entry: what is known stays
        pass
    finally:
        try:
            nv.nvmlShutdown()
        except Exception:  # noqa: BLE001
            pass
    return gpu
