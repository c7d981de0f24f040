"""The one validation step (harness/plan.py) that --check and a run share: pure checks
in-process, and under mpirun every input a run refuses before training is refused by
--check with the same message."""
import dataclasses

import pytest

from harness import dat, plan, topology
from harness.errors import RunError
from tests.conftest import dat_text, mpirun

CFG = dat.parse_text(dat_text(l10="1 2 4", l11="1 1 1"), "x.dat")


def test_layouts_skip_what_does_not_fit_the_world_as_hpl_does():
    planned, skipped = plan.layouts(CFG, dat.expand(CFG), 2, [0, 0])
    assert [p.test.index for p in planned] == [1, 2]
    assert [s.test.index for s in skipped] == [3]
    assert (skipped[0].reason, skipped[0].cause) == ("M x P = 4 x 1 = 4 exceeds the world size 2", "ranks")
    assert planned[0].warnings == ("M x P = 1 < world size 2: 1 rank(s) idle in this test",)
    assert planned[1].layout.jobs == ((0,), (1,))


def test_no_layout_that_fits_is_an_error_naming_the_lines():
    cfg = dat.parse_text(dat_text(l9=1, l10=3, l11=2), "x.dat")
    with pytest.raises(RunError, match=r"x.dat:10-11: found no layout that fits 4 rank\(s\) \(M x P = 3 x 2 = 6 "
                                       r"exceeds the world size 4\), expected M x P <= 4"):
        plan.layouts(cfg, dat.expand(cfg), 4, [0] * 4)


def test_aggregation_must_be_one_the_workload_defines():
    plan.check_aggregations(dat.parse_text(dat_text(l7="ewa"), "x.dat"))  # mean: fine
    with pytest.raises(RunError, match=r"x.dat:24: found 'vote', expected an aggregation that workload ewa defines \(mean\)"):
        plan.check_aggregations(dat.parse_text(dat_text(l7="ewa", l24="vote"), "x.dat"))


def test_adasum_needs_a_power_of_two_ranks_per_job_and_int8_goes_alone():
    for ps, fine in (("1 2 4", True), ("1 3", False)):
        cfg = dat.parse_text(dat_text(l9=len(ps.split()), l10=" ".join("1" for _ in ps.split()), l11=ps,
                                      l22="adasum"), "x.dat")
        planned, _ = plan.layouts(cfg, dat.expand(cfg), 4, [0, 0, 0, 0])
        if fine:
            plan.check_allreduce(cfg, planned)
        else:
            with pytest.raises(RunError, match=r"x.dat:22: found adasum with P=3 \(line 11\), expected P a power"
                                               r" of 2: Horovod's Adasum reduces a job's ranks in pairs"):
                plan.check_allreduce(cfg, planned)
    cfg = dat.parse_text(dat_text(l9=1, l10=1, l11=2, l21="int8", l22="adasum"), "x.dat")
    with pytest.raises(RunError, match=r"x.dat:21-22: found int8 communication with adasum, expected one of them"):
        plan.check_allreduce(cfg, plan.layouts(cfg, dat.expand(cfg), 4, [0, 0, 0, 0])[0])
    cfg = dat.parse_text(dat_text(l9=1, l10=1, l11=3), "x.dat")       # ring: any P
    plan.check_allreduce(cfg, plan.layouts(cfg, dat.expand(cfg), 4, [0, 0, 0, 0])[0])
    cfg = dat.parse_text(dat_text(l9=1, l10=1, l11=3, l22="torus"), "x.dat")       # torus: any P (grid)
    plan.check_allreduce(cfg, plan.layouts(cfg, dat.expand(cfg), 4, [0, 0, 0, 0])[0])
    cfg = dat.parse_text(dat_text(l9=1, l10=1, l11=2, l21="int8", l22="torus"), "x.dat")
    with pytest.raises(RunError, match=r"x.dat:21-22: found int8 communication with torus, expected one of them"):
        plan.check_allreduce(cfg, plan.layouts(cfg, dat.expand(cfg), 4, [0, 0, 0, 0])[0])


def test_lr_scale_is_p_but_for_adasum():
    from harness.train import lr_scale
    assert lr_scale("ring", 8, 4, False) == 8 and lr_scale("hierarchical", 8, 4, True) == 8
    assert lr_scale("adasum", 8, 4, False) == 1     # MPI on the CPU: Adasum every rank, the single-rank LR
    assert lr_scale("adasum", 8, 4, True) == 4      # NCCL averages a node's 4 ranks, Adasum across nodes


class _Data:
    n_train = 100


def test_batch_must_fit_the_training_set_with_p_ranks():
    cfg = dat.parse_text(dat_text(l9=1, l10=1, l11=2, l14=50), "x.dat")
    planned, _ = plan.layouts(cfg, dat.expand(cfg), 2, [0, 0])
    plan.check_batches(cfg, planned, {"digits": _Data()})  # 2 x 50 = 100: one step
    cfg = dat.parse_text(dat_text(l9=1, l10=1, l11=2, l14=51), "x.dat")
    planned, _ = plan.layouts(cfg, dat.expand(cfg), 2, [0, 0])
    with pytest.raises(RunError, match=r"x.dat:14: found B=51, expected at most 50 with P=2"):
        plan.check_batches(cfg, planned, {"digits": _Data()})


def test_results_directory_must_be_writable(tmp_path):
    (tmp_path / "file").write_text("")
    cfg = dat.parse_text(dat_text(l5=str(tmp_path / "file" / "runs")), "x.dat")
    assert plan.results_dir_problem(cfg).startswith(f"x.dat:5: found results directory '{tmp_path}/file/runs'")
    cfg = dat.parse_text(dat_text(l5=str(tmp_path / "new" / "runs")), "x.dat")
    assert plan.results_dir_problem(cfg) is None
    assert sorted(p.name for p in tmp_path.iterdir()) == ["file"]  # nothing made, the probe removed


def test_a_framework_must_carry_the_input_and_be_installed_on_every_node(monkeypatch):
    """Line 35: a framework whose packages this node cannot import, that lacks a
    workload's model, or cannot carry a Table 2 choice, is refused naming the line, the
    framework and what is missing."""
    from harness import frameworks
    cfg = dat.parse_text(dat_text(l34=2, l35="tensorflow pytorch"), "x.dat")
    assert plan.framework_problem(cfg) is None        # torch and TensorFlow are in the suite's venv
    ewa = dat.parse_text(dat_text(l7="ewa", l34=2, l35="tensorflow pytorch"), "x.dat")
    assert plan.framework_problem(ewa) is None        # every workload is built in both
    monkeypatch.setattr(frameworks.pytorch_models, "BUILT", ("digits", "ic"))   # a framework still being built
    assert plan.framework_problem(ewa) == ("x.dat:7: found workload ewa with framework pytorch (line 35), expected a"
                                           " workload whose model is built in pytorch (digits, ic)")
    assert plan.framework_problem(dataclasses.replace(ewa, frameworks=("tensorflow",))) is None
    monkeypatch.undo()
    adasum = dat.parse_text(dat_text(l22="adasum", l35="pytorch"), "x.dat")
    assert plan.framework_problem(adasum) == ("x.dat:22: found adasum with framework pytorch (line 35), expected"
                                              " another choice: " + frameworks.UNSUPPORTED["pytorch"]["allreduce",
                                                                                                    "adasum"])
    compiled = dat.parse_text(dat_text(l33="inductor", l35="pytorch"), "x.dat")
    assert plan.framework_problem(compiled) is None                     # g++ on PATH here
    monkeypatch.setenv("CXX", "no-such-c++")
    assert plan.framework_problem(compiled) == (
        "x.dat:33: found inductor with framework pytorch, expected a node that can compile: no-such-c++"
        " (TorchInductor's C++ compiler: $CXX, else g++) is not on PATH here")
    assert frameworks.compiler_missing("pytorch", "none") is None and frameworks.compiler_missing("tensorflow", "xla") is None
    monkeypatch.delenv("CXX")
    monkeypatch.setitem(frameworks.REQUIRES, "pytorch", (("torch_not_here", "torch (requirements-pytorch.txt)"),))
    assert plan.framework_problem(cfg) == ("x.dat:35: found pytorch, expected a framework installed on this node:"
                                           " torch (requirements-pytorch.txt) cannot be imported here (README.md,"
                                           " Frameworks)")
    assert frameworks.missing("tensorflow") == []


def test_a_pytorch_job_needs_a_gpu_a_rank():
    """Two nodes of 2 ranks each (world ranks 0, 1 on n1; 2, 3 on n2), layouts 2 x 1 and
    1 x 2 in PyTorch. NCCL refuses a communicator with two ranks on one GPU: with one GPU on
    n1 the 1 x 2 job puts ranks 0 and 1 on GPU 0 (local ranks 0 and 1, 1 % 1 = 0); with
    two GPUs a node, or a CPU node (0 GPUs: Gloo), or TensorFlow, nothing is refused, and
    base models of one rank may share a GPU."""
    cfg = dat.parse_text(dat_text(l9=2, l10="2 1", l11="1 2", l35="pytorch"), "x.dat")
    planned, _ = plan.layouts(cfg, dat.expand(cfg), 4, [0, 0, 1, 1])
    hosts = ("n1", "n2")
    assert plan.shared_gpu_problem(cfg, planned, (0, 0, 1, 1), [1, 1, 2, 2], hosts) == (
        "x.dat:11: found P = 2 (test 2, job 0) with world ranks 0 and 1 both on GPU 0 of n1 (1 GPU(s) there for its 2"
        " ranks), expected each rank of a PyTorch job on a GPU of its own: NCCL refuses two ranks of one communicator"
        " on one GPU; start at most 1 rank(s) a node on n1, or P = 1 there")
    assert plan.shared_gpu_problem(cfg, planned, (0, 0, 1, 1), [2, 2, 2, 2], hosts) is None
    assert plan.shared_gpu_problem(cfg, planned, (0, 0, 1, 1), [0, 0, 0, 0], hosts) is None
    assert plan.shared_gpu_problem(cfg, planned[:1], (0, 0, 1, 1), [1, 1, 1, 1], hosts) is None   # 2 x 1 only
    tf = [dataclasses.replace(p, test=dataclasses.replace(p.test, framework="tensorflow")) for p in planned]
    assert plan.shared_gpu_problem(cfg, tf, (0, 0, 1, 1), [1, 1, 1, 1], hosts) is None
    # PMAP 1 deals job ranks round-robin over the nodes: ranks 0 and 2, one a node, one GPU each: fine
    cfg1 = dat.parse_text(dat_text(l9=2, l10="2 1", l11="1 2", l12=1, l35="pytorch"), "x.dat")
    planned1, _ = plan.layouts(cfg1, dat.expand(cfg1), 4, [0, 0, 1, 1])
    assert planned1[1].layout.jobs == ((0, 2),)
    assert plan.shared_gpu_problem(cfg1, planned1, (0, 0, 1, 1), [1, 1, 1, 1], hosts) is None


def test_a_parallel_mode_needs_pytorch_a_chain_and_a_layout_it_takes(monkeypatch):
    """Line 37: model, pipeline and mixed are refused with TensorFlow, with ewa, with a
    compiler, on a layout they cannot take, and for a model not yet cut into stages;
    data always passes. Each message names line 37, the test and why."""
    from harness import frameworks
    cfg = dat.parse_text(dat_text(l9=1, l10=1, l11=2, l35="pytorch", l36=2, l37="data pipeline:4"), "x.dat")
    tests = dat.expand(cfg)
    monkeypatch.setattr(frameworks.pytorch_models, "SPLIT", ("digits",))
    assert plan.mode_problem(cfg, tests) is None                    # 32 x 2 = 64 samples in 4 micro-batches
    tf = [dataclasses.replace(t, framework="tensorflow") for t in tests]
    assert plan.mode_problem(cfg, tf) == (
        "x.dat:37: found pipeline:4 (test 2: digits, tensorflow, P = 2, B = 32), expected data: "
        + frameworks.split_problem("tensorflow", "digits"))
    assert "name pytorch on line 35" in frameworks.split_problem("tensorflow", "digits")
    ewa = [dataclasses.replace(t, workload="ewa") for t in tests]
    assert plan.mode_problem(cfg, ewa).endswith("expected data: " + frameworks.UNSPLIT["ewa"])
    assert plan.mode_problem(cfg, [dataclasses.replace(t, workload="ic") for t in tests]) == (
        "x.dat:37: found pipeline:4 (test 2: ic, pytorch, P = 2, B = 32), expected data: ic's PyTorch model is not"
        " yet cut into stages (cut so far: digits)")
    # P = 1 with a split mode: skipped, as a layout that does not fit (a sweep of Ps and modes runs what applies)
    ones = dat.parse_text(dat_text(l9=2, l10="1 1", l11="1 2", l35="pytorch", l36=2, l37="data pipeline:4"), "x.dat")
    planned, skipped = plan.layouts(ones, dat.expand(ones), 4, [0, 0, 0, 0])
    assert [(p.test.P, p.test.mode) for p in planned] == [(1, "data"), (2, "data"), (2, "pipeline:4")]
    assert [(s.test.index, s.reason, s.cause) for s in skipped] == [
        (2, "P = 1 holds the whole model on one rank: line 37's pipeline:4 needs P >= 2", "mode")]
    assert "expected a mode this layout takes (lines 11 and 14): pipeline:4 with P = 2, B = 3: a pipeline of 2 stages" \
        " trains B x 2 = 6 samples a step, which 4 micro-batches" in plan.mode_problem(
            cfg, [dataclasses.replace(t, batch=3) for t in tests])
    assert "with compiler inductor (line 33), expected data, or none on line 33" in plan.mode_problem(
        dataclasses.replace(cfg, compiler="inductor"), tests)
    assert plan.mode_problem(cfg, [t for t in tests if t.mode == "data"]) is None


def test_check_describes_skipped_tests():
    nodes = topology.Nodes((0, 0), ("h",), 0, 2)
    planned, skipped = plan.layouts(CFG, dat.expand(CFG), 2, [0, 0])
    p = plan.Plan(CFG, {}, planned, skipped, (), nodes, {}, None)
    text = "\n".join(plan.describe(p, 2))
    assert "x.dat: valid. 2 test(s) on 2 rank(s), 1 node(s):" in text
    assert "test 3: skipped, M x P = 4 x 1 = 4 exceeds the world size 2" in text


# Each of these passed --check and failed only once the nodes were allocated, before.
@pytest.mark.parametrize("lines,message", [
    ({"l7": "ewa", "l8": "synthetic:10:64", "l24": "vote"},
     ":24: found 'vote', expected an aggregation that workload ewa defines (mean)"),
    ({"l7": "ic", "l8": "embedded"}, ":8: workload ic: ic: there is no embedded data set"),
    ({"l14": 5000}, ":14: found B=5000, expected at most 1438 with P=1"),
    ({"l28": "STAGE_UNDER_FILE"}, ":28: staging directory"),
    ({"l35": "pytorch", "l22": "adasum"}, ":22: found adasum with framework pytorch (line 35), expected another"),
    ({"l11": 2, "l37": "pipeline"}, ":37: found pipeline (test 1: digits, tensorflow, P = 2, B = 32), expected data:"
                                   " TensorFlow 2 has no pipeline-parallel machinery"),
], ids=["ewa-vote", "ic-embedded", "batch-5000", "staging-under-a-file", "pytorch-adasum", "tensorflow-pipeline"])
def test_check_refuses_what_a_run_refuses(tmp_path, lines, message):
    (tmp_path / "file").write_text("")
    lines = {k: (str(tmp_path / "file" / "stage") if v == "STAGE_UNDER_FILE" else v) for k, v in lines.items()}
    path = tmp_path / "in.dat"
    path.write_text(dat_text(l5=str(tmp_path / "runs"), **{"l9": 1, "l10": 1, "l11": 1, "l30": 0, **lines}))
    p = mpirun(2, ["--check", str(path)], tmp_path)
    assert p.returncode == 1, p.stderr[-2000:]
    assert p.stderr.count("hpcai500: error:") == 1, p.stderr[-2000:]
    assert f"in.dat{message}" in p.stderr, p.stderr[-2000:]
    assert "valid." not in p.stdout and "Traceback" not in p.stderr


def test_a_run_refuses_with_the_same_message_as_check(tmp_path):
    path = tmp_path / "in.dat"
    path.write_text(dat_text(l5=str(tmp_path / "runs"), l9=1, l10=1, l11=1, l14=5000, l30=0))
    checked = mpirun(2, ["--check", str(path)], tmp_path)
    ran = mpirun(2, [str(path)], tmp_path)
    assert ran.returncode == checked.returncode == 1
    said = [ln for ln in ran.stderr.splitlines() if "hpcai500: error:" in ln]
    assert said == [ln for ln in checked.stderr.splitlines() if "hpcai500: error:" in ln], (said, checked.stderr)
    assert not (tmp_path / "runs").exists()  # refused before the data: no run folder, no cache


def test_resume_refuses_other_settings(tmp_path):
    import json

    from harness import results
    cfg = dat.parse_text(dat_text(), "x.dat")
    record = results.Record("x", str(tmp_path), {"sha256": results.sha256(cfg.text)}, {},
                            {"HPCAI500_IC_WIDTH": "8"}, {}, [], {})
    (tmp_path / "results.json").write_text(json.dumps(record.json()))
    with pytest.raises(RunError, match=r"the HPCAI500_\* settings differ from that run's"):
        plan.resumed(str(tmp_path), cfg, 3, {})
    assert plan.resumed(str(tmp_path), cfg, 3, {"HPCAI500_IC_WIDTH": "8"}).settings == {"HPCAI500_IC_WIDTH": "8"}
