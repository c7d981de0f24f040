"""harness/frameworks/pytorch/pipeline.py and train.PipelineStep, for real: 4 ranks under
mpirun, one job's process group (Gloo), torch.distributed.pipelining. One training step
of the model cut into stages gives the weights the unsplit model gets from one step on
the job's whole batch (B x P = 16 samples) on one rank, within 1e-5 in FP32, for every
schedule: a 2-stage pipeline (mixed:2, 2 replicas of each stage, their gradients
averaged once a step) on 1F1B and GPipe, 4 stages on 1F1B and GPipe, model parallelism (4
stages, one micro-batch), and with a workload's global gradient clipping (deepcam's LAMB)
of the whole model's norm over the stages; the last stage's loss is the mean over its
pipeline's batch, and a stage's replicas stay equal. The model: convolution, ReLU, pooling, dense (no
batch norm, which sees each micro-batch alone, and no dropout, which draws).
The profile of a chain on the meta device, in-process."""
import json

import pytest

from tests.conftest import ROOT, mpirun

torch = pytest.importorskip("torch")

MODES = ("mixed:2:4", "mixed:2:4:gpipe", "mixed:2:2", "pipeline:4", "pipeline:4:gpipe", "model", "mixed:2:4|clip")
CLIP = 0.05    # "|clip": a global gradient norm clipped to this (deepcam's LAMB clips at 1), well under the step's
PROGRAM = r'''
CLIP = %r
import copy, json, sys, types
sys.path.insert(0, sys.argv[1])
from mpi4py import MPI
import torch
from torch import nn
from harness import parallelism, train
from harness.frameworks.pytorch import distributed, pipeline
from harness.frameworks.pytorch import train as pt

def build(data=None):
    return nn.Sequential(nn.Conv2d(1, 4, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2), nn.Conv2d(4, 8, 3, padding=1),
                         nn.ReLU(), nn.Flatten(), nn.Linear(8 * 4 * 4, 16), nn.ReLU(), nn.Linear(16, 10))

module = types.SimpleNamespace(build_model=build, sample=lambda data: torch.zeros(1, 1, 8, 8), chain=None, L2=0.0,
                               loss=lambda out, y: nn.functional.cross_entropy(out, y, reduction="none"))
workload = types.SimpleNamespace(MOMENTUM=0.9, OPTIMIZER_OPTIONS={})
world, P, B, LR = MPI.COMM_WORLD, 4, 4, 0.1
g = torch.Generator().manual_seed(7)
x, y = torch.randn(P * B, 1, 8, 8, generator=g), torch.randint(0, 10, (P * B,), generator=g)
out = {"rank": world.rank, "modes": {}}
with distributed.job_group(world, "gloo"):
    for case in sys.argv[2].split(","):
        mode, clip = case.split("|")[0], "|clip" in case
        workload.OPTIMIZER_OPTIONS = {"sgd": {"global_clipnorm": CLIP}} if clip else {}
        torch.manual_seed(0)
        model = build()
        start, ref = copy.deepcopy(model), copy.deepcopy(model)   # ref: the unsplit model, one step on the whole batch
        opt = torch.optim.SGD(ref.parameters(), lr=LR, momentum=0.9)
        nn.functional.cross_entropy(ref(x), y).backward()
        norm = float(torch.nn.utils.clip_grad_norm_(ref.parameters(), CLIP if clip else float("inf")))
        opt.step()
        r = parallelism.resolve(parallelism.parse(mode), P, B)
        split = pipeline.Split(module, None, r)
        recipe = train.Recipe(batch=B, epochs=1, base_lr=LR, warmup_epochs=0, mode=mode)
        step = pt.PipelineStep(workload, module, model, recipe, torch.device("cpu"), lambda n: LR, split)
        rows = slice(split.groups.replica * r.pipeline_batch, (split.groups.replica + 1) * r.pipeline_batch)
        loss = step(x[rows] if split.groups.first_stage else None, y[rows] if split.groups.last_stage else None)
        with torch.no_grad():
            want = float(nn.functional.cross_entropy(start(x[rows]), y[rows]))
        replica_diff = split.replica_diff(model)
        split.assemble(model)
        diff = max(float((a - b).abs().max()) for a, b in zip(model.parameters(), ref.parameters()))
        moved = max(float((a - b).abs().max()) for a, b in zip(model.parameters(), start.parameters()))
        out["modes"][case] = {"norm": norm, "stage": split.groups.stage, "replica": split.groups.replica, "diff": diff,
                              "moved": moved, "replica_diff": replica_diff, "want": want,
                              "loss": None if loss is None else float(loss), "stages": [s.first for s in split.stages],
                              "busy": step.busy.seconds, "seconds": step.seconds}
with open(f"{sys.argv[3]}/rank{world.rank}.json", "w") as f:   # a file a rank: mpirun interleaves long lines
    json.dump(out, f)
''' % CLIP


def test_one_step_of_a_split_model_is_the_unsplit_models_step(tmp_path):
    (tmp_path / "prog.py").write_text(PROGRAM)
    p = mpirun(4, [tmp_path / "prog.py", ROOT, ",".join(MODES), tmp_path], tmp_path, program=())
    assert p.returncode == 0, p.stderr[-3000:]
    ranks = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(4)]
    assert [r["rank"] for r in ranks] == [0, 1, 2, 3]
    for mode in MODES:
        got = [r["modes"][mode] for r in ranks]
        mixed = mode.startswith("mixed")
        if mode.endswith("|clip"):
            assert got[0]["norm"] > 4 * CLIP, got[0]          # the clip bit: the step's norm was far above it
        # job rank r is stage r // R, replica r % R (R = 2 replicas for mixed:2, else 1)
        assert [(g["stage"], g["replica"]) for g in got] == ([(0, 0), (0, 1), (1, 0), (1, 1)] if mixed else
                                                               [(0, 0), (1, 0), (2, 0), (3, 0)]), mode
        for g in got:
            assert g["moved"] > 1e-3, (mode, g)                   # the step changed the weights ...
            assert g["diff"] < 1e-5, (mode, g)                    # ... as the unsplit model's step did
            assert g["replica_diff"] < 1e-7, (mode, g)            # mixed: the average kept the replicas equal
            assert 0 < g["busy"] < g["seconds"], (mode, g)        # the stage's compute, inside the step
        last = [g for g in got if g["stage"] == (1 if mixed else 3)]
        assert all(g["loss"] == pytest.approx(g["want"], rel=1e-5) for g in last), (mode, last)
        assert all(g["loss"] is None for g in got if g not in last), mode
        # the cut of BLOCKS (below): 2 stages 5184 | 13930; 4 stages 4864 | 320 | 9344 | 4586
        assert got[0]["stages"] == ([0, 3] if mixed else [0, 1, 3, 4]), (mode, got[0]["stages"])


# The chain's Table 3 FLOPs by hand, per 8 x 8 sample: conv 2 x 9 x Cin x out + bias (out),
# ReLU 1 an element, max-pool 1 an output, dense 2 x fin x fout + bias.
BLOCKS = [("0 Conv2d", 2 * 9 * 1 * 256 + 256, 40, 256), ("1 ReLU", 256, 0, 256), ("2 MaxPool2d", 64, 0, 64),
          ("3 Conv2d", 2 * 9 * 4 * 128 + 128, 296, 128), ("4 ReLU", 128, 0, 128), ("5 Flatten", 0, 0, 128),
          ("6 Linear", 2 * 128 * 16 + 16, 2064, 16), ("7 ReLU", 16, 0, 16), ("8 Linear", 2 * 16 * 10 + 10, 170, 10)]


def test_a_chain_is_profiled_block_by_block_on_the_meta_device():
    """pipeline.blocks: each block's FLOPs, weights and output elements; 2 stages cut where
    the costlier costs least: blocks 0-2 (5184) | 3-8 (13930), not 0-3 (14528) | 4-8."""
    import types

    from torch import nn

    from harness import parallelism
    from harness.frameworks.pytorch import pipeline

    def build(data=None):
        return nn.Sequential(nn.Conv2d(1, 4, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2), nn.Conv2d(4, 8, 3, padding=1),
                             nn.ReLU(), nn.Flatten(), nn.Linear(8 * 4 * 4, 16), nn.ReLU(), nn.Linear(16, 10))
    module = types.SimpleNamespace(build_model=build, sample=lambda data: torch.zeros(1, 1, 8, 8), chain=None)
    got = pipeline.blocks(module, None)
    assert [(b.name, b.flops, b.weights, b.out_elements) for b in got] == BLOCKS
    assert [b.trainable for b in got] == [b[2] for b in BLOCKS]     # no batch norm: every weight trains
    two = parallelism.stages(got, 2)
    assert [(s.first, s.last, s.flops, s.sends) for s in two] == [(0, 2, 5184, 64), (3, 8, 13930, 0)]
    with pytest.raises(TypeError, match="not an nn.Sequential"):
        pipeline.chain(types.SimpleNamespace(chain=None), nn.Linear(2, 2))


def test_a_stage_hands_its_neighbours_dense_tensors_both_ways():
    """A channels-last stage (every 2-D model on a GPU, digits on CPUs): what it sends on,
    its output, and what it sends back, its input's gradient, are contiguous (pipelining
    receives into a buffer laid out as the gradient is, and Gloo's irecv refused a strided
    one: digits' 4-stage model mode failed so). The raw gradient is channels-last."""
    from torch import nn

    from harness.frameworks.pytorch import pipeline, train
    conv = train.channels_last(nn.Sequential(nn.Conv2d(4, 8, 3, padding=1), nn.ReLU()))
    x = torch.randn(2, 4, 6, 6, requires_grad=True)     # as a stage receives it: contiguous
    (raw,) = torch.autograd.grad(conv(x).sum(), x)      # pipelining takes the gradient so
    assert not raw.is_contiguous()
    out = pipeline.Part(*conv)(x)
    (grad,) = torch.autograd.grad(out.sum(), x)
    assert out.is_contiguous() and grad.is_contiguous() and torch.equal(grad, raw)


@pytest.mark.parametrize("workload,data,settings", [
    ("digits", {"x_train": __import__("numpy").zeros((1, 8, 8, 1), "float32"), "num_classes": 10}, {}),
    ("ic", {"num_classes": 10, "side": 32}, {"HPCAI500_IC_WIDTH": 8, "HPCAI500_IC_STAGES": (1, 1, 1, 1)}),
    ("cosmoflow", {"side": 32}, {}),
    ("deepcam", {"height": 32, "width": 48}, {"HPCAI500_DEEPCAM_WIDTH": 8, "HPCAI500_DEEPCAM_MIDDLE": 2}),
])
def test_each_split_workloads_chain_is_its_model(monkeypatch, workload, data, settings):
    """Every workload line 37 may split (facts.SPLIT): its chain of blocks composes to the
    model's forward pass (deepcam: the low-level feature carried beside the deep path to
    the join), and its blocks' FLOPs and weights sum to the whole model's Table 3 count,
    so the cut divides exactly what Eq. 6 counts."""
    import types

    from harness import settings as hs
    from harness.frameworks.pytorch import flops as tflops
    from harness.frameworks.pytorch import facts, models, pipeline
    assert workload in facts.SPLIT
    monkeypatch.setattr(hs, "value", lambda name: settings.get(name))
    module, data = models.get(workload), types.SimpleNamespace(**data)
    torch.manual_seed(0)
    model = module.build_model(data).eval()
    x = torch.randn(2, *module.sample(data).shape[1:])
    with torch.no_grad():
        y = x
        for block in pipeline.chain(module, model):
            y = block(y)
        assert torch.equal(y, model(x))
    blocks, whole = pipeline.blocks(module, data), tflops.count_built(module, data)
    assert sum(b.flops for b in blocks) == whole.forward and sum(b.weights for b in blocks) == whole.weights
    if workload == "deepcam":    # the pair (deep, low) crosses every cut from the entry flow to the join
        with torch.no_grad():
            low = model.encoder.entry(x[:1]).numel()
        assert blocks[0].out_elements == 2 * low and blocks[1].out_elements > low


def test_a_stages_chunks_are_timed_by_the_devices_clock_read_once_a_step(monkeypatch):
    """Issue 67, item 10: a GPU times a stage's chunks with CUDA events, read once a step
    (no synchronisation of the whole device around each chunk, which also waited for the
    transfers on NCCL's streams); a CPU with perf_counter, as before. A fake stage's two
    chunks on a hand clock (marks 1, 3 and 10, 14): 2 + 4 = 6 s, added only when read."""
    from harness.frameworks.pytorch import pipeline
    assert type(pipeline.clock("cuda")) is pipeline.EventClock
    assert type(pipeline.clock("cpu")) is pipeline.WallClock
    synchronized = []
    monkeypatch.setattr(torch.cuda, "synchronize", lambda *a: synchronized.append(a))
    ticks = iter([1.0, 3.0, 10.0, 14.0])

    class Hand(pipeline.WallClock):
        def mark(self):
            return next(ticks)

    stage = type("Stage", (), {"forward_one_chunk": lambda self, k: f"f{k}", "backward_one_chunk": lambda self, k: f"b{k}"})()
    busy = pipeline.Busy(stage, Hand())
    assert (stage.forward_one_chunk(0), stage.backward_one_chunk(0)) == ("f0", "b0")
    assert busy.seconds == 0.0 and len(busy.marks) == 2        # nothing read while the schedule runs
    busy.read()
    assert busy.seconds == 6.0 and busy.marks == [] and synchronized == []
