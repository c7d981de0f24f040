"""Where TensorFlow's DeepLabv3+ step spends its time, beside PyTorch's (issue 47, item 4).

bench/frameworks.py measured TensorFlow's deepcam at 0.29 x PyTorch's FLOPS on the same CPU
(the reference DeepLabv3+ at 64 x 96). This profiles one training step of each, the same
model (TensorFlow's deeplab.build, PyTorch's deepcam.DeepLab: the same layers, weights and
Table 3 count), the same shape (B 2 at 64 x 96, 16 channels, 3 classes), the class-weighted
loss of the workload, plain SGD (the optimizer's update is not the question), one intra-op
thread a process (a rank's share when 2 ranks run on 2 cores, as in frameworks.py). Each
framework runs in a child process of its own, alone: STEPS steps warm it up (TensorFlow's
graph optimisation, PyTorch's allocator), then STEPS steps are timed (the median a step),
then STEPS steps are profiled (TensorFlow's profiler, its host plane's op events by op type;
torch.profiler's self CPU time by operator). The table gives each framework's step and its
costliest operators, with their share of the profiled op time.

    .venv/bin/python bench/deepcam_profile.py [--steps 5] [--top 12]      # ~3 min on 2 cores
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from bench.common import PY, ROOT, machine, table, wait_quiet  # noqa: E402

H, W, B = 64, 96, 2

TF_CHILD = r"""
import collections, glob, json, os, statistics, sys, tempfile, time
sys.path.insert(0, sys.argv[1])
steps = int(sys.argv[2])
import tensorflow as tf
tf.config.threading.set_intra_op_parallelism_threads(1)
tf.config.threading.set_inter_op_parallelism_threads(1)
from tensorflow.tsl.profiler.protobuf import xplane_pb2
from harness.frameworks.tensorflow import deepcam, deeplab
tf.keras.utils.set_random_seed(1)
model = deeplab.build(%(H)d, %(W)d, 16, 3)
opt = tf.keras.optimizers.SGD(0.01, momentum=0.9)
x = tf.random.normal((%(B)d, %(H)d, %(W)d, 16))
y = tf.random.uniform((%(B)d, %(H)d, %(W)d), 0, 3, tf.int32)

@tf.function(autograph=False)
def step():
    with tf.GradientTape() as tape:
        loss = tf.reduce_mean(deepcam.loss(y, model(x, training=True)))
    opt.apply_gradients(zip(tape.gradient(loss, model.trainable_variables), model.trainable_variables))
    return loss

for _ in range(steps):
    step().numpy()
times = []
for _ in range(steps):
    t = time.perf_counter(); step().numpy(); times.append(time.perf_counter() - t)
logdir = tempfile.mkdtemp()
tf.profiler.experimental.start(logdir)
for _ in range(steps):
    step().numpy()
tf.profiler.experimental.stop()
space = xplane_pb2.XSpace()
space.ParseFromString(open(glob.glob(os.path.join(logdir, "**", "*.xplane.pb"), recursive=True)[0], "rb").read())
ops = collections.Counter()
for plane in space.planes:
    for line in plane.lines:
        for ev in line.events:
            md = plane.event_metadata[ev.metadata_id]
            if ":" in md.name and md.display_name:      # a TensorFlow op: "scope/name:Type"
                ops[md.display_name] += ev.duration_ps / 1e12 / steps
print(json.dumps({"step": statistics.median(times), "ops": dict(ops)}))
""" % {"H": H, "W": W, "B": B}

TORCH_CHILD = r"""
import json, statistics, sys, time
sys.path.insert(0, sys.argv[1])
steps = int(sys.argv[2])
import torch
torch.set_num_threads(1)
from harness.frameworks.pytorch import deepcam
torch.manual_seed(1)
model = deepcam.DeepLab(16, 3)   # channels first, as the harness trains it on a CPU
opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
x = torch.randn(%(B)d, 16, %(H)d, %(W)d)
y = torch.randint(0, 3, (%(B)d, %(H)d, %(W)d))

def step():
    opt.zero_grad(set_to_none=True)
    loss = deepcam.loss(model(x), y).mean()
    loss.backward()
    opt.step()
    return float(loss)

for _ in range(steps):
    step()
times = []
for _ in range(steps):
    t = time.perf_counter(); step(); times.append(time.perf_counter() - t)
with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
    for _ in range(steps):
        step()
ops = {e.key: e.self_cpu_time_total / 1e6 / steps for e in prof.key_averages()}
print(json.dumps({"step": statistics.median(times), "ops": ops}))
""" % {"H": H, "W": W, "B": B}


def profile(child: str, steps: int) -> dict:
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3", TF_USE_LEGACY_KERAS="1", CUDA_VISIBLE_DEVICES="")
    out = subprocess.run([PY, "-c", child, ROOT, str(steps)], capture_output=True, text=True, env=env)
    if out.returncode:
        sys.exit(f"the profiled child failed:\n{out.stderr[-3000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def rows(name: str, got: dict, top: int) -> list[list]:
    total = sum(got["ops"].values())
    best = sorted(got["ops"].items(), key=lambda kv: -kv[1])[:top]
    head = [[name, f"step {got['step'] * 1e3:.0f} ms", f"profiled ops {total * 1e3:.0f} ms", ""]]
    return head + [["", op, f"{s * 1e3:.1f}", f"{100 * s / total:.1f} %"] for op, s in best]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--top", type=int, default=12)
    args = ap.parse_args()
    load = wait_quiet()
    tf_, torch_ = profile(TF_CHILD, args.steps), profile(TORCH_CHILD, args.steps)
    print(f"DeepLabv3+ (the reference) at {H} x {W}, B {B}, SGD, 1 intra-op thread; {machine()};"
          f" other load before {load:.2f} cores")
    print(table(["framework", "operator", "ms a step", "share"], rows("TensorFlow", tf_, args.top)
                + rows("PyTorch", torch_, args.top)))
    print(f"TensorFlow's step / PyTorch's: {tf_['step'] / torch_['step']:.2f}")


if __name__ == "__main__":
    main()
