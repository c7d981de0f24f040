"""The Table 2 options against the default: FLOPS and quality of each, on 2 ranks; with
--cluster, the communication options across 2 simulated nodes with the link shaped.

    .venv/bin/python bench/options.py                          # ~10 min on a quiet 2-core machine
    .venv/bin/python bench/options.py --epochs 1 --runs 1      # quick check that every option runs
    sudo .venv/bin/python bench/options.py --cluster           # root; ~50 min (see cluster_main)

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
import sys

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
    ("communication int8", {"l21": "int8"}),
    ("all-reduce hierarchical", {"l22": "hierarchical"}),
    ("all-reduce torus", {"l22": "torus"}),                 # P = 2: one row (the ring's two halves)
    ("all-reduce adasum", {"l22": "adasum"}),               # the LR x 1 (Horovod's CPU convention), not x P
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


# --cluster: ic (ResNet-50 v1.5 at 64 px) data-parallel, one job of 2 nodes x 2 ranks (PMAP 1)
CLUSTER_SET, CLUSTER_B, CLUSTER_EPOCHS = "synthetic:384:64", 32, 2
COMM_OPTIONS = [  # (row name, lines changed against fp32 communication and the ring all-reduce)
    ("fp32, ring (reference)", {}), ("fp16 communication", {"l21": "fp16"}), ("int8 communication", {"l21": "int8"}),
    ("hierarchical", {"l22": "hierarchical"}), ("torus", {"l22": "torus"}), ("adasum", {"l22": "adasum"})]
GOAL_INT8, GOAL_QUALITY = 1.3, 0.01     # int8 / fp32 FLOPS on the 1 Gb/s link, |quality - fp32's| at most


def cluster_main(runs: int, links: list[str]) -> None:
    """Each communication option (line 21 fp16/int8, line 22 hierarchical/torus/adasum)
    against fp32 and the ring, ic data-parallel on 2 simulated nodes x 2 ranks, per link
    (tc tbf both ways on each node); `runs` rounds, the options and links alternating
    within each round; medians. 6 options x 2 links x 2 rounds of ~2 min each."""
    sys.path.insert(0, os.path.join(common.ROOT, "scripts", "cluster"))
    import cluster as cl
    import multinode
    why = cl.available()
    if why:
        sys.exit(f"bench/options.py --cluster: {why}")
    common.NP = 4
    print(f"machine: {common.machine()}; 2 simulated nodes x 2 ranks (scripts/cluster/)")
    base = dict(l7="ic", l8=CLUSTER_SET, l9=1, l10=1, l11=4, l12=1, l13=1, l14=CLUSTER_B, l15=CLUSTER_EPOCHS,
                l17="fp32", l18="sgd", l21="fp32", l22="ring", l27=1, l30=0, l31=0)
    dats = [common.make_dat(f"options-cluster-{i}", **{**base, **lines}) for i, (_, lines) in enumerate(COMM_OPTIONS)]
    got = {(link, i): [] for link in links for i in range(len(COMM_OPTIONS))}
    rates = {link: [] for link in links}
    c = cl.Cluster("options", net=244).up(2, slots=2, tie=True)
    try:
        for r in range(runs):
            for link in (links if r % 2 == 0 else links[::-1]):
                for node in ("n1", "n2"):
                    c.shape(node, None if link == "none" else link)
                rates[link].append(multinode.link_rate(c))
                for i, (name, _) in enumerate(COMM_OPTIONS):
                    (t,), load = multinode.run(c, dats[i], 2)
                    got[link, i].append((t, load))
                    print(f"round {r + 1} {link} {name}: {t['flops']:.3e} FLOPS, {t['train_seconds']:.1f} s, quality "
                          f"{t['quality']:.4f}, consistency {t['consistency']['passed']}, exchange {t['exchange'][0]}, "
                          f"other load {load:.2f}", flush=True)
    finally:
        c.down()
    _cluster_table(got, rates, links, runs)


def _cluster_table(got: dict, rates: dict, links: list[str], runs: int) -> None:
    med = {k: common.median([t["flops"] for t, _ in v]) for k, v in got.items()}
    quality = {k: common.median([t["quality"] for t, _ in v]) for k, v in got.items()}
    rows = []
    for link in links:
        for i, (name, _) in enumerate(COMM_OPTIONS):
            tests = got[link, i]
            rows.append([link, f"{common.median(rates[link]):.0f}", name, f"{med[link, i]:.3e}",
                         " ".join(f"{t['flops']:.3e}" for t, _ in tests), f"{med[link, i] / med[link, 0]:.2f}",
                         f"{quality[link, i]:.4f}", f"{quality[link, i] - quality[link, 0]:+.4f}",
                         "PASSED" if all(t["consistency"]["passed"] for t, _ in tests) else "FAILED",
                         " ".join(f"{l:.2f}" for _, l in tests)])
    print(f"\nic {CLUSTER_SET}, one job of P = 4 (2 nodes x 2 ranks, PMAP 1), B {CLUSTER_B} per rank, "
          f"{CLUSTER_EPOCHS} epochs, sgd; medians of {runs} round(s), options and links alternating")
    print(common.table(["link", "measured Mbit/s", "option", "FLOPS", "runs", "/ fp32 ring", "quality",
                        "quality - fp32 ring", "consistency", "other load"], rows))
    slow = links[-1]
    i8, tor = [n for n, _ in COMM_OPTIONS].index("int8 communication"), [n for n, _ in COMM_OPTIONS].index("torus")
    ratio, dq = med[slow, i8] / med[slow, 0], abs(quality[slow, i8] - quality[slow, 0])
    ok = ratio >= GOAL_INT8 and dq <= GOAL_QUALITY
    print(f"int8 / fp32 on {slow}: {ratio:.2f}x, quality {dq:.4f} apart (goal >= {GOAL_INT8}x within "
          f"{GOAL_QUALITY}: {'MET' if ok else 'NOT MET'})")
    for link in links:
        t = med[link, tor] / med[link, 0]
        print(f"torus / ring on {link}: {t:.2f} (goal >= 1: {'MET' if t >= 1 else 'NOT MET'})")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cluster", action="store_true",
                    help="the communication options on 2 simulated nodes, ic, links shaped (root)")
    ap.add_argument("--links", default="10gbit,1gbit", help="--cluster: tc rates, slowest last")
    ap.add_argument("--epochs", type=int, default=EPOCHS)
    ap.add_argument("--runs", type=int, default=RUNS)
    ap.add_argument("--tries", type=int, default=common.TRIES,
                    help="runs of an option while others load the machine (a busy machine: 1)")
    ap.add_argument("--patience", type=float, default=120.0,
                    help="seconds to wait for a quiet machine before each run (a busy machine: less)")
    args = ap.parse_args()
    if args.cluster:
        return cluster_main(args.runs, args.links.split(","))
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
