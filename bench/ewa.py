"""ewa (Faster-RCNN) throughput: the harness against a bare Horovod loop, the feed, and
the gradient all-reduce's share of a step at P = 2.

    .venv/bin/python bench/ewa.py [--side 96] [--batch 4] [--backbone small|resnet50] [--patience 120]

All on 2 ranks, synthetic ewa data (published layout, SAMPLES images of SIDE x 1.5 SIDE),
M=1, P=2, per-rank batch B:
* harness: hpcai500.py, EPOCHS epochs; samples_trained / train_seconds (results.json);
* bare Horovod loop (bench/bare_ewa.py), the same model, batch and ranks:
  --feed numpy  (h5py reads per step, as the harness), --feed tfdata (the same reads
  through tf.data.Dataset.from_generator + prefetch), --feed tensors (no reading);
* bare loop without the all-reduce (plain GradientTape): the all-reduce's share of a
  step = 1 - step time without / step time with, both --feed tensors.
Runs alternate, RUNS rounds; medians reported.
"""
import argparse
import json
import os

import common

RUNS, SAMPLES, EPOCHS = 3, 400, 3


def bare(steps, batch, side, backbone, *flags):
    args = ["bench/bare_ewa.py", "--steps", str(steps), "--batch", str(batch), "--samples", str(SAMPLES),
            "--side", str(side), "--cache", os.path.join(common.WORK, ".data"), *flags]
    if backbone:
        args += ["--backbone", backbone]
    out, load = common.quietest(lambda: common.mpirun(*args))
    return json.loads(out.strip().splitlines()[-1]), load


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--side", type=int, default=96)
    p.add_argument("--batch", type=int, default=4)
    p.add_argument("--backbone", default=None, help="small or resnet50 (default: by image size)")
    p.add_argument("--patience", type=float, default=120.0,
                   help="seconds to wait for a quiet machine before each run (common.wait_quiet)")
    a = p.parse_args()
    quiet = common.wait_quiet
    common.wait_quiet = lambda: quiet(patience=a.patience)
    if a.backbone:
        common.ENV["HPCAI500_EWA_BACKBONE"] = a.backbone
    print(f"machine: {common.machine()}")
    dataset = f"synthetic:{SAMPLES}:{a.side}"
    dat = common.make_dat("ewa", l7="ewa", l8=dataset, l9=1, l10=1, l11=2, l13=1, l14=a.batch,
                          l15=EPOCHS, l19=0.01, l30=0)
    rows, figures = [], {}
    backbone, grad_mb = "?", 0.0

    def add(what, samples_per_s, steps, seconds, load, extra=""):
        figures.setdefault(what, []).append(samples_per_s)
        rows.append([len(figures[what]), what, steps, f"{seconds:.2f}", f"{samples_per_s:.2f}", f"{load:.2f}", extra])

    steps = None
    for _ in range(RUNS):
        (t,), load = common.quietest(lambda: common.run_harness(dat))
        steps = t["steps_per_epoch"][0] * EPOCHS
        add("harness", common.throughput(t), steps, t["train_seconds"], load, "first step timed (traced only before)")
        for feed in ("numpy", "tfdata", "tensors"):
            r, load = bare(steps, a.batch, a.side, a.backbone, "--feed", feed)
            add(f"bare, feed {feed}", r["samples_per_s"], r["steps"], r["seconds"], load,
                f"first step {r['first_step_s']:.2f} s (not timed)")
        r, load = bare(steps, a.batch, a.side, a.backbone, "--feed", "tensors", "--no-allreduce")
        add("bare, no all-reduce", r["samples_per_s"], r["steps"], r["seconds"], load)
        backbone, grad_mb = r["backbone"], r["gradient_bytes"] / 1e6

    print(f"\nper run (M=1, P=2, B={a.batch}, {dataset}, backbone {backbone}, {grad_mb:.1f} MB of "
          f"gradients; other load = cores used by other processes during the run):")
    print(common.table(["run", "what", "steps", "seconds", "samples/s", "other load", "note"], rows))
    med = {k: common.median(v) for k, v in figures.items()}
    print()
    print(common.table(["what", "samples/s (median)", "/ bare numpy feed"],
                       [[k, f"{v:.2f}", f"{v / med['bare, feed numpy']:.3f}"] for k, v in med.items()]))
    share = 1 - med["bare, feed tensors"] / med["bare, no all-reduce"]
    print(f"\nall-reduce share of a P=2 step (bare loop, tensors): {100 * share:.1f} % "
          f"(step {a.batch * 2 / med['bare, feed tensors'] * 1e3:.0f} ms with, "
          f"{a.batch * 2 / med['bare, no all-reduce'] * 1e3:.0f} ms without)")
    print(f"harness / bare (numpy feed) = {med['harness'] / med['bare, feed numpy']:.3f}; "
          f"tf.data prefetch / numpy feed = {med['bare, feed tfdata'] / med['bare, feed numpy']:.3f}")


if __name__ == "__main__":
    main()
