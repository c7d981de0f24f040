"""The benchmark trained by MindSpore (issue 47), in MindSpore's own venv (`make test`
builds it beside the suite's: MindSpore 2.10 and TensorFlow 2.18 need protobufs no venv
can hold together; pytest's --mindspore-venv names it, else .venv-mindspore). That venv has
neither TensorFlow, Horovod nor PyTorch, so a run there imports none of them. A real
mpirun of the venv's Open MPI on 2 ranks: every test PASSED, the ensemble learnt the
digits, --verify passes here (in the suite's venv, without MindSpore: its MLLOG check
runs MLPerf's checker on every base model's log); the model's Table 3 count and weights
are the hand-computed ones, TensorFlow's and PyTorch's (tests/test_flops.py); the job's
exchange averages over MPI in FP32 and FP16 to the bit."""
import io
import json
import os
import platform
import subprocess
from pathlib import Path

import pytest

from harness import verify
from tests.conftest import HANG, MPIRUN_STDIN, ROOT, SMALL_MODELS, dat_text, mpi_env, results, run_dir

@pytest.fixture(scope="module")
def ms_python(request) -> Path:
    """The MindSpore venv's python (pytest's --mindspore-venv, which make test gives; else
    .venv-mindspore); the test fails, naming the command that builds it, where there is none."""
    venv = Path(request.config.getoption("--mindspore-venv"))
    python = venv / "bin" / "python"
    if not python.exists():
        pytest.fail(f"no MindSpore venv at {venv}: make venv VENV=.venv-mindspore FRAMEWORKS=mindspore"
                    " (make test builds it)")
    return python


# The first lines of a script this suite runs in MindSpore's venv (ROOT set above them): the harness
# on the path and what a run sets before MindSpore is imported (interface.py: facts.before_import),
# so the script's MindSpore dispatches and picks its kernels as a run's does. Without the dispatch
# setting, tests/test_mindspore_ewa.py's script took 26 s and 34 core-s instead of 18 and 16 here.
MS_PROLOGUE = """
import os, platform, sys
sys.path.insert(0, ROOT)
from harness.frameworks.mindspore import facts
os.environ.update(facts.before_import(os.environ, platform.machine()))
"""


def _ms_mpirun(ms_python, np_: int, args, cwd: Path, timeout: int = HANG, env: dict | None = None
               ) -> subprocess.CompletedProcess:
    """mpirun of the MindSpore venv's Open MPI, its python running `args` (`env`: extra variables)."""
    env = {**mpi_env(env=env), "PATH": f"{ms_python.parent}{os.pathsep}{os.environ['PATH']}"}
    cmd = [str(ms_python.parent / "mpirun"), *MPIRUN_STDIN, "--oversubscribe", "-np", str(np_), str(ms_python),
           *map(str, args)]
    return subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)


def test_the_mindspore_venv_holds_no_other_framework(ms_python):
    p = subprocess.run([str(ms_python), "-c", "import importlib.util as u, json; print(json.dumps("
                        "{m: u.find_spec(m) is not None for m in ('mindspore', 'tensorflow', 'horovod', 'torch')}))"],
                       capture_output=True, text=True, timeout=HANG)
    assert json.loads(p.stdout) == {"mindspore": True, "tensorflow": False, "horovod": False, "torch": False}, p.stderr


@pytest.mark.parametrize("ranks", [1, 4])
def test_the_shipped_sweep_trains_in_mindspore(ms_python, tmp_path, ranks):
    """The shipped HPCAI500.dat with line 35 mindspore, 3 epochs of 10, on one node: 1 rank
    trains test 1 (M = 1; the sweep's M = 2 and 4 skipped for want of ranks); 4 ranks the
    shipped M = 1, 2, 4 base models of one rank. Every test PASSED, --verify passes
    (MLPerf's checker on every base model's log); each learnt the digits (Top-1 > 0.5;
    measured 0.84, 0.91 and 0.96 on 4 ranks, 0.97-0.99 after 5 epochs: MindSpore's digits
    step is ~4 x TensorFlow's on a CPU, so the suite trains it 3). A base model of 4 ranks
    (its gradients averaged over MPI): the two-node test below, in int8; 2 ranks: the runs
    after it, the FP32 exchange."""
    (tmp_path / "t.dat").write_text(dat_text(l5=tmp_path / "runs", l15=3, l35="mindspore"))
    p = _ms_mpirun(ms_python, ranks, [ROOT / "hpcai500.py", tmp_path / "t.dat"], tmp_path)
    assert p.returncode == 0, p.stderr[-3000:]
    run = run_dir(tmp_path / "runs")
    report = (run / "report.txt").read_text()
    layouts = {1: [(1, 1)], 4: [(1, 1), (2, 1), (4, 1)]}[ranks]
    assert report.count("...... PASSED") == len(layouts) and "FAILED" not in report, report[-2000:]
    res = results(tmp_path / "runs")
    assert [(t["M"], t["P"]) for t in res["tests"]] == layouts
    assert len(res["skipped"]) == {1: 2, 4: 0}[ranks]
    assert res["environment"]["frameworks"] == ["mindspore"] and list(res["roofline"]) == ["mindspore/fp32"]
    for t in res["tests"]:
        assert t["framework"] == "mindspore" and t["tv"] == "B32C32SRMS" and t["consistency"]["passed"]
        assert t["weights"] == 151_434 and t["utilisation"]["gemm"] > 0
        assert t["quality"] > 0.5, (t["index"], t["quality"])
    # oneDNN capped at AVX2 by the harness (facts.ISA_CAP), in force and said so
    if platform.machine() == "x86_64":
        assert res["environment"]["library_settings"]["ONEDNN_MAX_CPU_ISA"] == "AVX2"
        assert "LIB ENV : ONEDNN_MAX_CPU_ISA=AVX2\n" in report
        assert "- MindSpore's CPU kernels (oneDNN): ONEDNN_MAX_CPU_ISA=AVX2 (the harness sets" in report
    # operators dispatched from the calling thread (facts.DISPATCH), in force and said so
    assert res["environment"]["library_settings"]["MS_DEV_HOST_BLOCKING_RUN"] == "1"
    assert "- MindSpore's operator dispatch: MS_DEV_HOST_BLOCKING_RUN=1, one thread, the caller's (" in report
    out = io.StringIO()
    assert verify.main(str(run), out=out) == 0, out.getvalue()


def test_the_steps_own_mindspore_warnings_are_gone(ms_python, tmp_path):
    """Issue 66: two tests on one rank, so two base models' one-graph steps (Step.fused) in one
    process. Before, MindSpore printed at each compile "Some side effect nodes were eliminated by
    mistake" (the unused `_` of the step's graph) and, for the second, 'The function "fused" ...
    has been compiled again' (each base model's step is its own graph: expected); neither now,
    and train.Recompiled drops that warning for this file's graphs alone, not another's."""
    (tmp_path / "t.dat").write_text(dat_text(l5=tmp_path / "runs", l9=1, l10=1, l11=1, l13=2, l14="32 16", l15=1,
                                             l30=0, l35="mindspore"))
    p = _ms_mpirun(ms_python, 1, [ROOT / "hpcai500.py", tmp_path / "t.dat"], tmp_path)
    assert p.returncode == 0, p.stderr[-3000:]
    assert "eliminated by mistake" not in p.stderr and "has been compiled again" not in p.stderr, p.stderr[-3000:]
    check = subprocess.run([str(ms_python), "-c", f"ROOT = {str(ROOT)!r}\n" + MS_PROLOGUE + """
import logging
from harness.frameworks.mindspore import train
def said(text):
    return train.Recompiled().filter(logging.LogRecord("ME", logging.WARNING, "api.py", 193, text, None, None))
ours = f'The function "fused" at the file "{train.__file__}", line 230 has been compiled again. Try to reuse'
print(said(ours), said(ours.replace(train.__file__, "/elsewhere/model.py")), said("Some other warning"))
"""], capture_output=True, text=True, timeout=HANG, cwd=ROOT)
    assert check.stdout.split() == ["False", "True", "True"], check.stderr[-3000:]


def test_the_onednn_cap_is_set_on_x86_where_the_user_set_none():
    """facts.isa_cap by hand: AVX2 on x86-64 alone, never over the user's own cap (either
    of oneDNN's names), none on other CPUs; the report's line names what was in force."""
    from harness.frameworks.mindspore import facts
    assert facts.isa_cap({}, "x86_64") == {"ONEDNN_MAX_CPU_ISA": "AVX2"}
    assert facts.isa_cap({"PATH": "/bin"}, "AMD64") == {"ONEDNN_MAX_CPU_ISA": "AVX2"}
    assert facts.isa_cap({"ONEDNN_MAX_CPU_ISA": "ALL"}, "x86_64") == {}
    assert facts.isa_cap({"DNNL_MAX_CPU_ISA": "AVX512_CORE"}, "x86_64") == {}
    assert facts.isa_cap({}, "aarch64") == {}
    (line,) = facts.isa_lines({"library_settings": {"ONEDNN_MAX_CPU_ISA": "AVX2", "OMP_NUM_THREADS": "1"}})
    assert line.startswith("MindSpore's CPU kernels (oneDNN): ONEDNN_MAX_CPU_ISA=AVX2 (the harness sets ")
    (line,) = facts.isa_lines({"library_settings": {"DNNL_MAX_CPU_ISA": "ALL"}})
    assert line.startswith("MindSpore's CPU kernels (oneDNN): DNNL_MAX_CPU_ISA=ALL (")
    (line,) = facts.isa_lines({"library_settings": {}})
    assert line.startswith("MindSpore's CPU kernels (oneDNN): neither set, oneDNN's own choice of ISA (")


def test_mindspore_dispatches_from_the_calling_thread_where_the_user_chose_nothing():
    """facts.before_import by hand: the ISA cap and the dispatch variable together, each
    never over the user's own value; the report's line names what was in force."""
    from harness.frameworks.mindspore import facts
    assert facts.before_import({}, "x86_64") == {"ONEDNN_MAX_CPU_ISA": "AVX2", "MS_DEV_HOST_BLOCKING_RUN": "1"}
    assert facts.before_import({}, "aarch64") == {"MS_DEV_HOST_BLOCKING_RUN": "1"}
    assert facts.before_import({"MS_DEV_HOST_BLOCKING_RUN": "0", "ONEDNN_MAX_CPU_ISA": "ALL"}, "x86_64") == {}
    say = lambda settings: facts.dispatch_lines({"library_settings": settings})[0]  # noqa: E731
    assert say({"MS_DEV_HOST_BLOCKING_RUN": "1"}).startswith(
        "MindSpore's operator dispatch: MS_DEV_HOST_BLOCKING_RUN=1, one thread, the caller's (the harness sets")
    assert say({}).startswith("MindSpore's operator dispatch: MS_DEV_HOST_BLOCKING_RUN not set, MindSpore's"
                              " dispatch threads (")
    assert say({"MS_DEV_HOST_BLOCKING_RUN": "0"}).startswith(
        "MindSpore's operator dispatch: MS_DEV_HOST_BLOCKING_RUN=0, as MindSpore reads that value (")


def test_a_sweep_in_mindspore_on_two_nodes(ms_python, cluster, tmp_path):
    """The shipped digits input with line 35 mindspore, on 2 simulated nodes x 2 ranks (the
    venv's mpirun launching over ssh, as from a login node): M = 2 base models of one rank,
    and one base model of 4 ranks across both nodes whose gradients go over MPI in int8
    (line 21); every test under Adam in mixed precision (line 17's fp16: mindspore.amp's O2,
    a dynamic loss scale), 4 epochs. Every test PASSED and learnt the digits (a base model
    of 4 ranks trains a quarter of the steps: its final loss), --verify passes. LARS and
    LAMB (ours, eager: 11x SGD's step here) are held to the references below, not trained
    here."""
    (tmp_path / "t.dat").write_text(dat_text(l5=tmp_path / "runs", l9=2, l10="2 1", l11="1 4", l15=4,
                                             l17="fp16", l18="adam", l19=0.002, l21="int8", l35="mindspore"))
    env = mpi_env()
    cmd = [str(ms_python.parent / "mpirun"), *MPIRUN_STDIN, *cluster.mpirun_args("n1:2,n2:2", env), str(ms_python),
           str(ROOT / "hpcai500.py"), str(tmp_path / "t.dat")]
    p = subprocess.run(cmd, cwd=tmp_path, env={**env, "PATH": f"{ms_python.parent}{os.pathsep}{os.environ['PATH']}"},
                       capture_output=True, text=True, timeout=2 * HANG)
    assert p.returncode == 0, p.stderr[-3000:]
    (run,) = [d for d in (tmp_path / "runs").iterdir() if not d.name.startswith(".")]
    report = (run / "report.txt").read_text()
    assert report.count("...... PASSED") == 2 and "FAILED" not in report, report[-2000:]
    res = results(tmp_path / "runs")
    assert res["environment"]["hosts"] == ["n1", "n2"]
    assert res["environment"]["frameworks"] == ["mindspore"] and res["environment"]["mindspore"] == "2.10.0"
    assert [(t["M"], t["P"], t["tv"]) for t in res["tests"]] == [(2, 1, "B16C8ARMS"), (1, 4, "B16C8ARMS")]
    for t in res["tests"]:
        assert t["framework"] == "mindspore" and t["consistency"]["passed"] and t["weights"] == 151_434
        assert t["quality"] > 0.5 or (t["P"] > 1 and max(t["final_loss"]) < 0.5), (t["index"], t["quality"])
    assert res["tests"][1]["exchange"] == ["int8 all-gather, MPI"], res["tests"][1]["exchange"]
    assert list(res["roofline"]) == ["mindspore/fp16"] and all(t["utilisation"]["gemm"] > 0 for t in res["tests"])
    assert "- MindSpore: graph mode; each step's forward and backward pass one mindspore.jit graph" in report
    assert "- Communication int8 in MindSpore, over MPI on the host" in report
    assert "- Mixed precision in MindSpore (fp16): mindspore.amp's O2" in report
    out = io.StringIO()
    assert verify.main(str(run), out=out) == 0, out.getvalue()


def test_ic_cosmoflow_deepcam_and_ewa_train_in_mindspore(ms_python, tmp_path, monkeypatch):
    """ic's ResNet, CosmoFlow's 3D CNN, DeepCAM's DeepLabv3+ and ewa's Faster-RCNN, shrunk
    (conftest.SMALL_MODELS: ic's stem 8 wide, one bottleneck a stage; cosmoflow's first block
    4 filters; deepcam's channels x 1/8, one middle block; ewa's small backbone below 384 px),
    on synthetic:16:32 (TFRecords, JPEGs by Pillow; deepcam's HDF5 at 32 x 48, ewa's at 32 x
    48), one base model of 2 ranks each: PASSED, --verify passes; their weights the PyTorch
    twins' (tests/test_pytorch_run.py: 133 378, 90 832, 523 983 and 542 725; cosmoflow's by
    hand: convolutions 27 Cin F + F = 436 + 872 + 3472 + 13 856 + 55 360, dense 65 x 128 +
    129 x 64 + 65 x 4 = 16 836), cosmoflow's count its formula, 41 987 272 a sample, deepcam's
    PyTorch's count of the same shrunk model at 32 x 48 (harness/frameworks/pytorch/
    flops.count), 14 765 988; ewa's steps eager, as the report says. At the reference sizes
    the ResNet-50's and DeepLabv3+'s counts are test_digits_count_and_the_mpi_exchange_in_
    mindspore's, ewa's tests/test_mindspore_ewa.py's."""
    from harness.workloads import cosmoflow
    (tmp_path / "t.dat").write_text(dat_text(l5=tmp_path / "runs", l6=4, l7="ic cosmoflow deepcam ewa",
                                             l8="synthetic:16:32", l9=1, l10=1, l11=2, l14=2, l15=2, l30=0,
                                             l35="mindspore"))
    p = _ms_mpirun(ms_python, 2, [ROOT / "hpcai500.py", tmp_path / "t.dat"], tmp_path, env=SMALL_MODELS)
    assert p.returncode == 0, p.stderr[-3000:]
    ic, cosmo, deepcam, ewa = results(tmp_path / "runs")["tests"]
    for t in (ic, cosmo, deepcam, ewa):
        assert t["framework"] == "mindspore" and t["consistency"]["passed"], t["consistency"]
    assert (ic["weights"], cosmo["weights"], deepcam["weights"], ewa["weights"]) == (133_378, 90_832, 523_983, 542_725)
    assert deepcam["workload"] == "deepcam" and deepcam["forward_flops_per_sample"] == 14_765_988
    assert ewa["workload"] == "ewa" and 0.0 <= ewa["quality"] <= 1.0
    monkeypatch.setenv("HPCAI500_COSMO_WIDTH", "4")                  # the formula at the run's width
    assert cosmo["forward_flops_per_sample"] == cosmoflow.forward_flops(32) == 41_987_272
    (run,) = [d for d in (tmp_path / "runs").iterdir() if not d.name.startswith(".")]
    assert "- ewa in MindSpore: eager steps (PyNative), not one mindspore.jit graph" in (run / "report.txt").read_text()
    out = io.StringIO()
    assert verify.main(str(run), out=out) == 0, out.getvalue()


_CHECKS = MS_PROLOGUE + r'''
import json
import numpy as np
from mpi4py import MPI
from harness import communication as reference, workloads
from harness.frameworks.mindspore import communication, flops, models, train
world = MPI.COMM_WORLD
train.setup_devices(0, world.size)
out = {"rank": world.rank}
if world.rank == 0:
    data = workloads.Data(np.zeros((4, 8, 8, 1), np.float32), np.zeros(4, np.int64), np.zeros((2, 8, 8, 1), np.float32),
                          np.zeros(2, np.int64), 10, "zeros")
    c = flops.count_built(models.get("digits"), data)
    out["flops"] = [c.forward, c.by_operator, c.weights]
    class ImageNet:
        side, num_classes = 224, 1000
    r = flops.count_built(models.get("ic"), ImageNet)
    out["resnet50"] = [r.forward, r.by_operator, r.weights]
    # deepcam's reference model (scale 1, 16 middle blocks), built once, counted at 16 x 16 and 32 x 48
    deepcam = models.get("deepcam")
    sizes = [type("Climate", (), {"height": h, "width": w}) for h, w in ((16, 16), (32, 48))]
    model = deepcam.build_model(sizes[0])
    out["deepcam"] = [[c.forward, c.by_operator] for c in (flops.count(model, deepcam.sample(d)) for d in sizes)]
    out["deepcam"] += [flops.weights(model), sum(p.size for p in model.trainable_params())]
    # AdamW (deepcam's adam, ours): a kernel and a bias from 1, gradients 0.5 then -0.5
    import mindspore as ms
    from harness.frameworks.mindspore import optimizers
    kernel, bias = ms.Parameter(ms.Tensor(np.ones((1, 1), np.float32)), name="k"), ms.Parameter(
        ms.Tensor(np.ones(1, np.float32)), name="b")
    adamw, out["adamw"] = optimizers.AdamW([kernel, bias], lr=0.1, eps=1e-6, weight_decay=0.01), []
    for g in (0.5, -0.5):
        adamw([ms.Tensor(np.full((1, 1), g, np.float32)), ms.Tensor(np.full(1, g, np.float32))])
        out["adamw"].append([float(kernel.asnumpy()[0, 0]), float(bias.asnumpy()[0])])
# the Step's LR schedule, held by the optimizer: peak 0.5, 1 warm-up step of 3; a NaN batch in fp16
# (skipped, still counted), one finite step, then the undone warm-up of the same two steps
from harness import train as recipe
ones = workloads.Data(np.ones((2, 8, 8, 1), np.float32), np.zeros(2, np.int64), np.ones((2, 8, 8, 1), np.float32),
                      np.zeros(2, np.int64), 10, "ones")
model = train.build(workloads.get("digits"), ones, 1, 0, "fp16")
module = models.get("digits")
step = train.Step(workloads.get("digits"), module, model, recipe.Recipe(batch=1, epochs=1, base_lr=0.5,
                  warmup_epochs=1, precision="fp16"), recipe.Schedule(0.5, 1, 3), world)
x, y = module.inputs(np.ones((1, 8, 8, 1), np.float32)), module.targets(np.zeros(1, np.int64))
nan = module.inputs(np.full((1, 8, 8, 1), np.nan, np.float32))
at = lambda: [int(step.opt.global_step.asnumpy()[0]), float(step.opt.get_lr().asnumpy())]  # noqa: E731
out["lr"] = [at()]
step(nan, y)
out["lr"].append(at())
step(x, y)
out["lr"] += [at(), step.scale.value]
step.undone_warm_up(iter([(nan, y), (x, y)]), 2)
out["lr"] += [at(), step.scale.value]
# a checkpoint's state (Trainer.state: Step.snapshot, packed) put back after a step that moved it
from harness import checkpoint
before = step.snapshot()
blob = checkpoint.pack(*before)
same = lambda: all(np.array_equal(a, b) for (_, a), (_, b) in zip(before[0], step.snapshot()[0]))  # noqa: E731
step(x, y)
out["restored"] = [at(), same()]
arrays, extra = checkpoint.unpack(blob, [tuple(p.shape) for p in step.parameters()])
step.restore((list(zip([p.name for p in step.parameters()], arrays)), extra))
out["restored"] += [at(), step.scale.value, same(), step.snapshot()[1] == before[1]]
# rank r's two gradients: [r + 1, -(r + 1) / 4] and [[2 r + 0.5]]; the job's mean in FP32 and over FP16
mine = [np.array([world.rank + 1, -(world.rank + 1) / 4], np.float32), np.array([[2 * world.rank + 0.5]], np.float32)]
for precision in ("fp32", "fp16"):
    out[precision] = [a.tolist() for a in communication.average(mine, precision, world)]
# int8 against the numpy reference of the same two ranks' tensors: a ragged one and one with an inf on rank 1
ragged = [np.random.default_rng(r).normal(size=(3, 5)).astype(np.float32) for r in range(2)]
inf = [np.array([1.0, -2.0], np.float32), np.array([np.inf, 0.5], np.float32)]
got = communication.average([ragged[world.rank], inf[world.rank]], "int8", world)
want = [reference.int8_mean(ragged).reshape(3, 5), reference.int8_mean(inf)]
out["int8"] = [bool(np.array_equal(g, w, equal_nan=True)) for g, w in zip(got, want)] + [bool(np.isnan(got[1]).all())]
# fp16's loss scale: halved on a non-finite step (skipped), doubled after 2000 finite ones
scale = train.LossScale()
out["scale"] = [scale.update(False), scale.value, all(scale.update(True) for _ in range(1999)), scale.value,
                scale.update(True), scale.value, scale.good]
root = communication.broadcast([np.full(3, world.rank, np.float32)], world)
out["broadcast"] = root[0].tolist()
with open(f"result-{world.rank}.json", "w") as f:   # a file a rank: mpirun may merge two ranks' stdout lines
    json.dump(out, f)
'''


def test_digits_count_and_the_mpi_exchange_in_mindspore(ms_python, tmp_path):
    """The digits model's Table 3 count, cell by cell (harness/frameworks/mindspore/flops.py),
    by hand for 8 x 8 x 1 images and 10 classes: convolutions 2 x 9 x 1 x 8 x 8 x 32 = 36 864
    and 2 x 9 x 32 x 8 x 8 x 64 = 2 359 296; dense 2 x 1024 x 128 + 2 x 128 x 10 = 264 704;
    element-wise: biases 2048 + 4096 + 128 + 10 and ReLUs 2048 + 4096 + 128 = 12 554;
    pooling 4 x 4 x 64 = 1024; batch norm 8 x 8 x 32 = 2048; weights 320 + 128 (gamma, beta
    and the two moving statistics) + 18 496 + 131 200 + 1290 = 151 434 (TensorFlow's and
    PyTorch's figures). The exchange on 2 ranks: the mean of [1, -0.25] and [2, -0.5] is
    [1.5, -0.375], of 0.5 and 2.5 is 1.5, exact in FP32 and in FP16 too (each a sum of
    halves); int8 gives harness/communication.int8_mean's bits, NaN everywhere for a tensor
    with an inf on one rank; the broadcast gives the root's zeros. fp16's loss scale: 2^15
    halved to 16384 by a non-finite step, which is skipped; 2000 finite steps later 32768.
    deepcam's DeepLabv3+ at the reference's width and depth: PyTorch's count and weights,
    at 768 x 1152 from two small counts (below). AdamW (lr 0.1, decay 0.01, eps 1e-6; the
    kernel decays, the bias does not): step 1 m_hat 0.5, v_hat 0.25, u = 0.5 / 0.500001, the
    kernel 1 - 0.1 (u + 0.01) = 0.8990002, the bias 1 - 0.1 u = 0.9000002; step 2 m_hat
    -0.005 / 0.19, v_hat 0.25 again: 0.9033643 and 0.9052633 (torch.optim.AdamW's figures).
    The Step's LR schedule (peak 0.5, 1 warm-up step, 3 steps) read from its optimizer's
    global_step: lr_at gives 0.5, 0.5, 0.25; a NaN batch in fp16 is skipped and still counts
    (step 1, the scale halved), a finite step then takes it to step 2 (0.25); the undone
    warm-up puts both back, and so does a checkpoint's state (Trainer.state) after one more
    step (to 3: LR 0)."""
    (tmp_path / "checks.py").write_text(f"ROOT = {str(ROOT)!r}\n" + _CHECKS)
    p = _ms_mpirun(ms_python, 2, [tmp_path / "checks.py"], tmp_path)
    assert p.returncode == 0, p.stderr[-3000:]
    found = [json.loads((tmp_path / f"result-{r}.json").read_text()) for r in (0, 1)]
    assert [out["rank"] for out in found] == [0, 1]
    assert found[0]["flops"] == [2_676_490, {"convolution": 2_396_160, "depthwise": 0, "dense": 264_704,
                                             "elementwise": 12_554, "pooling": 1024, "normalization": 2048}, 151_434]
    for out in found:
        assert out["fp32"] == out["fp16"] == [[1.5, -0.375], [[1.5]]]
        assert out["broadcast"] == [0.0, 0.0, 0.0]
        assert out["int8"] == [True, True, True]      # the reference's bits; an inf: NaN on every rank
        assert out["scale"] == [False, 16384.0, True, 16384.0, True, 32768.0, 0]
        # lr_at: 0.5 (1 / 1 of the warm-up), 0.5 (cos 0), 0.25 (cos pi/2), 0 at the end
        assert out["lr"] == [[0, 0.5], [1, 0.5], [2, 0.25], 16384.0, [2, 0.25], 16384.0]
        # a step to 3 (lr_at 0 at the end) moved the weights; the checkpoint's state put step 2 back, every array
        assert out["restored"] == [[3, 0.0], False, [2, 0.25], 16384.0, True, True]
    # ResNet-50 v1.5 at 224 px: Keras' and PyTorch's count and weights (tests/test_ic.py), the
    # bottlenecks' adds and ReLUs from their records()
    assert found[0]["resnet50"] == [8_204_912_616, {"convolution": 8_174_272_512, "depthwise": 0, "dense": 4_096_000,
                                                    "elementwise": 15_129_064, "pooling": 301_056,
                                                    "normalization": 11_113_984}, 25_610_152]
    # DeepLabv3+ at the reference's width and depth: PyTorch's count of the same model at 32 x 48 and
    # its weights (harness/frameworks/pytorch/flops.count on the meta device: 56,454,720 trainable, the
    # reference's, tests/test_deepcam.py; 97,760 batch-norm statistics beside them)
    (f16, ops16), (f32, ops32), weights, trainable = found[0]["deepcam"]
    assert (f32, ops32) == (1_140_198_128, {"convolution": 1_131_475_456, "depthwise": 7_310_816, "dense": 0,
                                            "elementwise": 710_000, "pooling": 12_288, "normalization": 689_568})
    assert (weights, trainable) == (56_552_480, 56_454_720)
    # Table 3's count is affine in the pixels: every record counts elements of a map H/s x W/s (s = 1 .. 16),
    # but the pooling branch's 1 x 1 map, the constant. So these two counts give 768 x 1152's (884,736 pixels),
    # which MindSpore counts directly in 85 s here: PyTorch's and Keras' 656,150,601,728 (tests/test_deepcam.py)
    full = {op: ops16[op] + (ops32[op] - ops16[op]) * (768 * 1152 - 16 * 16) // (32 * 48 - 16 * 16) for op in ops16}
    assert full == {"convolution": 651_126_931_456, "depthwise": 4_210_735_616, "dense": 0, "elementwise": 408_665_600,
                    "pooling": 7_077_888, "normalization": 397_191_168}
    assert sum(full.values()) == 656_150_601_728 and f16 == sum(ops16.values())
    assert sum(found[0]["adamw"], []) == pytest.approx([0.8990002, 0.9000002, 0.9033643, 0.9052633], rel=2e-7)


def test_mindspores_arithmetic_is_the_references(ms_python):
    """tests/test_conformance.py again in MindSpore's venv: its int8 arithmetic and its LARS
    and LAMB held to the numpy references (the other frameworks skip there, absent), with what
    a run sets before MindSpore is imported (MS_PROLOGUE's facts.before_import)."""
    from harness.frameworks.mindspore import facts
    p = subprocess.run([str(ms_python), "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "no:xdist", "-rs",
                        str(ROOT / "tests" / "test_conformance.py")], cwd=ROOT, capture_output=True, text=True,
                       timeout=HANG, env={**os.environ, **facts.before_import(os.environ, platform.machine())})
    assert p.returncode == 0 and "10 passed, 18 skipped" in p.stdout, p.stdout[-3000:]
    assert "could not import 'mindspore'" not in p.stdout
