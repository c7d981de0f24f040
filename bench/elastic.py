"""Elastic bagging on the simulated cluster (issue 46, item 7): what a lost rank, and a
lost node, cost a run under `--on-fault drop` and `retrain`, against the same run without
a fault.

    sudo .venv/bin/python bench/elastic.py [--rounds 2]

Two layouts of the simulated cluster (scripts/cluster/): 4 nodes x 1 rank and 2 nodes x 2
ranks, M = 0 (as many as fit: 4) base models of P = 1 (digits, embedded data, B 32, 8 epochs, an evaluation
every epoch, no roofline). Per layout and round, alternated:

* `none`: no fault;
* `rank`: the last node's last rank SIGKILLed (HPCAI500_FAULT=RANK:STEP:kill) at a step
  drawn at random (seeded) between the second epoch and the second last, `--on-fault drop`;
* `retrain`: the same kill under `--on-fault retrain`: the survivors train the lost base
  model again once the others finish;
* `node`: the last node killed whole (its init: the Open MPI daemon and its ranks) once
  training has reached the same epoch;
* `relaunch` (issue 70): the same node killed under the launcher (`--relaunch 1`), which
  relaunches `--resume` on the nodes left;
* `checkpoint` (issue 70): M = 2 base models laid out round-robin (line 12: 1), so that job 1
  is on n2 in both layouts, and n2 killed whole under the launcher at the same epoch: the
  world left still holds M = 2, so the test goes on from its models' checkpoints (one after
  every evaluation, every epoch here).

Figures: mpirun's exit and the run's --status, time to solution, the ensemble's quality,
base models kept; for `rank`, from the fault (the injector's own clock) to the survivors'
agreed shrink (results.json's loss `time`), after which they train on; and whether every
surviving job's work was kept (its samples equal to the fault-free run's for that job);
for `retrain`, from the fault to the survivors' retraining wave (its progress line's
arrival here), and the quality against the fault-free run's; for `relaunch`, from the fault
to the relaunched run's first epoch (its progress line's arrival here), and the epochs of
the test under way lost (M = 0 lays out fewer models on the nodes left, so the test runs
again from its start: every epoch trained before the fault is trained again); for
`checkpoint`, the same, where the epochs trained again are those between the checkpoints it
went on from and the fault (goal: at most one checkpoint interval, an epoch here).

`--cases` picks the faulted cases (`none` always runs: the others' reference).
"""
from __future__ import annotations

import argparse
import json
import os
import random
import re
import subprocess
import sys
import time

import common

sys.path.insert(0, os.path.join(common.ROOT, "scripts", "cluster"))
import cluster as cl  # noqa: E402

EPOCHS, B, M = 8, 32, 4
LAYOUTS = {"4x1": ("n1:1,n2:1,n3:1,n4:1", "n4", 3), "2x2": ("n1:2,n2:2", "n2", 3)}   # hosts, last node, its rank
GOAL_RECOVERY = 10.0   # s, fault to the survivors' shrink (issue 46)
GOAL_AGAIN = 60.0      # s, a node's loss to training again under the launcher (issue 70)
CASES = ("rank", "retrain", "node", "relaunch", "checkpoint")
FIRES = re.compile(r"HPCAI500_FAULT fires: kill at step (\d+) \(t=([0-9.]+)\)")


def run(c, dat: str, hosts: str, env: dict, kill_node: str | None = None, at_epoch: int = 0,
        relaunch: bool = False) -> dict:
    """hpcai500.py on the cluster (under the launcher where `relaunch`): the results.json it
    wrote, mpirun's (the launcher's) exit, its stderr, and for a node killed, when (this
    machine's clock); `wave`: when a retraining wave, or the relaunch's first epoch, began."""
    before = set(os.listdir(common.WORK))
    if relaunch:   # the launcher runs mpirun, with the cluster's options less --host and -np (its own)
        launcher = [common.PY, "hpcai500.py", dat, "--relaunch", "1", "--hosts", hosts, "--mpirun",
                    " ".join(c.mpirun_args(None, {**common.ENV, **env}))]
    else:
        launcher = ["mpirun", *c.mpirun_args(hosts, {**common.ENV, **env}), common.PY, "hpcai500.py", dat]
    common.wait_quiet()
    p = subprocess.Popen(launcher, cwd=common.ROOT, env={**common.ENV, **env},
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    err, killed, wave, relaunched = [], None, None, False
    for line in p.stderr:
        err.append(line)
        if wave is None and "retraining wave 1:" in line:
            wave = time.time()
        relaunched = relaunched or ": relaunch 1 of 1 on " in line
        if wave is None and relaunched and re.search(r": epoch \d+/", line):
            wave = time.time()
        if kill_node and killed is None and f": epoch {at_epoch}/" in line:
            killed = time.time()
            c.kill(kill_node)
    p.wait(timeout=600)
    ended = time.time()
    (run_dir,) = [d for d in set(os.listdir(common.WORK)) - before if d[:1].isdigit()]
    path = os.path.join(common.WORK, run_dir)
    with open(os.path.join(path, "results.json")) as f:
        res = json.load(f)
    status = subprocess.run([common.PY, "hpcai500.py", "--status", path], cwd=common.ROOT, capture_output=True,
                            text=True)
    return {"res": res, "rc": p.returncode, "err": "".join(err), "killed": killed, "ended": ended, "wave": wave,
            "status": status.stdout.strip().split(": ", 2)[1].split(":")[0] if status.stdout else "?"}


def figures(case: str, out: dict, clean: dict | None) -> list:
    tests = out["res"]["tests"]
    t = tests[0] if tests else None
    kept = t and t["M"] - len(t["jobs_lost"])
    recovery, again = "-", "-"
    if case in ("rank", "retrain") and t and t["losses"]:
        fired = FIRES.search(out["err"])
        recovery = f"{t['losses'][0]['time'] - float(fired.group(2)):.2f}" if fired else "?"
        if case == "retrain":
            again = f"{out['wave'] - float(fired.group(2)):.2f}" if fired and out["wave"] else "?"
    if case == "node" and out["killed"]:
        recovery = f"job ended {out['ended'] - out['killed']:.1f} s after"
    if case in ("relaunch", "checkpoint") and out["killed"]:
        again = f"{out['wave'] - out['killed']:.2f}" if out["wave"] else "never"
    work = "-"
    if t and case == "relaunch":   # the test under way ran again from its start
        work = f"{out['at_epoch'] - 1} epoch(s) lost, trained again"
    if t and case == "checkpoint":   # from the checkpoints after epoch E: the epochs after E finished before the fault
        done = t["resumed"]["epoch"] if t["resumed"] else 0
        work = f"{out['at_epoch'] - done} epoch(s) lost, trained again (from epoch {done})"
    if t and clean and case in ("rank", "node"):
        ref = {r["job"]: r["size"] for r in clean["res"]["tests"][0]["resample"]}
        same = all(r["size"] == ref[r["job"]] for r in t["resample"])
        full = t["epochs_trained"] == clean["res"]["tests"][0]["epochs_trained"]
        work = "kept" if same and full else "NOT kept"
    if t and clean and case == "retrain":   # the same resamples, in the ensemble whole again
        ref = clean["res"]["tests"][0]
        work = f"quality {t['quality'] - ref['quality']:+.4f} vs none" + (
            ", same resamples" if t["resample"] == ref["resample"] else ", resamples DIFFER")
    return [case, out["rc"], out["status"], f"{t['time_to_solution']:.2f}" if t else "-",
            f"{t['quality']:.4f}" if t else "-", f"{kept} of {t['M']}" if t else "0 (no result)", work, recovery, again]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=2, help="rounds per layout (default 2)")
    ap.add_argument("--seed", type=int, default=46, help="draws the fault's step (default 46)")
    ap.add_argument("--cases", default="rank,retrain,node,relaunch,checkpoint",
                    help="the faulted cases, comma-separated (default every one: rank,retrain,node,relaunch,checkpoint)")
    args = ap.parse_args()
    cases = tuple(args.cases.split(","))
    if not set(cases) <= set(CASES):
        sys.exit(f"bench/elastic.py: --cases: found {args.cases!r}, expected some of {','.join(CASES)}")
    why = cl.available()
    if why:
        sys.exit(f"bench/elastic.py: {why}")
    draw = random.Random(args.seed)
    print(f"machine: {common.machine()}; simulated cluster (scripts/cluster/)")
    # M = 0: as many base models as the world holds, M on the layouts' 4 ranks; the relaunch's
    # smaller world then lays out as many as fit (a fixed M that no longer fits is skipped)
    dat = common.make_dat("elastic", l9=1, l10=0, l11=1, l14=B, l15=EPOCHS, l30=0, l31=1)
    two = common.make_dat("elastic-checkpoint", l9=1, l10=2, l11=1, l12=1, l14=B, l15=EPOCHS, l30=0, l31=1)
    c = cl.Cluster("elastic", net=244).up(4, slots=2, tie=True)
    rows = []
    try:
        for layout, (hosts, last, rank) in LAYOUTS.items():
            for r in range(args.rounds):
                clean = run(c, dat, hosts, {})
                steps = clean["res"]["tests"][0]["steps_per_epoch"][-1]
                step = draw.randrange(steps, steps * (EPOCHS - 1))
                order = cases[r % len(cases):] + cases[:r % len(cases)]
                outs = {"none": clean}
                for case in order:
                    if case in ("rank", "retrain"):
                        outs[case] = run(c, dat, hosts, {"HPCAI500_FAULT": f"{rank}:{step}:kill",
                                                         "HPCAI500_ON_FAULT": "drop" if case == "rank" else case})
                    else:
                        outs[case] = run(c, two if case == "checkpoint" else dat, hosts, {"HPCAI500_ON_FAULT": "drop"},
                                         kill_node="n2" if case == "checkpoint" else last, at_epoch=1 + step // steps,
                                         relaunch=case in ("relaunch", "checkpoint"))
                        outs[case]["at_epoch"] = 1 + step // steps
                        c.down()
                        c = cl.Cluster("elastic", net=244).up(4, slots=2, tie=True)   # the killed node back
                for case in ("none", *cases):
                    rows.append([layout, r + 1, f"step {step}" if case != "none" else "-",
                                 *figures(case, outs[case], clean)])
                print(f"  {layout} round {r + 1} done", flush=True)
    finally:
        c.down()
    print(f"\ndigits, M = {M} x P = 1 (checkpoint: 2, round-robin), B {B}, {EPOCHS} epochs, an evaluation (and a"
          f" checkpoint) every epoch; rank and node: --on-fault drop; {args.rounds} round(s) a layout")
    print(common.table(["layout", "round", "fault at", "fault", "mpirun exit", "--status", "time to solution s",
                        "quality", "base models", "surviving jobs' work", "fault to shrink s",
                        "fault to retraining (relaunch: to its first epoch) s"], rows))
    print()
    recov = [float(x[-2]) for x in rows if x[3] in ("rank", "retrain") and re.fullmatch(r"[0-9.]+", str(x[-2]))]
    worst = max(recov) if recov else float("nan")
    if "rank" in cases or "retrain" in cases:
        print(f"rank lost: fault to the survivors' shrink, worst {worst:.2f} s (goal < {GOAL_RECOVERY:g} s):"
              f" {'met' if recov and worst < GOAL_RECOVERY else 'NOT met'}; every surviving job's work kept:"
              f" {'yes' if all(x[-3] == 'kept' for x in rows if x[3] == 'rank') else 'NO'}")
    whole = [x for x in rows if x[3] == "retrain"]
    if whole:
        print(f"retrain: {sum(x[8] == f'{M} of {M}' for x in whole)} of {len(whole)} runs ended with the ensemble"
              " whole; its quality against the fault-free run's in the table (the same resamples: a model trained"
              " again differs from the lost one only by the nondeterminism of its training)")
    if "node" in cases:
        print("node lost: Open MPI 5.0.8's PRRTE ends the job when a daemon is lost (docs/running.md, 'Limits'):"
              " the run's finished tests stand, this test is lost")
    again = [float(x[-1]) for x in rows if x[3] == "relaunch" and re.fullmatch(r"[0-9.]+", str(x[-1]))]
    done = [x for x in rows if x[3] == "relaunch"]
    if done:
        print(f"node lost under the launcher: {sum(x[5] == 'complete' for x in done)} of {len(done)} runs complete;"
              f" fault to training again, worst {max(again) if again else float('nan'):.1f} s (goal < {GOAL_AGAIN:g} s):"
              f" {'met' if again and len(again) == len(done) and max(again) < GOAL_AGAIN else 'NOT met'}; the"
              " test under way trained again from its start (M = 0 lays out fewer models on the nodes left)")
    kept = [x for x in rows if x[3] == "checkpoint"]
    if kept:
        lost = [int(str(x[-3]).split()[0]) for x in kept if str(x[-3])[:1].isdigit()]
        print(f"node lost under the launcher, the layout still fitting: {sum(x[5] == 'complete' for x in kept)} of"
              f" {len(kept)} runs complete; finished epochs trained again, worst {max(lost) if lost else '?'} (goal <="
              f" 1, the checkpoint interval): {'met' if lost and len(lost) == len(kept) and max(lost) <= 1 else 'NOT met'}")


if __name__ == "__main__":
    main()
