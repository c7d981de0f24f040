"""What the base models' checkpoints cost a test (issue 70's goal: <= 2 % of a test's time at
the default interval, on the ic workload).

    .venv/bin/python bench/checkpoint.py [--framework pytorch] [--runs 3] [--epochs 3] [--samples 512]

The same test with HPCAI500_CHECKPOINT=1 (the default: each base model's root writes its
state after every evaluation but the last) and 0 (none), alternated: ResNet-50 (ic, the real
model, its weights and SGD's momentum: ~200 MB a checkpoint) at 64 x 64 px, M = 2 base
models of P = 1 on 2 ranks (both roots write at once, as bagging's do), B 32, synthetic data,
evaluated after every epoch (line 31: 1), so a run of E epochs writes E - 1 checkpoints a
model into its run folder (this machine's disk; each flushed to it before its rename). The
cost is the report's: the seconds training waited (the slowest root's: its state taken, a
write before it still under way), as a share of the test's Time (outside it, as evaluations
are), beside the seconds each write took behind training (a thread of the root), and what
they add to Time and the time to solution against the runs that write none; medians of the
alternated runs.
"""
import argparse

import common

B, SIDE, GOAL = 32, 64, 0.02


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--framework", default="pytorch", choices=["pytorch", "tensorflow"])
    ap.add_argument("--runs", type=int, default=3, help="alternated rounds (default 3)")
    ap.add_argument("--epochs", type=int, default=3, help="epochs a run trains (default 3: 2 checkpoints a model)")
    ap.add_argument("--samples", type=int, default=512, help="synthetic training samples (default 512)")
    args = ap.parse_args()
    print(f"machine: {common.machine()}")
    dat = common.make_dat("checkpoint", l7="ic", l8=f"synthetic:{args.samples}:{SIDE}", l9=1, l10=2, l11=1, l13=1,
                          l14=B, l15=args.epochs, l30=0, l31=1, l35=args.framework)
    common.run_harness(dat)     # writes the synthetic set's cache once, outside the comparison
    rows, got = [], {"1": [], "0": []}
    for i in range(args.runs):
        for every in (("1", "0") if i % 2 == 0 else ("0", "1")):   # each order as often: no drift favoured
            (t,), load = common.quietest(lambda: common.run_harness(dat, env={"HPCAI500_CHECKPOINT": every}))
            c = t["checkpoints"] or {"written": 0, "seconds": 0.0, "each_seconds": 0.0, "write_seconds": 0.0, "bytes": 0}
            got[every].append((t["train_seconds"], t["time_to_solution"], c["seconds"], c["each_seconds"]))
            rows.append([i + 1, every, c["written"], f"{c['bytes'] / 2**20:.0f}", f"{c['each_seconds']:.3f}",
                         f"{c['write_seconds']:.3f}",
                         f"{c['seconds']:.2f}", f"{t['train_seconds']:.2f}", f"{100 * c['seconds'] / t['train_seconds']:.2f}",
                         f"{t['time_to_solution']:.2f}", f"{load:.2f}"])
    print(f"\nper run ({args.framework}; ic = ResNet-50 at {SIDE} px, M=2, P=1, B={B}, {args.samples} synthetic"
          f" samples, {args.epochs} epochs evaluated each; other load = cores used by other processes):")
    print(common.table(["round", "every", "written", "MiB a set", "waited s each", "written s each", "waited s in all",
                        "Time s", "waited % of Time",
                        "TTS s", "other load"], rows))
    share = common.median([c / t for t, _, c, _ in got["1"]])
    each = common.median([e for *_, e in got["1"]])
    tts = common.median([x for _, x, _, _ in got["1"]]) / common.median([x for _, x, _, _ in got["0"]])
    time_ratio = common.median([t for t, *_ in got["1"]]) / common.median([t for t, *_ in got["0"]])
    print(f"\ntraining's wait for checkpoints / Time = {100 * share:.2f} % by median (goal <= {100 * GOAL:.0f} %):"
          f" {'MET' if share <= GOAL else 'NOT MET'}; {each:.3f} s a checkpoint (the slowest root's);"
          f" time to solution with / without {tts:.3f}; Time with / without {time_ratio:.3f}")


if __name__ == "__main__":
    main()
