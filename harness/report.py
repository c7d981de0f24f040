"""Output: the HPL-like report, results.json, written whole or not at all.

Text rendering is pure (strings from dictionaries); writing goes through
`atomic_write`, so a crash at any moment leaves the previous complete file.
"""
from __future__ import annotations

import json
import os
import tempfile

RULE = "=" * 80
THIN = "-" * 80
TOLERANCE = 1e-6          # replica consistency: max |w - w_root| allowed

LEGEND = """\
An explanation of the input/output parameters follows:
T/V     : Encoded variant ({tv})
WL      : Workload
M       : Base models in the ensemble (bagging jobs)
P       : Ranks per base model (P_degree)
B       : Per-rank batch size
Time    : Training seconds, max over all ranks of all jobs (barrier to last step)
Tflops  : FLOPS, analytic, forward + backward, all base models (Eq. 6)
VTflops : Valid FLOPS = FLOPS * (achieved/target)^n (Eq. 7-8)
Quality : Ensemble quality on the validation set"""

HEADER = f"{'T/V':<15} {'WL':<8} {'M':>4} {'P':>4} {'B':>5} {'Time':>12} {'Tflops':>12} {'VTflops':>11} {'Quality':>9}"


def header(version: str, tv_legend: str, params: list[str], conventions: list[str]) -> str:
    lines = [RULE, f"HPC AI500 V3.0  --  bagging-based scalable HPC AI benchmark  --  hpcai500 {version}",
             RULE, LEGEND.format(tv=tv_legend), "",
             "The following parameter values will be used:", "", *params, THIN,
             *[f"- {c}" for c in conventions], RULE]
    return "\n".join(lines) + "\n"


def row(t: dict) -> str:
    """One test's result block, like HPL's result line and residual check."""
    q = t["quality"]
    base = t["base_quality"]
    mean_base = sum(base) / len(base)
    verdict = "PASSED" if t["consistency"]["passed"] else "FAILED"
    lines = [
        HEADER, THIN,
        f"{t['tv']:<15} {t['workload']:<8} {t['M']:>4} {t['P']:>4} {t['B']:>5} "
        f"{t['train_seconds']:>12.2f} {t['flops'] / 1e12:>12.4e} {t['vflops'] / 1e12:>11.3e} {q:>9.4f}",
        f"Base models : {t['quality_name']} min {min(base):.4f}  mean {mean_base:.4f}  max {max(base):.4f} ;"
        f" ensemble {100 * (q - mean_base):+.1f} pts",
        f"Quality     : target {t['target_quality']:.4f}, n {t['penalty_n']:g}, penalty {t['penalty']:.4f} ;"
        f" {t['aggregation']} of {t['M']} model(s) on {t['val_samples']} samples",
        f"Work        : {t['samples_trained']} samples trained, {t['total_flops']:.4e} FLOPs ;"
        f" eval {t['eval_seconds']:.2f} s ; resample {t['sampler_seconds']:.2f} s",
        *([staging_line(t)] if t.get("staging") else []),
        *([f"Utilisation : {t['utilisation']['gemm']:.3f} of the GEMM roofline,"
            f" {t['utilisation']['conv']:.3f} of the CONV roofline"
            + (f", {t['utilisation']['peak']:.3f} of the theoretical peak" if t["utilisation"]["peak"] else "")]
          if t.get("utilisation") else []),
        telemetry_line(t),
        *[f"Warning     : {w}" for w in t["warnings"]],
        THIN,
        f"Replica consistency = {t['consistency']['max_diff']:.8e} ...... {verdict}",
        RULE,
    ]
    return "\n".join(lines) + "\n"


def repeats_block(t: dict, s: dict) -> str:
    """The summary of a test's repetitions, after its last one."""
    how = ("olympic mean: fastest and slowest dropped" if s["kept"] < s["runs"] else "mean of all runs")
    lines = [f"{t['tv']:<15} {t['workload']:<8} {t['M']:>4} {t['P']:>4} {t['B']:>5} {'(summary)':>12}"
             f" {s['flops'] / 1e12:>12.4e} {s['vflops'] / 1e12:>11.3e} {s['quality']:>9.4f}",
             f"Repeats     : test {s['index']}, {s['runs']} runs (seeds differ), {how} ({s['kept']} runs) ;"
             f" CV of FLOPS {100 * s['cv_flops']:.1f} %, of quality {100 * s['cv_quality']:.1f} %", RULE]
    return "\n".join(lines) + "\n"


def staging_line(t: dict) -> str:
    st = t["staging"]
    return (f"Staging     : {st['copies']} {'copy' if st['copies'] == 1 else 'copies'} (one per job per node),"
            f" {st['samples']} samples, {st['bytes'] / 2**20:.1f} MiB, {st['seconds']:.2f} s ;"
            f" time to solution {t['time_to_solution']:.2f} s")


def telemetry_line(t: dict) -> str:
    """What the devices did during training, from the telemetry reduced over ranks."""
    tel = t.get("telemetry") or {}
    cpu, rss = tel.get("cpu_process_percent"), tel.get("rss_bytes")
    parts = [f"CPU {cpu['mean']:.0f} % per rank (process, 100 = 1 core)" if cpu else "CPU n/a",
             f"RSS max {rss['max_of_max'] / 2**30:.2f} GiB" if rss else "RSS n/a"]
    gpu = tel.get("gpu_util_percent")
    parts.append(f"GPU util {gpu['mean']:.0f} %" if gpu else "GPU n/a (no NVIDIA driver)")
    if tel.get("power_watts_total"):
        parts.append(f"power {tel['power_watts_total']:.0f} W")
    if t.get("vflops_per_watt"):
        parts.append(f"{t['vflops_per_watt'] / 1e9:.3f} VGflops/W")
    return "Telemetry   : " + " ; ".join(parts)


def footer(tests: list[dict], skipped: int, scaling_lines: list[str], interrupted: bool = False) -> str:
    passed = sum(t["consistency"]["passed"] for t in tests)
    lines = ["", f"Finished {len(tests):6d} tests with the following results:",
             f"         {passed:6d} tests completed and passed consistency checks,",
             f"         {len(tests) - passed:6d} tests completed and failed consistency checks,",
             f"         {skipped:6d} tests skipped because of illegal input values.", THIN,
             *scaling_lines, "End of Tests." if not interrupted else "Tests interrupted.", RULE]
    return "\n".join(lines) + "\n"


def scaling_lines(tests: list[dict], weak_scaling) -> list[str]:
    """Bagging weak scaling: one line per (workload, B, precision, P) group whose tests
    span several M (so that data parallelism, a change of P, is never mixed in)."""
    groups: dict[tuple, list[tuple[int, float]]] = {}
    for t in tests:
        groups.setdefault((t["workload"], t["B"], t["precision"], t["P"]), []).append((t["M"] * t["P"], t["flops"]))
    out = []
    for (wl, b, prec, p), pts in groups.items():
        s = weak_scaling(pts)
        if s:
            out.append(f"Scaling ({wl}, B {b}, {prec}, P {p}): Sys_scale {s.scale_from} -> {s.scale_to} :"
                       f" FLOPS x{s.speedup:.2f}, efficiency {s.efficiency:.2f}")
    return out


def summarize(run_dirs: list[str]) -> str:
    """The result rows of earlier runs side by side, one table, read from results.json."""
    head = (f"{'run':<24} {'T/V':<10} {'WL':<7} {'M':>4} {'P':>4} {'B':>5} {'Time':>9} {'TTS':>9} {'Tflops':>11}"
            f" {'VTflops':>10} {'Quality':>8} Check")
    lines = [RULE, head, "TTS = time to solution: staging + training time (= Time without staging)", THIN]
    for d in run_dirs:
        if not os.path.isdir(d):
            raise ValueError(f"{d}: not a folder; give runs/<id> folders, e.g. runs/2*")
        path = os.path.join(d, "results.json")
        try:
            with open(path) as f:
                res = json.load(f)
        except FileNotFoundError:
            raise ValueError(f"{d}: no results.json (not a runs/<id> folder?)") from None
        except json.JSONDecodeError as e:
            raise ValueError(f"{path}: not valid JSON ({e})") from None
        name = os.path.basename(os.path.normpath(d))
        if not res.get("tests"):
            lines.append(f"{name:<24} (no finished test; status {res.get('status', '?')})")
        for t in res.get("tests", []):
            check = "PASSED" if t["consistency"]["passed"] else "FAILED"
            lines.append(f"{name:<24} {t['tv']:<10} {t['workload']:<7} {t['M']:>4} {t['P']:>4} {t['B']:>5} "
                         f"{t['train_seconds']:>9.2f} {t.get('time_to_solution', t['train_seconds']):>9.2f}"
                         f" {t['flops'] / 1e12:>11.4e} {t['vflops'] / 1e12:>10.3e} "
                         f"{t['quality']:>8.4f} {check}")
    return "\n".join(lines + [RULE]) + "\n"
