"""Model Parallelism Management (HPC AI500 V3.0): the parallel mode inside a base model.

The paper's second management module "determines the degree of parallelism inside each
base model": Table 2 lets a user choose data parallelism (the default: each of a job's P
ranks holds the whole model and trains on its share of the batch, the gradients
averaged) or model, pipeline or mixed parallelism (issue 35), lines 36-37 of the input:

    data                                  P replicas of the whole model
    model                                 the model's layers cut into P consecutive stages on
                                          P ranks, one batch at a time (no overlap)
    pipeline[:MICROBATCHES][:SCHEDULE]    the same P stages, the batch cut into micro-batches
                                          on a 1F1B (default) or GPipe schedule
    mixed:STAGES[:MICROBATCHES][:SCHEDULE]  STAGES stages x P / STAGES data-parallel replicas of
                                          each stage (a pipeline per replica, each stage's
                                          gradients averaged over its replicas)

Line 14's B stays per rank in every mode: a job trains B x P samples a step whichever way
it spreads them (a pipeline of S stages takes B x S samples a step, cut into its
micro-batches), so the modes of one layout train the same recipe (the same global batch,
the same linearly scaled learning rate), but for batch norm: a data-parallel rank
normalises over its B samples, a split mode over its micro-batch, so a model with batch
norm is not one computation across the modes (the report's Parallel modes block says so).
A job's rank r is stage r // R, replica r % R of it (R = P / S replicas): a stage's
replicas are consecutive ranks, which PMAP 0 places on one node, so that a mixed job's
gradient all-reduces stay inside a node and only activations cross the network.

A framework that cuts models (PyTorch: harness/frameworks/pytorch/pipeline.py) describes
a model as a chain of Blocks (each block's Table 3 FLOPs, weights, and the elements it
hands the next); `stages` cuts the chain where the costliest stage costs least.

Pure functions (the mode's syntax, its resolution against a test's P and B, the T/V
code, the FLOP-balanced cut, the bytes between stages, the schedule's theoretical
bubble); no MPI, no framework.
"""
from __future__ import annotations

import re
from dataclasses import dataclass

# Line 37's keywords: name -> meaning; the first is the default.
KINDS = {"data": "data parallelism: each rank a replica of the whole model, gradients averaged",
         "model": "model parallelism: the layers cut into P consecutive stages, one batch at a time",
         "pipeline": "pipeline parallelism: P stages, the batch cut into micro-batches",
         "mixed": "mixed: STAGES pipeline stages x P / STAGES data-parallel replicas of each"}
SCHEDULES = {"1f1b": ("1F1B", "one forward, one backward: at most S micro-batches in flight"),
             "gpipe": ("GPipe", "every micro-batch forward, then every one backward")}   # key: (name, how)
# The numbers each split kind takes after its keyword, in order, before its optional schedule, and
# the least each may be (one stage is data parallelism: mixed's STAGES is at least 2).
NUMBERS = {"pipeline": ("MICROBATCHES",), "mixed": ("STAGES", "MICROBATCHES")}
LEAST = {"STAGES": 2, "MICROBATCHES": 1}
# Each split kind's form, as the parser's messages say it (a required number bare, an optional one bracketed)
SHAPES = {kind: kind + "".join(f":{n}" if n == "STAGES" else f"[:{n}]" for n in numbers) + f"[:{'|'.join(SCHEDULES)}]"
          for kind, numbers in NUMBERS.items()}
# Line 37's grammar, as the input file's free text (harness/dat.LINES) and the parser's message say it.
FORM = (f"data, model, {SHAPES['pipeline']} or {SHAPES['mixed']};"
        " MICROBATCHES >= 1, STAGES >= 2")
MICROBATCHES_PER_STAGE = 4     # the default m = 4 S: GPipe's rule of thumb, bubble (S - 1) / (5 S - 1) < 20 %


@dataclass(frozen=True)
class Mode:
    """Line 37's value as written (not yet resolved against a test's P and B)."""
    kind: str                 # data | model | pipeline | mixed
    stages: int = 0           # mixed: STAGES; 0: P (model, pipeline), 1 (data)
    microbatches: int = 0     # 0: the default (model: 1; pipeline, mixed: MICROBATCHES_PER_STAGE x stages)
    schedule: str = "1f1b"    # 1f1b | gpipe (model: resolved to gpipe's order with one micro-batch)
    text: str = "data"        # as written, lowercase


@dataclass(frozen=True)
class Resolved:
    """A mode resolved for a job of P ranks, each of batch B."""
    kind: str
    stages: int               # S: consecutive pieces of the model, one rank each
    replicas: int             # R = P / S: data-parallel copies of each stage
    microbatches: int         # m: micro-batches a pipeline's batch is cut into
    schedule: str
    pipeline_batch: int       # samples: B x S, what one pipeline trains a step
    microbatch: int           # samples: pipeline_batch / m


@dataclass(frozen=True)
class Block:
    """One link of a model's chain, per sample of its forward pass."""
    name: str                 # e.g. "4 Bottleneck"
    flops: int                # FLOPs, Table 3
    weights: int              # as harness/flops counts them (batch-norm statistics included)
    out_elements: int         # elements of the output it hands the next block (tuples summed)
    trainable: int            # parameters with a gradient (what data parallelism averages)


@dataclass(frozen=True)
class Stage:
    """Consecutive blocks first..last of a chain, on one rank of a pipeline."""
    first: int
    last: int                 # inclusive
    names: tuple[str, ...]
    flops: int                # FLOPs per sample, forward
    share: float              # of the whole model's forward FLOPs
    weights: int
    sends: int                # elements per sample to the next stage (0: the last stage)

    @classmethod
    def of(cls, record: dict) -> "Stage":
        """A stage as results.json records it (dataclasses.asdict; names a list)."""
        return cls(**{**record, "names": tuple(record["names"])})


def stages(chain: list[Block], count: int) -> list[Stage]:
    """`chain` cut into `count` stages balanced by FLOPs (cut)."""
    starts = cut([b.flops for b in chain], count)
    total = sum(b.flops for b in chain) or 1
    out = []
    for k, first in enumerate(starts):
        last = (starts[k + 1] if k + 1 < len(starts) else len(chain)) - 1
        blocks = chain[first:last + 1]
        flops = sum(b.flops for b in blocks)
        out.append(Stage(first, last, tuple(b.name for b in blocks), flops, flops / total,
                         sum(b.weights for b in blocks), blocks[-1].out_elements if k + 1 < len(starts) else 0))
    return out


def step_bytes(stage_list: list[Stage], r: Resolved, element_bytes: int = 4) -> int:
    """Bytes one pipeline sends between its stages a step: each cut's activations forward
    and their gradients back (2 x elements x the pipeline's batch x element_bytes)."""
    return 2 * sum(s.sends for s in stage_list) * r.pipeline_batch * element_bytes


def describe_stages(stage_list: list[Stage], r: Resolved, trainable: int) -> list[str]:
    """--check's lines on a job's stages: each stage's blocks, share of the FLOPs, weights
    and what it sends; then a step's bytes between stages against the gradient bytes data
    parallelism averages (`trainable`: the model's trainable parameters; FP32 both)."""
    lines = []
    for k, s in enumerate(stage_list):
        names = s.names[0] if len(s.names) == 1 else f"{s.names[0]} .. {s.names[-1]}"
        lines.append(f"stage {k}: blocks {s.first}-{s.last} ({names}), {s.share:.1%} of the FLOPs, {s.weights:,}"
                     f" weights" + (f", sends {s.sends:,} elements a sample" if s.sends else ""))
    lines.append(f"between stages a step: {step_bytes(stage_list, r) / 1e6:.3g} MB a pipeline (activations forward,"
                 f" their gradients back, FP32); data parallelism would average {trainable * 4 / 1e6:.3g} MB of"
                 f" gradients")
    return lines


class ModeError(ValueError):
    """A token of line 37 not of FORM, saying which part is wrong: `part` (as written; the
    whole token where its keyword is unknown), what it stands as in the token (`role`, e.g.
    "as pipeline's schedule"; "" for the whole token), and what that place takes (`expected`).
    The input's parser puts them in its `FILE:37: found ..., expected ...` (harness/dat.py)."""

    def __init__(self, part: str, role: str, expected: str):
        self.part, self.role, self.expected = part, role, expected
        super().__init__(f"found {self.found()}, expected {expected}")

    def found(self, token: str | None = None) -> str:
        """The part quoted and its role, and the token it is part of where that is more."""
        inside = f" in {token!r}" if token is not None and token != self.part else ""
        return " ".join(w for w in (repr(self.part), self.role) if w) + inside


_NUMBERISH = re.compile(r"[-+]?[0-9.]*")   # a part meant as a number (or empty), not as a schedule


def parse(token: str) -> Mode:
    """Line 37's token -> Mode; ModeError naming the part that is not of FORM. Each split kind's
    parts after its keyword fill NUMBERS[kind] in order, then the schedule (which may come
    earlier, once the required STAGES is given); a word where a number may still come, last in
    the token, is read as a schedule (pipeline:zigzag: a schedule misspelt, not MICROBATCHES)."""
    parts = token.split(":")
    kind, rest = parts[0].lower(), parts[1:]
    if kind not in KINDS:
        raise ModeError(token, "", f"a parallel mode ({FORM})")
    if kind in ("data", "model"):
        if rest:
            raise ModeError(rest[0], f"after {kind}", f"{kind} alone: data and model take no parameters")
        return Mode(kind, text=kind)
    slots, numbers, schedule = NUMBERS[kind], [], None
    for i, part in enumerate(rest):
        word = part.lower()
        if schedule is not None:
            raise ModeError(part, f"after {kind}'s schedule {schedule!r}", f"nothing after it: {SHAPES[kind]}")
        slot = slots[len(numbers)] if len(numbers) < len(slots) else None
        numberish = _NUMBERISH.fullmatch(part) is not None
        if slot is None or (slot != "STAGES" and (word in SCHEDULES or (i == len(rest) - 1 and not numberish))):
            if word not in SCHEDULES:   # a number too many says how many the kind takes
                takes = (f": {kind} takes {('one', 'two')[len(slots) - 1]} number{'s' * (len(slots) > 1)}"
                         f" ({', '.join(slots)}) before it") if slot is None and part and numberish else ""
                raise ModeError(part, f"as {kind}'s schedule", f"one of {', '.join(SCHEDULES)}{takes}")
            schedule = word
            continue
        if not part.isdigit() or int(part) < LEAST[slot]:
            why = ": one stage is data parallelism" if slot == "STAGES" and part == "1" else ""
            raise ModeError(part, f"as {kind}'s {slot}", f"an integer >= {LEAST[slot]}{why}")
        numbers.append(int(part))
    if len(numbers) < len(slots) and slots[len(numbers)] == "STAGES":
        raise ModeError(token, "without its STAGES", f"{SHAPES[kind]}, STAGES >= {LEAST['STAGES']}")
    stages = numbers.pop(0) if kind == "mixed" else 0
    return Mode(kind, stages, numbers[0] if numbers else 0, schedule or "1f1b", token.lower())


class Unfit(ValueError):
    """A mode a job of P ranks of batch B cannot take: what it would take instead (`expected`),
    `why`, and whether B plays a part (`batch`): the caller names line 14 only then."""

    def __init__(self, where: str, expected: str, why: str, batch: bool = False):
        self.expected, self.why, self.batch = expected, why, batch
        super().__init__(f"{where}: {why}; expected {expected}")


def resolve(mode: Mode, P: int, batch: int) -> Resolved:
    """The mode for a job of P ranks of batch B each; Unfit saying why it cannot be and what
    would do (the caller names the lines): a split model needs P >= 2 ranks, mixed's STAGES
    must divide P with at least 2 replicas, the micro-batches must cut B x S evenly."""
    if mode.kind == "data":
        return Resolved("data", 1, P, 1, mode.schedule, batch, batch)
    where = f"{mode.text} with P = {P}"
    if P < 2:
        raise Unfit(where, "data, or P >= 2", "one rank holds the whole model; a split model needs a rank a stage")
    stages = P if mode.kind in ("model", "pipeline") else mode.stages
    if mode.kind == "mixed" and not (2 <= stages < P and P % stages == 0):
        fits = [str(s) for s in range(2, P) if P % s == 0]
        raise Unfit(where, f"mixed:STAGES with STAGES {' or '.join(fits)}" if fits else "pipeline or model",
                    "STAGES must be at least 2 and divide P with at least two replicas of each stage"
                    " (STAGES = P is pipeline)")
    m = 1 if mode.kind == "model" else mode.microbatches or MICROBATCHES_PER_STAGE * stages
    schedule = "gpipe" if mode.kind == "model" else mode.schedule    # one micro-batch: forward, then backward
    if schedule == "1f1b" and m < stages:
        raise Unfit(where, f"MICROBATCHES >= {stages}, or gpipe", "1F1B keeps every stage busy only with at least"
                    f" as many micro-batches as stages ({m} < {stages})")
    pipeline_batch = batch * stages
    if pipeline_batch % m:
        least = stages if schedule == "1f1b" else 1
        fits = [str(k) for k in range(least, pipeline_batch + 1) if pipeline_batch % k == 0]
        raise Unfit(f"{where}, B = {batch}", f"MICROBATCHES one of {', '.join(fits)}",   # B x S itself always fits
                    f"a pipeline of {stages} stages trains B x {stages} = {pipeline_batch} samples a step, which {m}"
                    " micro-batches do not cut evenly", batch=True)
    return Resolved(mode.kind, stages, P // stages, m, schedule, pipeline_batch, pipeline_batch // m)


def code(mode: Mode, P: int, batch: int) -> str:
    """The mode's field of the T/V code: '' for data (the codes of every run before the
    parallel-mode lines read as they did), MP for model, PP<m> (1F1B) or GP<m> (GPipe) for a
    pipeline of m micro-batches, <S>S before it for mixed: e.g. MP, PP8, GP8, 2SPP8. The
    micro-batches are the resolved ones where the mode resolves, else as written."""
    if mode.kind in ("data", "model"):
        return {"data": "", "model": "MP"}[mode.kind]
    try:
        m = resolve(mode, P, batch).microbatches
    except ValueError:
        m = mode.microbatches
    pipe = f"{'GP' if mode.schedule == 'gpipe' else 'PP'}{m or ''}"
    return pipe if mode.kind == "pipeline" else f"{mode.stages}S{pipe}"


def describe(r: Resolved) -> str:
    """One line on how a job trains in this mode, for --check and the report."""
    if r.kind == "data":
        return "data parallelism"
    out = f"{r.stages} stages"
    if r.replicas > 1:
        out += f" x {r.replicas} replicas"
    if r.kind == "model":
        return out + f", one batch of {r.pipeline_batch} at a time"
    return (out + f", {r.microbatches} micro-batches of {r.microbatch} on {SCHEDULES[r.schedule][0]}"
            f" (bubble {bubble(r.stages, r.microbatches):.0%} in theory)")


def summary(r: Resolved, ranks: list[dict], root: dict) -> dict:
    """results.json's `pipeline` of a test of a split mode: the mode resolved; each stage's
    measured idle share (the mean over its ranks, every job and replica, of 1 - its
    compute seconds / its schedule's seconds: the bubble plus the waits for its neighbours)
    beside the schedule's theory; the cut (the job root's: the same on every rank); the
    bytes a pipeline sends between its stages a step against the gradient bytes data
    parallelism would average. `ranks`: each training rank's {"stage", "busy", "seconds"};
    `root`: {"cut", "trainable"} (a job root's)."""
    idle = []
    for k in range(r.stages):
        mine = [1.0 - q["busy"] / q["seconds"] for q in ranks if q["stage"] == k and q["seconds"] > 0]
        idle.append(sum(mine) / len(mine) if mine else None)
    cut_ = [Stage.of(c) for c in root["cut"]]
    return {"stages": r.stages, "replicas": r.replicas, "microbatches": r.microbatches, "schedule": r.schedule,
            "microbatch": r.microbatch, "bubble_theory": bubble(r.stages, r.microbatches), "idle": idle,
            "cut": root["cut"], "bytes_between_stages": step_bytes(cut_, r), "gradient_bytes": 4 * root["trainable"]}


def bubble(stages: int, microbatches: int) -> float:
    """The share of a step each stage idles on a GPipe or 1F1B schedule of equal stages:
    (S - 1) / (m + S - 1) (GPipe, Huang et al. 2019; 1F1B has the same bubble, less memory)."""
    return (stages - 1) / (microbatches + stages - 1)


def cut(costs: list[float], stages: int) -> list[int]:
    """The first block of each stage, [0, ...], cutting a chain of blocks of `costs`
    (FLOPs) into `stages` consecutive non-empty stages so that the costliest stage costs
    least (a pipeline runs at its slowest stage's pace); of equal cuts, the earliest.
    ValueError when the chain has fewer blocks than stages."""
    n = len(costs)
    if not 1 <= stages <= n:
        raise ValueError(f"a chain of {n} blocks cannot make {stages} stages")
    prefix = [0.0]
    for c in costs:
        prefix.append(prefix[-1] + c)
    # best[k][i]: the least possible costliest stage of blocks i.. cut into k stages; first[k][i]: where its next begins
    inf = float("inf")
    best = [[inf] * (n + 1) for _ in range(stages + 1)]
    first = [[n] * (n + 1) for _ in range(stages + 1)]
    best[0][n] = 0.0
    for k in range(1, stages + 1):
        for i in range(n - k, -1, -1):
            for j in range(i + 1, n - k + 2):
                worst = max(prefix[j] - prefix[i], best[k - 1][j])
                if worst < best[k][i]:
                    best[k][i], first[k][i] = worst, j
    starts, i = [], 0
    for k in range(stages, 0, -1):
        starts.append(i)
        i = first[k][i]
    return starts
