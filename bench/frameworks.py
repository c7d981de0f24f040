"""The same workloads in every framework, side by side (issue 34, item 9; issue 47).

    .venv/bin/python bench/frameworks.py [--runs 2] [--cases digits,ic64,cosmoflow,deepcam,ewa]

Per case, one hpcai500.py invocation on 2 ranks with line 35 = `tensorflow pytorch`: the
same data, seed, resamples and recipe in each framework, the two tests adjacent (the
framework is the innermost sweep), M = 2 base models of 1 rank (bagging, the benchmark's
mode), SGD, 3 epochs, evaluated at the end. Per framework: FLOPS (the report's: Table 3
FLOPs x samples trained / the slowest job's training seconds), quality, rank 0's peak
resident memory (the process's, whichever framework it ran last: both tests run in one
process, so the second framework's figure includes the first's high-water mark: runs
alternate the order, `tensorflow pytorch` then `pytorch tensorflow`, and the table gives
each framework's figure from the run where it went first), the weights and the FLOPs a
training sample (which must be equal: one architecture, one count). Runs repeat RUNS
times; medians with min-max. The models are the reference's (ResNet-50 at 64 px, the
CosmoFlow CNN at 32^3, DeepLabv3+ at 64 x 96, ewa's Faster-RCNN with its ResNet-50 trunk at
64 x 96: HPCAI500_EWA_BACKBONE=resnet50, since below 384 px the small backbone is the
default), no test-only setting.

MindSpore (issue 47) cannot share TensorFlow's venv: where it builds the workload (its facts'
BUILT: digits, ic, cosmoflow, deepcam so far) each round adds a third invocation, the same input with
line 35 = `mindspore`, by MindSpore's venv (.venv-mindspore), run after the other two; its
process runs one framework, so its peak memory is always a first.
"""
import argparse
import os
import sys
import time

import common

sys.path.insert(0, common.ROOT)
from harness import frameworks  # noqa: E402 -- the registry's facts only: no framework imported

RUNS, EPOCHS = 2, 3
# case -> (workload, dataset line, per-rank batch, line 18's optimizer, line 19's LR)
CASES = {"digits": ("digits", "embedded", 32, "sgd", 0.05),
         "ic64": ("ic", "synthetic:320:64", 16, "sgd", 0.05),          # 256 training JPEGs of 64 px
         "cosmoflow": ("cosmoflow", "synthetic:80:32", 4, "sgd", 0.01),  # 64 universes of 32^3
         "deepcam": ("deepcam", "synthetic:40:64", 2, "adam", 0.001),   # 32 samples of 64 x 96
         "ewa": ("ewa", "synthetic:48:64", 2, "sgd", 0.02)}             # 38 images of 64 x 96, 16 channels
ENV = {"ewa": {"HPCAI500_EWA_BACKBONE": "resnet50"}}   # the reference's trunk at a small size (recorded)
ORDERS = (("tensorflow", "pytorch"), ("pytorch", "tensorflow"))


def run(case: str, order: tuple) -> tuple[dict, float]:
    """{framework: its test} of one invocation, and the noise gauge."""
    wl, dataset, batch, optimizer, lr = CASES[case]
    dat = common.make_dat(f"frameworks-{case}-{order[0]}", l7=wl, l8=dataset, l9=1, l10=2, l11=1, l13=1, l14=batch,
                          l15=EPOCHS, l18=optimizer, l19=lr, l30=0, l31=0, l34=2, l35=" ".join(order))
    record, load, _ = common.run_record(dat, np=2, env=ENV.get(case))
    tests = {t["framework"]: t for t in record["tests"]}
    if sorted(tests) != sorted(order):
        sys.exit(f"{case}: found tests of {sorted(tests)}, expected one each of {list(order)}")
    for t in tests.values():
        if not t["consistency"]["passed"]:
            sys.exit(f"{case}: the {t['framework']} test's replica check FAILED")
    first = order[0]
    tests[first]["first"] = True
    return tests, load


def run_mindspore(case: str) -> tuple[dict, float]:
    """MindSpore's test of the case's input (line 35 = mindspore), by its own venv."""
    wl, dataset, batch, optimizer, lr = CASES[case]
    dat = common.make_dat(f"frameworks-{case}-mindspore", l7=wl, l8=dataset, l9=1, l10=2, l11=1, l13=1, l14=batch,
                          l15=EPOCHS, l18=optimizer, l19=lr, l30=0, l31=0, l35="mindspore")
    record, load, _ = common.run_record(dat, np=2, env=ENV.get(case), python=common.MS_PY)
    (t,) = record["tests"]
    if not t["consistency"]["passed"]:
        sys.exit(f"{case}: the mindspore test's replica check FAILED")
    return {"mindspore": {**t, "first": True}}, load


def spread(xs, fmt: str) -> str:
    return f"{common.median(xs):{fmt}} ({min(xs):{fmt}}-{max(xs):{fmt}})"


def main(runs: int, cases: list[str]) -> None:
    print(f"machine: {common.machine()}; date {time.strftime('%Y-%m-%d')}")
    rows, per_run, loads = [], [], []
    for case in cases:
        ms = os.path.exists(common.MS_PY) and CASES[case][0] in frameworks.facts("mindspore").BUILT
        got = {"tensorflow": [], "pytorch": [], **({"mindspore": []} if ms else {})}
        for i in range(runs):
            tests, load = common.quietest(lambda: run(case, ORDERS[i % 2]))
            loads.append(load)
            if ms:
                more, load = common.quietest(lambda: run_mindspore(case))
                loads.append(load)
                tests = {**tests, **more}
            for fw, t in tests.items():
                got[fw].append(t)
                per_run.append([case, i + 1, fw, "first" if t.get("first") else "second", f"{t['flops'] / 1e9:.2f}",
                                f"{t['quality']:.4f}", f"{t['rank0_peak_rss_bytes'] / 2**20:.0f}",
                                f"{t['train_seconds']:.2f}", f"{load:.2f}"])
        tf_ = got["tensorflow"]
        same = all(a["weights"] == b["weights"] and a["training_flops_per_sample"] == b["training_flops_per_sample"]
                   for a, *others in zip(tf_, *[ts for fw, ts in got.items() if fw != "tensorflow"]) for b in others)
        for fw, ts in got.items():
            firsts = [t["rank0_peak_rss_bytes"] / 2**20 for t in ts if t.get("first")] or [float("nan")]
            rows.append([case, fw, spread([t["flops"] / 1e9 for t in ts], ".2f"),
                         spread([t["quality"] for t in ts], ".4f"), f"{common.median(firsts):.0f}",
                         f"{ts[0]['weights']:,}", f"{ts[0]['training_flops_per_sample'] / 1e9:.4f}",
                         "yes" if same else "NO"])
        for fw in [f for f in got if f != "tensorflow"]:
            over_tf = [o["flops"] / t["flops"] for o, t in zip(got[fw], tf_)]
            rows.append([case, f"{fw} / tensorflow", spread(over_tf, ".2f"), "", "", "", "", ""])
    print(f"\nper run (2 ranks, M = 2 base models of 1 rank, {EPOCHS} epochs; other load = cores used by other"
          " processes):")
    print(common.table(["case", "run", "framework", "order", "GFLOPS", "quality", "rank 0 peak RSS MiB",
                        "train s", "other load"], per_run))
    print(f"\nside by side, medians (min-max) of {runs} runs; peak RSS from the runs where the framework went first:")
    print(common.table(["case", "framework", "GFLOPS", "quality", "peak RSS MiB", "weights",
                        "GFLOPs / training sample", "same model"], rows))
    if max(loads) > common.QUIET:
        print(f"warning: other processes used up to {max(loads):.2f} cores during a run: noisy figures")


if __name__ == "__main__":
    os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    p = argparse.ArgumentParser()
    p.add_argument("--runs", type=int, default=RUNS)
    p.add_argument("--cases", default=",".join(CASES))
    a = p.parse_args()
    main(a.runs, a.cases.split(","))
