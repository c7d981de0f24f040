"""The Table 2 options against the default: FLOPS and quality of each, on 2 ranks.

    .venv/bin/python bench/options.py                          # ~10 min on a quiet 2-core machine
    .venv/bin/python bench/options.py --epochs 1 --runs 1      # quick check that every option runs

Default: digits, synthetic:20000:16 (16000 training images of 16x16), M=1 P=2 (so that
gradient compression and the all-reduce matter), B=32, 2 epochs, sgd at base LR 0.05,
fp32 training and communication, ring all-reduce, micro-kernels off. Each other row
changes one line of that .dat file (the optimizers also their base LR, line 19: see LR
below). Every option is run RUNS times, interleaved (all options in turn, RUNS rounds),
and each figure is the median over the runs. fp16 training is too slow on a CPU for
that set: it runs once on a small set against fp32 on the same small set (SMALL below).
A run that fails is shown as FAILED with the tail of its output; the other rows go on.
"""
import argparse
import glob
import json
import os

import common

RUNS, B, SIDE, EPOCHS = 2, 32, 16, 2
DATASET = f"synthetic:20000:{SIDE}"
# FP16 arithmetic is emulated on a CPU, about 40x slower than fp32 here: 7 s a step, so
# the default set would take an hour. fp16 runs once on a small set (800 training
# images, SMALL_EPOCHS) and is compared with fp32 on that same small set.
SMALL, SMALL_EPOCHS = f"synthetic:1000:{SIDE}", 1
RESULTS = os.path.join(common.WORK, "options")  # our own results dir: other benches share WORK
# Base LR per rank (line 19) of each optimizer; the job uses LR x P. sgd: the shipped 0.05.
# LARS (eta 0.001 trust ratio) needs a far larger LR, as README.md says; Adam and LAMB
# want a smaller one; the values are those tests/test_options.py trains with.
LR = {"sgd": 0.05, "adam": 0.002, "adagrad": 0.1, "lars": 1.0, "lamb": 0.01}
OPTIONS = [  # (row name, the lines changed against the default)
    ("default (fp32, sgd, C32, ring)", {}),
    ("precision bf16", {"l17": "bf16"}),
    *[(f"optimizer {o} (LR {LR[o]})", {"l18": o, "l19": LR[o]}) for o in ("adam", "adagrad", "lars", "lamb")],
    ("communication fp16", {"l21": "fp16"}),
    ("all-reduce hierarchical", {"l22": "hierarchical"}),
    ("small set: default", {"l8": SMALL}),          # the reference of the next row
    ("small set: precision fp16", {"l8": SMALL, "l17": "fp16"}),
]
N_MAIN = len(OPTIONS) - 2  # rows against row 0; the small-set rows go against each other, once


def run(dat: str):
    """(test of results.json, report.txt text), other load: one hpcai500.py run."""
    before = set(glob.glob(os.path.join(RESULTS, "*", "results.json")))
    _, other = common.mpirun("hpcai500.py", dat)
    (new,) = set(glob.glob(os.path.join(RESULTS, "*", "results.json"))) - before
    with open(new) as f:
        (test,) = json.load(f)["tests"]
    with open(os.path.join(os.path.dirname(new), "report.txt")) as f:
        return (test, f.read()), other


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--epochs", type=int, default=EPOCHS)
    ap.add_argument("--runs", type=int, default=RUNS)
    ap.add_argument("--tries", type=int, default=common.TRIES,
                    help="runs of an option while others load the machine (a busy machine: 1)")
    ap.add_argument("--patience", type=float, default=120.0,
                    help="seconds to wait for a quiet machine before each run (a busy machine: less)")
    args = ap.parse_args()
    common.TRIES = args.tries
    wait = common.wait_quiet
    common.wait_quiet = lambda: wait(patience=args.patience)
    small_epochs = min(args.epochs, SMALL_EPOCHS)
    print(f"machine: {common.machine()}")
    os.makedirs(RESULTS, exist_ok=True)
    base = dict(l5=RESULTS, l8=DATASET, l9=1, l10=1, l11=2, l13=1, l14=B, l15=args.epochs, l16=1, l17="fp32",
                l18="sgd", l19=LR["sgd"], l21="fp32", l22="ring", l27=1, l30=0)
    dats = [common.make_dat(f"options-{i}", **{**base, **({"l15": small_epochs} if i >= N_MAIN else {}), **lines})
            for i, (_, lines) in enumerate(OPTIONS)]
    got = {i: [] for i in range(len(OPTIONS))}   # option -> [(test, other load)]
    failed, notes = {}, {}

    def one(r, i):
        name = OPTIONS[i][0]
        try:
            (test, report), load = common.quietest(lambda: run(dats[i]))
        except SystemExit as e:  # common.mpirun exits with the command's output tail
            failed[i] = str(e)
            print(f"run {r + 1} {name}: FAILED\n{str(e)[-2000:]}", flush=True)
            return
        got[i].append((test, load))
        notes[i] = [l.strip() for l in report.splitlines() if "flat MPI" in l]
        print(f"run {r + 1} {name}: {common.throughput(test):.0f} samples/s, {test['train_seconds']:.2f} s, "
              f"quality {test['quality']:.4f}, loss {test['final_loss'][0]:.4f}, other load {load:.2f}", flush=True)

    for r in range(args.runs):  # interleaved: slow drift of machine speed hits every option alike
        for i in range(N_MAIN):
            if i not in failed:
                one(r, i)
    for i in range(N_MAIN, len(OPTIONS)):  # once: fp16 alone takes minutes
        one(0, i)

    def med(i, field):
        return common.median([t[field] for t, _ in got[i]])

    rows = []
    for i, (name, _) in enumerate(OPTIONS):
        ref = 0 if i < N_MAIN else N_MAIN
        if not got[i]:
            rows.append([name, "FAILED", "", "", "", "", "", "", "0"])
            continue
        f, q = med(i, "flops"), med(i, "quality")
        loss = common.median([t["final_loss"][0] for t, _ in got[i]])
        rf, rq = (med(ref, "flops"), med(ref, "quality")) if got[ref] else (None, None)
        rows.append([name + (" (FAILED in a later run)" if i in failed else ""), f"{f:.4e}",
                     f"{f / rf:.3f}" if rf else "", f"{med(i, 'train_seconds'):.2f}", f"{q:.4f}",
                     f"{q - rq:+.4f}" if rq is not None else "", f"{loss:.4f}", " ".join(f"{l:.2f}" for _, l in got[i]),
                     len(got[i])])
    print(f"\n{DATASET} (16000 training images), M=1 P=2, B={B} per rank, {args.epochs} epochs, bootstrap sampler, "
          f"micro-kernels off; medians of {args.runs} run(s) per option, interleaved. The last two rows: "
          f"{SMALL} (800 training images), {small_epochs} epochs, 1 run each, fp16 against fp32 on that set. "
          f"Other load = cores used by other processes during each run (a run above {common.QUIET} is tried "
          f"again, {common.TRIES} times at most):")
    print(common.table(["option", "FLOPS", "/ default", "train seconds", "quality", "quality - default",
                        "final loss", "other load", "runs"], rows))
    print("quality = Top-1 on the validation set (saturates near 1 on this synthetic set); final loss = training"
          " loss of the last epoch, which still tells the options apart there.")
    print("LR = base learning rate per rank (line 19; the job uses LR x P); the other rows use sgd at "
          f"{LR['sgd']}.")
    for i, lines in notes.items():
        for line in lines:
            print(f"{OPTIONS[i][0]}: the report says: {line}")
    loads = [l for g in got.values() for _, l in g]
    if loads and max(loads) > common.QUIET:
        print(f"warning: other processes used up to {max(loads):.2f} cores during a run: noisy figures")
    for i, err in failed.items():
        print(f"\n{OPTIONS[i][0]} FAILED:\n{err[-3000:]}")


if __name__ == "__main__":
    main()
