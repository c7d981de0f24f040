"""How long a test must train for its figures to repeat: the shipped run's headline
(bagging's Sys_scale 1 -> 2 efficiency) against the length of the timed span.

    .venv/bin/python bench/span.py [--runs 5] [--epochs 10,30,60]

The shipped HPCAI500.dat (digits, embedded data, B 32, evaluation every epoch) with its
layouts M=1 and M=2 of P=1 on 2 ranks, the roofline kernels off, and line 15's epochs set
to each E of --epochs in turn; rounds alternate the E's. Per E: each test's median timed
span (train_seconds), the spread of its FLOPS over the rounds ((max - min) / median), and
the efficiency FLOPS(M=2) / (2 x FLOPS(M=1)) of every round, as the report's scaling line
computes it. The spread is what a reader of one report cannot see.
"""
import argparse

import common

COLUMNS = ["epochs", "M=1 span s", "M=1 FLOPS spread", "M=2 span s", "M=2 FLOPS spread", "efficiency median",
           "efficiency range", "range width"]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=5, help="rounds over the epochs (default 5)")
    ap.add_argument("--epochs", default="10,30,60", help="line 15 values, comma-separated (default 10,30,60)")
    args = ap.parse_args()
    epochs = [int(e) for e in args.epochs.split(",")]
    print(f"machine: {common.machine()}")
    dats = {e: common.make_dat(f"span-{e}", l9=2, l10="1 2", l11="1 1", l15=e, l30=0) for e in epochs}
    got = {e: [] for e in epochs}     # e -> [{M: test}] per round
    loads = []
    for r in range(args.runs):
        for e in epochs:
            tests, load = common.quietest(lambda: common.run_harness(dats[e]))
            got[e].append({t["M"]: t for t in tests})
            loads.append(load)
            eff = got[e][-1][2]["flops"] / (2 * got[e][-1][1]["flops"])
            print(f"  round {r + 1}, {e} epochs: spans {got[e][-1][1]['train_seconds']:.2f} s and "
                  f"{got[e][-1][2]['train_seconds']:.2f} s, efficiency {eff:.3f} (other load {load:.2f})", flush=True)
    rows = []
    for e in epochs:
        effs = [g[2]["flops"] / (2 * g[1]["flops"]) for g in got[e]]
        cells = [e]
        for m in (1, 2):
            fl = [g[m]["flops"] for g in got[e]]
            cells += [f"{common.median([g[m]['train_seconds'] for g in got[e]]):.2f}",
                      f"{(max(fl) - min(fl)) / common.median(fl):.3f}"]
        cells += [f"{common.median(effs):.3f}", f"{min(effs):.3f}-{max(effs):.3f}", f"{max(effs) - min(effs):.3f}"]
        rows.append(cells)
    print(f"\nshipped digits, M=1 and M=2 of P=1 on 2 ranks; {args.runs} rounds alternating the epochs; "
          f"other processes used {min(loads):.2f}-{max(loads):.2f} cores during the runs")
    print(common.table(COLUMNS, rows))


if __name__ == "__main__":
    main()
