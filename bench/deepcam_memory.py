"""How much memory a rank needs to train DeepCAM (the reference model) at 768 x 1152.

The reference DeepLabv3+ (TensorFlow's deepcam.build_model, no test-only setting) trains a few steps
(LAMB, as the reference; fp32) in a fresh process for each (height, width, B), and the
process's peak resident memory (ru_maxrss) is read. Memory grows with the pixels a step
holds (B x H x W: activations and their gradients) over a fixed part (weights, their
gradients and LAMB's two slots, TensorFlow itself), so a least-squares line through the
small sizes, peak = fixed + per_pixel x B x H x W, is extrapolated to 768 x 1152 at B = 1
and 2, printed beside a bound from above: 4 bytes x (every layer's output x 2, as if
each were kept for the backward pass with its gradient, + weights x 4: values,
gradients, LAMB's 2 slots); TensorFlow keeps fewer (a ReLU or batch norm reuses or
recomputes), so the measured figure is lower.

    .venv/bin/python bench/deepcam_memory.py            # ~3 min on 2 cores
    .venv/bin/python bench/deepcam_memory.py --sizes 64x96 128x192 --batches 1 2 --steps 3
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from bench.common import fit, machine, table  # noqa: E402

REFERENCE = (768, 1152)

CHILD = r"""
import json, os, resource, sys
os.environ["TF_USE_LEGACY_KERAS"] = "1"
import numpy as np, tensorflow as tf
sys.path.insert(0, sys.argv[1])
from harness.frameworks.tensorflow import deepcam, deeplab, flops, optimizers
h, w, b, steps = map(int, sys.argv[2:6])
model = deeplab.build(h, w, 16, 3)
opt = optimizers.make("lamb", 1e-3)
x = tf.random.normal((b, h, w, 16))
y = tf.random.uniform((b, h, w), 0, 3, tf.int32)

@tf.function
def step():
    with tf.GradientTape() as tape:
        loss = tf.reduce_mean(deepcam.loss(y, model(x, training=True)))
    opt.apply_gradients(zip(tape.gradient(loss, model.trainable_variables), model.trainable_variables))
    return loss

for _ in range(steps):
    step().numpy()
count = flops.count(model)
print(json.dumps({"peak": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,
                  "activations": count.activations, "weights": count.weights}))
"""


def measure(root: str, h: int, w: int, b: int, steps: int) -> dict:
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3", CUDA_VISIBLE_DEVICES="")
    out = subprocess.run([sys.executable, "-c", CHILD, root, str(h), str(w), str(b), str(steps)],
                         capture_output=True, text=True, env=env, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sizes", nargs="+", default=["64x96", "128x192", "192x288"])
    ap.add_argument("--batches", nargs="+", type=int, default=[1, 2])
    ap.add_argument("--steps", type=int, default=2)
    args = ap.parse_args()
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    rows, points = [], []
    for size in args.sizes:
        h, w = map(int, size.split("x"))
        for b in args.batches:
            m = measure(root, h, w, b, args.steps)
            # the per-sample activations scale with the pixels exactly: any measured size gives them
            act_per_pixel, weights = m["activations"] / (h * w), m["weights"]
            pixels = b * h * w
            points.append((pixels, m["peak"]))
            rows.append([f"{h} x {w}", b, f"{pixels:,}", f"{m['peak'] / 2**30:.2f}"])
    fixed, per_pixel = fit(*zip(*points))
    for b in (1, 2):
        pixels = b * REFERENCE[0] * REFERENCE[1]
        kept = 4 * (2 * act_per_pixel * pixels + 4 * weights)
        rows.append([f"{REFERENCE[0]} x {REFERENCE[1]} (extrapolated)", b, f"{pixels:,}",
                     f"{(fixed + per_pixel * pixels) / 2**30:.1f} (all outputs kept: {kept / 2**30:.1f})"])
    print(f"# deepcam memory, {machine().rsplit(', ', 1)[0]}, one process")
    print(f"# fit: peak = {fixed / 2**30:.2f} GiB + {per_pixel:.0f} bytes x B x H x W")
    print(table(["size", "B", "pixels a step", "peak RSS GiB"], rows))


if __name__ == "__main__":
    main()
