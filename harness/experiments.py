"""The paper's two headline experiments, read from a sweep's finished tests.

* Bagging against data parallelism (HPC AI500 V3.0, Fig. 9): at one Sys_scale = M x P,
  each bagging layout (M > 1) against the data-parallel layout (M = 1, P = Sys_scale).
* Quality against speed at a fixed scale (Fig. 7): every layout that shares a Sys_scale,
  side by side, the best VFLOPS and the shortest time to quality marked.
* The parallel mode inside a base model (Fig. 7's other axis, line 37): one layout in
  data, model, pipeline and mixed parallelism side by side, which won and why.

Pure: typed results in, strings and plain records out; no MPI, no matplotlib, no
file. The grouping lives here once, so the report's lines and the charts of
`harness/plots.py` can never disagree about which tests belong together.

Input: one `results.TestResult` per test index (the caller folds repetitions:
report.fold), of which these read index, workload, B, precision, M, P, flops and
vflops (FLOP/s), quality, quality_name, base_quality (one per base model),
time_to_quality (s, None: target not reached) and target_quality. Only tests of one
(workload, B, precision) are ever compared: a change of batch or precision changes
the work, not the layout.
"""
from __future__ import annotations

import textwrap
from dataclasses import dataclass

from harness.results import TestResult

NOT_REACHED = "not reached"


@dataclass(frozen=True)
class Group:
    """The tests of one (workload, B, precision) at one Sys_scale."""
    workload: str
    B: int                    # per-rank batch (samples)
    precision: str
    scale: int                # Sys_scale = M x P (ranks)
    tests: tuple              # TestResult, M descending, then test index

    @property
    def name(self) -> str:
        return f"{self.workload}, B {self.B}, {self.precision}"

    @property
    def layouts(self) -> list[tuple[int, int]]:
        """The distinct (M, P) of the group, in the tests' order."""
        return list(dict.fromkeys((t.M, t.P) for t in self.tests))


@dataclass(frozen=True)
class Comparison:
    """Experiment 1 at one Sys_scale: the data-parallel test and the bagging ones."""
    group: Group
    dp: TestResult            # M = 1, P = Sys_scale
    bagging: tuple            # M > 1, M descending, then test index


@dataclass(frozen=True)
class Series:
    """A scaling curve of one (workload, B, precision): bagging adds base models at a
    fixed P; data parallelism adds ranks to one model (M = 1)."""
    workload: str
    B: int                    # per-rank batch (samples)
    precision: str
    kind: str                 # "bagging" or "data parallelism"
    P: int | None             # ranks per base model of a bagging series; None for data parallelism
    tests: tuple              # Sys_scale ascending, then test index


def _setting(t: TestResult) -> tuple:
    return t.workload, t.B, t.precision


def _scale(t: TestResult) -> int:
    return t.M * t.P


def groups(tests: list[TestResult]) -> list[Group]:
    """Every (workload, B, precision, Sys_scale) of the data-parallel tests, sorted by
    those four; within a group M descending (most base models first), ties by test index.
    A test of a split mode (line 37) is mode_lines', not a layout of these."""
    by: dict[tuple, list[TestResult]] = {}
    for t in tests:
        if t.mode != "data":
            continue
        by.setdefault((*_setting(t), _scale(t)), []).append(t)
    return [Group(*key, tuple(sorted(ts, key=lambda t: (-t.M, t.index))))
            for key, ts in sorted(by.items(), key=lambda kv: kv[0])]


def fixed_scale_groups(tests: list[TestResult]) -> list[Group]:
    """Experiment 2's groups: those holding two or more distinct (M, P). Repetitions of
    one layout (or a layout listed twice) are not a trade-off."""
    return [g for g in groups(tests) if len(g.layouts) > 1]


def comparisons(tests: list[TestResult]) -> list[Comparison]:
    """Experiment 1's pairs: each group that holds both the data-parallel layout and at
    least one bagging layout. A layout listed twice in the sweep gives one comparison per
    data-parallel test, so that every ratio names its two tests."""
    out = []
    for g in groups(tests):
        bagging = tuple(t for t in g.tests if t.M > 1)
        out += [Comparison(g, dp, bagging) for dp in sorted((t for t in g.tests if t.M == 1),
                                                           key=lambda t: t.index) if bagging]
    return out


def scaling_series(tests: list[TestResult]) -> list[Series]:
    """The scaling curves spanning two or more Sys_scales, sorted by (workload, B,
    precision); bagging series first (P ascending), then data parallelism. A test with
    M = 1 is the first point of both its bagging series and the data-parallel one.
    Several results of one layout (repetitions) stay separate points, as they were given."""
    by: dict[tuple, list[TestResult]] = {}
    for t in (t for t in tests if t.mode == "data"):
        by.setdefault((*_setting(t), 0, t.P), []).append(t)          # 0: bagging before DP
        if t.M == 1:
            by.setdefault((*_setting(t), 1, None), []).append(t)
    out = []
    for (wl, b, prec, dp, p), ts in sorted(by.items(), key=lambda kv: (kv[0][:4], kv[0][4] or 0)):
        if len({_scale(t) for t in ts}) > 1:
            out.append(Series(wl, b, prec, "data parallelism" if dp else "bagging", p,
                              tuple(sorted(ts, key=lambda t: (_scale(t), t.index)))))
    return out


# -- text ------------------------------------------------------------------------------
def tflops(value: float) -> str:
    """FLOP/s as the report's Tflops column prints it."""
    return f"{value / 1e12:.4e}"


def vtflops(value: float) -> str:
    """FLOP/s as the report's VTflops column prints it."""
    return f"{value / 1e12:.3e}"


def seconds(value: float | None) -> str:
    return NOT_REACHED if value is None else f"{value:.2f}"


def ratio(numerator: float | None, denominator: float | None) -> str:
    """`x2.00` (`x5.18e+04` from 1000 on: a VFLOPS far below the target's penalty makes
    such ratios, and they must fit the column); n/a when either side is missing (a
    target not reached) or the denominator is not positive (a VFLOPS of 0 at quality 0)."""
    if numerator is None or denominator is None or denominator <= 0:
        return "n/a"
    r = numerator / denominator
    return f"x{r:.2f}" if r < 1000 else f"x{r:.2e}"


def mean_base(t: TestResult) -> float:
    return sum(t.base_quality) / len(t.base_quality)


def comparison_lines(tests: list[TestResult]) -> list[str]:
    """Experiment 1 (Fig. 9), one block per Sys_scale that holds both: the data-parallel
    row first (the denominator), then each bagging layout with its ratios to it.
    FLOPS and VFLOPS ratios are bagging / DP (above 1: bagging is faster); the time to
    quality ratio is bagging / DP too, so below 1 means bagging reached the target
    sooner. One direction for all three keeps the block readable without a key per
    column. Empty when no scale holds both."""
    head = (f"  {'Layout':<7} {'Test':>4} {'M':>5} {'P':>5} {'Tflops':>11} {'VTflops':>10} {'TTQ s':>11}"
            f"  {'FLOPS':>9} {'VFLOPS':>9} {'TTQ bagging/DP':>14}")
    out = []
    for c in comparisons(tests):
        dp = c.dp
        out += [f"Bagging vs data parallelism ({c.group.name}, Sys_scale {c.group.scale}):", head,
                _figures("DP", dp)]
        out += [_figures("bagging", t) + f"  {ratio(t.flops, dp.flops):>9}"
                f" {ratio(t.vflops, dp.vflops):>9}"
                f" {ratio(t.time_to_quality, dp.time_to_quality):>14}" for t in c.bagging]
        out.append("  Ratios x = bagging / DP; a TTQ ratio below 1: bagging reached the target sooner")
    return out


def _figures(kind: str, t: TestResult) -> str:
    """A comparison row's own figures, before the ratios."""
    return (f"  {kind:<7} {t.index:>4} {t.M:>5} {t.P:>5} {tflops(t.flops):>11}"
            f" {vtflops(t.vflops):>10} {seconds(t.time_to_quality):>11}")


def tradeoff_lines(tests: list[TestResult]) -> list[str]:
    """Experiment 2 (Fig. 7), one block per Sys_scale holding several layouts: what the
    choice of M (base models) against P (ranks per model) buys in quality and costs in
    speed. '*' marks the best VTflops and the shortest time to quality of the tests
    that reached the target (every tie marked); no time is marked when none reached it. Empty when no scale holds two layouts."""
    out = []
    for g in fixed_scale_groups(tests):
        qn = g.tests[0].quality_name
        best_v = max(t.vflops for t in g.tests)
        reached = [t.time_to_quality for t in g.tests if t.time_to_quality is not None]
        best_t = min(reached) if reached else None
        out += [f"Quality vs speed at Sys_scale {g.scale} ({g.name}):",
                f"  {'Test':>4} {'M':>5} {'P':>5} {'Ens ' + qn:>12} {'Base mean':>10} {'Tflops':>11}"
                f" {'VTflops':>10}  {'TTQ s':>11}"]
        for t in g.tests:
            ttq = t.time_to_quality
            out.append(f"  {t.index:>4} {t.M:>5} {t.P:>5} {t.quality:>12.4f} {mean_base(t):>10.4f}"
                       f" {tflops(t.flops):>11} {vtflops(t.vflops):>10}{'*' if t.vflops == best_v else ' '}"
                       f" {seconds(ttq):>11}{'*' if ttq is not None and ttq == best_t else ''}".rstrip())
        target = f"target {g.tests[0].target_quality:.4f}"
        out.append(f"  * best VTflops and shortest time to quality ({target})" if reached else
                   f"  * best VTflops (time to quality: no layout reached the {target})")
    return out


def mode_groups(tests: list[TestResult]) -> list[tuple]:
    """The tests of one (workload, framework, B, precision, M, P) in two or more parallel
    modes (line 37): [(key, tests in index order)], sorted by key."""
    by: dict[tuple, list[TestResult]] = {}
    for t in tests:
        by.setdefault((t.workload, t.framework, t.B, t.precision, t.M, t.P), []).append(t)
    return [(k, tuple(sorted(ts, key=lambda t: t.index))) for k, ts in sorted(by.items())
            if len({t.mode for t in ts}) > 1]


def mode_lines(tests: list[TestResult], version: tuple[int, int] = (2, 9)) -> list[str]:
    """One block per layout run in several modes: each mode's FLOPS (and its ratio to data
    parallelism's), VFLOPS, time to quality, what it sent a step (gradients averaged, or
    activations between stages and the stages' gradients) and its stages' mean idle share
    beside the theory; then the reading (`reading`; results schema `version` before 2.9:
    as it was written then, `_reading_2_8`)."""
    out = []
    for (wl, fw, b, prec, m, p), ts in mode_groups(tests):
        data = next((t for t in ts if t.mode == "data"), None)
        out += [f"Parallel modes ({wl}, {fw}, B {b}, {prec}, M {m} x P {p}):",
                f"  {'Test':>4} {'Mode':<18} {'Tflops':>11} {'vs data':>8} {'VTflops':>10} {'TTQ s':>11}"
                f" {'MB/step':>9} {'idle':>6} {'theory':>6}"]
        for t in ts:
            idle, theory = mean_idle(t.pipeline), t.pipeline and t.pipeline["bubble_theory"]
            idle = "-" if idle is None else f"{100 * idle:.0f} %"
            theory = "-" if theory is None else f"{100 * theory:.0f} %"
            out.append(f"  {t.index:>4} {t.mode:<18} {tflops(t.flops):>11}"
                       f" {ratio(t.flops, data.flops) if data else 'n/a':>8} {vtflops(t.vflops):>10}"
                       f" {seconds(t.time_to_quality):>11} {_step_megabytes(t):>9.3g} {idle:>6} {theory:>6}")
        text = reading(ts, data) if version >= (2, 9) else _reading_2_8(ts, data)
        out += [*MODE_LEGEND, *textwrap.wrap(text, 98, initial_indent="  ", subsequent_indent="  ")]
    return out


MODE_LEGEND = ("  MB/step: data, the gradients each rank's all-reduce averages (4 bytes x the model's weights,",
               "  batch-norm statistics included); a split mode, what a pipeline sent between its stages",
               "  (activations forward, their gradients back) and, mixed, its stages' gradients over their",
               "  replicas; idle: its stages' mean share of the schedule spent waiting; theory (S-1)/(m+S-1)")


def _step_megabytes(t: TestResult) -> float:
    """MB a step: data parallelism, the model's gradients (what each rank's all-reduce
    averages; 0 with P = 1); a split mode, what a pipeline sent between its stages and,
    mixed, its stages' gradients averaged over their replicas."""
    pl = t.pipeline
    if pl is None:
        return 4 * t.weights / 1e6 if t.P > 1 else 0.0
    grads = pl["gradient_bytes"] if pl["replicas"] > 1 else 0
    return (pl["bytes_between_stages"] + grads) / 1e6


def mean_idle(pipeline: dict | None) -> float | None:
    """The mean of a test's stages' measured idle shares (results.json's `pipeline`; None
    for data parallelism, or where no stage measured one)."""
    idle = [v for v in (pipeline or {}).get("idle", []) if v is not None]
    return sum(idle) / len(idle) if idle else None


def reading(ts: tuple, data: TestResult | None) -> str:
    """The block's reading, every clause one of its printed figures: which mode had the
    highest FLOPS (and the highest VFLOPS, where another mode had it: quality decides
    VFLOPS); why, from the two figures the block gives (the bytes a step against data
    parallelism's gradients; the stages' idle share, time a split mode's ranks did not
    compute, beside the bubble's theory); where they do not explain the winner, that
    they do not; and where the modes' recipes differ (batch norm over another number of
    samples), that their qualities compare recipes too."""
    best = max(ts, key=lambda t: t.flops)
    top_v = max(ts, key=lambda t: t.vflops)
    out = [f"Highest FLOPS: {best.mode} (test {best.index})"
           + (f", x{best.flops / data.flops:.2f} of data (test {data.index})." if data and best is not data else ".")]
    if top_v is not best:
        out.append(f"Highest VFLOPS: {top_v.mode} (test {top_v.index}), {vtflops(top_v.vflops)} against"
                   f" {vtflops(best.vflops)}: its quality {top_v.quality:.4f} against {best.quality:.4f}.")
    if data is None:
        out.append("No data-parallel test to read the others against.")
    else:
        out.append(_why_data(ts, data) if best is data else _why_split(best, data))
    recipes = _normalised_over(ts)
    if recipes:
        out.append(f"Not the same computation: batch norm normalises over {recipes}, so the modes' qualities"
                   " compare their recipes as well as how the work is spread.")
    return " ".join(out)


UNMEASURED = "the speed of each stage's kernels on its batch against the whole model's on B"


def _idle(t: TestResult) -> str | None:
    """A split mode's measured idle share beside the theory, in words (None: not measured)."""
    idle = mean_idle(t.pipeline)
    return None if idle is None else (f"idled {100 * idle:.0f} % of the schedule (theory"
                                      f" {100 * t.pipeline['bubble_theory']:.0f} %)")


def _why_split(best: TestResult, data: TestResult) -> str:
    """Why a split mode beat data parallelism, as far as the block's figures say: only
    sending less than the gradients is a reason; idle time is a cost, said as one."""
    mine, grads = _step_megabytes(best), _step_megabytes(data)
    idle = _idle(best)
    if mine < grads:
        return (f"Why: it sent {mine:.3g} MB a step where data parallelism averaged {grads:.3g} MB of gradients"
                + (f", though its stages {idle}." if idle else "."))
    return (f"Not from these figures: it sent more ({mine:.3g} MB a step against {grads:.3g} MB of gradients)"
            + (f" and its stages {idle}" if idle else "") + f"; the lead comes from what the block does not"
            f" measure ({UNMEASURED}).")


def _why_data(ts: tuple, data: TestResult) -> str:
    """Why data parallelism beat every split mode, as far as the block's figures say: each
    split mode's bytes a step where more than the gradients, and its stages' idle time."""
    grads, costs, unexplained = _step_megabytes(data), [], []
    for t in (t for t in ts if t is not data):
        mine, idle = _step_megabytes(t), _idle(t)
        cost = [f"sent {mine:.3g} MB" if mine >= grads else "", f"its stages {idle}" if idle else ""]
        cost = " and ".join(c for c in cost if c)
        if cost:
            costs.append(f"{t.mode} {cost}")
        else:
            unexplained.append(t.mode)
    why = f"Why: against data parallelism's {grads:.3g} MB of gradients a step, {'; '.join(costs)}." if costs else ""
    if unexplained:
        why += (f" {', '.join(unexplained)} sent less and measured no idle time, yet trained slower: not from these"
                f" figures ({UNMEASURED}).")
    return why.strip()


def _normalised_over(ts: tuple) -> str | None:
    """Where the modes' recipes differ: the samples batch norm normalises over in each
    (data: a rank's B; a split mode: its micro-batch), as '32 samples in data, 128 in
    model, ...', or None when the model has no normalisation or every mode normalises
    over as many."""
    if not any(t.flops_by_operator.get("normalization") for t in ts):
        return None
    over = {t.mode: t.B if t.pipeline is None else t.pipeline["microbatch"] for t in ts}
    if len(set(over.values())) < 2:
        return None
    return ", ".join(f"{n}{' samples' if k == 0 else ''} in {mode}" for k, (mode, n) in enumerate(over.items()))


def _reading_2_8(ts: tuple, data: TestResult | None) -> str:
    """The reading as results schema 2.8 wrote it, so that --verify re-renders such a
    report as written: which mode had the highest FLOPS, what it moved a step against data
    parallelism's gradients, how long its stages idled. (Its 'kept computing' did not
    follow from the idle share it printed beside it: schema 2.9's `reading` replaced it.)"""
    best = max(ts, key=lambda t: t.flops)
    if data is None:
        return f"Highest FLOPS: {best.mode} (no data-parallel test to read it against)."
    mine, grads = _step_megabytes(best), _step_megabytes(data)
    if best is data:
        idle = ", ".join(f"{t.mode} {100 * v:.0f} %" for t in ts if (v := mean_idle(t.pipeline)) is not None)
        return (f"Highest FLOPS: data. Why: averaging its gradients ({grads:.3g} MB a step) cost less than the split"
                f" modes lost to their stages' idle time ({idle}).")
    idle = mean_idle(best.pipeline)
    why = (f"it moved {mine:.3g} MB a step where data parallelism averaged {grads:.3g} MB of gradients"
           if mine < grads else f"though it moved more ({mine:.3g} MB a step against {grads:.3g} MB of gradients),"
           " its stages kept computing")
    return (f"Highest FLOPS: {best.mode}, x{best.flops / data.flops:.2f} of data. Why: {why}; its stages idled"
            f" {100 * (idle or 0):.0f} % of the schedule (theory {100 * best.pipeline['bubble_theory']:.0f} %).")
