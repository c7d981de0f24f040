"""The one validation step (harness/plan.py) that --check and a run share: pure checks
in-process, and under mpirun every input a run refuses before training is refused by
--check with the same message."""
import dataclasses

import pytest

from harness import dat, gpus, plan, topology
from harness.errors import RunError
from tests.conftest import dat_text, mpirun

CFG = dat.parse_text(dat_text(l10="1 2 4", l11="1 1 1"), "x.dat")


def test_layouts_skip_what_does_not_fit_the_world_as_hpl_does():
    planned, skipped = plan.layouts(CFG, dat.expand(CFG), 2, [0, 0])
    assert [p.test.index for p in planned] == [1, 2]
    assert [s.test.index for s in skipped] == [3]
    assert (skipped[0].reason, skipped[0].cause) == (
        "x.dat:10-11: found '4 x 1', expected M x P <= 2: M x P = 4 x 1 = 4 exceeds the world size 2", "ranks")
    assert planned[0].warnings == ("M x P = 1 < world size 2: 1 rank(s) idle in this test",)
    assert planned[1].layout.jobs == ((0,), (1,))


def test_no_layout_that_fits_is_an_error_naming_the_lines():
    cfg = dat.parse_text(dat_text(l9=1, l10=3, l11=2), "x.dat")
    with pytest.raises(RunError, match=r"^x.dat:10-11: found '3 x 2', expected M x P <= 4: M x P = 3 x 2 = 6 exceeds"
                                       r" the world size 4 \(test 1\)$"):
        plan.layouts(cfg, dat.expand(cfg), 4, [0] * 4)


def test_aggregation_must_be_one_the_workload_defines():
    """Line 24 holds one aggregation for every workload of line 7: a workload that lacks it
    skips its tests, the others run; with no other workload, nothing runs."""
    cfg = dat.parse_text(dat_text(l6=2, l7="digits ewa", l8="synthetic", l9=1, l10=1, l11=1, l24="vote"), "x.dat")
    planned, skipped = plan.layouts(cfg, dat.expand(cfg), 1, [0])
    assert [p.test.workload for p in planned] == ["digits"]
    assert [(s.test.index, s.cause, s.reason) for s in skipped] == [
        (2, "aggregation", "x.dat:24: found 'vote' with workload ewa (line 7), expected mean: the aggregations ewa"
                           " defines")]
    assert plan.aggregation_problem(dat.parse_text(dat_text(l7="ewa"), "x.dat"), planned[0].test) is None  # mean
    with pytest.raises(RunError, match=r"^x.dat:24: found 'vote' with workload ewa \(line 7\), expected mean: the"
                                       r" aggregations ewa defines \(test 2\)$"):
        plan.layouts(dataclasses.replace(cfg, workloads=("ewa",)), [skipped[0].test], 1, [0])


def test_adasum_needs_a_power_of_two_ranks_per_job_and_int8_goes_alone():
    """Adasum with a P of the sweep that is not a power of 2: that test skipped; int8 with
    Adasum or the torus (two lines of one value each): the input refused."""
    cfg = dat.parse_text(dat_text(l9=3, l10="1 1 1", l11="1 2 3", l22="adasum"), "x.dat")
    planned, skipped = plan.layouts(cfg, dat.expand(cfg), 4, [0, 0, 0, 0])
    assert [p.test.P for p in planned] == [1, 2]
    assert [(s.test.index, s.cause, s.reason) for s in skipped] == [
        (3, "adasum", "x.dat:22: found 'adasum' with P = 3 (line 11), expected one of ring, hierarchical, torus, or P"
                      " a power of 2: Horovod's Adasum reduces a job's ranks in pairs")]
    for reduction in ("adasum", "torus"):
        with pytest.raises(RunError, match=rf"^x.dat:21: found 'int8' with all-reduce {reduction} \(line 22\),"
                                           r" expected one of fp32, fp16: int8's exchange all-gathers and averages"):
            plan.check_allreduce(dat.parse_text(dat_text(l21="int8", l22=reduction), "x.dat"))
    for line22 in ("ring", "torus", "hierarchical"):                 # any P
        cfg = dat.parse_text(dat_text(l9=1, l10=1, l11=3, l22=line22), "x.dat")
        plan.check_allreduce(cfg)
        assert plan.layouts(cfg, dat.expand(cfg), 4, [0, 0, 0, 0])[1] == ()


def test_lr_scale_is_p_but_for_adasum():
    from harness.train import lr_scale
    assert lr_scale("ring", 8, 4, False) == 8 and lr_scale("hierarchical", 8, 4, True) == 8
    assert lr_scale("adasum", 8, 4, False) == 1     # MPI on the CPU: Adasum every rank, the single-rank LR
    assert lr_scale("adasum", 8, 4, True) == 4      # NCCL averages a node's 4 ranks, Adasum across nodes


class _Data:
    n_train = 100


def test_batch_must_fit_the_training_set_with_p_ranks():
    """A job's step takes P x B samples: 2 x 50 = 100 fits 100 samples; 2 x 51 does not, and
    that test is skipped while the one of P = 1 runs; with nothing left, refused."""
    cfg = dat.parse_text(dat_text(l9=2, l10="1 1", l11="1 2", l13=2, l14="50 51"), "x.dat")
    every, _ = plan.layouts(cfg, dat.expand(cfg), 2, [0, 0])
    planned, skipped = plan.batches(cfg, every, (), {"digits": _Data()})
    assert [(p.test.P, p.test.batch) for p in planned] == [(1, 50), (1, 51), (2, 50)]
    assert [(s.test.index, s.cause, s.reason) for s in skipped] == [
        (4, "batch", "x.dat:14: found '51' with P = 2 (line 11), expected at most 50: digits has 100 training samples"
                     " and a job's step takes P x B")]
    with pytest.raises(RunError, match=r"^x.dat:14: found '51' with P = 2 \(line 11\), expected at most 50: .*"
                                       r" \(test 4\)$"):
        plan.batches(cfg, every[3:], (), {"digits": _Data()})


def test_results_directory_must_be_writable(tmp_path):
    (tmp_path / "file").write_text("")
    cfg = dat.parse_text(dat_text(l5=str(tmp_path / "file" / "runs")), "x.dat")
    assert plan.results_dir_problem(cfg) == (f"x.dat:5: found '{tmp_path}/file/runs', expected a results directory"
                                             f" that can be made and written: {tmp_path}/file is not a directory")
    cfg = dat.parse_text(dat_text(l5=str(tmp_path / "new" / "runs")), "x.dat")
    assert plan.results_dir_problem(cfg) is None
    assert sorted(p.name for p in tmp_path.iterdir()) == ["file"]  # nothing made, the probe removed


def test_a_framework_may_refuse_one_precision_of_a_sweep(monkeypatch):
    """Line 17's precisions are a sweep: a framework refusing one (its REFUSES, keyed by the
    test's own field, plan.TEST_FIELDS) skips that test alone, naming line 17."""
    from harness import frameworks
    monkeypatch.setitem(frameworks.facts("pytorch").REFUSES, ("precision", "bf16"), "not built")
    cfg = dat.parse_text(dat_text(l9=1, l10=1, l11=1, l16=2, l17="fp32 bf16", l35="pytorch"), "x.dat")
    planned, skipped = plan.layouts(cfg, dat.expand(cfg), 1, [0])
    assert [p.test.precision for p in planned] == ["fp32"]
    assert [(s.test.precision, s.cause, s.reason) for s in skipped] == [("bf16", "framework", (
        "x.dat:17: found 'bf16' with framework pytorch (line 35), expected one of fp32, fp16: not built"))]


def test_a_precision_a_ranks_gpu_cannot_train_skips_its_tests_alone():
    """Issue 67, item 11: once the devices are set up, a framework that says a rank's device
    cannot train a precision (PyTorch: bf16 on a GPU before Ampere) skips that framework's
    tests of it, cause "device", naming line 17, the first such rank and why; its other
    precisions and the other framework's bf16 run; none left: refused."""
    from harness import results
    cfg = dat.parse_text(dat_text(l9=1, l10=1, l11=1, l16=2, l17="fp32 bf16", l34=2, l35="tensorflow pytorch"),
                         "x.dat")
    planned, skipped = plan.layouts(cfg, dat.expand(cfg), 1, [0])
    given = plan.Plan(cfg, {}, planned, skipped, tuple((p, 0) for p in planned), topology.Nodes((0,), ("h",), 0, 1),
                      {}, None)
    assert plan.device_skipped(given, {}) is given
    why = "GPU Tesla V100-SXM2-16GB (compute capability 7.0) has no bf16 tensor cores"
    got = plan.device_skipped(given, {("pytorch", "bf16"): (3, why)})
    assert [(p.test.framework, p.test.precision) for p in got.tests] == [
        ("tensorflow", "fp32"), ("pytorch", "fp32"), ("tensorflow", "bf16")]
    assert [p.test.index for p, _ in got.runs] == [p.test.index for p in got.tests]
    (s,) = got.skipped
    assert (s.test.framework, s.test.precision, s.cause) == ("pytorch", "bf16", "device") and s.cause in results.SKIP_CAUSES
    assert s.reason == f"x.dat:17: found 'bf16' with framework pytorch (line 35) on world rank 3, expected one of fp32, fp16: {why}"
    alone = plan.Plan(cfg, {}, tuple(p for p in planned if p.test.precision == "bf16"), (), (),
                      given.nodes, {}, None)
    with pytest.raises(RunError, match="x.dat:17: found 'bf16' with framework pytorch"):
        plan.device_skipped(alone, {("pytorch", "bf16"): (0, why), ("tensorflow", "bf16"): (0, why)})


def test_a_framework_must_carry_the_input_and_be_installed_on_every_node(monkeypatch):
    """Line 35: a framework that lacks a workload's model, or cannot carry a Table 2 choice,
    skips those tests (each test's framework: framework_choice_problem), naming the line, the
    framework and what that line accepts there; one whose packages this node cannot import,
    or whose compiler it lacks, is refused (the node's: framework_problem)."""
    from harness import frameworks
    cfg = dat.parse_text(dat_text(l34=2, l35="tensorflow pytorch"), "x.dat")
    assert plan.framework_problem(cfg) is None        # torch and TensorFlow are in the suite's venv
    ewa = dat.parse_text(dat_text(l7="ewa", l8="synthetic", l34=2, l35="tensorflow pytorch"), "x.dat")
    tf_ewa, pt_ewa = dat.expand(ewa)[:2]
    assert plan.framework_choice_problem(ewa, pt_ewa) is None        # every workload is built in both
    monkeypatch.setattr(frameworks.facts("pytorch"), "BUILT", ("digits", "ic"))   # a framework still being built
    assert plan.framework_choice_problem(ewa, pt_ewa) == ("framework", (
        "x.dat:7: found 'ewa' with framework pytorch (line 35), expected one of digits, ic: the workloads whose model"
        " is built in pytorch"))
    assert plan.framework_choice_problem(ewa, tf_ewa) is None
    monkeypatch.undo()
    adasum = dat.parse_text(dat_text(l9=1, l10=1, l11=2, l22="adasum", l34=2, l35="tensorflow pytorch"), "x.dat")
    planned, skipped = plan.layouts(adasum, dat.expand(adasum), 2, [0, 0])    # TensorFlow's test runs
    assert [p.test.framework for p in planned] == ["tensorflow"]
    assert [(s.test.index, s.cause, s.reason) for s in skipped] == [(2, "framework", (
        "x.dat:22: found 'adasum' with framework pytorch (line 35), expected ring: "
        + frameworks.facts("pytorch").REFUSES["allreduce", "adasum"]))]
    assert plan.framework_choice_problem(dataclasses.replace(adasum, allreduce="ring", compiler="inductor"),
                                         planned[0].test)[1].startswith(
        "x.dat:33: found 'inductor' with framework tensorflow (line 35), expected one of none, xla: ")
    compiled = dat.parse_text(dat_text(l33="inductor", l35="pytorch"), "x.dat")
    assert plan.framework_problem(compiled) is None                     # g++ on PATH here
    monkeypatch.setenv("CXX", "no-such-c++")
    assert plan.framework_problem(compiled) == (
        "x.dat:33: found 'inductor' with framework pytorch (line 35), expected none, or a node that can compile:"
        " no-such-c++ (TorchInductor's C++ compiler: $CXX, else g++) is not on PATH on this rank's node")
    assert frameworks.compiler_missing("pytorch", "none") is None and frameworks.compiler_missing("tensorflow", "xla") is None
    monkeypatch.delenv("CXX")
    monkeypatch.setattr(frameworks.facts("pytorch"), "REQUIRES", (("torch_not_here", "torch (requirements-pytorch.txt)"),))
    assert plan.framework_problem(cfg) == ("x.dat:35: found 'pytorch', expected a framework installed on every node:"
                                           " torch (requirements-pytorch.txt) cannot be imported on this rank's node"
                                           " (docs/install.md, 'Frameworks')")
    assert frameworks.missing("tensorflow") == []


def test_a_framework_of_a_venv_of_its_own_says_to_run_with_it(tmp_path, monkeypatch):
    """Issue 66: MindSpore lives in a venv of its own (facts VENV). Run from the main venv,
    the refusal says to run with that venv's python where it is built here (the Makefile's
    stamp, .installed), to build it where it is not, to build it again where this Python is
    its own; still FILE:35: found ..., expected ... . The main venv's frameworks: as before."""
    from harness import frameworks
    monkeypatch.setattr(frameworks.facts("mindspore"), "REQUIRES", (("mindspore_not_here", "mindspore (x.txt)"),))
    monkeypatch.setattr(frameworks, "ROOT", str(tmp_path))
    monkeypatch.setattr(plan.sys, "executable", "/main/.venv/bin/python")
    monkeypatch.setattr(frameworks.sys, "prefix", "/main/.venv")
    cfg = dat.parse_text(dat_text(l35="mindspore"), "x.dat")
    head = ("x.dat:35: found 'mindspore', expected a framework installed on every node: mindspore (x.txt) cannot be"
            " imported by this Python (/main/.venv/bin/python) on this rank's node; MindSpore runs from a venv of its own")
    run = (f"run with its python (one rank: {tmp_path}/.venv-mindspore/bin/python hpcai500.py x.dat; N ranks, with its"
           f" mpirun: PATH={tmp_path}/.venv-mindspore/bin:$PATH mpirun -np N python hpcai500.py x.dat)"
           " (docs/install.md, 'Frameworks')")
    assert plan.framework_problem(cfg) == (f"{head}, not built here: make venv VENV=.venv-mindspore"
                                           f" FRAMEWORKS=mindspore, then {run}")
    (tmp_path / ".venv-mindspore" / "bin").mkdir(parents=True)
    (tmp_path / ".venv-mindspore" / "bin" / "python").write_text("")   # still building: no stamp yet
    assert ", not built here: make venv" in plan.framework_problem(cfg)
    (tmp_path / ".venv-mindspore" / ".installed").write_text("")
    assert plan.framework_problem(cfg) == f"{head}, built here: {run}"
    monkeypatch.setattr(frameworks.sys, "prefix", str(tmp_path / ".venv-mindspore"))
    assert plan.framework_problem(cfg).endswith(
        f"; this Python is MindSpore's own venv, {tmp_path}/.venv-mindspore, and lacks it: build it again, make venv"
        " VENV=.venv-mindspore FRAMEWORKS=mindspore (docs/install.md, 'Frameworks')")
    assert frameworks.own_venv_hint("pytorch", "x.dat") is None and frameworks.own_venv_hint("tensorflow", "x.dat") is None


def _record(bus: str | None, nccl: bool = True, visible: str = "0") -> dict:
    """A framework's set-up record on one rank (setup_devices), by hand: the GPU it pinned
    (its bus id; every rank's index 0, as under Slurm's --gpus-per-task=1) or None."""
    gpu = None if bus is None else {"index": 0, "visible": visible, "bus_id": bus, "uuid": None, "nvml_index": None}
    return {"device": "GPU 0 of 1" if gpu else "CPU", "gpus_on_node": int(gpu is not None), "gpu": gpu,
            "nccl": nccl and gpu is not None}


def _pinned(*per_rank: dict) -> list[dict]:
    """What driver._devices gathers: per rank, framework -> gpus.nccl_identity of its record."""
    return [{name: gpus.nccl_identity(r) for name, r in records.items()} for records in per_rank]


def test_a_pytorch_job_needs_a_gpu_a_rank():
    """Two nodes of 2 ranks each (world ranks 0, 1 on n1; 2, 3 on n2), layouts 2 x 1 and
    1 x 2 in PyTorch; the 1 x 2 job is ranks 0 and 1, on n1. NCCL refuses a communicator
    with two ranks on one GPU (the same host and bus id). Compared by the GPU each rank
    pinned, not its index: one GPU visible a rank, every rank's "GPU 0", on distinct bus ids
    is accepted; the same bus id on one node is refused; on two nodes, or on CPUs (Gloo),
    accepted; base models of one rank may share a GPU."""
    cfg = dat.parse_text(dat_text(l9=2, l10="2 1", l11="1 2", l35="pytorch"), "x.dat")
    planned, _ = plan.layouts(cfg, dat.expand(cfg), 4, [0, 0, 1, 1])
    assert planned[1].layout.jobs == ((0, 1),)
    hosts, nodes = ("n1", "n2"), (0, 0, 1, 1)
    a, b = "0000:07:00.0", "0000:0f:00.0"
    one_each = _pinned(*({"pytorch": _record(bus)} for bus in (a, b, a, b)))   # every rank "GPU 0", 2 GPUs a node
    assert plan.shared_gpu_problem(cfg, planned, nodes, one_each, hosts) is None
    shared = _pinned(*({"pytorch": _record(bus)} for bus in (a, a, b, b)))     # ranks 0 and 1 bound to one GPU
    assert plan.shared_gpu_problem(cfg, planned, nodes, shared, hosts) == (
        "x.dat:11: found '2' (test 2's P) with world ranks 0 and 1 of job 0 both on GPU 0000:07:00.0 of n1 (1 GPU(s)"
        " pinned there by its 2 ranks), expected each rank of a PyTorch job on a GPU of its own: NCCL refuses two"
        " ranks of one communicator on one GPU; start at most one rank a GPU on n1, each bound to a different one"
        " (its index among the node's ranks, or CUDA_VISIBLE_DEVICES / Slurm's --gpus-per-task=1 a rank), or P = 1"
        " there")
    cpus = _pinned(*({"pytorch": _record(None)} for _ in range(4)))
    assert plan.shared_gpu_problem(cfg, planned, nodes, cpus, hosts) is None
    assert plan.shared_gpu_problem(cfg, planned[:1], nodes, shared, hosts) is None   # 2 x 1 only: jobs of one rank
    # PMAP 1 deals job ranks round-robin over the nodes: ranks 0 and 2, one a node, the same bus id on each: fine
    cfg1 = dat.parse_text(dat_text(l9=2, l10="2 1", l11="1 2", l12=1, l35="pytorch"), "x.dat")
    planned1, _ = plan.layouts(cfg1, dat.expand(cfg1), 4, [0, 0, 1, 1])
    assert planned1[1].layout.jobs == ((0, 2),)
    same_bus = _pinned(*({"pytorch": _record(a)} for _ in range(4)))
    assert plan.shared_gpu_problem(cfg1, planned1, nodes, same_bus, hosts) is None


def test_a_tensorflow_job_needs_a_gpu_a_rank_where_horovod_has_nccl():
    """Horovod built with NCCL (its record's "nccl": hvd.nccl_built()) is refused two ranks
    of a job on one GPU mid-test ("Duplicate GPU detected", horovod#3929): refused before;
    a Horovod without NCCL carries GPU tensors through MPI or Gloo: allowed."""
    cfg = dat.parse_text(dat_text(l9=2, l10="2 1", l11="1 2", l35="tensorflow"), "x.dat")
    planned, _ = plan.layouts(cfg, dat.expand(cfg), 4, [0, 0, 1, 1])
    hosts, nodes, a = ("n1", "n2"), (0, 0, 1, 1), "0000:07:00.0"
    nccl = _pinned(*({"tensorflow": _record(a)} for _ in range(4)))
    assert "with world ranks 0 and 1 of job 0 both on GPU 0000:07:00.0 of n1 (1 GPU(s) pinned there by its 2 ranks)," \
           " expected each rank of a TensorFlow job on a GPU of its own" in plan.shared_gpu_problem(cfg, planned, nodes,
                                                                                                  nccl, hosts)
    mpi = _pinned(*({"tensorflow": _record(a, nccl=False)} for _ in range(4)))
    assert plan.shared_gpu_problem(cfg, planned, nodes, mpi, hosts) is None


def test_each_test_is_checked_on_its_own_frameworks_gpu():
    """Issue 67 item 6: a sweep of MindSpore (its CPU build) and PyTorch (GPUs); a PyTorch
    test is checked on PyTorch's record, whichever framework line 35 names first, and
    MindSpore's tests, on the host, on none."""
    a = "0000:07:00.0"
    shared = _pinned(*({"mindspore": _record(None), "pytorch": _record(a)} for _ in range(4)))
    for line35 in ("mindspore pytorch", "pytorch mindspore"):
        cfg = dat.parse_text(dat_text(l9=2, l10="2 1", l11="1 2", l34=2, l35=line35), "x.dat")
        planned, _ = plan.layouts(cfg, dat.expand(cfg), 4, [0, 0, 1, 1])
        torch_tests = [p for p in planned if p.test.framework == "pytorch"]
        ms_tests = [p for p in planned if p.test.framework == "mindspore"]
        assert "of a PyTorch job" in plan.shared_gpu_problem(cfg, torch_tests, (0, 0, 1, 1), shared, ("n1", "n2"))
        assert plan.shared_gpu_problem(cfg, ms_tests, (0, 0, 1, 1), shared, ("n1", "n2")) is None


def test_the_gpu_nccl_compares():
    """gpus.identity: the bus id (NCCL's key: two MIG slices of one GPU are one GPU to it),
    else NVML's UUID, else the CUDA_VISIBLE_DEVICES entry; nccl_identity: None where the
    record allows sharing (no GPU, or no NCCL)."""
    gpu = {"index": 0, "visible": "MIG-4b2e", "bus_id": "0000:07:00.0", "uuid": "MIG-4b2e", "nvml_index": None}
    assert gpus.identity(gpu) == "0000:07:00.0"
    assert gpus.identity({**gpu, "bus_id": None}) == "MIG-4b2e"
    assert gpus.identity({**gpu, "bus_id": None, "uuid": None, "visible": "3"}) == "cuda:3"
    assert gpus.nccl_identity({"gpu": gpu, "nccl": True}) == "0000:07:00.0"
    assert gpus.nccl_identity({"gpu": gpu, "nccl": False}) is None
    assert gpus.nccl_identity({"gpu": None, "nccl": False}) is None


def test_a_parallel_mode_needs_pytorch_a_chain_and_a_layout_it_takes(monkeypatch):
    """Line 37: model, pipeline and mixed cannot run with TensorFlow, with ewa, with fp16,
    with a compiler, on a P or B they cannot take, or for a model not yet cut into stages;
    data always can. Each message names line 37, the values of the other lines that meet
    in it (and no other line), and what line 37 accepts there."""
    from harness import frameworks
    cfg = dat.parse_text(dat_text(l9=1, l10=1, l11=2, l35="pytorch", l36=2, l37="data pipeline:4"), "x.dat")
    data, pipe = dat.expand(cfg)
    monkeypatch.setattr(frameworks.facts("pytorch"), "SPLIT", ("digits",))
    assert plan.mode_problem(cfg, data) is None and plan.mode_problem(cfg, pipe) is None   # 64 samples in 4
    at = "x.dat:37: found 'pipeline:4' with"
    assert plan.mode_problem(cfg, dataclasses.replace(pipe, framework="tensorflow")) == ("split", (
        f"{at} framework tensorflow (line 35), expected data: " + frameworks.split_problem("tensorflow", "digits")))
    assert "name pytorch on line 35" in frameworks.split_problem("tensorflow", "digits")
    assert plan.mode_problem(cfg, dataclasses.replace(pipe, workload="ewa")) == ("split", (
        f"{at} workload ewa (line 7), expected data: " + frameworks.UNSPLIT["ewa"]))
    assert plan.mode_problem(cfg, dataclasses.replace(pipe, workload="ic")) == ("split", (
        f"{at} workload ic (line 7), expected data: ic's PyTorch model is not yet cut into stages (cut so far:"
        " digits)"))
    assert plan.mode_problem(cfg, dataclasses.replace(pipe, batch=3)) == ("split", (
        f"{at} P = 2 (line 11) and B = 3 (line 14), expected MICROBATCHES one of 2, 3, 6: a pipeline of 2 stages"
        " trains B x 2 = 6 samples a step, which 4 micro-batches do not cut evenly"))
    assert plan.mode_problem(cfg, dataclasses.replace(pipe, P=8)) == ("split", (       # B plays no part: no line 14
        f"{at} P = 8 (line 11), expected MICROBATCHES >= 8, or gpipe: 1F1B keeps every stage busy only with at least"
        " as many micro-batches as stages (4 < 8)"))
    assert plan.mode_problem(dataclasses.replace(cfg, compiler="inductor"), pipe) == ("split", (
        f"{at} compiler inductor (line 33), expected data, or none on line 33: the compiler is not yet applied to a"
        " model cut into stages"))
    assert plan.mode_problem(cfg, dataclasses.replace(pipe, precision="fp16"))[1].startswith(
        f"{at} precision fp16 (line 17), expected data, or fp32 or bf16 on line 17: ")
    assert plan.mode_problem(cfg, dataclasses.replace(pipe, P=4, mode="mixed:3")) == ("split", (
        "x.dat:37: found 'mixed:3' with P = 4 (line 11), expected mixed:STAGES with STAGES 2: STAGES must be at least"
        " 2 and divide P with at least two replicas of each stage (STAGES = P is pipeline)"))
    # P = 1 first, whatever else the test holds: schema 2.8's cause of its own
    assert plan.mode_problem(cfg, dataclasses.replace(pipe, P=1, framework="tensorflow")) == ("mode", (
        f"{at} P = 1 (line 11), expected data, or P >= 2: one rank holds the whole model; a split model needs a rank"
        " a stage"))


def test_tests_the_sweep_forces_that_cannot_run_are_skipped_the_rest_run():
    """Issue 45: lines 11, 35 and 37 sweep as a cross product, so Ps `1 2` x `tensorflow
    pytorch` x `data pipeline:4` holds TensorFlow's pipeline and P = 1's: those three are
    skipped with their reasons and causes, the other five run; --check lists them."""
    cfg = dat.parse_text(dat_text(l9=2, l10="1 1", l11="1 2", l34=2, l35="tensorflow pytorch", l36=2,
                                  l37="data pipeline:4"), "x.dat")
    planned, skipped = plan.layouts(cfg, dat.expand(cfg), 2, [0, 0])
    assert [(p.test.index, p.test.P, p.test.framework, p.test.mode) for p in planned] == [
        (1, 1, "tensorflow", "data"), (3, 1, "pytorch", "data"), (5, 2, "tensorflow", "data"),
        (7, 2, "pytorch", "data"), (8, 2, "pytorch", "pipeline:4")]
    one = ("x.dat:37: found 'pipeline:4' with P = 1 (line 11), expected data, or P >= 2: one rank holds the whole"
           " model; a split model needs a rank a stage")
    from harness import frameworks
    assert [(s.test.index, s.cause, s.reason) for s in skipped] == [
        (2, "mode", one), (4, "mode", one),
        (6, "split", "x.dat:37: found 'pipeline:4' with framework tensorflow (line 35), expected data: "
                     + frameworks.facts("tensorflow").NO_PIPELINE)]
    text = plan.describe(plan.Plan(cfg, {}, (), skipped, (), topology.Nodes((0, 0), ("h",), 0, 2), {}, None), 2)
    assert text[-3:] == [f"test 2: skipped, {one}", f"test 4: skipped, {one}", f"test 6: skipped, {skipped[2].reason}"]
    from harness import results
    assert {s.cause for s in skipped} <= set(results.SKIP_CAUSES)


def test_check_describes_skipped_tests():
    nodes = topology.Nodes((0, 0), ("h",), 0, 2)
    planned, skipped = plan.layouts(CFG, dat.expand(CFG), 2, [0, 0])
    p = plan.Plan(CFG, {}, planned, skipped, (), nodes, {}, None)
    text = "\n".join(plan.describe(p, 2))
    assert "x.dat: valid. 2 test(s) on 2 rank(s), 1 node(s):" in text
    assert "test 3: skipped, x.dat:10-11: found '4 x 1', expected M x P <= 2: M x P = 4 x 1 = 4 exceeds the world" \
        " size 2" in text


# Each of these passed --check and failed only once the nodes were allocated, before. Each input's
# every test cannot run: refused, with one message in the format, and no rank before it.
@pytest.mark.parametrize("lines,message", [
    ({"l7": "ewa", "l8": "synthetic:10:64", "l24": "vote"},
     ":24: found 'vote' with workload ewa (line 7), expected mean: the aggregations ewa defines (test 1)"),
    ({"l7": "ic", "l8": "embedded"}, ":8: found 'embedded' with workload ic (line 7), expected a dataset ic can read:"
                                     " ic: there is no embedded data set"),
    ({"l14": 5000}, ":14: found '5000' with P = 1 (line 11), expected at most 1438: digits has"),
    ({"l28": "STAGE_UNDER_FILE"}, ":28: found '"),
    ({"l35": "pytorch", "l22": "adasum"}, ":22: found 'adasum' with framework pytorch (line 35), expected ring: "),
    ({"l11": 2, "l37": "pipeline"}, ":37: found 'pipeline' with framework tensorflow (line 35), expected data:"
                                   " TensorFlow 2 has no pipeline-parallel machinery"),
    ({"l9": 2, "l10": "1 1", "l11": "1 2", "l37": "pipeline"},     # two reasons, one message
     ":37: found 'pipeline' with P = 1 (line 11), expected data, or P >= 2: one rank holds the whole model; a split"
     " model needs a rank a stage (test 1); PATH:37: found 'pipeline' with framework tensorflow (line 35), expected"
     " data: TensorFlow 2 has no pipeline-parallel machinery"),
], ids=["ewa-vote", "ic-embedded", "batch-5000", "staging-under-a-file", "pytorch-adasum", "tensorflow-pipeline",
        "nothing-runs"])
def test_check_refuses_what_a_run_refuses(tmp_path, lines, message):
    (tmp_path / "file").write_text("")
    lines = {k: (str(tmp_path / "file" / "stage") if v == "STAGE_UNDER_FILE" else v) for k, v in lines.items()}
    path = tmp_path / "in.dat"
    path.write_text(dat_text(l5=str(tmp_path / "runs"), **{"l9": 1, "l10": 1, "l11": 1, "l30": 0, **lines}))
    p = mpirun(2, ["--check", str(path)], tmp_path)
    assert p.returncode == 1, p.stderr[-2000:]
    assert p.stderr.count("hpcai500: error:") == 1, p.stderr[-2000:]
    assert f"hpcai500: error: {path}{message.replace('PATH', str(path))}" in p.stderr, p.stderr[-2000:]
    assert "valid." not in p.stdout and "Traceback" not in p.stderr


def test_check_skips_the_tests_the_sweep_forces_and_passes(tmp_path):
    """Issue 45, under mpirun: Ps `1 2` x `tensorflow pytorch` x `data pipeline:4` on 2 ranks
    (refused whole before) is valid: 5 tests, and TensorFlow's pipeline and P = 1's skipped,
    each with its line's message; exit status 0, nothing on stderr said as an error."""
    path = tmp_path / "in.dat"
    path.write_text(dat_text(l5=str(tmp_path / "runs"), l9=2, l10="1 1", l11="1 2", l30=0, l34=2,
                             l35="tensorflow pytorch", l36=2, l37="data pipeline:4"))
    p = mpirun(2, ["--check", str(path)], tmp_path, timeout=240)
    assert p.returncode == 0, p.stderr[-2000:]
    assert f"{path}: valid. 5 test(s) on 2 rank(s), 1 node(s):" in p.stdout, p.stdout[-3000:]
    one = f"{path}:37: found 'pipeline:4' with P = 1 (line 11), expected data, or P >= 2: one rank holds the whole"
    skipped = [ln for ln in p.stdout.splitlines() if ": skipped, " in ln]
    assert [ln.split(",")[0] for ln in skipped] == ["test 2: skipped", "test 4: skipped", "test 6: skipped"], skipped
    assert skipped[0].startswith(f"test 2: skipped, {one}") and skipped[1].startswith(f"test 4: skipped, {one}")
    assert skipped[2].startswith(f"test 6: skipped, {path}:37: found 'pipeline:4' with framework tensorflow (line 35),"
                                 " expected data: TensorFlow 2 has no pipeline-parallel machinery")
    assert "parallel mode pipeline:4: 2 stages, 4 micro-batches of 16 on 1F1B" in p.stdout     # test 8 runs
    assert "hpcai500: error" not in p.stderr and "Traceback" not in p.stderr


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
    with pytest.raises(RunError) as e:
        plan.resumed(str(tmp_path), cfg, 3, {})
    assert str(e.value) == (f"--resume {tmp_path}: found HPCAI500_IC_WIDTH=8 there, unset now, expected the settings"
                            " that run's finished tests had: resume with them, or start a new run")
    assert plan.resumed(str(tmp_path), cfg, 3, {"HPCAI500_IC_WIDTH": "8"}).settings == {"HPCAI500_IC_WIDTH": "8"}


def test_resume_may_change_what_a_fault_costs_and_names_the_option_of_a_setting(tmp_path):
    """Issue 66: a run under --on-fault abort resumes plainly (the policy changes no finished
    test's figures; each test records what its own faults cost); a setting that an option
    sets is named with the option, not as a Python dict."""
    import json

    from harness import results
    cfg = dat.parse_text(dat_text(), "x.dat")
    record = results.Record("x", str(tmp_path), {"sha256": results.sha256(cfg.text)}, {},
                            {"HPCAI500_ON_FAULT": "abort", "HPCAI500_WATCHDOG": "60"}, {}, [], {}, status="interrupted")
    (tmp_path / "results.json").write_text(json.dumps(record.json()))
    assert plan.resumed(str(tmp_path), cfg, 3, {}).settings["HPCAI500_ON_FAULT"] == "abort"
    assert plan.resumed(str(tmp_path), cfg, 3, {"HPCAI500_ON_FAULT": "drop"}) is not None
    from harness import settings
    assert settings.resume_differences({"HPCAI500_FAULT": "1:3"}, {"HPCAI500_FAULT": "1:4"}) == [
        "HPCAI500_FAULT=1:3 there, HPCAI500_FAULT=1:4 now"]
    assert settings.resume_differences({}, {"HPCAI500_ON_FAULT": "drop", "HPCAI500_HEARTBEAT": "2"}) == []


def test_tensorflow_and_pytorch_do_not_share_a_nodes_gpus_in_one_run():
    """Issue 67 item 3: TensorFlow keeps the GPU memory it grew until its process ends, so a
    run of both frameworks on GPUs is refused at set-up, naming line 35; on CPUs, or with
    MindSpore (CPUs here) beside one of them, it runs."""
    both = dat.parse_text(dat_text(l34=2, l35="tensorflow pytorch"), "x.dat")
    assert plan.gpu_memory_problem(both, 4) == (
        "x.dat:35: found 'tensorflow pytorch' on a node with 4 GPU(s), expected tensorflow alone on GPUs in a run:"
        " TensorFlow keeps the GPU memory it grew until its process ends, so pytorch's tests would run out of it; run"
        " each framework in its own invocation (docs/install.md, 'GPU builds')")
    assert plan.gpu_memory_problem(both, 0) is None
    assert plan.gpu_memory_problem(dat.parse_text(dat_text(l34=2, l35="pytorch mindspore"), "x.dat"), 4) is None
    assert plan.gpu_memory_problem(dat.parse_text(dat_text(l35="pytorch"), "x.dat"), 8) is None


def test_a_pytorch_jobs_gpu_cache_goes_back_when_it_closes_and_a_cpus_is_left_alone(monkeypatch):
    import torch

    from harness.frameworks.pytorch import interface
    calls = []
    monkeypatch.setattr(torch.cuda, "synchronize", lambda d=None: calls.append(("sync", str(d))))
    monkeypatch.setattr(torch.cuda, "empty_cache", lambda: calls.append(("empty",)))
    interface.release_cached_memory(torch.device("cpu"))
    assert calls == []
    interface.release_cached_memory(torch.device("cuda", 1))
    assert calls == [("sync", "cuda:1"), ("empty",)]


def test_tensorflow_refuses_bf16_by_its_pinned_gpus_compute_capability(monkeypatch):
    """Issue 67 item 11, TensorFlow's side: the GPU setup_devices left visible is asked for its
    compute capability (stand-ins for TensorFlow's config calls): 7.0 refuses bf16 naming the
    GPU, 9.0 and a CPU do not, and a capability TensorFlow does not give refuses nothing."""
    import tensorflow as tf

    from harness.frameworks.tensorflow import interface
    seen, details = [["gpu0"]], [{"device_name": "Tesla V100-SXM2-16GB", "compute_capability": (7, 0)}]
    monkeypatch.setattr(tf.config, "get_visible_devices", lambda kind: seen[0])
    monkeypatch.setattr(tf.config.experimental, "get_device_details", lambda device: details[0])
    assert interface.precision_problem("bf16") == ("GPU Tesla V100-SXM2-16GB (compute capability 7.0) has no bf16"
                                                   " tensor cores (Ampere, compute capability 8.0, or newer)")
    assert interface.precision_problem("fp16") is None
    details[0] = {"device_name": "NVIDIA H100 80GB HBM3", "compute_capability": (9, 0)}
    assert interface.precision_problem("bf16") is None
    details[0] = {"device_name": "?"}
    assert interface.precision_problem("bf16") is None
    seen[0] = []
    assert interface.precision_problem("bf16") is None
