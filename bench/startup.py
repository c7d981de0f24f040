"""A run's start-up: the CPU a short run of this tree takes against the same run of a baseline commit.

    .venv/bin/python bench/startup.py [--baseline COMMIT] [--runs 5] [--frameworks tensorflow,pytorch]

One rank (an MPI singleton, no mpirun), digits on the embedded data, one epoch, M = P = 1, no
micro-kernels, one evaluation: a run that is almost all start-up (imports, MPI, the model's first
trace, the report and its charts). The baseline is checked out beside the tree (`git worktree`,
removed at the end) and run by the same venv, so only the harness's code differs. The two trees
alternate, RUNS times each per framework; the figure is the run's CPU (user + system of the
process and its children, rusage), less sensitive to this shared guest's speed than its wall time.
"""
import argparse
import os
import subprocess
import tempfile
import time

import common


def one(tree: str, dat: str) -> tuple[float, float]:
    """(CPU seconds, wall seconds) of hpcai500.py of `tree` on `dat`; a failed run stops the bench."""
    common.wait_quiet()
    c0, t0 = common.children_seconds(), time.monotonic()
    p = subprocess.run([common.PY, os.path.join(tree, "hpcai500.py"), dat], cwd=tree, env=common.ENV,
                       capture_output=True, text=True)
    wall, cpu = time.monotonic() - t0, common.children_seconds() - c0
    if p.returncode:
        raise SystemExit(f"bench/startup.py: {tree} exited {p.returncode}:\n{p.stderr[-2000:]}")
    return cpu, wall


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--baseline", default="HEAD~1", help="the commit to compare with (default HEAD~1)")
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--frameworks", default="tensorflow,pytorch")
    args = ap.parse_args()
    print(f"machine: {common.machine()}")
    base = tempfile.mkdtemp(prefix="hpcai500-baseline-")
    subprocess.run(["git", "worktree", "add", "--detach", base, args.baseline], cwd=common.ROOT, check=True,
                   capture_output=True)
    rows = []
    try:
        for fw in args.frameworks.split(","):
            dat = common.make_dat(f"startup-{fw}", l9=1, l10=1, l11=1, l15=1, l30=0, l31=0, l35=fw)
            got = {"this tree": [], args.baseline: []}
            for _ in range(args.runs):     # alternated: the machine's drift falls on both alike
                got["this tree"].append(one(common.ROOT, dat))
                got[args.baseline].append(one(base, dat))
            cpu = {k: common.median([c for c, _ in v]) for k, v in got.items()}
            for k, v in got.items():
                cs = [c for c, _ in v]
                rows.append([fw, k, f"{cpu[k]:.2f}", f"{min(cs):.2f}-{max(cs):.2f}",
                             f"{common.median([w for _, w in v]):.2f}",
                             f"{cpu[k] / cpu[args.baseline]:.2f}"])
    finally:
        subprocess.run(["git", "worktree", "remove", "--force", base], cwd=common.ROOT, capture_output=True)
    print(f"\n1 rank, digits, 1 epoch, no micro-kernels; {args.runs} alternated runs of each tree:")
    print(common.table(["framework", "tree", "CPU s (median)", "CPU s (range)", "wall s (median)",
                        "CPU against the baseline"], rows))


if __name__ == "__main__":
    main()
