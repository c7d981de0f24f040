"""VFLOPS per watt over the timed window only: the GPU energy between the training
clock's start and stop (harness/telemetry.window_energy, per_joule), by hand."""
import sys
import time

import pytest

from harness import telemetry
from harness.telemetry import Sampler
from tests.test_telemetry import GPU, fake_nvml


def test_power_readings_each_hold_until_the_next():
    readings = [(0.0, 100.0), (1.0, 200.0), (2.0, 300.0)]
    # [0.5, 2.5]: 0.5 s at 100 W + 1 s at 200 W + 0.5 s at 300 W
    assert telemetry.window_energy(readings, 0.5, 2.5, counter=False) == pytest.approx(50 + 200 + 150)
    # before the first reading its power is taken: [-1, 0.5] = 1.5 s at 100 W
    assert telemetry.window_energy(readings, -1.0, 0.5, counter=False) == pytest.approx(150)
    assert telemetry.window_energy(readings, 1.2, 1.2, counter=False) == 0.0


def test_an_energy_counter_is_read_between_readings():
    readings = [(0.0, 1000.0), (2.0, 5000.0), (4.0, 6000.0)]     # mJ: 2 W, then 0.5 W
    assert telemetry.window_energy(readings, 1.0, 3.0, counter=True) == pytest.approx((5500 - 3000) / 1000)
    # outside the readings: extrapolated at the nearest pair's rate
    assert telemetry.window_energy(readings, -1.0, 0.0, counter=True) == pytest.approx(2.0)
    assert telemetry.window_energy(readings, 4.0, 6.0, counter=True) == pytest.approx(1.0)


def test_per_joule_is_the_windows_valid_flops_over_its_energy():
    assert telemetry.per_joule(2e12, 10.0, {"window_energy_joules_total": 4000.0}) == pytest.approx(5e9)
    assert telemetry.per_joule(2e12, 10.0, {"window_energy_joules_total": None}) is None


def test_reduce_sums_each_physical_gpus_window_once():
    gpu = {"uuid": "GPU-0", "window_energy_joules": 30.0, "power_watts": {"mean": 1, "max": 1}}
    per_rank = [{"samples": 1, "seconds": 1, "gpu": gpu}, {"samples": 1, "seconds": 1, "gpu": dict(gpu)},
                {"samples": 1, "seconds": 1, "gpu": {**gpu, "uuid": "GPU-1", "window_energy_joules": 12.0}}]
    assert telemetry.reduce(per_rank)["window_energy_joules_total"] == 42.0   # GPU-0 shared by two ranks


def test_the_sampler_gives_the_window_apart_from_its_whole_span(monkeypatch):
    monkeypatch.setitem(sys.modules, "pynvml", fake_nvml(energy=False, util=True))
    s = Sampler(interval=0.02, gpu=GPU(0))
    s.start()
    time.sleep(0.15)
    t0 = time.perf_counter()
    time.sleep(0.2)
    t1 = time.perf_counter()
    # a power reading after the window, however late a loaded machine lets the thread take it (the
    # span's energy over 1.5 x the window's, asserted before, held only while every sleep kept its length)
    deadline = time.monotonic() + 60        # a hang bound: readings come every 0.02 s
    while not any(t > t1 for t, _ in list(s._power_at)):
        assert time.monotonic() < deadline, "no power reading after the window"
        time.sleep(0.02)
    g = s.stop(window=(t0, t1))["gpu"]
    assert g["window_energy_joules"] == pytest.approx(250 * (t1 - t0), rel=1e-6)   # 250 W held throughout
    # the whole span, start() to the last reading, holds the window, the 0.15 s of sleep before it and more
    assert g["energy_joules"] > g["window_energy_joules"] + 250 * 0.15
