"""Sampler and staging cost at ImageNet scale (1 281 167 training samples, DESIGN.md §14).

Part 1, one process: the Data Sampler's pure steps for one base model, against a plain
shuffle of the same N (which any data-parallel run pays) as the baseline.
Part 2, under mpirun (2 ranks = 2 base models, M=2 P=1): the real `sampler.distribute`
and `staging.stage` of digits-format samples (8x8 float32, 256 B each: 328 MB of
training data), against writing and reading the same bytes as one raw numpy file.

    .venv/bin/python bench/staging.py            # ~2 min here; launches mpirun itself
"""
from __future__ import annotations

import json
import os
import shutil
import sys
import time

import numpy as np

import common  # noqa: E402 - bench/ is the script's folder

sys.path.insert(0, common.ROOT)  # the harness

N = 1_281_167          # ImageNet-1k training images
SIDE = 8               # digits-format samples: the copy moves N x SIDE^2 x 4 bytes
STAGE = os.path.join(common.WORK, "stage")


def _time(fn, repeat: int = 3) -> float:
    best = float("inf")
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t0)
    return best


def part1() -> list[list]:
    from harness import sampler, staging
    idx = sampler.resample(N, "bootstrap", 42, 0)
    base = _time(lambda: np.random.default_rng(0).permutation(N))
    rows = [["shuffle of N (baseline)", f"{base:.3f}", "1.00"]]
    steps = {
        "resample bootstrap": lambda: sampler.resample(N, "bootstrap", 42, 0),
        "resample poisson": lambda: sampler.resample(N, "poisson", 42, 0),
        "digest (SHA-256)": lambda: sampler.digest(idx),
        "out-of-bag fraction": lambda: sampler.out_of_bag_fraction(idx, N),
        "epoch shard (P=64, B=128)": lambda: sampler.epoch_shard(idx, 42, 0, 0, 5, 64, 128),
        "staging plan (unique + renumber)": lambda: staging.renumber(staging.union([idx]), idx),
    }
    for name, fn in steps.items():
        s = _time(fn)
        rows.append([name, f"{s:.3f}", f"{s / base:.2f}"])
    return rows


def part2_rank() -> None:
    """Runs on every rank under mpirun: one base model per rank."""
    from mpi4py import MPI

    from harness import sampler, staging, topology
    from harness.workloads import Data, digits
    world = MPI.COMM_WORLD
    job = world.Split(world.rank, 0)
    rng = np.random.default_rng(world.rank)
    x = rng.random((N, SIDE, SIDE, 1), dtype=np.float32)
    y = rng.integers(0, 10, N)
    data = Data(x, y, x[:50_000], y[:50_000], 10, "bench")
    world.Barrier()
    t0 = time.perf_counter()
    idx = sampler.distribute(world, [[r] for r in range(world.size)], N, "bootstrap", 42, job, world.rank)
    dist = time.perf_counter() - t0
    node = topology.node_comm(world)   # one node here: one copy, the union of the ranks' resamples
    copy = staging.stage(digits, data, idx, world.rank, node, STAGE, staging.folder(STAGE, "bench", 1, 0, 0))
    node.Free()
    world.Barrier()
    t1 = time.perf_counter()                     # baseline: the same samples as raw .npz
    raw = os.path.join(STAGE, f"raw-{world.rank}.npz")
    np.savez(raw, x=x[np.unique(idx)], y=y[np.unique(idx)], x_val=data.x_val, y_val=data.y_val)
    with np.load(raw) as f:
        [f[k] for k in f.files]
    world.Barrier()
    raw_s = time.perf_counter() - t1
    os.unlink(raw)
    staging.cleanup(copy, keep=False)
    out = world.gather({"distribute": dist, "stage": copy.seconds, "bytes": copy.bytes,
                        "samples": copy.samples, "raw": raw_s}, root=0)
    if world.rank == 0:
        print(json.dumps(out))


def part2() -> tuple[list[list], float]:
    os.makedirs(STAGE, exist_ok=True)
    stdout, other = common.mpirun(os.path.abspath(__file__), "--rank")
    per_rank = json.loads(stdout.strip().splitlines()[-1])
    shutil.rmtree(STAGE, ignore_errors=True)
    rows = []
    for r, d in enumerate(per_rank):
        mb = d["bytes"] / 1e6
        rows.append([r, d["samples"], f"{mb:.0f}", f"{d['distribute']:.3f}", f"{d['stage']:.2f}",
                     f"{mb / d['stage']:.0f}", f"{d['raw']:.2f}", f"{d['stage'] / d['raw']:.2f}"])
    return rows, other


def main() -> None:
    if "--rank" in sys.argv:
        part2_rank()
        return
    print(f"Machine: {common.machine()}; N = {N} training samples\n")
    print("Part 1: Data Sampler steps for one base model (best of 3)\n")
    print(common.table(["step", "seconds", "x shuffle"], part1()))
    rows, other = part2()
    print(f"\nPart 2: distribute + stage under mpirun, {common.NP} base models (one per rank), "
          f"{SIDE}x{SIDE} float32 samples, to {STAGE}; other load {other:.2f} cores\n")
    print(common.table(["rank", "distinct samples", "MB written", "distribute s", "stage s (write+read)",
                        "MB/s", "raw npz s (same samples)", "stage / raw"], rows))


if __name__ == "__main__":
    main()
