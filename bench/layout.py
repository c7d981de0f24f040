"""PyTorch on CPUs: the 2-D models channels-last (as train.build lays them out on a GPU,
and on a CPU where a model's module sets CPU_CHANNELS_LAST) against channels-first,
training step for step: what each module's CPU_CHANNELS_LAST rests on.

    .venv/bin/python bench/layout.py [--runs 5] [--threads 1,2]

One process a thread count (its intra-op threads, as setup_devices gives a rank), a
one-rank Gloo group and DistributedDataParallel, as a P = 1 job trains. Each case's two
layouts train the same model module (the harness's own) on the same in-memory batches
(the feed is not measured here), each batch made by models.channels_first:
`channels-first`, the model as built and the batch's canonical NCHW strides;
`channels-last`, the model through train.channels_last and the batch NHWC in memory.
Rounds alternate the layouts' order; a round is one timed pass over the batches of each
(after one untimed pass: oneDNN's first-call work). Per case: the median ms a step of each layout over
the rounds and channels-last's speed over channels-first's (> 1: faster). Cases: digits
(embedded, B 32), ic64 (ResNet-50 v1.5 at 64 px, B 16), deepcam (DeepLabv3+ at 64 x 96,
16 channels, B 2); cosmoflow's 3-D model has no channels-last layout.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import time

import common

CASES = {"digits": ((32, 8, 8, 1), 10, 50), "ic64": ((16, 64, 64, 3), 1000, 3), "deepcam": ((2, 64, 96, 16), 3, 3)}
LAYOUTS = ("channels-first", "channels-last")


def _model(case: str):
    from harness.frameworks.pytorch import deepcam, digits, ic
    from harness.workloads import Dataset
    from harness.workloads import digits as digits_data
    if case == "digits":
        return digits, digits.build_model(digits_data.load(Dataset.parse("embedded"), ""))
    if case == "ic64":
        return ic, ic.resnet_v1_5(1000, *ic.ic.shape())
    return deepcam, deepcam.build_model(None)


def _trainer(case: str, layout: str, xs, ys):
    """One timed pass over the batches: a function of no argument, returning seconds."""
    import torch
    from harness.frameworks.pytorch import models, train
    torch.manual_seed(0)
    module, model = _model(case)
    last = layout == "channels-last"
    model = train.channels_last(model) if last else model
    batches = [models.channels_first(x, "cpu", cpu_channels_last=last) for x in xs]
    ddp = torch.nn.parallel.DistributedDataParallel(model)
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)

    def one_pass() -> float:
        start = time.perf_counter()
        for x, y in zip(batches, ys):
            opt.zero_grad(set_to_none=True)
            module.loss(ddp(x), y).mean().backward()
            opt.step()
        return time.perf_counter() - start
    one_pass()    # warm-up: oneDNN's first-call work
    return one_pass


def child(threads: int, runs: int, cases: list[str]) -> None:
    """The figures of one thread count, as JSON on the last line: {case: {layout: [s/step]}}."""
    import numpy as np
    import torch
    import torch.distributed as dist
    torch.set_num_threads(threads)
    torch.set_num_interop_threads(1)
    store = tempfile.mktemp(prefix="layout-store-")
    dist.init_process_group("gloo", store=dist.FileStore(store, 1), rank=0, world_size=1)
    rng = np.random.default_rng(0)
    out = {}
    for case in cases:
        shape, classes, steps = CASES[case]
        xs = [rng.random(shape, np.float32) for _ in range(steps)]
        label = shape[:1] if case != "deepcam" else shape[:3]     # deepcam: a class a pixel
        ys = [torch.from_numpy(rng.integers(0, classes, label)) for _ in range(steps)]
        passes = {layout: _trainer(case, layout, xs, ys) for layout in LAYOUTS}
        out[case] = {layout: [] for layout in LAYOUTS}
        for r in range(runs):
            for layout in (LAYOUTS if r % 2 == 0 else LAYOUTS[::-1]):
                out[case][layout].append(passes[layout]() / steps)
    dist.destroy_process_group()
    os.unlink(store)
    print(json.dumps(out), flush=True)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=5, help="alternated rounds (default 5)")
    ap.add_argument("--threads", default="1,2", help="intra-op thread counts, comma-separated (default 1,2)")
    ap.add_argument("--cases", default=",".join(CASES), help=f"comma-separated, of {', '.join(CASES)}")
    ap.add_argument("--child", type=int, help=argparse.SUPPRESS)
    args = ap.parse_args()
    cases = args.cases.split(",")
    if args.child:
        return child(args.child, args.runs, cases)
    print(f"machine: {common.machine().rsplit(', ', 1)[0]}, 1 process at a time")
    rows = []
    for threads in (int(t) for t in args.threads.split(",")):
        # no launcher: one plain process; common.mpirun waits for quiet and gauges the other load
        out, other = common.mpirun("bench/layout.py", "--child", str(threads), "--runs", str(args.runs),
                                   "--cases", args.cases, launcher=[])
        got = json.loads(out.strip().splitlines()[-1])
        for case in cases:
            first, last = (statistics.median(got[case][layout]) for layout in LAYOUTS)
            ratios = sorted(f / s for f, s in zip(got[case]["channels-first"], got[case]["channels-last"]))
            rows.append([case, threads, f"{first * 1e3:.2f}", f"{last * 1e3:.2f}", f"{first / last:.3f}",
                         f"{ratios[0]:.3f}-{ratios[-1]:.3f}", f"{other:.2f}"])
    print(common.table(["case", "threads", "channels-first ms/step", "channels-last ms/step",
                        "last / first speed", "per-round range", "other load (cores)"], rows))


if __name__ == "__main__":
    main()
