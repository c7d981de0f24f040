"""Output: the HPL-like report, results.json, MLLOG files and charts, written whole or not at all.

Text rendering is pure (strings from the typed results, harness/results.py); `Output` is world
rank 0's writer, and every file goes through `files.atomic_write`, so a crash at any
moment leaves the previous complete file. After each finished test the report and
results.json are rewritten: the finished tests survive whatever happens next.
"""
from __future__ import annotations

import os
import sys
import textwrap
import threading
import time
from collections import Counter
from dataclasses import replace

from harness import (experiments, files, flops, frameworks, heartbeat, metrics, mllog, parallelism, results, telemetry,
                     topology, train, tune)

RULE = "=" * 80
THIN = "-" * 80

LEGEND = """\
An explanation of the input/output parameters follows:
T/V     : Encoded variant ({tv})
WL      : Workload
M       : Base models in the ensemble (bagging jobs)
P       : Ranks per base model (P_degree)
B       : Per-rank batch size
Time    : Training seconds, max over all ranks of all jobs (barrier to last step, evaluations excluded)
Tflops  : FLOPS, analytic, forward + backward, all base models (Eq. 6)
VTflops : Valid FLOPS = FLOPS * (achieved/target)^n, for an error (MAE) * (target/achieved)^n (Eq. 7-8)
Quality : Ensemble quality on the validation set, at the last evaluation"""

TV_WIDTH = 15   # the T/V column at least; from results schema 2.9 as wide as the test's code (split modes')


def tv_width(t: results.TestResult, schema: str) -> int:
    """The T/V column of a test's rows: 15, or from schema 2.9 on the code's length where
    longer (a split mode's code, e.g. PBFC16MRPT2SGP16, pushed the other columns right)."""
    return max(TV_WIDTH, len(t.tv)) if results.minor(schema) >= (2, 9) else TV_WIDTH


def result_header(width: int = TV_WIDTH) -> str:
    return (f"{'T/V':<{width}} {'WL':<8} {'M':>4} {'P':>4} {'B':>5} {'Time':>12} {'Tflops':>12} {'VTflops':>11}"
            f" {'Quality':>9}")


def header(version: str, tv_legend: str, params: list[str], conventions: list[str]) -> str:
    lines = [RULE, f"HPC AI500 V3.0  --  bagging-based scalable HPC AI benchmark  --  hpcai500 {version}",
             RULE, LEGEND.format(tv=tv_legend), "",
             "The following parameter values will be used:", "", *params, THIN,
             *[f"- {c}" for c in conventions], RULE]
    return "\n".join(lines) + "\n"


def test_line(t: results.TestResult, repetitions: int, invocations: int) -> str:
    """A test block's first line (results schema 2.9 on): the test's number, by which the
    skipped lines, the Repeats line and the Parallel modes block name it, and what the
    result row does not say: the framework (line 35), the mode where not data (line 37),
    the repetition, and the earlier invocation that timed it in a resumed run."""
    parts = [t.framework + ("" if t.mode == "data" else f", {t.mode}")]
    if repetitions > 1:
        parts.append(f"repetition {t.repetition + 1} of {repetitions}")
    if t.invocation < invocations - 1:
        parts.append(f"timed by invocation {t.invocation + 1} of {invocations} (before --resume), as recorded then")
    if t.trial:   # a tuning run's (--tune): its stage and length
        parts.append(f"tuning trial, {t.trial['stage']}, {t.trial['epochs']} of {t.epochs} epochs"
                     if t.trial["epochs"] != t.epochs else f"tuning trial, {t.trial['stage']}, {t.epochs} epochs")
    return f"Test {t.index} : " + " ; ".join(parts)


def row(t: results.TestResult, repetitions: int = 1, invocations: int = 1, schema: str = results.SCHEMA) -> str:
    """One test's result block, like HPL's result line and residual check, as results
    schema `schema` wrote it. `repetitions`: line 27's; `invocations`: the run's
    invocations (1 + its resumes)."""
    w = tv_width(t, schema)
    q = t.quality
    base = t.base_quality
    mean_base = sum(base) / len(base)
    higher = t.higher_is_better
    # "+x pts" of a percentage; an error (lower is better) in its own units, signed so + is better too
    gain = metrics.gain(q, mean_base, higher)
    gain = f"ensemble {100 * gain:+.1f} pts" if higher else f"ensemble {gain:+.4f} better (lower is better)"
    verdict = "PASSED" if t.consistency["passed"] else "FAILED"
    lines = [
        *([test_line(t, repetitions, invocations)] if results.minor(schema) >= (2, 9) else []),
        result_header(w), THIN,
        f"{t.tv:<{w}} {t.workload:<8} {t.M:>4} {t.P:>4} {t.B:>5} "
        f"{t.train_seconds:>12.2f} {t.flops / 1e12:>12.4e} {t.vflops / 1e12:>11.3e} {q:>9.4f}",
        f"Base models : {t.quality_name} min {min(base):.4f}  mean {mean_base:.4f}  max {max(base):.4f} ; {gain}",
        f"Quality     : target {t.target_quality:.4f}, n {t.penalty_n:g}, penalty {t.penalty:.4f} ;"
        f" {t.aggregation} of {t.M - len(t.jobs_lost)} model(s) on {t.val_samples} samples",
        *([losses_line(t, results.minor(schema))] if t.losses or t.jobs_lost else []),
        *([world_line(t)] if t.launch_ranks is not None and results.minor(schema) >= LOSS_COSTS else []),
        *([resumed_line(t)] if t.resumed else []),
        f"Work        : {t.samples_trained} samples trained, {t.total_flops:.4e} FLOPs ;"
        f" resample {t.sampler_seconds:.2f} s",
        f"Solution    : time to solution {t.time_to_solution:.2f} s = staging "
        f"{(t.staging or {}).get('seconds', 0.0):.2f} + wall {t.evaluations[-1]['seconds']:.2f} s to the last"
        f" evaluation (training {t.train_seconds:.2f} s, evaluations {t.eval_seconds:.2f} s"
        + (f", checkpoints {t.checkpoints['seconds']:.2f} s)" if t.checkpoints and t.checkpoints["written"] else ")"),
        ttq_line(t),
        division_line(t),
        *([staging_line(t)] if t.staging else []),
        *([checkpoints_line(t)] if t.checkpoints else []),
        *([f"Utilisation : {t.utilisation['gemm']:.3f} of the GEMM roofline,"
            f" {t.utilisation['conv']:.3f} of the CONV roofline"
            + (f", {t.utilisation['peak']:.3f} of the theoretical peak" if t.utilisation["peak"] else "")]
          if t.utilisation else []),
        telemetry_line(t),
        *([exchange_line(t)] if t.exchange else []),
        *(pipeline_lines(t) if t.pipeline else []),
        *[f"Warning     : {w}" for w in t.warnings],
        THIN,
        f"Replica consistency = {t.consistency['max_diff']:.8e} ...... {verdict}",
        RULE,
    ]
    return "\n".join(lines) + "\n"


def earlier_losses(previous: results.Record) -> list[dict]:
    """The losses of a run's invocations so far (fault_tolerance.losses), each marked with the
    invocation that had it: 0 the first, k after the k-th --resume (as TestResult.invocation)."""
    k = len(previous.resumed)
    return [{**x, "invocation": x.get("invocation", k)} for x in previous.fault_losses]


LOSS_COSTS = (2, 18)   # from this results schema on, the report says what faults cost (losses_line, world_line, footer)


def losses_line(t: results.TestResult, version: tuple[int, int] = results.minor(results.SCHEMA)) -> str:
    """Ranks lost during the test (harness/elastic.py), the base models they cost, and (from
    results schema 2.18, `version`) what that cost the test's figures."""
    kept = t.M - len(t.jobs_lost)
    where = "; ".join(f"{'rank' if len(x['ranks']) == 1 else 'ranks'} {', '.join(map(str, x['ranks']))}"
                      f" on {', '.join(x['hosts']) or '?'} found lost at {x['phase']}" for x in t.losses)
    again = "; ".join(f"job {r['job']} trained again in wave {r['wave']} on rank(s) {topology.ranges(r['ranks'])}"
                      for r in t.retrained)
    cost = (f"job(s) {', '.join(map(str, t.jobs_lost))} dropped: every figure is the {kept} left's"
            if t.jobs_lost else "" if again else "no base model lost: the losses came after the last evaluation")
    parts = (again, cost, fault_cost(t) if version >= LOSS_COSTS else "")
    return f"Losses      : {kept} of {t.M} base models trained ; {where}" + "".join(f" ; {x}" for x in parts if x)


def fault_cost(t: results.TestResult) -> str:
    """What the test's faults cost its figures: under retrain the waves' share of the time to
    solution (the wall from the first pass's last evaluation to the last wave's), under drop
    that Time is the survivors' alone. "" where no base model was lost."""
    if t.retrained:
        first = max(p["seconds"] for p in t.evaluations if not p.get("wave"))
        waves = t.evaluations[-1]["seconds"] - first
        return (f"the retraining waves took {waves:.2f} s of the time to solution {t.time_to_solution:.2f} s"
                f" ({t.time_to_solution - waves:.2f} s without them), Time {t.train_seconds:.2f} s sums every pass")
    if t.jobs_lost:
        return ("Time is the survivors' alone: a fault-free run's is not comparable, and can be longer where the lost"
                " ranks shared cores with them (theirs from the loss on)")
    return ""


def world_line(t: results.TestResult) -> str:
    """A test laid out on the world that ranks lost before it left (results schema 2.18 on)."""
    return (f"World       : the {len(t.launch_ranks)} rank(s) left after ranks were lost before this test (launch"
            f" ranks {topology.ranges(t.launch_ranks)}): laid out anew on them (--on-fault)")


def ttq_line(t: results.TestResult) -> str:
    """Time to quality: when the ensemble first reached the target (line 25), or not."""
    ev, every = t.evaluations, t.eval_every
    how = (f"{len(ev)} evaluation{'s' if len(ev) > 1 else ''}, "
           + (_every(every) if every else "at the end only")
           + (", stop at target" if t.stop_at_target else ""))
    if t.time_to_quality is None:
        best = next(p for p in ev if p["quality"] == metrics.best([p["quality"] for p in ev],
                                                                  t.higher_is_better))
        return (f"Time to Q   : not reached (best {best['quality']:.4f} after epoch {best['epoch']} of"
                f" {t.epochs_trained}{_of_wave(best)}) ; {how}")
    reached = next((p for p in ev if p["seconds"] == t.time_to_quality), {})
    return (f"Time to Q   : {t.time_to_quality:.2f} s, epoch {t.epochs_to_quality} of {t.epochs}{_of_wave(reached)}"
            f" (training and evaluations, staging apart) ; {how}")


def _of_wave(point: dict) -> str:
    """An evaluation of a wave of --on-fault retrain says so: its epochs count from 1 again."""
    return f" of retraining wave {point['wave']}" if point.get("wave") else ""


def _every(k: int) -> str:
    return "every epoch" if k == 1 else f"every {k} epochs"


def repeats_block(t: results.TestResult, s: metrics.Repeats, schema: str = results.SCHEMA) -> str:
    """The summary of a test's repetitions, after its last one."""
    how = (f"olympic: fastest and slowest by {s.ordered_by} dropped" if s.kept < s.runs else "all runs")
    lines = [f"{t.tv:<{tv_width(t, schema)}} {t.workload:<8} {t.M:>4} {t.P:>4} {t.B:>5} {'(summary)':>12}"
             f" {s.flops / 1e12:>12.4e} {s.vflops / 1e12:>11.3e} {s.quality:>9.4f}",
             f"Repeats     : test {s.index}, {s.runs} runs (seeds differ), {how} ({s.kept} runs) ;"
             f" CV of FLOPS {100 * s.cv_flops:.1f} %, of quality {100 * s.cv_quality:.1f} %",
             (f"Time to Q   : {s.time_to_quality:.2f} s (olympic by time to quality) ; CV of epochs to quality"
              f" {100 * s.cv_epochs_to_quality:.1f} %" if s.time_to_quality is not None else
              f"Time to Q   : reached in {s.reached} of {s.runs} runs: no mean"),
             "Summary     : Tflops = the kept runs' FLOPs / their training time; VTflops from it and their"
             " mean quality (Eq. 7-8)", division_line(t), RULE]
    return "\n".join(lines) + "\n"


def division_line(t: results.TestResult) -> str:
    if t.division == "closed":
        return "Division    : closed (a ranking result: harness/division.py)"
    return "Division    : open, not a ranking result: " + "; ".join(t.open_reasons)


def staging_line(t: results.TestResult) -> str:
    st = t.staging
    return (f"Staging     : {st['copies']} {'copy' if st['copies'] == 1 else 'copies'} (one per node),"
            f" {st['samples']} samples, {st['bytes'] / 2**20:.1f} MiB, {st['seconds']:.2f} s")


def resumed_line(t: results.TestResult) -> str:
    """What an interruption cost a test that went on from its base models' checkpoints."""
    r = t.resumed
    return (f"Resumed     : from its base models' checkpoints after epoch {r['epoch']}, epochs 1-{r['epoch']} not"
            f" trained again ; Time holds {r['seconds_before']:.2f} s trained before them (an earlier interruption's"
            f" cost with it) and {r['lost_seconds']:.2f} s from the last one written to training again (work lost, the"
            " fault, the relaunch: in no FLOPs)")


def checkpoints_line(t: results.TestResult) -> str:
    """What the base models' checkpoints along the test cost (harness/checkpoint.py), or why
    none was written."""
    c = t.checkpoints
    if not c["written"]:
        why = "; ".join(c["refused"]) or (f"no evaluation but the last fell on their interval ({c['every']}"
                                          " evaluation(s), line 31's every K epochs)")
        return f"Checkpoints : none written: {why}; a --resume would train this test again from its start"
    every = "every evaluation" if c["every"] == 1 else f"every {c['every']} evaluations"
    return (f"Checkpoints : {c['written']} written (each base model's state after {every} but the last),"
            f" {c['bytes'] / 2**20:.1f} MiB a set ; training waited {c['each_seconds']:.3f} s each at most,"
            f" {c['seconds']:.2f} s in all = {100 * c['seconds'] / t.train_seconds:.1f} % of Time, outside it as"
            f" evaluations are ; each written behind training in {c['write_seconds']:.3f} s at most"
            + (f" ; a model wrote none: {'; '.join(c['refused'])}" if c["refused"] else ""))


def telemetry_line(t: results.TestResult) -> str:
    """What the devices did during training, from the telemetry reduced over ranks."""
    tel = t.telemetry or {}
    cpu, rss = tel.get("cpu_process_percent"), tel.get("rss_bytes")
    parts = [f"CPU {cpu['mean']:.0f} % per rank (process, 100 = 1 core)" if cpu else "CPU n/a",
             f"RSS max {rss['max_of_max'] / 2**30:.2f} GiB" if rss else "RSS n/a"]
    gpu = tel.get("gpu_util_percent")
    parts.append(f"GPU util {gpu['mean']:.0f} %" if gpu else "GPU n/a (no NVIDIA driver)")
    if tel.get("power_watts_total"):
        parts.append(f"power {tel['power_watts_total']:.0f} W")
    if t.vflops_per_watt:
        parts.append(f"{t.vflops_per_watt / 1e9:.3f} VGflops/W (GPU boards, timed window)")
    if t.other_load:
        parts.append(other_load_text(t.other_load))
    return "Telemetry   : " + " ; ".join(parts)


def other_load_text(machines: list[dict]) -> str:
    """The cores other processes kept busy in the timed span: the machine's figure, or
    the most loaded of several and their mean (a thousand nodes stay one phrase)."""
    top = max(machines, key=lambda m: m["other_cores"])
    where = ", ".join(top["hosts"])
    if len(machines) == 1:
        return f"other processes {top['other_cores']:.2f} cores ({where})"
    mean = sum(m["other_cores"] for m in machines) / len(machines)
    return f"other processes max {top['other_cores']:.2f} cores ({where}), mean {mean:.2f} over {len(machines)} machines"


def skipped_line(index: int, reason: str) -> str:
    return f"Test {index} skipped: {reason}"


def skipped_entry(entry: dict, repetitions: int) -> str:
    """The report's line for results.Record.skipped's `entry`: a test left out during the
    sweep (its `repetition`, harness/elastic.py) names the repetition where line 27 repeats."""
    rep = entry.get("repetition")
    return skipped_line(entry["index"], entry["reason"] + (f" (repetition {rep + 1})" if rep is not None and
                                                           repetitions > 1 else "")) + "\n"


def footer(tests: list[results.TestResult], skipped: list[dict], summary: list[str],
           interrupted: bool = False, fault_losses: list[dict] = (), schema: str = results.SCHEMA) -> str:
    """The counts, then `summary` (summary_lines: scaling and the paper's experiments).
    `skipped`: results.Record.skipped; each counted under its cause, a line a cause
    (results.SKIP_CAUSES; "ranks" always, as every report has said it; a record of schema
    2.7 or before has no cause: then every skip was a layout larger than the run).
    From results schema 2.18 (`schema`) a run that lost ranks (`fault_losses`: its
    fault_tolerance.losses) counts them, and the base models trained again and dropped."""
    passed = sum(t.consistency["passed"] for t in tests)
    closed = sum(t.division == "closed" for t in tests)
    causes = Counter(s.get("cause", "ranks") for s in skipped)
    lost = heartbeat.tally(list(fault_losses), tests, skipped)
    faults = ([f"         {len(lost.ranks):6d} ranks lost to faults: {lost.again} base models trained again,"
               f" {lost.dropped} dropped (see the Losses lines)."]
              if lost and results.minor(schema) >= LOSS_COSTS else [])
    lines = ["", f"Finished {len(tests):6d} tests with the following results:",
             f"         {passed:6d} tests completed and passed consistency checks,",
             f"         {len(tests) - passed:6d} tests completed and failed consistency checks,",
             *[f"         {causes[cause]:6d} tests skipped because {why}."
               for cause, why in results.SKIP_CAUSES.items() if cause == "ranks" or causes[cause]],
             *faults,
             f"         {closed:6d} tests closed (ranking results), {len(tests) - closed} open (see their Division"
             " lines).", THIN,
             *summary, "End of Tests." if not interrupted else "Tests interrupted.", RULE]
    return "\n".join(lines) + "\n"


def scaling_lines(tests: list[results.TestResult], weak_scaling, mark_short: bool = True,
                  name_framework: bool = True) -> list[str]:
    """Bagging weak scaling: one line per (workload, framework, B, precision, P, mode) group whose tests
    span several M (so that data parallelism, a change of P, is never mixed in); marked
    when a test of the group trained for less than metrics.SHORT_SPAN (mark_short=False:
    as reports of results schema 2.2 and before wrote it). The framework is named on every
    line (name_framework=False: all but the default framework, as schema 2.8 and before wrote them)."""
    groups: dict[tuple, list[results.TestResult]] = {}
    for t in tests:
        groups.setdefault((t.workload, t.framework, t.B, t.precision, t.P, t.mode), []).append(t)
    out = []
    for (wl, fw, b, prec, p, mode), ts in groups.items():
        s = weak_scaling([(t.M * t.P, t.flops) for t in ts])
        if s:
            short = mark_short and any(t.train_seconds < metrics.SHORT_SPAN for t in ts)
            named = name_framework or fw != frameworks.DEFAULT
            out.append(f"Scaling ({wl}{', ' + fw if named else ''}, B {b}, {prec}, P {p}"
                       f"{'' if mode == 'data' else ', ' + mode}): Sys_scale {s.scale_from} -> {s.scale_to} :"
                       f" FLOPS x{s.speedup:.2f}, efficiency {s.efficiency:.2f}"
                       + (f" (timed spans under {metrics.SHORT_SPAN:g} s: indicative)" if short else ""))
    return out


def fold(tests: list[results.TestResult], summaries: list[metrics.Repeats]) -> list[results.TestResult]:
    """One result per test index for the sweep-wide comparisons: a repeated test's first
    run with the figures of its repetition summary (FLOPS, VFLOPS, quality, time to
    quality) and the base models of all its runs."""
    runs: dict[int, list[results.TestResult]] = {}
    for t in tests:
        runs.setdefault(t.index, []).append(t)
    by_index = {s.index: s for s in summaries}
    out = []
    for index, rs in runs.items():
        s = by_index.get(index)
        out.append(rs[0] if not s else replace(
            rs[0], flops=s.flops, vflops=s.vflops, quality=s.quality, time_to_quality=s.time_to_quality,
            base_quality=[q for r in rs for q in r.base_quality]))
    return out


def summary_lines(tests: list[results.TestResult], summaries: list[metrics.Repeats],
                  schema: str = results.SCHEMA) -> list[str]:
    """The lines after the footer's counts: bagging weak scaling, then the paper's two
    experiments (harness/experiments.py: bagging against data parallelism, quality
    against speed at a fixed scale) and the parallel modes, on the tests folded over
    repetitions; as results schema `schema` wrote them."""
    folded, version = fold(tests, summaries), results.minor(schema)
    return (scaling_lines(tests, metrics.weak_scaling, version >= (2, 3), version >= (2, 9))
            + experiments.comparison_lines(folded) + experiments.tradeoff_lines(folded)
            + experiments.mode_lines(folded, version))


def summarize(paths: list[str]) -> str:
    """The result rows of earlier runs side by side, one table, read from results.json.
    `paths`: run folders, or results directories (line 5: every run in them, oldest
    first, as --status takes one: heartbeat.run_folders). The T/V and WL columns are as
    wide as the longest entry (a split mode's T/V code is 16 characters)."""
    runs = [(d, results.load_run(d)) for p in paths for d in heartbeat.run_folders(p)]
    tests = [t for _, res in runs for t in res.tests]
    tv, wl = max([10, *(len(t.tv) for t in tests)]), max([7, *(len(t.workload) for t in tests)])
    m = max([4, *(len(models(t)) for t in tests)])
    head = (f"{'run':<24} {'T/V':<{tv}} {'WL':<{wl}} {'M':>{m}} {'P':>4} {'B':>5} {'Time':>9} {'TTS':>9} {'TTQ':>9}"
            f" {'Tflops':>11} {'VTflops':>10} {'Quality':>8} Check")
    lines = [RULE, head, "M = base models in the ensemble measured ('3/4': 3 of the 4 asked for, the others lost to"
                         " faults and dropped)", "TTS = time to solution: staging + training + evaluations",
             "TTQ = time to quality: training and evaluations until the target (- = not reached)", THIN]
    for d, res in runs:
        name = os.path.basename(os.path.normpath(d))
        for t in res.tests:
            check = "PASSED" if t.consistency["passed"] else "FAILED"
            lines.append(f"{name:<24} {t.tv:<{tv}} {t.workload:<{wl}} {models(t):>{m}} {t.P:>4} {t.B:>5} "
                         f"{t.train_seconds:>9.2f} {t.time_to_solution:>9.2f} {_ttq(t):>9}"
                         f" {t.flops / 1e12:>11.4e} {t.vflops / 1e12:>10.3e} "
                         f"{t.quality:>8.4f} {check}")
        lines.append(f"{name:<24} {heartbeat.status(d, res).line()}")   # a dead run is not taken for a live one
        if res.tuning and res.tuning.get("tuned"):   # a tuning run: its pick, and where the search is
            best = tune.pick(res.tuning)
            lines.append(f"{'':<24} tuned: {tune.label(tune.choice_of(best))}; trial {best['number']} of"
                         f" {len(res.tuning['trials'])}, {best['vflops'] / 1e12:.3e} VTflops measured at the full"
                         f" length; {d}/{res.tuning['tuned']}, the search in {d}/{tune.TABLE}")
    return "\n".join(lines + [RULE]) + "\n"


def models(t: results.TestResult) -> str:
    """--summarize's M: the base models measured, 'kept/M' where faults dropped some."""
    return f"{t.M - len(t.jobs_lost)}/{t.M}" if t.jobs_lost else str(t.M)


def pipeline_lines(t: results.TestResult) -> list[str]:
    """A split mode's test (line 37): how its pipelines ran, each stage's measured idle
    share against the schedule's theory, the bytes between stages against data
    parallelism's gradients; the cut."""
    p = t.pipeline
    idle = ", ".join(f"stage {k} {'-' if v is None else f'{100 * v:.1f} %'}" for k, v in enumerate(p["idle"]))
    how = "one batch at a time" if p["microbatches"] == 1 else (
        f"{p['microbatches']} micro-batches of {p['microbatch']} on {parallelism.SCHEDULES[p['schedule']][0]}")
    cut = ", ".join(f"{k}: blocks {c['first']}-{c['last']} {100 * c['share']:.1f} %" for k, c in enumerate(p["cut"]))
    return [f"Pipeline    : {p['stages']} stages x {p['replicas']} replica(s), {how} ; idle {idle}"
            f" (theory {100 * p['bubble_theory']:.1f} %) ; {p['bytes_between_stages'] / 1e6:.3g} MB a step between"
            f" stages, gradients {p['gradient_bytes'] / 1e6:.3g} MB",
            f"Stages      : {cut} of the FLOPs"]


def exchange_line(t: results.TestResult) -> str:
    """Each job's gradient exchange and the library that carried it, jobs alike counted
    once (a thousand jobs on equal nodes are one entry)."""
    return "Exchange    : " + "; ".join(e if n == t.M else f"{e} ({n} of {t.M} jobs)"
                                        for e, n in Counter(t.exchange).items())


def _ttq(t: results.TestResult) -> str:
    return "-" if t.time_to_quality is None else f"{t.time_to_quality:.2f}"


# -- what the report states about how it measures --------------------------------------
def conventions(cfg, devices: dict, notes: list[str], placement: list[str], ceilings: dict,
                framework_lines: list[str]) -> list[str]:
    """The conventions block: every rule behind a figure of this run. `notes`: the
    workloads' FLOP notes; `placement`: the nodes (telemetry.node_lines) and what
    topology.sharing says of shared machines, cores and bindings; `framework_lines`: how
    each framework of the run trains (its package's conventions(): exchange, options)."""
    lines = [
        flops.CONVENTION,
        "Time: wall clock from a world barrier to the end of the last epoch, max over all ranks;"
        " evaluations (and the waits for other jobs in them) and resampling timed apart; a test timed"
        f" over less than {metrics.SHORT_SPAN:g} s carries a warning and marks its scaling line: on a quiet 2-core"
        " machine such FLOPS repeated within about 5 %, from 2.4 s on within 2.5 % (bench/span.py)",
        f"Warm-up: before that barrier each job runs {train.WARMUP_STEPS} training step(s) and undoes them (every"
        " variable the step writes is restored): the framework's first-step work"
        f" ({'; '.join(frameworks.facts(n).WARM_UP for n in cfg.frameworks)}) is set-up, as MLPerf's init; the"
        " timed epochs train exactly the samples counted;"
        " the feed (one for all epochs, built there too) reads, decodes and augments inside the clock",
        "FLOPS: analytic FLOPs of every sample trained by every base model / Time (Eq. 6)",
        "Evaluation: "
        + (f"after {_every(cfg.eval_every)} (line 31) and the last" if cfg.eval_every else
           "after the last epoch only (line 31)")
        + ": every job predicts the validation set with its root's model, the ensemble is reduced and scored"
        + ("; training stops at the first evaluation that reaches the target (line 32)" if cfg.stop_at_target
           else "; training runs every epoch (line 32)"),
        "Time to quality: world rank 0's wall clock from the start barrier to the end of the first evaluation"
        " whose ensemble quality reaches the target (training, evaluations, waits; staging apart)",
        "Time to solution: staging + world rank 0's wall clock from the start barrier to the end of the last"
        " evaluation, MLPerf HPC's time to train",
        "Replica consistency: max |w - w_root| over the trainable weights of every rank of each"
        f" base model; PASSED at <= {metrics.REPLICA_TOLERANCE:.0e}",
        devices_line(cfg, devices),
        "Other load: per machine, its busy cores during the timed span minus the cores the run's ranks kept busy"
        " (the Telemetry line's 'other processes'; a test warns above"
        f" {telemetry.OTHER_LOAD_LIMIT:g} a rank); CPU counters read every second and at the span's edges;"
        " a little below 0 on a quiet machine (the kernel counts a process's CPU time exactly, the machine's"
        " in clock ticks), not clamped",
        "VFLOPS per watt: valid FLOPs of the timed training (VFLOPS x Time) / the energy the GPU boards used"
        " from the start barrier to the end of training, the evaluations along the way (line 31) included"
        " (NVML's counter, else its sampled power); CPUs, memory and network are not counted",
        *framework_lines, *run_lines(cfg), *notes, *placement]
    for c in ceilings.values():
        lines += roofline_lines(c)
    return lines


def devices_line(cfg, devices: dict) -> str:
    """The Devices line: rank 0's device and threads in each framework of the run
    (`devices`: name -> its setup_devices record), said once where they agree (as every
    run of one framework said them) and by framework where they differ (a GPU framework
    beside MindSpore's CPU build, from results schema 2.19), and where the feed runs."""
    def each(say) -> str:
        said = {n: say(devices[n]) for n in cfg.frameworks}
        if len(set(said.values())) == 1:
            return said[cfg.frameworks[0]]
        return ", ".join(f"{frameworks.facts(n).TITLE} {text}" for n, text in said.items())
    threads = each(lambda d: f"{d['threads']} intra-op and {d['inter_op']} inter-op")
    return (f"Devices (rank 0): {each(lambda d: d['device'])}; threads per rank: {threads} for the step (cores /"
            " ranks sharing them); " + input_line(cfg, devices))


def input_line(cfg, devices: dict) -> str:
    """Where the feed runs, in each framework of the run, and on which cores: the GPU's
    clause once where every framework of the run is alike, else each framework's own."""
    def cores(name: str) -> str:
        return (", on the same cores, none set aside: on a CPU-only node it shares them with the step"
                if not devices[name]["gpus_on_node"] else ", on the cores the GPU leaves idle")
    alike = len({cores(n) for n in cfg.frameworks}) == 1
    feeds = "; ".join(frameworks.facts(f).FEED + ("" if alike else cores(f)) for f in cfg.frameworks)
    return ("input (read, decode, augment: the workload's feed) runs " + feeds
            + (cores(cfg.frameworks[0]) if alike else ""))


def run_lines(cfg) -> list[str]:
    """The input's choices that mean the same in every framework: staging, repetitions (a
    framework's own: its facts' conventions)."""
    lines = []
    if cfg.staging != "none":
        lines.append(f"Staging to {cfg.staging}: one writer per node copies the union of the distinct resampled"
                     " samples of the jobs the node serves and the validation set, in the workload's format; each"
                     " job trains its own resample from the copy. Staging time = node barrier to the end of the"
                     " read-back, max over ranks, counted in the time to solution; Tflops use Time only")
    if cfg.repetitions > 1:
        lines.append(f"Repetitions: {cfg.repetitions} runs of each test with seeds {cfg.seed}..{cfg.seed + cfg.repetitions - 1};"
                     " summary = mean without the fastest and slowest run (3 or more), CV over all runs")
    return lines


def roofline_lines(c: dict) -> list[str]:
    """The conventions block's roofline lines for one precision."""
    n = sum(r is not None for r in c["per_rank"])   # a rank lost in the roofline: None (harness/driver.py)
    fw = "" if c.get("framework", frameworks.DEFAULT) == frameworks.DEFAULT else f"{c['framework']}, "
    lines = [f"Roofline ({fw}{c['precision']}, per rank, median of {n} ranks run at once): GEMM "
             f"{c['gemm_flops'] / 1e12:.4f} Tflops, CONV {c['conv_flops'] / 1e12:.4f} Tflops,"
             f" triad {c['bandwidth'] / 1e9:.1f} GB/s; first call excluded, median of repeats",
             "Utilisation: FLOPS / sum of the measured GEMM (and CONV) figures of the ranks the test used"]
    peak, source = c["peak"]["flops"], c["peak"]["source"]
    if peak:
        lines.append(f"Theoretical peak per rank ({source}): {peak / 1e12:.1f} Tflops;"
                     f" GEMM reaches {c['gemm_flops'] / peak:.2f} of it")
    else:
        lines.append(f"Theoretical peak per rank: {source} (set HPCAI500_PEAK_TFLOPS to give it)")
    return lines


# -- rank 0's writer -----------------------------------------------------------------
def tuning_block(cfg, tuning: dict) -> str:
    """The report's block of a tuning run (--tune): its table, and the tuned file or why there is none."""
    best = tune.pick(tuning)
    lines = ["", f"Tuning ({len(tuning['trials'])} trials of {tuning['planned']} planned, {tuning['spent_seconds'] / 60:.1f}"
             f" of {tuning['budget_seconds'] / 60:g} min of machine time):", *tune.table_lines(cfg, tuning["trials"]),
             *textwrap.wrap(tune.TABLE_LEGEND, 98)]
    if tuning.get("picks"):
        lines.append("Speed picks (highest FLOPS of the probes): " + tune.label(
            tune.choice_of({"choice": tuning["picks"]}), [a.field for a in tune.varied(cfg, "speed")]))
    lines.append(f"Tuned input file: {tuning['tuned']} (trial {best['number']}: VFLOPS {best['vflops'] / 1e12:.3e} T,"
                 f" measured at the full length)" if best and tuning.get("tuned") else
                 "Tuned input file: none (no finalist finished)")
    return "\n".join(lines) + "\n"


class Output:
    """The report and the results record of one invocation, on world rank 0. The
    signal thread may call `finish` while the main thread writes: one lock."""

    def __init__(self, cfg, record: results.Record, params: list[str], previous: results.Record | None = None):
        """`previous`: the results of the invocation being resumed; its finished tests
        stand as they were and the report shows them again."""
        self.cfg, self.record = cfg, record
        self.text = ""
        self.current: tuple[int, int] | None = None   # (test, repetition) under way
        self.lock = threading.RLock()
        self._emit(header(record.hpcai500, record.tv_legend, params, record.conventions))
        for s in record.skipped:
            self._emit(skipped_line(s["index"], s["reason"]) + "\n")
        # the losses of the invocations before a --resume, each marked with its invocation (0: the
        # first): kept in front of this one's (`lost`), so a resumed run keeps the record of a fault
        self.earlier_losses = earlier_losses(previous) if previous else []
        if previous:
            record.tests.extend(previous.tests)
            record.repeats.extend(previous.repeats)
            record.resumed = previous.resumed + [time.strftime("%Y-%m-%dT%H:%M:%S")]
            record.node_maps = previous.node_maps + [results.node_map(previous.environment, [], 0)]
            if self.earlier_losses and record.fault_tolerance is not None:
                record.fault_tolerance = {**record.fault_tolerance, "losses": self.earlier_losses}
            for r in record.tests:
                self._emit(row(r, cfg.repetitions, len(record.resumed) + 1))
        self._save()

    @classmethod
    def taken_over(cls, cfg, run_dir: str) -> "Output":
        """The output of a run whose world rank 0 was lost, on the rank that takes over
        (harness/driver.py): the results and the report as the lost one last wrote them
        (both rewritten whole after each test); OSError or ValueError where they cannot be read."""
        self = cls.__new__(cls)
        self.cfg, self.record = cfg, results.load_run(run_dir)
        with open(os.path.join(run_dir, "report.txt")) as f:
            self.text = f.read()
        self.current, self.lock = None, threading.RLock()
        # this invocation's own losses carry no invocation (earlier_losses marks the ones before it)
        self.earlier_losses = [x for x in self.record.fault_losses if "invocation" in x]
        return self

    def begin(self, index: int, rep: int) -> None:
        self.current = (index, rep)

    def lost(self, losses: list[dict]) -> None:
        """Every loss of ranks so far (elastic.entry), the roofline's and a lost coordinator's
        too, which no test's `losses` holds."""
        with self.lock:
            self._losses(losses)
            self._save()

    def _losses(self, losses: list[dict]) -> None:
        """Every loss of ranks so far in the record (under the lock; the caller saves)."""
        self.record.fault_tolerance = {**self.record.fault_tolerance, "losses": self.earlier_losses + losses}

    def skip(self, index: int, rep: int, reason: str, cause: str, losses: list[dict] | None = None) -> None:
        """A test (repetition `rep`) left out during the sweep: its ranks were lost
        (harness/elastic.py). Counted with the skipped tests under `cause`. `losses`: every
        loss so far (as `lost`), recorded in the same write: a signal between two writes
        (mpirun's SIGTERM after a node's death, as its ranks learn it from ULFM) left a
        test skipped for lost ranks with no rank lost on record."""
        with self.lock:
            if losses is not None:
                self._losses(losses)
            entry = {"index": index, "reason": reason, "cause": cause, "repetition": rep,
                     "after": len(self.record.tests)}   # where its line is: after that many test blocks
            self.record.skipped.append(entry)
            self._emit(skipped_entry(entry, self.cfg.repetitions))
            self._save()
            self.current = None

    def add(self, result: results.TestResult, mllogs: dict) -> None:
        """A finished test: its MLLOG files, its block in the report, both files rewritten.
        The time this takes is the record's `write_seconds` (on disk from the next rewrite:
        the next test's, or the finish's)."""
        t0 = time.perf_counter()
        with self.lock:
            result = replace(result, invocation=len(self.record.resumed))
            self.record.tests.append(result)
            self._write_mllogs(result.index, result.repetition, mllogs)
            self._emit(row(result, self.cfg.repetitions, len(self.record.resumed) + 1))
            if result.repetition == self.cfg.repetitions - 1 and result.repetition > 0:
                self._summarise_repeats(result.index)
            self._save()
            self.current = None
            self.record.write_seconds.append(time.perf_counter() - t0)

    def finish(self, interrupted: str | None = None) -> None:
        """The summary, the charts, the final results. `interrupted` says why the tests
        stopped early (a signal, an agreed error); the finished tests stand as they are."""
        rec = self.record
        with self.lock:
            if rec.status != "running":  # a signal after the normal end
                return
            rec.status = "interrupted" if interrupted else "complete"
            if interrupted:
                test, rep = self.current or (None, None)
                rec.interrupted = {"reason": interrupted, "test": test}
                if test and self.cfg.repetitions > 1:
                    rec.interrupted["repetition"] = rep
                self._emit(f"\nInterrupted: {interrupted}" +
                           (f" during test {test}; its result is lost, the finished tests' stand.\n"
                            if test else ".\n"))
            if rec.tuning is not None:
                self._emit(tuning_block(self.cfg, rec.tuning))
            self._emit(footer(rec.tests, rec.skipped, summary_lines(rec.tests, rec.repeats), bool(interrupted),
                              rec.fault_losses))
            self._save()     # the figures first: on a signal, the launcher may kill us any moment
            self._charts()
            self._save()
        print(f"hpcai500: results in {rec.run_dir}/ (report.txt, results.json)", file=sys.stderr, flush=True)

    def tuned(self, state: dict) -> None:
        """A tuning run's state (harness/tune.py) as it grows: results.json's `tuning`, rewritten."""
        with self.lock:
            self.record.tuning = {**(self.record.tuning or {}), **state}
            self._save()

    def _emit(self, text: str) -> None:
        """Append to the report; the device of lines 3-4 gets it as it grows (stdout and
        stderr at once, a file rewritten whole)."""
        self.text += text
        dev = self.cfg.device_out
        if dev in (6, 7):
            stream = sys.stdout if dev == 6 else sys.stderr
            stream.write(text)
            stream.flush()

    def _save(self) -> None:
        files.atomic_write(os.path.join(self.record.run_dir, "report.txt"), self.text)
        files.write_json(os.path.join(self.record.run_dir, "results.json"), self.record.json())
        if self.cfg.device_out not in (6, 7):
            files.atomic_write(self.cfg.output_file, self.text)

    def _summarise_repeats(self, index: int) -> None:
        runs = [r for r in self.record.tests if r.index == index]
        summary = metrics.repeats(runs)
        self.record.repeats.append(summary)
        self._emit(repeats_block(runs[0], summary))

    def _charts(self) -> None:
        from harness import plots   # matplotlib (~1 s): on rank 0, when a chart is drawn
        rec = self.record
        rec.charts = []
        if rec.tests and plots.scaling(rec.tests, os.path.join(rec.run_dir, "scaling.png")):
            rec.charts.append("scaling.png")
        if rec.tests and plots.tradeoff(fold(rec.tests, rec.repeats), os.path.join(rec.run_dir, "tradeoff.png")):
            rec.charts.append("tradeoff.png")
        for t in rec.tests:   # the ensemble's and the base models' quality against time, each test
            name = f"quality-test{t.index:03d}" + (f"-rep{t.repetition:02d}" if self.cfg.repetitions > 1 else "")
            if plots.quality_curve(t, os.path.join(rec.run_dir, name + ".png")):
                rec.charts.append(name + ".png")
        if rec.tuning and rec.tuning.get("trials") and plots.tuning(rec.tuning["trials"],
                                                                    os.path.join(rec.run_dir, tune.CHART)):
            rec.charts.append(tune.CHART)
        for prec, ceil in rec.roofline.items():
            tests = [t for t in rec.tests if frameworks.roofline_key(t.framework, t.precision) == prec]
            name = "roofline.png" if len(rec.roofline) == 1 else f"roofline-{prec.replace('/', '-')}.png"
            if tests and plots.roofline(tests, ceil, os.path.join(rec.run_dir, name)):
                rec.charts.append(name)

    def _write_mllogs(self, index: int, rep: int, mllogs: dict) -> None:
        folder = os.path.join(self.record.run_dir, "mllog")
        os.makedirs(folder, exist_ok=True)
        for job, lines in mllogs.items():
            files.atomic_write(os.path.join(folder, mllog.filename(index, rep, job)), "\n".join(lines) + "\n")
