"""The benchmark trained by PyTorch (issue 34): the shipped sweep with line 35 set to
pytorch, under a real mpirun on 1 and 4 ranks and on two simulated nodes with both job
maps, every rank started through a wrapper that makes TensorFlow, Keras and Horovod
unimportable (a node with PyTorch alone); every test PASSED, --verify passes (its MLLOG
check runs MLPerf's checker on every base model's log). A mixed sweep (both frameworks
side by side) and the option lines PyTorch refuses are tests/test_plan.py's and below."""
import io
import json

import pytest

from harness import verify
from harness.workloads import cosmoflow
from tests.conftest import (SMALL_MODELS, cluster_mpirun, dat_text, forwarded, mpirun, report_of, results, run_dir,
                            without)

pytest.importorskip("torch")

def _wrapper(folder):
    return without(folder, "tensorflow", "tf_keras", "keras", "horovod")


def _passes(folder, p, tests: int, tv="B32C32SRPT", quality: bool = True):
    """Exit 0, `tests` tests all PASSED and trained by PyTorch with T/V code `tv` (or codes,
    one a test), --verify passes; `quality`: each learnt the digits (Top-1 > 0.5, or for a
    base model of several ranks a final training loss under 0.5: chance is Top-1 0.1, loss
    ln 10 = 2.3). Such a model trains 1 / P of the steps, and batch norm's running
    statistics, which the evaluation uses, move 0.01 a step (Keras' momentum): after 5
    epochs its Top-1 measured 0.18-0.70 at final losses of 0.13 (model mode, 4 stages),
    and 0.87-0.95 after 15."""
    assert p.returncode == 0, p.stderr[-3000:]
    (run,) = [d for d in folder.iterdir() if not d.name.startswith(".")]
    report = (run / "report.txt").read_text()
    assert report.count("...... PASSED") == tests and "FAILED" not in report, report[-2000:]
    # stdout: the report as mpirun forwarded it, pieces lost at most (tests/conftest.forwarded)
    assert forwarded(p.stdout, report), (len(p.stdout), len(report), p.stdout[-500:])
    res = results(folder)
    assert len(res["tests"]) == tests
    assert res["environment"]["frameworks"] == ["pytorch"] and "tensorflow" not in res["environment"]
    assert [t["tv"] for t in res["tests"]] == ([tv] * tests if isinstance(tv, str) else list(tv))
    for t in res["tests"]:
        assert t["framework"] == "pytorch" and t["consistency"]["passed"]
        learnt = t["quality"] > 0.5 or (t["P"] > 1 and max(t["final_loss"]) < 0.5)
        assert learnt or not quality, (t["index"], t["mode"], t["quality"], t["final_loss"])
    out = io.StringIO()
    assert verify.main(str(run), out=out) == 0, out.getvalue()
    return res


@pytest.mark.parametrize("ranks", [1, 4])
def test_the_shipped_sweep_trains_in_pytorch_without_tensorflow(tmp_path, ranks):
    """1 rank: test 1 (the others skipped), trained by LAMB (harness/frameworks/pytorch/
    optimizers.py) through torch.compile (line 33's inductor); 4 ranks: the shipped
    options, M = 1, 2, 4 base models, and (issue 35) one base model of 4 ranks in the four
    parallel modes of line 37: data, model (4 stages, one batch at a time), pipeline (16
    micro-batches on 1F1B) and mixed:2 (2 stages x 2 replicas); the split modes with P = 1
    skipped. The roofline micro-kernels run in PyTorch and are the utilisation's ceiling."""
    options = {1: {"l18": "lamb", "l19": 0.01, "l33": "inductor"},
               4: {"l9": 4, "l10": "1 2 4 1", "l11": "1 1 1 4", "l36": 4, "l37": "data model pipeline mixed:2"}}[ranks]
    (tmp_path / "t.dat").write_text(dat_text(l5=tmp_path / "runs", l15=5, l35="pytorch", **options))  # 5 epochs of 10
    p = mpirun(ranks, [tmp_path / "t.dat"], tmp_path, program=_wrapper(tmp_path))
    res = _passes(tmp_path / "runs", p, {1: 1, 4: 7}[ranks], {1: ["B32C32MRIPT"], 4: ["B32C32SRPT"] * 4 + [
        "B32C32SRPTMP", "B32C32SRPTPP16", "B32C32SRPT2SPP8"]}[ranks])
    report = report_of(tmp_path / "runs")    # not stdout: mpirun's forwarding can lose bytes
    if ranks == 1:
        assert "- Compiler inductor: torch.compile of the DDP-wrapped model" in report
        assert "- Optimizer lamb in PyTorch: harness/frameworks/pytorch/optimizers.py" in report
        assert "COMPILER: torch.compile, TorchInductor" in report
    else:
        _four_modes(res, report)
    assert list(res["roofline"]) == ["pytorch/fp32"] and res["roofline"]["pytorch/fp32"]["framework"] == "pytorch"
    assert all(t["utilisation"]["gemm"] > 0 for t in res["tests"])
    assert "- PyTorch: each job's ranks are one torch.distributed process group (Gloo on CPUs" in report
    (devices,) = [ln for ln in report.splitlines() if ln.startswith("- Devices (rank 0)")]
    assert "runs in PyTorch on the rank's own threads, no DataLoader workers" in devices and "tf.data" not in devices
    assert "FRAMEWRK: pytorch" in report
    assert "Grad strides do not match" not in p.stderr      # DDP's layout contract kept (models.channels_first)


def _four_modes(res, report) -> None:
    """Line 37's four modes of one base model of 4 ranks (the sweep's last four tests):
    each split test's pipeline recorded, its cut, each stage's measured idle share (of the
    schedule's span, in [0, 1)) beside the theory (S - 1) / (m + S - 1); the same samples
    trained in every mode; the report's Parallel modes block."""
    assert len(res["skipped"]) == 9                          # P = 1 with model, pipeline, mixed:2
    assert {s["cause"] for s in res["skipped"]} == {"mode"}
    assert "     0 tests skipped because they need more ranks" in report, report[-3000:]
    assert "     9 tests skipped because their parallel mode (line 37) needs P >= 2." in report
    data, model, pipe, mixed = res["tests"][-4:]
    assert data["pipeline"] is None and data["exchange"] == ["DDP all-reduce, Gloo"]
    for t, stages, m in ((model, 4, 1), (pipe, 4, 16), (mixed, 2, 8)):
        pl = t["pipeline"]
        assert (pl["stages"], pl["microbatches"], len(pl["idle"]), len(pl["cut"])) == (stages, m, stages, stages)
        assert pl["bubble_theory"] == pytest.approx((stages - 1) / (m + stages - 1))
        assert all(0 <= idle < 1 for idle in pl["idle"]), pl
        assert t["samples_trained"] == data["samples_trained"]      # B x P a step in every mode, as many steps
    assert mixed["exchange"] == ["activations point-to-point between 2 stages, Gloo; a stage's gradients:"
                                 " all-reduce, Gloo"]
    assert "Pipeline    : 4 stages x 1 replica(s), 16 micro-batches of 8 on 1F1B ; idle stage 0" in report
    assert "- Parallel modes in PyTorch (line 37)" in report
    assert "Parallel modes (digits, pytorch, B 32, fp32, M 1 x P 4):" in report and "Highest FLOPS: " in report
    # the block's test numbers are the test blocks' (their first lines: framework and mode)
    n = data["index"]
    for k, mode in enumerate(("", ", model", ", pipeline", ", mixed:2")):
        assert f"\nTest {n + k} : pytorch{mode}\nT/V " in report


@pytest.mark.parametrize("pmap", [0, 1])
def test_the_shipped_sweep_in_pytorch_on_two_nodes(cluster, tmp_path, pmap):
    """2 simulated nodes x 2 ranks, and one base model of 4 ranks across both (its DDP
    all-reduce crosses the network; PMAP 1 deals its ranks round-robin over the nodes);
    with PMAP 0 that model also as mixed:2:2 (line 37; P = 1 with mixed skipped): a stage's
    replicas on one node, so that its gradients stay there and its activations cross.
    PMAP 1 runs that model alone: a base model of one rank is on one node at either PMAP."""
    layouts = {"l9": 4, "l10": "1 2 4 1", "l11": "1 1 1 4", "l36": 2, "l37": "data mixed:2:2"} if pmap == 0 else \
        {"l9": 1, "l10": 1, "l11": 4}
    (tmp_path / "t.dat").write_text(dat_text(l5=tmp_path / "runs", l12=pmap, l15=2, l30=0, l35="pytorch", **layouts))
    p = cluster_mpirun(cluster, "n1:2,n2:2", [tmp_path / "t.dat"], tmp_path, program=_wrapper(tmp_path))
    # 2 epochs: what learning takes is the one-node runs' to show (1 x 4 reaches ~0.5 only after 3)
    tvs = ["B32C32SRPT"] * 4 + ["B32C32SRPT2SPP2"] if pmap == 0 else ["B32C32SRPT"]
    res = _passes(tmp_path / "runs", p, len(tvs), tvs, quality=False)
    assert res["environment"]["hosts"] == ["n1", "n2"]
    assert len(res["skipped"]) == 3 * (1 - pmap)                          # P = 1 with mixed:2
    dp = next(t for t in res["tests"] if t["P"] == 4)                     # the model of 4 ranks, data parallel
    assert dp["jobs"] == [[0, 1, 2, 3] if pmap == 0 else [0, 2, 1, 3]], dp["jobs"]   # PMAP 1: round-robin
    assert dp["exchange"] == ["DDP all-reduce, Gloo"]
    if pmap == 0:
        mixed = res["tests"][4]
        assert mixed["jobs"] == dp["jobs"] and mixed["pipeline"]["replicas"] == 2
        assert mixed["exchange"] == ["activations point-to-point between 2 stages, Gloo; a stage's gradients:"
                                     " all-reduce, Gloo"]


def test_both_frameworks_side_by_side_in_one_sweep(tmp_path):
    """Line 35 `tensorflow pytorch`: each layout in each framework, adjacent; each test's
    utilisation against its own framework's micro-kernels."""
    (tmp_path / "t.dat").write_text(dat_text(l5=tmp_path / "runs", l9=1, l10=2, l11=1, l15=4, l34=2,
                                             l35="tensorflow pytorch"))
    p = mpirun(2, [tmp_path / "t.dat"], tmp_path)
    assert p.returncode == 0, p.stderr[-3000:]
    res = results(tmp_path / "runs")
    assert [(t["index"], t["framework"], t["tv"]) for t in res["tests"]] == [
        (1, "tensorflow", "B32C32SR"), (2, "pytorch", "B32C32SRPT")]
    assert sorted(res["roofline"]) == ["fp32", "pytorch/fp32"]
    assert res["environment"]["frameworks"] == ["tensorflow", "pytorch"]
    assert {"tensorflow", "horovod", "torch"} <= set(res["environment"])
    for t in res["tests"]:
        assert t["consistency"]["passed"] and t["quality"] > 0.8
        assert t["flops_by_operator"] == res["tests"][0]["flops_by_operator"]   # one architecture, one count
        assert t["weights"] == res["tests"][0]["weights"] == 151_434
    report = report_of(tmp_path / "runs")    # not stdout: mpirun's forwarding can lose bytes
    assert report.count("...... PASSED") == 2
    # which framework trained a test: its block's first line and its progress lines say so (issue 45)
    assert [ln for ln in report.splitlines() if ln.startswith("Test ")] == ["Test 1 : tensorflow", "Test 2 : pytorch"]
    assert "hpcai500: test 1/2 tensorflow M=2 P=1 B=32 : epoch 1/4" in p.stderr, p.stderr[-2000:]
    assert "hpcai500: test 2/2 pytorch M=2 P=1 B=32 : evaluation after epoch 4" in p.stderr
    (run,) = [d for d in (tmp_path / "runs").iterdir() if not d.name.startswith(".")]
    out = io.StringIO()
    assert verify.main(str(run), out=out) == 0, out.getvalue()
    assert json.loads((run / "results.json").read_text())["config"]["frameworks"] == ["tensorflow", "pytorch"]




def test_ic_cosmoflow_deepcam_and_ewa_train_in_pytorch_without_tensorflow(tmp_path, monkeypatch):
    """One mpirun of 2 ranks, TensorFlow, Keras and Horovod absent: ic, cosmoflow, deepcam and
    ewa on synthetic:16:32 (written and read without TensorFlow: TFRecords and tf.train.Example
    in plain Python, JPEGs by Pillow, HDF5), the models shrunk (SMALL_MODELS; ewa's small
    backbone below 384 px, its detections fused and scored by mAP), M = 2 base
    models of 1 rank and 1 of 2 (DDP across the ranks, its gradients exchanged in int8 through
    the DDP hook, line 21), Adam, 2 epochs: every test PASSED its replica check, --verify
    passes; the weights are the Keras twins' (Keras' count of
    the same shrunk models: tests/test_pytorch_flops.py compares the two frameworks where
    both are installed), cosmoflow's FLOPs its hand formula."""
    (tmp_path / "t.dat").write_text(dat_text(l5=tmp_path / "runs", l6=4, l7="ic cosmoflow deepcam ewa",
                                             l8="synthetic:16:32", l9=2, l10="2 1", l11="1 2", l14=2, l15=2,
                                             l18="adam", l19=0.001, l21="int8", l30=0, l35="pytorch"))
    p = mpirun(2, [tmp_path / "t.dat"], tmp_path, program=_wrapper(tmp_path), env=SMALL_MODELS)
    assert p.returncode == 0, p.stderr[-3000:]
    res = results(tmp_path / "runs")
    # which test's check said what, and by how much: a failure names its test. Counted in report.txt:
    # stdout is what mpirun forwarded, which lost a block's PASSED line once (2026-11-28, report.txt whole)
    run = run_dir(tmp_path / "runs")
    report = (run / "report.txt").read_text()
    assert report.count("...... PASSED") == 8 and "FAILED" not in report, [
        (t["workload"], t["M"], t["P"], t["consistency"]) for t in res["tests"]]
    assert forwarded(p.stdout, report), (len(p.stdout), len(report), p.stdout[-500:])
    assert "tensorflow" not in res["environment"]
    assert [(t["workload"], t["M"], t["P"]) for t in res["tests"]] == [
        (w, m, p_) for w in ("ic", "cosmoflow", "deepcam", "ewa") for m, p_ in ((2, 1), (1, 2))]
    for name, value in SMALL_MODELS.items():
        monkeypatch.setenv(name, value)
    for t in res["tests"]:
        assert t["framework"] == "pytorch" and t["consistency"]["passed"] and t["consistency"]["max_diff"] == 0.0
        assert t["weights"] == {"ic": 133_378, "cosmoflow": 90_832, "deepcam": 523_983, "ewa": 542_725}[t["workload"]]
        assert t["exchange"] == (["int8 all-gather, Gloo"] if t["P"] == 2 else ["none (P = 1)"] * 2)
        assert t["tv"] == "B32C8ARPT"     # fp32, int8 communication, Adam, ring, PyTorch
    assert res["tests"][2]["forward_flops_per_sample"] == cosmoflow.forward_flops(32)   # filters 4 .. 64
    assert "- Communication int8 in PyTorch, a DDP communication hook" in report
    out = io.StringIO()
    assert verify.main(str(run), out=out) == 0, out.getvalue()


def test_ic_cosmoflow_and_deepcam_train_cut_into_stages(tmp_path):
    """Line 37's pipeline on 2 ranks for the three chain workloads of the other split runs'
    digits (issue 35): ic's ResNet, cosmoflow's 3-D CNN and deepcam's DeepLabv3+ (its
    low-level feature carried to the decoder's stage), shrunk (SMALL_MODELS), LAMB
    (deepcam's global clipping over both stages), 2 micro-batches on GPipe, 1 epoch:
    every test PASSED, --verify passes, each pipeline recorded with 2 stages and the FLOPs
    whole (the cut splits them; the count is the model's)."""
    (tmp_path / "t.dat").write_text(dat_text(l5=tmp_path / "runs", l6=3, l7="ic cosmoflow deepcam",
                                             l8="synthetic:16:32", l9=1, l10=1, l11=2, l14=2, l15=1, l18="lamb",
                                             l19=0.001, l30=0, l35="pytorch", l37="pipeline:2:gpipe"))
    p = mpirun(2, [tmp_path / "t.dat"], tmp_path, program=_wrapper(tmp_path), env=SMALL_MODELS)
    res = _passes(tmp_path / "runs", p, 3, "B32C32MRPTGP2", quality=False)
    for t in res["tests"]:
        assert t["pipeline"]["stages"] == 2 and abs(sum(c["share"] for c in t["pipeline"]["cut"]) - 1) < 1e-9
        assert t["exchange"] == ["activations point-to-point between 2 stages, Gloo; a stage's gradients: none"]
    assert [t["workload"] for t in res["tests"]] == ["ic", "cosmoflow", "deepcam"]
