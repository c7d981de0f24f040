"""harness/telemetry.py: real psutil sampling, the no-NVML paths, the GPU arithmetic on a
stub pynvml (pure logic: no driver here), reduce(), promptness of stop()."""
import os
import sys
import threading
import time
import types

import numpy as np
import pytest

from harness import gpus, telemetry
from harness.telemetry import Sampler


def GPU(index: int, **known) -> dict:
    """A pinned-GPU record (harness/gpus.pinned) with nothing but the index known: NVML finds
    it by its index (CUDA_VISIBLE_DEVICES unset)."""
    return {"index": index, "visible": str(index), "bus_id": None, "uuid": None, "nvml_index": None, **known}


def busy(seconds: float) -> None:
    a = np.random.default_rng(0).random((200, 200))
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        a = np.tanh(a @ a.T / 200.0)


def telemetry_threads():
    return [t for t in threading.enumerate() if t.name == "hpcai500-telemetry"]


def test_real_sampling_under_load():
    """How many samples a loaded machine lets the thread take is its scheduler's: at least
    one (stop() takes one if none), never more than one per interval; the span is the
    one timed around it, from start() to stop()."""
    t0 = time.perf_counter()
    with Sampler(interval=0.05) as s:
        busy(0.6)
    wall = time.perf_counter() - t0
    r = s.summary
    assert 1 <= r["samples"] <= r["seconds"] / r["interval"] + 1 and r["errors"] == 0 and r["gpu"] is None
    assert 0.6 <= r["seconds"] <= wall
    assert r["cpu_process_percent"]["max"] > 0 and r["cpu_process_percent"]["mean"] > 0
    assert 0 < r["cpu_node_percent"]["max"] <= 100
    assert r["rss_bytes"]["mean"] > 10e6 and r["rss_bytes"]["max"] >= r["rss_bytes"]["mean"]
    assert not telemetry_threads()


def test_stop_is_prompt_and_takes_one_sample():
    """Prompt without a clock: the thread would sleep out its hour-long interval, and
    stop() gives up joining it after 5 s; the thread being gone when stop() returns is
    the proof that stop() woke it."""
    s = Sampler(interval=3600.0)
    s.start()
    time.sleep(0.05)
    r = s.stop()
    assert r["samples"] == 1 and r["rss_bytes"]["max"] > 0   # never empty
    assert not s._thread.is_alive() and not telemetry_threads()
    assert s.stop() is r                                       # idempotent


def test_no_driver(monkeypatch):
    pynvml = pytest.importorskip("pynvml")

    def missing():
        raise pynvml.NVMLError_LibraryNotFound(pynvml.NVML_ERROR_LIBRARY_NOT_FOUND)
    monkeypatch.setattr(pynvml, "nvmlInit", missing)
    r = Sampler(interval=0.02, gpu=GPU(0)).__enter__().stop()
    assert r["gpu"] is None and r["samples"] >= 1
    assert telemetry.gpu_inventory() == []


def test_no_pynvml(monkeypatch):
    monkeypatch.setitem(sys.modules, "pynvml", None)   # `import pynvml` raises ImportError
    with Sampler(interval=0.02, gpu=GPU(0)) as s:
        time.sleep(0.05)
    assert s.summary["gpu"] is None
    assert telemetry.gpu_inventory() == []


# -- a stub pynvml: the few calls the module makes --------------------------------------
def fake_nvml(energy=True, util=False, count=2):
    nv = types.ModuleType("pynvml")
    nv.NVMLError = type("NVMLError", (Exception,), {})
    nv.NVMLError_NotSupported = type("NVMLError_NotSupported", (nv.NVMLError,), {})
    nv.calls = {"util": 0, "energy": 0, "shutdown": 0, "handle": []}

    def not_supported(*_):
        raise nv.NVMLError_NotSupported()

    def utilisation(h):
        nv.calls["util"] += 1
        if not util:
            not_supported()
        return types.SimpleNamespace(gpu=75, memory=30)

    def energy_mj(h):
        if not energy:
            not_supported()
        nv.calls["energy"] += 1
        return 1_000_000 + 5000 * nv.calls["energy"]    # +5 J per read

    nv.nvmlInit = lambda: None
    nv.nvmlShutdown = lambda: nv.calls.__setitem__("shutdown", nv.calls["shutdown"] + 1)
    nv.nvmlDeviceGetCount = lambda: count
    nv.nvmlDeviceGetHandleByIndex = lambda i: nv.calls["handle"].append(i) or f"h{i}"
    nv.nvmlDeviceGetHandleByUUID = lambda u: nv.calls["handle"].append(u) or u
    nv.nvmlDeviceGetName = lambda h: "Fake A100"
    nv.nvmlDeviceGetUUID = lambda h: f"GPU-{h}"
    nv.nvmlDeviceGetUtilizationRates = utilisation
    nv.nvmlDeviceGetMemoryInfo = lambda h: types.SimpleNamespace(used=2 << 30, total=40 << 30)
    nv.nvmlDeviceGetPowerUsage = lambda h: 250_000           # mW
    nv.nvmlDeviceGetTotalEnergyConsumption = energy_mj
    nv.nvmlSystemGetDriverVersion = lambda: "550.54.15"
    return nv


def test_gpu_path_counter_and_unsupported_query(monkeypatch):
    nv = fake_nvml(energy=True, util=False)
    monkeypatch.setitem(sys.modules, "pynvml", nv)
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    with Sampler(interval=0.02, gpu=GPU(1)) as s:
        time.sleep(0.2)
    g = s.summary["gpu"]
    n = s.summary["samples"]
    assert n >= 2 and s.summary["errors"] == 0
    assert g["index"] == 1 and g["name"] == "Fake A100" and g["uuid"] == "GPU-h1" and nv.calls["handle"] == [1]
    assert g["power_watts"] == {"mean": 250.0, "max": 250.0}           # mW -> W
    assert g["memory_bytes"]["max"] == 2 << 30
    assert g["util_percent"] is None and nv.calls["util"] == 1          # unsupported: asked once
    assert g["available"] == ["memory_bytes", "power_watts", "energy_counter"]
    # reads: one at start, one a sample, one at stop; each +5 J
    assert nv.calls["energy"] == n + 2
    assert g["energy_joules"] == pytest.approx(5.0 * (n + 1)) and g["energy_source"] == "counter"
    assert nv.calls["shutdown"] == 1


def test_gpu_path_power_integral(monkeypatch):
    monkeypatch.setitem(sys.modules, "pynvml", fake_nvml(energy=False, util=True))
    with Sampler(interval=0.02, gpu=GPU(0)) as s:
        time.sleep(0.3)
    g, secs = s.summary["gpu"], s.summary["seconds"]
    assert g["util_percent"]["mean"] == 75.0 and "energy_counter" not in g["available"]
    assert g["energy_source"] == "power integral"
    # 250 W from start to the last sample, which is at most about one interval before stop
    assert 250 * (secs - 0.1) <= g["energy_joules"] <= 250 * secs + 1e-9


def test_gpu_transient_error_is_skipped(monkeypatch):
    nv = fake_nvml(energy=False, util=True)
    calls = []

    def flaky_power(h):                       # one transient failure, then 100 W
        calls.append(h)
        if len(calls) == 1:
            raise nv.NVMLError("GPU busy")
        return 100_000
    nv.nvmlDeviceGetPowerUsage = flaky_power
    monkeypatch.setitem(sys.modules, "pynvml", nv)
    with Sampler(interval=0.02, gpu=GPU(0)) as s:
        time.sleep(0.2)
    r = s.summary
    assert r["errors"] == 1 and len(calls) == r["samples"] >= 3      # still asked after the error
    assert r["gpu"]["power_watts"]["mean"] == 100.0
    assert r["gpu"]["energy_joules"] <= 100 * r["seconds"]


def test_cuda_visible_devices_entry_of_a_framework_index():
    """Pure: the entry of CUDA_VISIBLE_DEVICES a framework's index stands for."""
    assert gpus.visible_entry(1, "2,3") == "3" and gpus.visible_entry(0, "2,3") == "2"
    assert gpus.visible_entry(1, None) == "1"                       # unset: every GPU, CUDA's numbering
    assert gpus.visible_entry(0, "GPU-8c1f,GPU-77aa") == "GPU-8c1f"
    assert gpus.visible_entry(0, " MIG-4b2e-aa ") == "MIG-4b2e-aa"


def test_nvml_finds_the_pinned_gpu_by_uuid_then_bus_id_never_by_a_local_rank():
    """Pure: the key NVML is asked by. NVML's UUID from set-up first; a MIG slice by its own
    UUID (its parent's power is other slices' too); the bus id; a GPU- entry; an index entry
    last (NVML's index only in PCI order). CUDA_VISIBLE_DEVICES="2,3", framework index 1:
    physical GPU 3, whatever the rank's local rank."""
    visible = {"index": 1, "visible": gpus.visible_entry(1, "2,3"), "bus_id": None, "uuid": None}
    assert gpus.nvml_key(visible) == ("index", 3)
    assert gpus.nvml_key({**visible, "bus_id": "0000:41:00.0"}) == ("bus_id", "0000:41:00.0")
    assert gpus.nvml_key({**visible, "bus_id": "0000:41:00.0", "uuid": "GPU-9f"}) == ("uuid", "GPU-9f")
    assert gpus.nvml_key({**visible, "visible": "GPU-8c1f"}) == ("uuid", "GPU-8c1f")
    assert gpus.nvml_key({**visible, "visible": "MIG-4b2e", "bus_id": "0000:41:00.0"}) == ("uuid", "MIG-4b2e")


def test_a_bus_id_in_one_form():
    """CUDA writes the PCI domain in 4 hex digits, NVML in 8: one form, so ranks compare alike."""
    assert gpus.bus_id("0000:07:00.0") == gpus.bus_id("00000000:07:00.0") == "0000:07:00.0"
    assert gpus.bus_id("0000:B1:00.0") == "0000:b1:00.0"
    assert gpus.bus_id("") is None and gpus.bus_id("junk") is None and gpus.bus_id(None) is None


class FakeDriver:
    """libcuda's three calls as ctypes makes them: the framework's ordinal -> a bus id."""
    def __init__(self, buses, fail=None):
        self.buses, self.fail = buses, fail

    def cuInit(self, flags):
        return 3 if self.fail == "init" else 0           # CUDA_ERROR_NOT_INITIALIZED

    def cuDeviceGet(self, ref, ordinal):
        if ordinal >= len(self.buses):
            return 101                                   # CUDA_ERROR_INVALID_DEVICE
        ref._obj.value = 100 + ordinal
        return 0

    def cuDeviceGetPCIBusId(self, text, length, device):
        text.value = self.buses[device.value - 100].encode()
        return 0


def test_the_driver_names_the_pinned_gpu_by_its_bus_id():
    """driver_bus_id through a stand-in libcuda; no driver, a refused call: None."""
    assert gpus.driver_bus_id(1, FakeDriver(["0000:07:00.0", "0000:0F:00.0"])) == "0000:0f:00.0"
    assert gpus.driver_bus_id(2, FakeDriver(["0000:07:00.0"])) is None
    assert gpus.driver_bus_id(0, FakeDriver(["0000:07:00.0"], fail="init")) is None
    assert gpus.driver_bus_id(0, object()) is None                  # no such symbol


def test_cuda_visible_devices_mapping(monkeypatch):
    """gpus.pinned at set-up: NVML finds the GPU by its bus id where the driver gives one,
    else through CUDA_VISIBLE_DEVICES ("3,2": index 1 is NVML's 2; a UUID entry by UUID),
    and records NVML's UUID; the sampler then opens that UUID."""
    nv = fake_nvml()
    nv.nvmlDeviceGetHandleByPciBusId = lambda b: nv.calls["handle"].append(b) or "h7"
    nv.nvmlDeviceGetIndex = lambda h: int(h[1:]) if h[1:].isdigit() else 0
    monkeypatch.setitem(sys.modules, "pynvml", nv)
    no_driver = object()
    one = gpus.pinned(1, {"CUDA_VISIBLE_DEVICES": "3,2"}, no_driver)
    assert one == {"index": 1, "visible": "2", "bus_id": None, "uuid": "GPU-h2", "nvml_index": 2}
    assert gpus.pinned(0, {"CUDA_VISIBLE_DEVICES": "GPU-abc"}, no_driver)["uuid"] == "GPU-GPU-abc"
    bus = gpus.pinned(0, {"CUDA_VISIBLE_DEVICES": "0"}, FakeDriver(["0000:07:00.0"]))
    assert (bus["bus_id"], bus["uuid"], bus["nvml_index"]) == ("0000:07:00.0", "GPU-h7", 7)
    assert nv.calls["handle"] == [2, "GPU-abc", "0000:07:00.0"]
    assert Sampler(0.02, gpu=one).__enter__().stop()["gpu"]["uuid"] == "GPU-GPU-h2"   # by NVML's UUID
    assert nv.calls["handle"][-1] == "GPU-h2"


def test_a_renumbered_rank_samples_the_gpu_it_pinned(monkeypatch):
    """Item 7 of issue 67: a rank pins GPU 3 at set-up (local rank 3 of 4); a loss renumbers
    it local rank 2, and the sampler still opens GPU 3: it takes the record, not the rank."""
    nv = fake_nvml(count=4)
    monkeypatch.setitem(sys.modules, "pynvml", nv)
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    pinned = GPU(3)                          # set-up's record: local rank 3 % 4 GPUs
    local_rank_after_the_loss = 2            # topology.discover on the survivors
    with Sampler(0.02, gpu=pinned) as s:
        time.sleep(0.05)
    assert s.summary["gpu"]["index"] == 3 != local_rank_after_the_loss and nv.calls["handle"] == [3]


def test_inventories(monkeypatch):
    monkeypatch.setitem(sys.modules, "pynvml", fake_nvml(count=2))
    inv = telemetry.gpu_inventory()
    assert [g["index"] for g in inv] == [0, 1]
    assert inv[0] == {"index": 0, "name": "Fake A100", "uuid": "GPU-h0",
                      "memory_total_bytes": 40 << 30, "driver_version": "550.54.15"}
    h = telemetry.host_inventory()
    assert h["hostname"] and h["cpu_model"] and h["cores_logical"] >= 1 and h["memory_total_bytes"] > 0


# -- reduce() ---------------------------------------------------------------------------
def rank(cpu, rss, gpu=None):
    return {"samples": 10, "seconds": 10.0, "interval": 1.0, "errors": 0,
            "cpu_process_percent": {"mean": cpu, "max": cpu * 2}, "cpu_node_percent": {"mean": 50.0, "max": 60.0},
            "rss_bytes": {"mean": rss, "max": rss + 1}, "gpu": gpu}


def gpu(uuid, util, watts, joules):
    return {"index": 0, "name": "X", "uuid": uuid, "util_percent": util and {"mean": util, "max": util + 10},
            "memory_bytes": {"mean": 1e9, "max": 2e9}, "power_watts": {"mean": watts, "max": watts + 50},
            "energy_joules": joules, "energy_source": "counter", "available": []}


def test_reduce_math():
    r = telemetry.reduce([rank(100, 1e9, gpu("GPU-a", 80, 200, 2000)),
                          rank(200, 2e9, gpu("GPU-b", 60, 300, None)),
                          rank(300, 3e9, gpu("GPU-a", None, 200, 2000)),   # shares GPU-a
                          rank(400, 4e9)])
    assert r["ranks"] == 4 and r["ranks_with_gpu"] == 3 and r["gpus"] == 2 and r["samples"] == 40
    assert r["cpu_process_percent"] == {"min": 100, "mean": 250, "max": 400, "max_of_max": 800, "ranks": 4}
    assert r["rss_bytes"]["mean"] == 2.5e9 and r["rss_bytes"]["max_of_max"] == 4e9 + 1
    assert r["gpu_util_percent"] == {"min": 60, "mean": 70, "max": 80, "max_of_max": 90, "ranks": 2}
    assert r["energy_joules_total"] == 2000          # GPU-a once; GPU-b unknown
    assert r["power_watts_total"] == 500             # GPU-a once + GPU-b
    assert telemetry.device_utilisation(r) == 70 and telemetry.power_watts(r) == 500


def test_reduce_without_gpus():
    r = telemetry.reduce([rank(100, 1e9), None])
    assert r["ranks"] == 1 and r["ranks_with_gpu"] == 0 and r["gpu_power_watts"] is None
    assert telemetry.device_utilisation(r) is None and telemetry.power_watts(r) is None
    assert r["energy_joules_total"] is None
    assert telemetry.reduce([])["ranks"] == 0


def test_node_lines_group_alike_nodes_and_do_not_grow_with_them():
    from harness.telemetry import node_lines
    node = {"cpu_model": "EPYC", "cores_logical": 2, "cores_of_ranks": 2, "memory_total_bytes": 3 * 2**30, "ranks": 2,
            "gpus": []}
    two = [{**node, "hostname": "n1"}, {**node, "hostname": "n2"}]
    assert node_lines(two) == ["Nodes: 2 x [2 rank(s); EPYC, 2 cores, 3.0 GiB; no GPU] (n1, n2)"]
    many = [{**node, "hostname": f"c{i:03d}"} for i in range(500)]
    gpu = {**node, "hostname": "g1", "ranks": 4, "cores_of_ranks": 1,
           "gpus": [{"name": "A100"}, {"name": "A100"}, {"name": "A100"}, {"name": "A100"}]}
    assert node_lines(many + [gpu]) == [
        "Nodes: 500 x [2 rank(s); EPYC, 2 cores, 3.0 GiB; no GPU] (c000 ... c499)",
        "Nodes: 1 x [4 rank(s); EPYC, 2 cores (its ranks bound to 1 of them), 3.0 GiB; 4 x A100] (g1)"]


def test_a_nodes_usable_cores_are_its_ranks_bindings_together():
    """Issue 66: not rank 0's binding alone. Node 0 (ranks 0, 1, 3) and node 1 (ranks 2, 4),
    8 cores each. Rank 0 bound to core 0 (mask 0b1), rank 1 to cores 1-2 (0b110), rank 3 to
    core 2 again (0b100): node 0's ranks use cores 0, 1, 2: 3 (rank 0 alone would say 1).
    Node 1: rank 2 unbound (0xff: 8 cores), rank 4 on core 7: all 8, so no words added."""
    from harness.telemetry import node_lines, with_ranks_cores
    node = {"cpu_model": "EPYC", "cores_logical": 8, "memory_total_bytes": 2**31, "ranks": 3, "gpus": []}
    inventory = [{**node, "hostname": "n1"}, None, {**node, "hostname": "n2", "ranks": 2}, None, None]
    nodes = with_ranks_cores(inventory, [0b1, 0b110, 0xff, 0b100, 0b10000000], [0, 0, 1, 0, 1])
    assert [(n["hostname"], n["cores_of_ranks"]) for n in nodes] == [("n1", 3), ("n2", 8)]
    assert node_lines(nodes) == ["Nodes: 1 x [3 rank(s); EPYC, 8 cores (its ranks bound to 3 of them), 2.0 GiB;"
                                 " no GPU] (n1)",
                                 "Nodes: 1 x [2 rank(s); EPYC, 8 cores, 2.0 GiB; no GPU] (n2)"]


# ---- other load: the cores other processes kept busy during the timed span ---------------
def test_counter_delta_reads_between_readings_and_beyond_them():
    readings = [(0.0, 0.0), (1.0, 2.0), (3.0, 4.0)]          # rate 2 then 1 a second
    assert telemetry.counter_delta(readings, 0.5, 2.0) == 3.0 - 1.0
    assert telemetry.counter_delta(readings, 2.0, 4.0) == 5.0 - 3.0   # extrapolated at the last rate
    assert telemetry.counter_delta(readings, -1.0, 0.5) == 1.0 + 2.0  # and at the first
    assert telemetry.window_energy([(0.0, 0.0), (2.0, 4000.0)], 0.5, 1.5, counter=True) == 2.0   # mJ -> J


def test_cpu_window_of_a_rank():
    readings = [(10.0, 1.0, 100.0), (11.0, 1.9, 101.5), (13.0, 3.9, 105.5)]   # (t, process s, machine s)
    w = telemetry.cpu_window(readings, 10.5, 12.0)
    assert w == {"seconds": 1.5, "process_cpu_seconds": pytest.approx(2.9 - 1.45),
                 "machine_busy_cpu_seconds": pytest.approx(103.5 - 100.75)}


def test_other_load_per_machine_by_hand():
    """Nodes n1, n2 on machine 0 (simulated: one kernel), n3 on machine 1. Ranks 0-1 on n1,
    2 on n2, 3 on n3. Machine 0 busy 2.6 cores (as ranks 0-2 read it, mean), its ranks
    0.9 + 0.8 + 0.5 = 2.2: other 0.4, under 0.25 x 3 ranks. Machine 1 busy 1.8, its rank
    0.9: other 0.9, over 0.25 x 1: one warning."""
    def w(proc, busy, seconds=2.0):
        return {"seconds": seconds, "process_cpu_seconds": proc * seconds, "machine_busy_cpu_seconds": busy * seconds}
    windows = {0: w(0.9, 2.5), 1: w(0.8, 2.6), 2: w(0.5, 2.7, seconds=4.0), 3: w(0.9, 1.8), 4: None}
    got = telemetry.other_load(windows, [0, 0, 1, 2, 2], [0, 0, 1], ["n1", "n2", "n3"])
    assert [m["hosts"] for m in got] == [["n1", "n2"], ["n3"]] and [m["ranks"] for m in got] == [3, 1]
    assert got[0]["busy_cores"] == pytest.approx(2.6) and got[0]["ranks_cores"] == pytest.approx(2.2)
    assert got[0]["other_cores"] == pytest.approx(0.4) and got[1]["other_cores"] == pytest.approx(0.9)
    assert got[0]["seconds"] == pytest.approx(8 / 3)
    (warning,) = telemetry.other_load_warnings(got)
    assert warning == ("processes other than the run kept 0.90 cores busy on n3 during the timed span, over 0.25 a"
                       " rank (1 rank(s) there): the figures carry that load")
    # every node its own machine (machine_of_node = ()): n1 and n2 apart
    assert [m["hosts"] for m in telemetry.other_load(windows, [0, 0, 1, 2, 2], (), ["n1", "n2", "n3"])] == \
        [["n1"], ["n2"], ["n3"]]


def test_a_sampler_with_a_window_counts_its_own_cpu_in_it():
    """A busy main thread for 0.6 s inside the window: some CPU s of this process in it
    (how much a shared machine grants is its load's), no more than its cores could give,
    and the machine was at least that busy."""
    s = Sampler(interval=0.1)
    s.start()
    t0 = time.perf_counter()
    busy(0.6)
    t1 = time.perf_counter()
    w = s.stop(window=(t0, t1))["cpu_window"]
    assert w["seconds"] == pytest.approx(t1 - t0)
    # the readings are interpolated between samples 0.1 s apart: up to a sample's worth of every core over
    assert 0 < w["process_cpu_seconds"] <= len(os.sched_getaffinity(0)) * (t1 - t0 + 2 * 0.1)
    assert w["machine_busy_cpu_seconds"] >= 0.9 * w["process_cpu_seconds"]
