"""The control plane against world size (issue 15): what start-up, the sampler's
distribution, staging, the ensemble's reduction, gathering and writing the results, and
rank 0's memory cost at W ranks, measured at W = 1..16 here and modelled at 64, 1,024
and 4,096 ranks for ImageNet-sized data.

    .venv/bin/python bench/scale.py [--ranks 1 2 4 8 16] [--runs 3] [--model-only]

Part 1 runs hpcai500.py at each W with M = W base models of P = 1 (the most jobs a world
holds, so every per-job cost is at its largest), the tiniest workload (digits, embedded,
1 epoch, B 32, micro-kernels off, one evaluation at the end) staged to a /tmp directory,
the W alternated over rounds; each figure is what the harness records in results.json
(no timing of our own): environment.startup_seconds, sampler_seconds, staging.seconds,
reduce_seconds, gather_seconds, write_seconds, rank0_peak_rss_bytes. Medians over runs
with min-max. The medians are kept in $TMPDIR/hpcai500-bench/scale.json for part 2.

Part 2 (`model`, pure) predicts each cost from the code's complexity (bench/README.md,
"scale.py", gives the formulas and assumptions), with constants measured here
(resample draws at N = 1,281,167, SHA-256 and numpy summing rates, ResNet-50's per-rank
record) or fitted to part 1 (per-rank and per-job slopes).
"""
from __future__ import annotations

import argparse
import json
import math
import os
import pickle
import sys
import time
from dataclasses import dataclass

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from bench import common  # noqa: E402

CACHE = os.path.join(common.WORK, "scale.json")
PHASES = ("startup", "sampler", "staging", "reduce", "gather", "write", "rss", "json")


# ---- part 1: measured ------------------------------------------------------------

def figures(rec: dict, size: int) -> dict:
    """One run's control-plane figures (s, bytes) from its results.json."""
    (t,) = rec["tests"]
    return {"startup": rec["environment"]["startup_seconds"]["max"], "sampler": t["sampler_seconds"],
            "staging": t["staging"]["seconds"], "reduce": t["reduce_seconds"], "gather": t["gather_seconds"],
            "write": rec["write_seconds"][0], "rss": t["rank0_peak_rss_bytes"], "json": size}


def measure(ranks: list[int], runs: int) -> dict:
    stage = os.path.join(common.WORK, "stage-scale")
    out = {w: {"runs": [], "load": []} for w in ranks}
    for r in range(runs):
        for w in ranks:     # alternated: slow drift of the machine spreads over every W
            dat = common.make_dat(f"scale-{w}", l9=1, l10=w, l11=1, l14=32, l15=1, l28=stage, l30=0, l31=0)
            (rec, size), load = common.quietest(lambda: _run(dat, w))
            out[w]["runs"].append(figures(rec, size))
            out[w]["load"].append(load)
            print(f"round {r + 1} W={w}: other load {load:.2f}", file=sys.stderr, flush=True)
    return out


def _run(dat: str, w: int):
    """((results.json, its size), other load): common.quietest's shape."""
    rec, load, size = common.run_record(dat, w)
    return (rec, size), load


def summary(measured: dict) -> dict:
    """W -> phase -> (median, min, max); and the runs' other load."""
    return {int(w): {**{p: (common.median([x[p] for x in m["runs"]]), min(x[p] for x in m["runs"]),
                             max(x[p] for x in m["runs"])) for p in PHASES},
                     "load": (common.median(m["load"]), max(m["load"])), "n": len(m["runs"])}
            for w, m in measured.items()}


def measured_table(s: dict) -> str:
    ms = lambda v: f"{v[0] * 1e3:.1f} ({v[1] * 1e3:.1f}-{v[2] * 1e3:.1f})"   # noqa: E731
    sec = lambda v: f"{v[0]:.2f} ({v[1]:.2f}-{v[2]:.2f})"                    # noqa: E731
    rows = [[w, sec(f["startup"]), ms(f["sampler"]), ms(f["staging"]), ms(f["reduce"]), ms(f["gather"]),
             ms(f["write"]), f"{f['rss'][0] / 2**30:.2f} ({f['rss'][1] / 2**30:.2f}-{f['rss'][2] / 2**30:.2f})",
             f"{f['json'][0] / 1024:.0f}", f"{f['load'][0]:.2f} (max {f['load'][1]:.2f})", f["n"]]
            for w, f in sorted(s.items())]
    return common.table(["W = M", "start-up s", "sampler ms", "staging ms", "reduce ms", "gather ms", "write ms",
                         "rank 0 peak GiB", "results.json KiB", "other load", "runs"], rows)


# ---- part 2: the model -------------------------------------------------------------

@dataclass(frozen=True)
class Data:
    """ImageNet as ic trains it; ResNet-50."""
    n: int = 1_281_167              # training samples
    n_val: int = 50_000             # validation samples
    classes: int = 1_000            # score width of the mean/vote reduction
    params: int = 25_610_152        # ResNet-50's trainable parameters (harness/frameworks/tensorflow/resnet.py)
    sample_bytes: float = 110e3     # bytes, a TFRecord'ed JPEG (ImageNet's ~140 GB / N)


@dataclass(frozen=True)
class Machine:
    """Assumptions about the large machine (bench/README.md says why these)."""
    ranks_per_node: int = 8         # one rank per GPU
    net: float = 10e9               # bytes/s, one rank's injection bandwidth (HDR InfiniBand, effective)
    latency: float = 5e-6           # s, one message
    disk: float = 3e9               # bytes/s, node-local NVMe write (and read back)
    fs: float = 1e12                # bytes/s, the shared file system's aggregate read
    create: float = 1e-3            # s, creating a small file on the shared file system (rank 0's results)
    in_flight: int = 4              # harness/sampler.IN_FLIGHT


@dataclass(frozen=True)
class Constants:
    """Measured on this machine (in-process) or fitted to part 1."""
    draw_bootstrap: float           # s, sampler.resample(N, bootstrap)
    draw_poisson: float             # s, sampler.resample(N, poisson)
    sha256: float                   # bytes/s
    add: float                      # bytes/s, numpy a += b of float64 (the reduction's sum)
    record_bytes: int               # pickled FlopCount of ResNet-50: the largest part of a rank's record
    record_objects: int             # bytes of Python objects it unpickles to on rank 0
    unpickle: float                 # s, unpickling one such record
    startup_1: float                # s, start-up of 1 rank with its own core (part 1, W = 1)
    gather_0: float                 # s, gather + measure at W = 1 (part 1)
    mllog_file: float               # s, files.atomic_write of one MLLOG file (write, fsync, rename) here
    json_per_byte: float            # s, files.write_json per byte of results.json here
    json_per_rank: float            # bytes of results.json per rank (M = W, part 1 fit)
    reduce_0: float                 # s, the reduction's small-W cost (part 1, median at W = 1)


def model(W: int, c: Constants, d: Data = Data(), m: Machine = Machine(), P: int = 1) -> dict:
    """Predicted control-plane costs at W ranks, M = W / P jobs (s, or bytes for memory)."""
    M = W // P
    idx = 8 * d.n                                            # one resample, int64
    scores = 8 * d.n_val * d.classes                         # the reduced (n_val, classes) float64 matrix
    jobs_per_node = max(1, m.ranks_per_node // P)
    nodes = math.ceil(W / m.ranks_per_node)
    # a node copies the union of its j jobs' bootstrap resamples: a sample is missed by all
    # j draws of N with probability (1 - 1/N)^(jN), so 1 - e^-j of N (0.632 at j = 1,
    # 0.9997 at 8), plus the validation set once
    distinct = 1 - (1 - 1 / d.n) ** (jobs_per_node * d.n)
    copy = (distinct * d.n + d.n_val) * d.sample_bytes       # one node's staged copy
    send = idx / m.net
    sampler = {s: M * max(t, send) + min(t, send) for s, t in (("bootstrap", c.draw_bootstrap),
                                                                 ("poisson", c.draw_poisson))}
    steps = math.ceil(math.log2(W)) if W > 1 else 0
    return {
        "startup": c.startup_1 + 4 * (steps * m.latency + W * 100 / m.net),   # 4 small allgathers of ~100 B
        "sampler_bootstrap": sampler["bootstrap"], "sampler_poisson": sampler["poisson"],
        "staging": max(copy * 2 / m.disk, nodes * copy / m.fs),  # the node's write + read back; or the FS
        "staging_fs_bytes": nodes * copy, "staging_node_bytes": copy,
        "reduce": c.reduce_0 + steps * (scores / m.net + scores / c.add),    # per evaluation, binomial tree
        "gather": c.gather_0 + W * (c.record_bytes / m.net + c.unpickle),
        "write": W * c.json_per_rank * c.json_per_byte + M * (c.mllog_file + m.create),
        "json_bytes": W * c.json_per_rank,
        "digest": 8 * d.params / c.sha256 + (math.ceil(math.log2(P)) if P > 1 else 0) * 8 * d.params / m.net,
        "rank0_bytes": (m.in_flight + 1) * idx + 4.5 * scores + W * c.record_objects,
    }


def constants(s: dict) -> Constants:
    import hashlib

    import numpy as np

    from harness import sampler
    best = lambda f: min(_timed(f) for _ in range(3))   # noqa: E731
    n = Data().n
    buf = np.ones(Data().n_val * Data().classes)
    a, b = buf.copy(), buf.copy()
    blob = b"\0" * (8 * Data().params)
    rec = _resnet_record()
    ws = sorted(s)
    _, j1 = common.fit(ws, [s[w]["json"][0] for w in ws])
    mllog_file, json_per_byte = _writes()
    return Constants(
        draw_bootstrap=best(lambda: sampler.resample(n, "bootstrap", 42, 0)),
        draw_poisson=best(lambda: sampler.resample(n, "poisson", 42, 0)),
        sha256=len(blob) / best(lambda: hashlib.sha256(blob).digest()),
        add=a.nbytes / best(lambda: np.add(a, b, out=a)),
        record_bytes=len(rec), record_objects=_objects(rec), unpickle=best(lambda: pickle.loads(rec)),
        startup_1=s[min(ws)]["startup"][0], gather_0=s[min(ws)]["gather"][0], mllog_file=mllog_file,
        json_per_byte=json_per_byte, json_per_rank=max(0.0, j1), reduce_0=s[min(ws)]["reduce"][0])


def _writes() -> tuple[float, float]:
    """rank 0's writing, timed in-process with the harness's own writers (under mpirun the
    other ranks busy-poll on the same 2 cores and slow it W/2-fold): one MLLOG file
    (the largest run's first) and its results.json, each written as Output.add does."""
    import glob

    from harness import files
    largest = max(glob.glob(os.path.join(common.WORK, "*", "results.json")), key=os.path.getsize)
    folder = os.path.dirname(largest)
    with open(largest) as f:
        rec = json.load(f)
    with open(sorted(glob.glob(os.path.join(folder, "mllog", "*.log")))[0]) as f:
        log = f.read()
    scratch = os.path.join(common.WORK, "scale-writes")
    os.makedirs(scratch, exist_ok=True)
    per_file = min(_timed(lambda: [files.atomic_write(os.path.join(scratch, f"{i}.log"), log) for i in range(50)])
                   for _ in range(3)) / 50
    per_byte = min(_timed(lambda: files.write_json(os.path.join(scratch, "results.json"), rec))
                   for _ in range(3)) / os.path.getsize(largest)
    return per_file, per_byte


def _timed(f) -> float:
    t0 = time.perf_counter()
    f()
    return time.perf_counter() - t0


def _resnet_record() -> bytes:
    """What every training rank sends rank 0 at the end of a test, for ResNet-50, minus the
    few hundred bytes of figures: its FLOP count with the layer records (harness/run.py)."""
    os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    from harness.frameworks.tensorflow import flops
    from harness.errors import native_stderr_captured
    with native_stderr_captured():     # TensorFlow's start-up banners
        from harness.frameworks.tensorflow import resnet
        return pickle.dumps(flops.count(resnet.build((224, 224, 3), Data().classes)))


def _objects(blob: bytes) -> int:
    import tracemalloc
    tracemalloc.start()
    kept = [pickle.loads(blob) for _ in range(10)]
    size = tracemalloc.get_traced_memory()[0] // len(kept)
    tracemalloc.stop()
    return size


def model_table(c: Constants, scales=(64, 1024, 4096)) -> str:
    preds = {w: model(w, c) for w in scales}
    s = lambda k: [f"{preds[w][k]:.3g}" for w in scales]                 # noqa: E731
    gb = lambda k: [f"{preds[w][k] / 1e9:.3g}" for w in scales]          # noqa: E731
    rows = [["start-up (s; a rank's own, import storm not modelled)", *s("startup")],
            ["sampler distribution, bootstrap (s, rank 0, serial in M)", *s("sampler_bootstrap")],
            ["sampler distribution, poisson (s)", *s("sampler_poisson")],
            ["staging (s: node disk or shared FS, the slower)", *s("staging")],
            ["staging: a node's copy (GB, on its disk)", *gb("staging_node_bytes")],
            ["staging: shared-FS read (TB)", *[f"{preds[w]['staging_fs_bytes'] / 1e12:.3g}" for w in scales]],
            ["ensemble reduction, per evaluation (s)", *s("reduce")],
            ["result gathering + measure (s)", *s("gather")],
            ["writing a test's results (s)", *s("write")],
            ["results.json per test (MB)", *[f"{preds[w]['json_bytes'] / 1e6:.3g}" for w in scales]],
            ["weight digest + consistency, per job (s)", *s("digest")],
            ["rank 0 control-plane memory beyond training (GB)", *gb("rank0_bytes")]]
    return common.table(["cost (ImageNet, ResNet-50, M = W, P = 1)", *[f"W = {w:,}" for w in scales]], rows)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ranks", type=int, nargs="+", default=[1, 2, 4, 8, 16])
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--tries", type=int, default=common.TRIES, help="runs of a W when others load the machine")
    ap.add_argument("--model-only", action="store_true", help="reuse the last measurement (scale.json)")
    args = ap.parse_args()
    common.TRIES = args.tries
    if args.model_only:
        with open(CACHE) as f:
            s = {int(k): v for k, v in json.load(f).items()}
    else:
        s = summary(measure(args.ranks, args.runs))
        os.makedirs(common.WORK, exist_ok=True)
        with open(CACHE, "w") as f:
            json.dump(s, f)
    print(f"bench/scale.py, {time.strftime('%Y-%m-%d %H:%M')}, {common.machine().replace(f', {common.NP} MPI ranks', '')}"
          f", mpirun --oversubscribe: W ranks share these cores")
    print("\nMeasured (digits, embedded, 1 epoch, B 32, M = W, P = 1, staged to /tmp; median (min-max) of the runs)\n")
    print(measured_table(s))
    c = constants(s)
    print("\nConstants: " + ", ".join(f"{k} {v:.4g}" for k, v in vars(c).items()))
    print("\nModel (bench/README.md, scale.py: formulas and assumptions)\n")
    print(model_table(c))


if __name__ == "__main__":
    main()
