"""Charts and --summarize, drawn from the typed results alone."""
import json
import subprocess
import sys
from dataclasses import replace

import pytest

from harness import plots, results
from tests.conftest import ROOT, result

PNG = b"\x89PNG\r\n\x1a\n"


def _test(index, M, P, flops, wl="digits", B=32):
    return result(index=index, workload=wl, M=M, P=P, B=B, flops=flops, vflops=flops * 0.9, intensity=10.0 * index,
                  train_seconds=1.5, consistency={"passed": index != 2}, time_to_solution=2.0,
                  time_to_quality=None if index == 2 else 1.25)


def test_scaling_chart(tmp_path):
    tests = [_test(1, 1, 1, 1e10), _test(2, 2, 1, 1.9e10), _test(3, 4, 1, 3.5e10), _test(4, 1, 1, 1e10, B=64)]
    out = tmp_path / "scaling.png"
    assert plots.scaling(tests, str(out)) == 3        # the B=64 series has a single scale
    assert out.read_bytes()[:8] == PNG
    assert plots.scaling(tests[3:], str(tmp_path / "none.png")) == 0
    assert not (tmp_path / "none.png").exists()


def test_roofline_chart(tmp_path):
    out = tmp_path / "roofline.png"
    ceilings = {"precision": "fp32", "gemm_flops": 1e11, "conv_flops": 8e10, "bandwidth": 1e10}
    assert plots.roofline([_test(1, 1, 1, 1e10), _test(2, 2, 1, 1.9e10)], ceilings, str(out)) == 2
    assert out.read_bytes()[:8] == PNG


def test_summarize_prints_runs_side_by_side(tmp_path):
    for name, tests in (("run-a", [_test(1, 1, 1, 1e10), _test(2, 2, 1, 2e10)]), ("run-b", [])):
        (tmp_path / name).mkdir()
        record = results.Record("x", str(tmp_path / name), {}, {}, {}, {}, [], {}, status="interrupted",
                                tests=tests)
        (tmp_path / name / "results.json").write_text(json.dumps(record.json()))
    cmd = [sys.executable, str(ROOT / "hpcai500.py"), "--summarize", str(tmp_path / "run-a"), str(tmp_path / "run-b")]
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=60)
    assert p.returncode == 0, p.stderr
    rows = [ln for ln in p.stdout.splitlines() if ln.startswith("run-")]
    assert len(rows) == 4 and rows[0].endswith("PASSED") and rows[1].endswith("FAILED")
    assert "2.0000e-02" in rows[1]
    # each run's state after its rows, as --status says it (harness/heartbeat.py)
    assert rows[2] == f"{'run-a':<24} interrupted: no reason recorded; 2 test run(s) finished"
    assert rows[3] == f"{'run-b':<24} interrupted: no reason recorded; 0 test run(s) finished"
    assert rows[0].split()[7:9] == ["2.00", "1.25"] and rows[1].split()[7:9] == ["2.00", "-"]   # TTS, TTQ
    p = subprocess.run(cmd[:3] + [str(tmp_path / "nowhere")], capture_output=True, text=True, timeout=60)
    assert p.returncode == 1 and "error: --summarize: " in p.stderr and "nowhere: not a folder" in p.stderr
    # a results directory, as --status takes one: every run in it, oldest (by name) first
    p = subprocess.run(cmd[:3] + [str(tmp_path)], capture_output=True, text=True, timeout=60)
    assert p.returncode == 0, p.stderr
    assert [ln for ln in p.stdout.splitlines() if ln.startswith("run-")] == rows


def test_summarize_columns_fit_a_split_modes_code(tmp_path):
    """A split mode's T/V code (16 characters: PyTorch, mixed:2 on GPipe with 16 micro-batches)
    and cosmoflow (9) widen their columns instead of pushing the row's figures right."""
    from harness import report
    tests = [replace(_test(1, 1, 1, 1e10), tv="PBFC16MRPT2SGP16", workload="cosmoflow"), _test(2, 2, 1, 2e10)]
    (tmp_path / "run-a").mkdir()
    record = results.Record("x", str(tmp_path / "run-a"), {}, {}, {}, {}, [], {}, status="complete", tests=tests)
    (tmp_path / "run-a" / "results.json").write_text(json.dumps(record.json()))
    lines = report.summarize([str(tmp_path / "run-a")]).splitlines()
    head, rows = lines[1], [ln for ln in lines if ln.startswith("run-a ") and ln.endswith("ED")]
    assert head.split()[:3] == ["run", "T/V", "WL"]
    assert {ln.index("PASSED" if "PASSED" in ln else "FAILED") for ln in rows} == {head.index("Check")}
    assert rows[0].split()[1:3] == ["PBFC16MRPT2SGP16", "cosmoflow"]


def test_scaling_line_keeps_bagging_apart_from_data_parallelism():
    from harness import metrics, report
    tests = [_test(1, 1, 1, 1e10), _test(2, 2, 1, 2e10), _test(3, 1, 2, 1.2e10)]
    line = "Scaling (digits, tensorflow, B 32, fp32, P 1): Sys_scale 1 -> 2 : FLOPS x2.00, efficiency 1.00"
    # their timed spans (1.5 s) are under metrics.SHORT_SPAN (2 s): the line says so
    assert report.scaling_lines(tests, metrics.weak_scaling) == [line + " (timed spans under 2 s: indicative)"]
    assert report.scaling_lines([replace(t, train_seconds=2.0) for t in tests], metrics.weak_scaling) == [line]
    # as schemas 2.2 (no mark) and 2.8 (TensorFlow not named) wrote them, for --verify of such runs
    old = line.replace("tensorflow, ", "")
    assert report.scaling_lines(tests, metrics.weak_scaling, mark_short=False, name_framework=False) == [old]
    torch = [replace(t, framework="pytorch") for t in tests]
    assert report.scaling_lines(torch, metrics.weak_scaling, False, False) == [line.replace("tensorflow", "pytorch")]


def test_a_short_timed_span_warns_and_a_long_one_does_not():
    from harness import metrics
    assert metrics.short_span(2.0) is None and metrics.short_span(30.0) is None
    assert metrics.short_span(0.84).startswith("timed span 0.84 s, under 2 s: its FLOPS repeat only within about 5 %")


def _drawn(monkeypatch):
    """Keep the figure a chart function saves, to count what it drew."""
    figs = []
    save = plots._save
    monkeypatch.setattr(plots, "_save", lambda fig, path: (figs.append(fig), save(fig, path)))
    return figs


def test_quality_curve_of_thousands_of_models_is_a_band(tmp_path, monkeypatch):
    """M = 4,096: the base models are one min-max band and one mean line, not 4,096 lines.
    At evaluation e (1..3) half the models score 0.5 + 0.1 e - 0.05, half + 0.05: the band
    spans 0.55-0.85 over the run, the mean is 0.6, 0.7, 0.8."""
    M = 4096
    ev = [{"epoch": e, "seconds": 2.0 * e, "quality": 0.6 + 0.1 * e,
           "base_quality": [0.5 + 0.1 * e + (0.05 if j % 2 else -0.05) for j in range(M)]} for e in (1, 2, 3)]
    test = result(workload="ic", M=M, target_quality=0.763, evaluations=ev)
    figs = _drawn(monkeypatch)
    assert plots.quality_curve(test, str(tmp_path / "q.png")) == 3 * (1 + 3)   # ensemble + min, mean, max
    assert (tmp_path / "q.png").read_bytes()[:8] == PNG
    (ax,) = figs[0].axes
    assert len(ax.lines) == 3 and len(ax.collections) == 1      # mean, ensemble, target; the band
    mean, ensemble = ax.lines[0], ax.lines[1]
    assert list(mean.get_ydata()) == pytest.approx([0.6, 0.7, 0.8])
    assert ensemble.get_zorder() > mean.get_zorder()            # the ensemble on top
    ys = ax.collections[0].get_paths()[0].vertices[:, 1]
    assert (ys.min(), ys.max()) == pytest.approx((0.55, 0.85))
    assert len(ax.get_legend().get_texts()) == 4                # band, mean, ensemble, target


def test_quality_curve_of_a_few_models_keeps_a_line_each(tmp_path, monkeypatch):
    ev = [{"epoch": 1, "seconds": 1.0, "quality": 0.9, "base_quality": [0.8 + 0.01 * j for j in range(plots.BAND_ABOVE)]}]
    figs = _drawn(monkeypatch)
    test = result(M=plots.BAND_ABOVE, evaluations=ev)
    assert plots.quality_curve(test, str(tmp_path / "q.png")) == 1 + plots.BAND_ABOVE
    (ax,) = figs[0].axes
    assert len(ax.lines) == plots.BAND_ABOVE + 2 and not ax.collections   # a line a model, ensemble, target


def test_a_test_block_names_its_test_framework_mode_and_invocation():
    """A test block's first line (results schema 2.9): `Test N` as the Parallel modes block
    and the footer name it, the framework and the mode the result row does not show, the
    repetition, and the invocation of a resumed run that timed it; the T/V column as wide
    as a split mode's code. A 2.8 record re-renders as it was written (--verify)."""
    from harness import report
    t = replace(_test(3, 1, 4, 1e10), framework="pytorch", mode="mixed:2:16:gpipe", tv="PBFC16MRPT2SGP16",
                consistency={"passed": True, "max_diff": 0.0},
                repetition=1, invocation=0)
    lines = report.row(t, repetitions=3, invocations=2).splitlines()
    assert lines[0] == ("Test 3 : pytorch, mixed:2:16:gpipe ; repetition 2 of 3 ; timed by invocation 1 of 2"
                        " (before --resume), as recorded then")
    assert lines[1].split()[:2] == ["T/V", "WL"] and lines[3].split()[:2] == ["PBFC16MRPT2SGP16", "digits"]
    assert lines[1].index("Quality") + len("Quality") == len(lines[3])       # the row's columns under the header's
    assert report.row(replace(t, mode="data", invocation=1), 1, 2).splitlines()[0] == "Test 3 : pytorch"
    old = report.row(t, 3, 2, schema="2.8").splitlines()
    assert old[0].startswith("T/V ") and old[2].startswith("PBFC16MRPT2SGP16 digits")   # 2.8's 15-wide column


def test_the_devices_line_names_each_frameworks_device_where_they_differ():
    """Issue 67 item 6: the conventions' Devices line from one set-up record per framework.
    Alike (one framework, or two on CPUs): the line as every earlier run wrote it. A GPU
    framework beside MindSpore's CPU build: each framework's device, and each feed's cores."""
    from types import SimpleNamespace as NS
    from harness import report
    cpu = {"device": "CPU", "threads": 2, "inter_op": 1, "gpus_on_node": 0, "gpu": None, "nccl": False}
    gpu = {**cpu, "device": "GPU 0 of 1", "gpus_on_node": 1, "gpu": {"index": 0}, "nccl": True}
    one = report.devices_line(NS(frameworks=("mindspore",)), {"mindspore": cpu})
    assert one == ("Devices (rank 0): CPU; threads per rank: 2 intra-op and 1 inter-op for the step (cores / ranks"
                   " sharing them); input (read, decode, augment: the workload's feed) runs on the host between steps"
                   " (the workloads' numpy batches, channels first), on the same cores, none set aside: on a CPU-only"
                   " node it shares them with the step")
    both = report.devices_line(NS(frameworks=("mindspore", "pytorch")), {"mindspore": cpu, "pytorch": gpu})
    assert both.startswith("Devices (rank 0): MindSpore CPU, PyTorch GPU 0 of 1; threads per rank: 2 intra-op and 1"
                           " inter-op for the step")
    assert "channels first), on the same cores, none set aside" in both and both.endswith(
        ", on the cores the GPU leaves idle")
