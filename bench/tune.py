"""--tune (issue 69) against an exhaustive grid of the same space, on 4 ranks of one node.

    .venv/bin/python bench/tune.py [--runs 3] [--epochs 40] [--fraction 0.333]

The space, 64 combinations of 5 lines, 48 of which can run (PyTorch has no hierarchical
all-reduce); digits, embedded data, roofline off, line 15's epochs the full length:
layouts 4x1 2x2 1x4 2x1 and B 64 32 (quality knobs: successive halving), PMAP 0 1 (line
12), all-reduce ring hierarchical (line 22) and frameworks tensorflow pytorch (line 35)
(speed knobs: FLOPS probes). On one node PMAP and the all-reduce change next to nothing:
they are the kind of speed knob the probes exist to settle cheaply, and they make the grid
large enough to show what the probes save.

1. The grid: every candidate trained the full length once, as ordinary runs (no --tune):
   one input per combination of the single-valued lines' values (PMAP x all-reduce, 4
   inputs), each sweeping layouts x B x frameworks. Its best VFLOPS is the grid's pick.
2. The tuning run: the same space with lines 12 and 22 listing both values, `--tune` with
   a budget of --fraction (1/3) of the grid's machine time less one invocation's fixed cost
   (the tuner counts its trials' wall time only; start-up and the final report are outside
   its budget and inside the whole-mpirun time compared below). A budget the tuner refuses
   is raised by the shortfall it states and the run made again; the table says so.
3. Both picks run again by ordinary runs, alternated --runs rounds (the tuned file as it
   was written; the grid's best as a one-test input), each the quietest of its tries.

Machine time is the whole mpirun's wall time on both sides (the grid: the sum of its runs),
from launch to exit, start-up included. Goal: the tuned pick's median VFLOPS >= 0.95 of the
grid's pick's, in <= 1/3 of the grid's machine time. 4 ranks share this machine's 2 cores.
"""
from __future__ import annotations

import argparse
import glob
import itertools
import json
import os
import re
import shutil
import subprocess
import time

import common

NP = 4
LAYOUTS = ((4, 1), (2, 2), (1, 4), (2, 1))
BATCHES = (64, 32)
PMAP = (0, 1)
ALLREDUCE = ("ring", "hierarchical")
FRAMEWORKS = ("tensorflow", "pytorch")
GOAL_VFLOPS, GOAL_TIME = 0.95, 1 / 3


def dat(name: str, epochs: int, pmap: str, allreduce: str, layouts=LAYOUTS, batches=BATCHES,
        frameworks=FRAMEWORKS) -> str:
    return common.make_dat(name, l9=len(layouts), l10=" ".join(str(m) for m, _ in layouts),
                           l11=" ".join(str(p) for _, p in layouts), l12=pmap, l13=len(batches),
                           l14=" ".join(map(str, batches)), l15=epochs, l22=allreduce, l30=0,
                           l34=len(frameworks), l35=" ".join(frameworks))


def launch(*args: str) -> dict:
    """hpcai500.py ARGS on NP ranks once the machine is quiet: wall seconds from launch to
    exit, the other load (common.mpirun's gauge), the exit status, stdout, stderr, and the
    run folder it made (None: none)."""
    before = set(glob.glob(os.path.join(common.WORK, "*", "results.json")))
    common.wait_quiet()
    cmd = ["mpirun", "--oversubscribe", "-np", str(NP), common.PY, "hpcai500.py", *args]
    t_launch = time.time()
    t0, busy0, ours0 = time.perf_counter(), common.machine_busy_seconds(), common.children_seconds()
    p = subprocess.run(cmd, cwd=common.ROOT, env=common.ENV, capture_output=True, text=True)
    wall = time.perf_counter() - t0
    other = (common.machine_busy_seconds() - busy0) - (common.children_seconds() - ours0)
    new = sorted(set(glob.glob(os.path.join(common.WORK, "*", "results.json"))) - before)
    return {"wall": wall, "launched": t_launch, "other": max(0.0, other / wall), "rc": p.returncode,
            "out": p.stdout, "err": p.stderr, "dir": os.path.dirname(new[0]) if new else None}


def fixed_seconds(run: dict) -> float:
    """An invocation's seconds outside its tests: launch to the first MLLOG event (start-up,
    data, the plan) plus the last MLLOG event to exit (the summary, charts, files)."""
    stamps = []
    for path in glob.glob(os.path.join(run["dir"], "mllog", "*.log")):
        with open(path) as f:
            stamps += [json.loads(line.split(":::MLLOG ", 1)[1])["time_ms"] / 1e3 for line in f if ":::MLLOG" in line]
    return run["wall"] - (max(stamps) - min(stamps))


def results(run: dict) -> dict:
    with open(os.path.join(run["dir"], "results.json")) as f:
        return json.load(f)


def key(t: dict) -> tuple:
    """A test's candidate: (M, P, B, framework, PMAP, all-reduce)."""
    return t["M"], t["P"], t["B"], t["framework"], t["pmap"], t["allreduce"]


def words(k: tuple) -> str:
    return f"{k[0]}x{k[1]} B {k[2]} {k[3]} PMAP {k[4]} {k[5]}"


def quiet_tests(path: str) -> tuple[dict, float]:
    """One ordinary run of a one-test input on NP ranks (the quietest of common.TRIES):
    its test and the other load."""
    (t,), load = common.quietest(lambda: common.run_harness(path, np=NP))
    return t, load


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=3, help="rounds re-measuring the two picks (default 3)")
    ap.add_argument("--epochs", type=int, default=40, help="line 15: the full length (default 40)")
    ap.add_argument("--fraction", type=float, default=GOAL_TIME,
                    help="the tuning budget as a fraction of the grid's machine time (default 1/3)")
    args = ap.parse_args()
    print(f"machine: {common.machine().replace(f'{common.NP} MPI ranks', f'{NP} MPI ranks')}", flush=True)
    space = (f"digits, embedded, {args.epochs} epochs, roofline off; layouts "
             f"{' '.join(f'{m}x{p}' for m, p in LAYOUTS)} x B {' '.join(map(str, BATCHES))} (quality) x PMAP "
             f"{' '.join(map(str, PMAP))} x all-reduce {' '.join(ALLREDUCE)} x frameworks {' '.join(FRAMEWORKS)} (speed): "
             f"{len(LAYOUTS) * len(BATCHES) * len(PMAP) * len(ALLREDUCE) * len(FRAMEWORKS)} combinations (PyTorch has"
             " no hierarchical all-reduce: 48 can run)")
    print(f"space: {space}", flush=True)

    # 1. the grid --------------------------------------------------------------------------
    grid, grid_runs = {}, []
    for pmap, ar in itertools.product(PMAP, ALLREDUCE):   # one ordinary input per value of the single-valued lines
        r = launch(dat(f"tune-grid-{pmap}-{ar}", args.epochs, pmap, ar))
        if r["rc"]:
            raise SystemExit(f"grid run ({pmap}, {ar}) failed ({r['rc']}):\n{r['out'][-2000:]}{r['err'][-3000:]}")
        res = results(r)
        for t in res["tests"]:
            grid[key({**t, "pmap": pmap, "allreduce": ar})] = t
        r["fixed"] = fixed_seconds(r)
        grid_runs.append(r)
        print(f"  grid, PMAP {pmap}, all-reduce {ar}: {len(res['tests'])} tests, {r['wall']:.1f} s wall ({r['fixed']:.1f} s"
              f" outside its tests), other load {r['other']:.2f}", flush=True)
    grid_wall = sum(r["wall"] for r in grid_runs)
    fixed = common.median([r["fixed"] for r in grid_runs])
    ranked = sorted(grid, key=lambda k: -grid[k]["vflops"])
    best_k = ranked[0]
    print(f"grid: {len(grid)} candidates, {grid_wall:.1f} s of machine time; best {words(best_k)}, VFLOPS "
          f"{grid[best_k]['vflops'] / 1e12:.3e} T", flush=True)
    print(common.table(["rank", "candidate", "train s", "Tflops", "quality", "VTflops", "other load"],
                       [[i + 1, words(k), f"{grid[k]['train_seconds']:.2f}", f"{grid[k]['flops'] / 1e12:.4e}",
                         f"{grid[k]['quality']:.4f}", f"{grid[k]['vflops'] / 1e12:.3e}",
                         f"{max(o['other_cores'] for o in grid[k]['other_load']):.2f}"]
                        for i, k in enumerate(ranked)]), flush=True)

    # 2. the tuning run ----------------------------------------------------------------------
    budget = args.fraction * grid_wall - fixed
    tune_dat = dat("tune-space", args.epochs, " ".join(map(str, PMAP)), " ".join(ALLREDUCE))
    tries = []
    while True:
        r = launch(tune_dat, "--tune", f"{budget / 60:.3f}")
        tries.append(r)
        if r["rc"] == 0:
            break
        m = re.search(r"found ([0-9.]+) min of the budget left after the calibration, expected at least ([0-9.]+) min",
                      r["err"]) or re.search(r"found a budget of ([0-9.]+) min, expected at least ([0-9.]+) min",
                                             r["err"])
        if not m or len(tries) > 2:
            raise SystemExit(f"tuning run failed ({r['rc']}):\n{r['out'][-2000:]}{r['err'][-3000:]}")
        refused = budget
        budget += (float(m.group(2)) - float(m.group(1))) * 60 + 6.0   # the shortfall, and 0.1 min more
        print(f"  the tuner refused {refused / 60:.2f} min: {m.group(0)}; run again with {budget / 60:.2f} min",
              flush=True)
    tune_run = tries[-1]
    tuning = results(tune_run)["tuning"]
    tune_wall = tune_run["wall"]
    refused_wall = sum(r["wall"] for r in tries[:-1])
    rows = tuning["trials"]
    best_row = next(x for x in rows if x["number"] == tuning["best"])
    c = best_row["choice"]
    tuned_k = (*map(int, c["layouts"].split("x")), c["batch_sizes"], c["frameworks"], c["pmap"], c["allreduce"])
    print(f"tuning run: budget {tuning['budget_seconds']:.1f} s, spent {tuning['spent_seconds']:.1f} s by the "
          f"tuner's count in {len(rows)} trials (planned {tuning['planned']}), {tune_wall:.1f} s wall, other load "
          f"{tune_run['other']:.2f}; pick {words(tuned_k)} (trial {tuning['best']}, VFLOPS "
          f"{best_row['vflops'] / 1e12:.3e} T); picks of the speed probes {tuning['picks']}", flush=True)
    with open(os.path.join(tune_run["dir"], "tuning.txt")) as f:
        print(f.read(), flush=True)
    tuned_path = os.path.join(common.WORK, "tune-tuned.dat")
    shutil.copy(os.path.join(tune_run["dir"], tuning["tuned"]), tuned_path)

    # 3. both picks measured again, alternated ---------------------------------------------------
    m_, p_, b_, fw_, pmap_, ar_ = best_k
    grid_best = dat("tune-gridbest", args.epochs, pmap_, ar_, layouts=((m_, p_),), batches=(b_,), frameworks=(fw_,))
    got = {"tuned": [], "grid": []}
    loads = []
    for i in range(args.runs):
        for name, path in (("tuned", tuned_path), ("grid", grid_best)):
            t, load = quiet_tests(path)
            got[name].append(t["vflops"])
            loads.append(load)
            print(f"  round {i + 1}, {name} pick: VFLOPS {t['vflops'] / 1e12:.3e} T, train {t['train_seconds']:.2f} s,"
                  f" quality {t['quality']:.4f}, other load {load:.2f}", flush=True)
    pairs = [a / b for a, b in zip(got["tuned"], got["grid"])]
    med = {k: common.median(v) for k, v in got.items()}
    ratio_v = med["tuned"] / med["grid"]
    ratio_t = tune_wall / grid_wall
    rank = ranked.index(tuned_k) + 1

    refusal = (f"; the tuner refused the first budget: {len(tries) - 1} refused run(s) took {refused_wall:.1f} s more,"
               " not counted below" if len(tries) > 1 else "")

    def span(xs):
        return f"{common.median(xs) / 1e12:.3e} ({min(xs) / 1e12:.3e}-{max(xs) / 1e12:.3e})"
    print(f"\n--tune against the exhaustive grid, {NP} ranks on one node; {space}.\nMachine time = the whole "
          f"mpirun's wall time, launch to exit (the grid: the sum of its {len(grid_runs)} runs); the tuning budget = "
          f"{args.fraction:.3f} x the grid's time less {fixed:.1f} s (the grid runs' median time outside their tests)"
          f"{refusal}."
          f"\nVFLOPS re-measured: medians (min-max) of {args.runs} alternated rounds of ordinary runs; other load "
          f"{min(loads):.2f}-{max(loads):.2f} cores")
    print(common.table(
        ["search", "pick", "runs, tests or trials", "machine time s", "other load", "VTflops in the search",
         f"grid's VTflops of the pick (rank of {len(grid)})", "VTflops re-measured"],
        [["grid", words(best_k), f"{len(grid_runs)} runs, {len(grid)} tests", f"{grid_wall:.1f}",
          "-".join(f"{r['other']:.2f}" for r in grid_runs), f"{grid[best_k]['vflops'] / 1e12:.3e} (measured)",
          f"{grid[best_k]['vflops'] / 1e12:.3e} (1)", span(got["grid"])],
         ["--tune", words(tuned_k), f"1 run, {len(rows)} trials (budget {tuning['budget_seconds']:.0f} s, spent "
          f"{tuning['spent_seconds']:.0f} s)", f"{tune_wall:.1f}", f"{tune_run['other']:.2f}",
          f"{best_row['vflops'] / 1e12:.3e} (measured)", f"{grid[tuned_k]['vflops'] / 1e12:.3e} ({rank})",
          span(got["tuned"])]]))
    same = " (the same candidate: the ratio is the machine's noise)" if tuned_k == best_k else ""
    ok_v, ok_t = ratio_v >= GOAL_VFLOPS, ratio_t <= GOAL_TIME
    print(f"tuned / grid VFLOPS: {ratio_v:.3f} by medians (rounds {min(pairs):.3f}-{max(pairs):.3f}){same}; goal "
          f">= {GOAL_VFLOPS}: {'met' if ok_v else 'NOT met'} by {ratio_v - GOAL_VFLOPS:+.3f}")
    print(f"tune / grid machine time: {ratio_t:.3f} ({tune_wall:.1f} s / {grid_wall:.1f} s); goal <= 1/3: "
          f"{'met' if ok_t else 'NOT met'} by {GOAL_TIME - ratio_t:+.3f} ({grid_wall * GOAL_TIME - tune_wall:+.1f} s)"
          + (f"; with the refused run(s) {(tune_wall + refused_wall) / grid_wall:.3f}" if len(tries) > 1 else ""))
    print(f"goal {'met' if ok_v and ok_t else 'NOT met'}")


if __name__ == "__main__":
    main()
