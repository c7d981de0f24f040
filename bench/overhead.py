"""Harness overhead: training throughput of hpcai500.py against a bare Horovod loop.

    .venv/bin/python bench/overhead.py

M=1, P=2, B=32 on 2 ranks, synthetic digits (16000 training images of 16x16, 3 epochs
= 750 steps). The bare loop (bench/bare_horovod.py) runs the same model, batch, ranks
and number of steps. Runs alternate harness / bare, RUNS times each; medians compared
(and, less sensitive to drifting machine speed, the ratio within each adjacent pair).
"""
import common

RUNS, B, SIDE, EPOCHS, GOAL = 3, 32, 16, 3, 0.98
DATASET = f"synthetic:20000:{SIDE}"


def main() -> None:
    print(f"machine: {common.machine()}")
    dat = common.make_dat("overhead", l8=DATASET, l9=1, l10=1, l11=2, l13=1, l14=B, l15=EPOCHS)
    rows, harness, bare, loads = common.alternate(
        dat, lambda steps: ("bench/bare_horovod.py", "--steps", str(steps), "--batch", str(B), "--side", str(SIDE)),
        RUNS, EPOCHS)
    print(f"\nper run (M=1, P=2, B={B}, {DATASET}, {EPOCHS} epochs; other load = cores used by "
          f"other processes during the run; a run above {common.QUIET} is tried again, {common.TRIES} times at most):")
    print(common.table(["run", "what", "steps", "samples", "seconds", "samples/s", "other load"], rows))
    h, b = common.median(harness), common.median(bare)
    print()
    print(common.table(["what", "samples/s (median)", "runs"],
                       [["harness (hpcai500.py)", f"{h:.0f}", RUNS], ["bare Horovod loop", f"{b:.0f}", RUNS]]))
    ratio = h / b
    print(f"\nratio harness/bare = {ratio:.3f} (goal >= {GOAL}): {'MET' if ratio >= GOAL else 'NOT MET'}")
    paired = [h_ / b_ for h_, b_ in zip(harness, bare)]
    print(f"per round (adjacent runs) harness/bare: {', '.join(f'{x:.3f}' for x in paired)}; "
          f"median {common.median(paired):.3f}; best against best {max(harness) / max(bare):.3f}")
    if max(loads) > common.QUIET:
        print(f"warning: other processes used up to {max(loads):.2f} cores during a run: noisy figures")


if __name__ == "__main__":
    main()
