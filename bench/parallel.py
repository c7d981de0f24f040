"""The parallel mode inside a base model (line 37, issue 35) across two nodes with the link
shaped, on the simulated cluster of scripts/cluster/ (root): data parallelism against
model, pipeline and mixed parallelism of one base model, PyTorch.

    sudo .venv/bin/python bench/parallel.py [--runs 2] [--links none,1gbit,100mbit] [--per-node 1]
                                            [--workloads ic,deepcam]

One job (M = 1) of P = 2 x per-node ranks spanning both nodes (--per-node 1: one rank a
node, P = 2; --per-node 2: 2 x 2, P = 4). Workloads: ic, ResNet-50 v1.5 at 64 px
(synthetic:256:64, B 16 a rank); deepcam, DeepLabv3+ at 64 x 96 (synthetic:32:64, B 4 a
rank); 1 epoch, one evaluation at the end. Modes: data, model, pipeline:4 (4 micro-batches
on 1F1B) and, with P = 4, mixed:2:4 (2 stages x 2 replicas, PMAP 0 putting each stage's
replicas on one node). Each round runs every mode in one invocation (line 37
sweeps them, in that order), the links alternate between rounds, figures are medians
over rounds. Each link's measured rate (4 MB from n1 to n2) is printed.

Goals (issue 35): the pipeline >= 2x data parallelism's FLOPS on the 100 Mbit/s link for
ResNet-50 (data parallelism all-reduces ~102 MB of gradients a step; a pipeline sends a
few MB of activations); each stage's measured idle share within 5 points of the
schedule's theory (S - 1) / (m + S - 1); the report's Parallel modes block says which
mode won and why. The simulated nodes share this machine's 2 cores: with --per-node 1 a
core a rank; with --per-node 2 two ranks a core (the table says which).
"""
from __future__ import annotations

import argparse
import os
import sys

import common
import multinode   # its run (hpcai500.py on the cluster) and link_rate, as bench/options.py uses them

sys.path.insert(0, os.path.join(common.ROOT, "scripts", "cluster"))
import cluster as cl  # noqa: E402
from harness import experiments  # noqa: E402  (the report's mean of the stages' idle shares)

WORKLOADS = {"ic": ("synthetic:256:64", 16), "deepcam": ("synthetic:32:64", 4)}   # dataset, B a rank
GOAL_RATIO, GOAL_LINK, GOAL_WORKLOAD, GOAL_POINTS = 2.0, "100mbit", "ic", 0.05


def modes(P: int) -> list[str]:
    """4 micro-batches a pipeline: ic's of 8 samples (B x S / 4), deepcam's of 2 with P = 2."""
    return ["data", "model", "pipeline:4"] + (["mixed:2:4"] if P >= 4 else [])


def dats(P: int, workloads: list[str]) -> dict:
    """One input a workload: M = 1, P ranks, every mode of `modes(P)` on line 37."""
    out = {}
    for w in workloads:
        dataset, b = WORKLOADS[w]
        out[w] = common.make_dat(f"parallel-{w}-{P}", l7=w, l8=dataset, l9=1, l10=1, l11=P, l12=0, l13=1, l14=b,
                                 l15=1, l30=0, l31=0, l35="pytorch", l36=len(modes(P)), l37=" ".join(modes(P)))
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=2, help="rounds over the links (default 2)")
    ap.add_argument("--links", default="none,1gbit,100mbit", help="tc rates, slowest last (default none,1gbit,100mbit)")
    ap.add_argument("--per-node", type=int, choices=(1, 2), default=1, help="ranks per node (default 1)")
    ap.add_argument("--workloads", default="ic,deepcam", help="of ic, deepcam (default both)")
    args = ap.parse_args()
    why = cl.available()
    if why:
        sys.exit(f"bench/parallel.py: {why}")
    links, workloads, P = args.links.split(","), args.workloads.split(","), 2 * args.per_node
    common.NP = P
    print(f"machine: {common.machine()}; 2 simulated nodes x {args.per_node} rank(s) (scripts/cluster/)")
    inputs = dats(P, workloads)
    got = {(w, link, m): [] for w in workloads for link in links for m in modes(P)}
    rates, loads = {link: [] for link in links}, []
    c = cl.Cluster("bench", net=245).up(2, slots=args.per_node, tie=True)
    try:
        for r in range(args.runs):
            for link in (links if r % 2 == 0 else links[::-1]):   # alternated: drift hits every link alike
                for node in ("n1", "n2"):
                    c.shape(node, None if link == "none" else link)
                rates[link].append(multinode.link_rate(c))
                for w in workloads:
                    tests, load = multinode.run(c, inputs[w], args.per_node)
                    loads.append(load)
                    for t in tests:
                        got[w, link, t["mode"]].append(t)
                    print(f"  round {r + 1} {link} {w}: " + ", ".join(f"{t['mode']} {t['flops']:.3e}" for t in tests)
                          + f" FLOPS (other load {load:.2f})", flush=True)
    finally:
        c.down()
    report(got, rates, loads, links, workloads, P, args)


def report(got, rates, loads, links, workloads, P, args) -> None:
    shared, note = common.cores_shared(P)
    med = {k: common.median([t["flops"] for t in v]) for k, v in got.items() if v}
    rows, gaps = [], []
    for w in workloads:
        for link in links:
            data = med[w, link, "data"]
            for m in modes(P):
                last = got[w, link, m][-1]
                idle, pl = experiments.mean_idle(last["pipeline"]), last["pipeline"]
                theory = pl and pl["bubble_theory"]
                if idle is not None and not m.startswith("model"):
                    gaps += [abs(v - theory) for v in pl["idle"] if v is not None]
                rows.append([w, link, f"{common.median(rates[link]):.0f}", shared, m, f"{med[w, link, m]:.3e}",
                             f"{med[w, link, m] / data:.2f}", "-" if idle is None else f"{100 * idle:.0f} %",
                             "-" if theory is None else f"{100 * theory:.0f} %",
                             f"{(pl['bytes_between_stages'] if pl else 4 * last['weights']) / 1e6:.3g}",
                             f"{last['quality']:.3f}"])
    print(f"\nM = 1, P = {P} on 2 nodes, 1 epoch, PyTorch; medians of {args.runs} round(s); other processes used "
          f"{', '.join(f'{x:.2f}' for x in loads)} cores during the runs")
    print(common.table(["workload", "link", "measured Mbit/s", "ranks share cores", "mode", "FLOPS", "vs data",
                        "idle (mean of stages)", "theory", "MB a step (data: gradients)", "quality"], rows))
    pipe = modes(P)[2]
    if (GOAL_WORKLOAD, GOAL_LINK, pipe) in med:
        ratio = med[GOAL_WORKLOAD, GOAL_LINK, pipe] / med[GOAL_WORKLOAD, GOAL_LINK, "data"]
        print(f"\npipeline / data on {GOAL_LINK}, {GOAL_WORKLOAD}: {ratio:.2f} (goal >= {GOAL_RATIO}:"
              f" {'MET' if ratio >= GOAL_RATIO else 'NOT MET'})")
    if gaps:
        worst = max(gaps)
        print(f"largest gap between a stage's measured idle share and the theory (pipeline, mixed): {100 * worst:.1f}"
              f" points (goal <= {100 * GOAL_POINTS:.0f}: {'MET' if worst <= GOAL_POINTS else 'NOT MET'})")
    print(note)


if __name__ == "__main__":
    main()
