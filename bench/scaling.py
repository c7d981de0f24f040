"""Bagging scaling on 2 ranks: layouts (M, P) = (1,1), (2,1), (1,2) in one HPCAI500.dat.

    .venv/bin/python bench/scaling.py

Same B, epochs and synthetic data for every layout; the file is run RUNS times and each
figure is the median over the runs (quality is seeded: the same every run). Bagging weak
scaling: 2 base models on 2 ranks against 1 on 1 rank, efficiency = FLOPS(2,1) /
(2 x FLOPS(1,1)). Bagging against pure data parallelism on the same 2 ranks:
FLOPS(2,1) / FLOPS(1,2).
"""
import common

RUNS, B, SIDE, EPOCHS, GOAL, GOAL_DP = 3, 32, 16, 2, 0.95, 1.5
DATASET = f"synthetic:20000:{SIDE}"
LAYOUTS = [(1, 1), (2, 1), (1, 2)]


def main() -> None:
    print(f"machine: {common.machine()}")
    dat = common.make_dat("scaling", l8=DATASET, l9=len(LAYOUTS), l10=" ".join(str(m) for m, _ in LAYOUTS),
                          l11=" ".join(str(p) for _, p in LAYOUTS), l13=1, l14=B, l15=EPOCHS)
    runs, loads = [], []
    for _ in range(RUNS):
        tests, load = common.quietest(lambda: common.run_harness(dat))
        runs.append({(t["M"], t["P"]): t for t in tests})
        loads.append(load)
    med = {k: {f: common.median([r[k][f] for r in runs]) for f in ("flops", "vflops", "train_seconds")}
           for k in LAYOUTS}
    last = runs[-1]
    print(f"\n{DATASET}, B={B} per rank, {EPOCHS} epochs, sampler bootstrap; medians of {RUNS} runs "
          f"(other processes used {', '.join(f'{x:.2f}' for x in loads)} cores during them)")
    print(common.table(
        ["layout", "Sys_scale", "FLOPS", "VFLOPS", "ensemble quality", "mean base quality", "train seconds",
         "FLOPS per run"],
        [[f"M={m} P={p}", m * p, f"{med[m, p]['flops']:.4e}", f"{med[m, p]['vflops']:.4e}",
          f"{last[m, p]['quality']:.4f}", f"{sum(last[m, p]['base_quality']) / m:.4f}",
          f"{med[m, p]['train_seconds']:.2f}", " ".join(f"{r[m, p]['flops']:.3e}" for r in runs)]
         for m, p in LAYOUTS]))
    f11, f21, f12 = (med[k]["flops"] for k in LAYOUTS)
    eff = f21 / (2 * f11)
    print(f"\nbagging weak-scaling efficiency  FLOPS(M=2,P=1) / (2 x FLOPS(M=1,P=1)) = {eff:.3f}"
          f" (goal >= {GOAL}: {'MET' if eff >= GOAL else 'NOT MET'})")
    print(f"bagging vs data parallelism      FLOPS(M=2,P=1) / FLOPS(M=1,P=2)       = {f21 / f12:.3f}"
          f" (goal >= {GOAL_DP}: {'MET' if f21 / f12 >= GOAL_DP else 'NOT MET'})")
    print("ensemble quality                 " + "   ".join(f"M={m},P={p}: {last[m, p]['quality']:.4f}"
                                                         for m, p in LAYOUTS))
    print("note: one core per rank; M=1,P=1 leaves the second rank and its core idle.")
    if max(loads) > common.QUIET:
        print(f"warning: other processes used up to {max(loads):.2f} cores during a run: noisy figures")


if __name__ == "__main__":
    main()
