"""The harness against its peers: a bare Horovod loop, measured the way Horovod's own
TensorFlow 2 synthetic benchmark measures (batches held in memory, warm-up batches,
then timed iterations), for ic at 224 and 64 px, for ewa (small backbone, and the
reference's ResNet-50 trunk: ewa-r50) and for deepcam (the reference model at 64 x 96),
on 1 and 2 ranks; then
bagging's weak scaling and bagging against data parallelism (bench/scaling.py).

    .venv/bin/python bench/peers.py [--runs 3] [--cases ic224,ic64,ewa,ewa-r50,deepcam] [--ranks 1,2] [--no-scaling]
    mpirun -np 2 .venv/bin/python bench/peers.py --bare ic64 --steps 8 [--feed]   # the bare loop alone

Per case and rank count R (layout M = 1, P = R; every figure samples/s, so a ratio is
also the ratio of the two Tflops, the model and its FLOP count being the same):
* harness: hpcai500.py on a copy of HPCAI500.dat. Whole run = samples_trained /
  train_seconds from results.json: the report's FLOPS basis (max over ranks, reading,
  decoding and augmenting inside the clock, warm-up outside). Steady state = the
  samples of epochs 2..E / the time between the end of epoch 1 and the end of epoch E,
  from job 0's MLLOG epoch_stop stamps (its root's clock).
* bare (this script with --bare, under mpirun): the workload's own model
  (its TensorFlow module's build_model), loss and weight decay, SGD with its momentum at a constant LR,
  DistributedGradientTape, the same batch, ranks and threads per rank
  (frameworks/tensorflow/train.setup_devices); 4 batches from the workload's feed held in memory as
  tensors, cycled; WARMUP batches untimed, then E iterations of the harness's steps
  per epoch. Whole run = all timed iterations; steady state = iterations 2..E. Max
  over ranks of each iteration's time.
* bare fed (--bare --feed): the bare loop with its batches from the harness's own
  training feed (workloads.training_feed, one for all epochs, made before the clock),
  each epoch a new draw of the rank's rows: the input's cost apart from the harness.
  bare fed / bare is what reading, decoding and augmenting cost on the step's cores;
  harness / bare fed what the harness adds to a loop with the same input.
Runs alternate harness, bare, bare fed, RUNS times; medians with min-max. Goals (issue
14): harness / bare >= 0.98 steady state, >= 0.95 whole run. See bench/README.md on noise.

--framework pytorch (issue 34): the harness with line 35 = pytorch against a bare DDP loop
as PyTorch's DDP tutorial writes it (init_process_group from MASTER_ADDR/MASTER_PORT, rank
0's port broadcast over MPI; DistributedDataParallel; zero_grad, forward, loss, backward,
step), the same model module, loss, SGD with the workload's momentum and weight decay,
threads per rank and batches as above; cases ic224, ic64 and deepcam (ewa has no PyTorch
model yet). Same measures and goals.

    .venv/bin/python bench/peers.py --framework pytorch --cases ic64,deepcam --no-scaling

--framework mindspore (issue 47): the harness with line 35 = mindspore, run by MindSpore's
venv (.venv-mindspore), against MindSpore's tutorial loop (bare_ms_loop); cases digits and
cosmo (the workloads MindSpore builds so far).

    .venv/bin/python bench/peers.py --framework mindspore --cases digits,cosmo --no-scaling

--bind-to-core: both loops' ranks bound to a core each (BIND_TO_CORE says why; MindSpore's
2-rank runs repeat within 6 % so, against 2 x unbound: bench/README.md).
"""
import argparse
import functools
import glob
import itertools
import json
import os
import sys
import time

import common

RUNS, EPOCHS, WARMUP = 2, 3, 3
# case -> (workload, dataset line, per-rank batch, settings): sized for a few minutes on 2 cores
CASES = {"digits": ("digits", "embedded", 32, {}),           # the shipped workload (MindSpore builds it)
         "cosmo": ("cosmoflow", "synthetic:64:32", 4, {"HPCAI500_COSMO_WIDTH": "8"}),   # 48 universes of 32^3
         "ic224": ("ic", "synthetic:80:224", 8, {}),        # 64 training JPEGs of 224 px
         "ic64": ("ic", "synthetic:640:64", 32, {}),        # 512 of 64 px
         "ewa": ("ewa", "synthetic:400:96", 4, {}),         # 320 images of 96 x 144, small backbone
         # the reference model's ResNet-50 trunk on 80 images of 96 x 144
         "ewa-r50": ("ewa", "synthetic:100:96", 4, {"HPCAI500_EWA_BACKBONE": "resnet50"}),
         # the reference DeepLabv3+ (no test-only setting) on 48 samples of 64 x 96
         "deepcam": ("deepcam", "synthetic:64:64", 2, {})}
GOALS = {"steady": 0.98, "whole": 0.95}
# the cases each framework's run takes by default: MindSpore builds digits and cosmoflow so far
DEFAULT_CASES = {"tensorflow": "ic224,ic64,ewa,ewa-r50,deepcam", "pytorch": "ic224,ic64,ewa,ewa-r50,deepcam",
                 "mindspore": "digits,cosmo"}
RUNS_OF = ("harness", "bare", "bare fed")   # each pair of the goals, and the bare loop on the harness's feed


def python_of(framework: str) -> str:
    """The venv that runs `framework`: MindSpore's own (protobuf), else the suite's."""
    return common.MS_PY if framework == "mindspore" else common.PY


# --bind-to-core: both loops' ranks bound to a core each (Open MPI's --bind-to core) instead of
# common.mpirun's --oversubscribe, which leaves them unbound. A MindSpore rank keeps ~1.5 cores'
# worth of threads busy (its main, PyNative dispatch, kernel and actor threads); unbound, two
# ranks' threads float over 2 cores and one run differs from the next by up to 2 x.
BIND_TO_CORE = False


def mpirun_flags() -> dict:
    """common.mpirun's keyword for both loops' runs: bound to a core each, else its default."""
    return {"flags": ("--bind-to", "core")} if BIND_TO_CORE else {}


def harness_run(case: str, ranks: int, framework: str = "tensorflow") -> tuple[dict, float]:
    wl, dataset, batch, env = CASES[case]
    dat = common.make_dat(f"peers-{case}-{ranks}-{framework}", l7=wl, l8=dataset, l9=1, l10=1, l11=ranks, l13=1,
                          l14=batch, l15=EPOCHS, l30=0, l31=0, l35=framework)
    before = set(glob.glob(os.path.join(common.WORK, "*", "results.json")))
    _, load = common.mpirun("hpcai500.py", dat, np=ranks, env=env, python=python_of(framework), **mpirun_flags())
    (new,) = set(glob.glob(os.path.join(common.WORK, "*", "results.json"))) - before
    with open(new) as f:
        record = json.load(f)
    (t,) = record["tests"]
    if any(str(record["settings"].get(k)) != v for k, v in env.items()):
        sys.exit(f"{case}: the harness recorded settings {record['settings']}, expected {env}")
    stops = {}
    for path in glob.glob(os.path.join(os.path.dirname(new), "mllog", "*model0000.log")):
        for line in open(path):
            if '"key": "epoch_stop"' in line:
                rec = json.loads(line.split(":::MLLOG", 1)[1])
                stops[rec["metadata"]["epoch_num"]] = rec["time_ms"] / 1000.0
    per_epoch = t["samples_trained"] / EPOCHS
    return {"steps": t["steps_per_epoch"][0], "whole": t["samples_trained"] / t["train_seconds"],
            "steady": per_epoch * (EPOCHS - 1) / (stops[EPOCHS] - stops[1])}, load


def bare_run(case: str, ranks: int, steps: int, fed: bool = False, framework: str = "tensorflow") -> tuple[dict, float]:
    out, load = common.mpirun("bench/peers.py", "--bare", case, "--steps", str(steps), *(["--feed"] if fed else []),
                              "--framework", framework, np=ranks, env=CASES[case][3], python=python_of(framework),
                              **mpirun_flags())
    return json.loads(out.strip().splitlines()[-1]), load


def bare_ddp_loop(case: str, steps: int, fed: bool = False) -> None:
    """bare_loop's PyTorch twin: PyTorch's DDP tutorial loop on in-memory batches (or, fed,
    on the harness's training feed), warm-up, then timed iterations."""
    import socket

    import numpy as np
    import torch
    import torch.distributed as dist
    from mpi4py import MPI
    from torch.nn.parallel import DistributedDataParallel
    from harness import workloads
    from harness.frameworks.pytorch import models, train as torch_train
    wl_name, dataset, batch, _ = CASES[case]
    comm = MPI.COMM_WORLD
    if comm.rank == 0:
        with socket.socket() as probe:     # a free port, as the tutorial's fixed one would not be on a shared machine
            probe.bind(("127.0.0.1", 0))
            port = probe.getsockname()[1]
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(comm.bcast(port if comm.rank == 0 else None)))
    local = comm.Split_type(MPI.COMM_TYPE_SHARED)
    torch_train.setup_devices(local.rank, local.size)   # the harness's threads per rank (and GPU)
    dev = torch_train.device()
    dist.init_process_group("nccl" if dev.type == "cuda" else "gloo", rank=comm.rank, world_size=comm.size)
    wl, module = workloads.get(wl_name), models.get(wl_name)
    data = wl.load(workloads.Dataset.parse(dataset), os.path.join(common.WORK, ".data"), local.rank, local.Barrier)
    tensors = lambda feed: ((module.inputs(x, dev), module.targets(y, dev)) for x, y in feed)  # noqa: E731
    rows = np.random.default_rng(comm.rank).integers(0, data.n_train, 4 * batch)
    batches = list(tensors((module.batches or wl.batches)(data, rows, batch, training=True, seed=1)))
    model = torch_train.build(wl, data, 7, 0, dev)   # the harness's model, as the harness lays it out on a GPU
    ddp = DistributedDataParallel(model, device_ids=[dev.index] if dev.type == "cuda" else None)
    opt, _ = torch_train.make_optimizer("sgd", model, 0.01 * comm.size, wl.MOMENTUM, {}, module.L2)

    def step(x, y):
        opt.zero_grad(set_to_none=True)
        loss = module.loss(ddp(x).float(), y).mean()
        loss.backward()
        opt.step()
        return loss

    for s in range(WARMUP):
        float(step(*batches[s % len(batches)]))
    shards = lambda e: np.random.default_rng([comm.rank, e]).integers(0, data.n_train, steps * batch)  # noqa: E731
    feed = (tensors(torch_train.feed(wl, module, data, shards, EPOCHS, batch, 1)) if fed
            else (batches[s % len(batches)] for s in itertools.count()))
    seconds = timed_epochs(step, feed, steps, comm, float)   # float(loss): the GPU's queue drained
    dist.destroy_process_group()
    say_rates(seconds, steps * batch, comm)


def bare_ms_loop(case: str, steps: int, fed: bool = False) -> None:
    """bare_loop's MindSpore twin, as MindSpore's tutorials write a training loop: the
    forward function, value_and_grad over the optimizer's parameters, one mindspore.jit
    train_step that also updates (on 1 rank). On 2 ranks the tutorials' DistributedGradReducer
    needs MindSpore's own cluster, which the harness does not form (facts.py says why): the
    bare loop's gradients then go over MPI on the host as the harness's do, so that the
    ratio measures the harness's loop, feed and clock, not another exchange."""
    import platform
    import numpy as np
    from harness.frameworks.mindspore import facts
    os.environ.update(facts.before_import(os.environ, platform.machine()))   # as the harness's runs
    import mindspore as ms
    from mindspore import nn
    from mpi4py import MPI
    from harness import workloads
    from harness.frameworks.mindspore import communication, models, train as ms_train
    wl_name, dataset, batch, _ = CASES[case]
    comm = MPI.COMM_WORLD
    local = comm.Split_type(MPI.COMM_TYPE_SHARED)
    ms_train.setup_devices(local.rank, local.size)   # the harness's threads per rank
    wl, module = workloads.get(wl_name), models.get(wl_name)
    data = wl.load(workloads.Dataset.parse(dataset), os.path.join(common.WORK, ".data"), local.rank, local.Barrier)
    tensors = lambda feed: ((module.inputs(x), module.targets(y)) for x, y in feed)  # noqa: E731
    rows = np.random.default_rng(comm.rank).integers(0, data.n_train, 4 * batch)
    batches = list(tensors(wl.batches(data, rows, batch, training=True, seed=1)))
    ms.set_seed(7)
    model = module.build_model(data)
    ms_train.root_state(model, comm, trainable=True)
    opt = nn.SGD(model.trainable_params(), learning_rate=0.01 * comm.size, momentum=wl.MOMENTUM)

    def forward(x, y):
        return module.loss(model(x), y).mean()
    grad_fn = ms.value_and_grad(forward, None, opt.parameters)

    @ms.jit
    def train_step(x, y):
        loss, grads = grad_fn(x, y)
        opt(grads)
        return loss
    gradients = ms.jit(grad_fn)

    def step(x, y):
        if comm.size == 1:
            return train_step(x, y)
        loss, grads = gradients(x, y)
        opt(tuple(ms.Tensor(g) for g in communication.average([g.asnumpy() for g in grads], "fp32", comm)))
        return loss

    for s in range(WARMUP):
        step(*batches[s % len(batches)]).asnumpy()
    shards = lambda e: np.random.default_rng([comm.rank, e]).integers(0, data.n_train, steps * batch)  # noqa: E731
    feed = (tensors(workloads.training_feed(wl.batches, None, data, shards, EPOCHS, batch, 1)) if fed
            else (batches[s % len(batches)] for s in itertools.count()))
    say_rates(timed_epochs(step, feed, steps, comm, lambda loss: loss.asnumpy()), steps * batch, comm)   # drained


def bare_loop(case: str, steps: int, fed: bool = False) -> None:
    """Horovod's synthetic-benchmark way: in-memory batches, warm-up, timed iterations.
    fed: the batches come from the workload's feed instead (what the harness adds)."""
    import numpy as np
    from mpi4py import MPI
    import horovod.tensorflow as hvd
    from harness import workloads
    from harness.frameworks.tensorflow import models, train
    from harness.workloads import get
    wl_name, dataset, batch, _ = CASES[case]   # its settings: in the environment mpirun gave
    hvd.init()
    wl, module = get(wl_name), models.get(wl_name)
    feed_of = module.batches or wl.batches   # TensorFlow's feed of the workload, as train.train takes it
    data = wl.load(workloads.Dataset.parse(dataset), os.path.join(common.WORK, ".data"), hvd.local_rank(), MPI.COMM_WORLD.Barrier)
    train.setup_devices(hvd.local_rank(), hvd.local_size())   # the harness's threads per rank
    import tensorflow as tf
    rows = np.random.default_rng(hvd.rank()).integers(0, data.n_train, 4 * batch)
    batches = [tf.nest.map_structure(tf.convert_to_tensor, b)
               for b in feed_of(data, rows, batch, training=True, seed=1)]
    tf.keras.utils.set_random_seed(7)
    model = module.build_model(data)
    opt = tf.keras.optimizers.SGD(learning_rate=0.01 * hvd.size(), momentum=wl.MOMENTUM)
    hvd.broadcast_variables(model.variables, root_rank=0)

    step = common.bare_step(model, opt, module.loss)

    for s in range(WARMUP):
        step(*batches[s % len(batches)]).numpy()
    # fed: the harness's own training feed (one for all epochs, made before the clock),
    # each epoch a new draw of this rank's rows; else the in-memory batches, cycled
    shards = lambda e: np.random.default_rng([hvd.rank(), e]).integers(0, data.n_train, steps * batch)  # noqa: E731
    feed = (workloads.training_feed(feed_of, module.stream, data, shards, EPOCHS, batch, seed=1) if fed
            else (batches[s % len(batches)] for s in itertools.count()))
    seconds = timed_epochs(step, feed, steps, MPI.COMM_WORLD, lambda loss: loss.numpy())
    del feed    # a tf.data teardown, after the clock as in the harness
    say_rates(seconds, steps * batch, MPI.COMM_WORLD)


def timed_epochs(step, feed, steps: int, comm, wait) -> list[float]:
    """A bare loop's EPOCHS timed epochs, each from a barrier: `steps` calls step(x, y) on
    `feed`'s batches, `wait(loss)` until the last is done; an epoch's seconds are the
    slowest rank's of `comm`."""
    from mpi4py import MPI
    seconds = []
    for _ in range(EPOCHS):
        comm.Barrier()
        start = time.perf_counter()
        for x, y in itertools.islice(feed, steps):
            loss = step(x, y)
        wait(loss)
        seconds.append(comm.allreduce(time.perf_counter() - start, op=MPI.MAX))
    return seconds


def say_rates(seconds: list[float], per_rank: int, comm) -> None:
    """Rank 0 prints the bare loop's samples/s (`per_rank` samples a rank an epoch) as the JSON bare_run reads."""
    if comm.rank == 0:
        per_iter = per_rank * comm.size
        print(json.dumps({"seconds": seconds, "whole": per_iter * EPOCHS / sum(seconds),
                          "steady": per_iter * (EPOCHS - 1) / sum(seconds[1:])}), flush=True)


def spread(xs) -> str:
    return f"{common.median(xs):.2f} ({min(xs):.2f}-{max(xs):.2f})"


def main(runs: int, cases: list[str], ranks: list[int], scaling: bool, framework: str = "tensorflow") -> None:
    bare = {"tensorflow": "Horovod", "pytorch": "PyTorch DDP", "mindspore": "MindSpore's tutorial loop"}[framework]
    print(f"machine: {common.machine()}; date {time.strftime('%Y-%m-%d')}; framework {framework} (bare: {bare});"
          f" ranks {'bound to a core each' if BIND_TO_CORE else 'unbound (mpirun --oversubscribe)'}")
    rows, summary, parts, loads = [], [], [], []
    for case in cases:
        for r in ranks:
            got = {what: [] for what in RUNS_OF}
            for i in range(runs):
                steps = None   # the harness's steps per epoch, which the bare loops time
                for what in RUNS_OF:   # alternated: harness, bare, bare fed, harness, ...
                    got_one, load = common.quietest(functools.partial(
                        harness_run, case, r, framework) if what == "harness" else functools.partial(
                        bare_run, case, r, steps, fed=what == "bare fed", framework=framework))
                    steps = steps or got_one["steps"]
                    got[what].append(got_one)
                    loads.append(load)
                    rows.append([case, r, i + 1, what, f"{got_one['whole']:.2f}", f"{got_one['steady']:.2f}",
                                 f"{load:.2f}"])
            ratio = {k: [h[k] / b[k] for h, b in zip(got["harness"], got["bare"])] for k in GOALS}
            summary.append([case, r, spread([h["steady"] for h in got["harness"]]),
                            spread([b["steady"] for b in got["bare"]]), spread(ratio["steady"]),
                            spread(ratio["whole"]),
                            " ".join("met" if common.median(ratio[k]) >= g else "NOT met" for k, g in GOALS.items())])
            parts.append([case, r, spread([f["steady"] for f in got["bare fed"]]),
                          spread([f["steady"] / b["steady"] for f, b in zip(got["bare fed"], got["bare"])]),
                          spread([h["steady"] / f["steady"] for h, f in zip(got["harness"], got["bare fed"])]),
                          spread([h["whole"] / f["whole"] for h, f in zip(got["harness"], got["bare fed"])])])
    print(f"\nper run (samples/s; M=1, P=ranks; {EPOCHS} epochs; bare: {WARMUP} warm-up batches, then {EPOCHS}"
          " iterations of the harness's steps per epoch; bare fed: the same, its batches from the harness's"
          " training feed; other load = cores used by other processes):")
    print(common.table(["case", "ranks", "run", "what", "whole run", "steady state", "other load"], rows))
    print(f"\nharness / bare, medians (min-max) of {runs} alternated runs each; goals: steady >= {GOALS['steady']},"
          f" whole run >= {GOALS['whole']}")
    print(common.table(["case", "ranks", "harness steady", "bare steady", "ratio steady", "ratio whole",
                        "goals (steady, whole)"], summary))
    print("\nwhere the gap is: the input (bare fed / bare: reading, decoding, augmenting on the step's cores) and"
          " the harness's own cost (harness / bare fed: the same input, the harness's step, loop and clock)")
    print(common.table(["case", "ranks", "bare fed steady", "input: fed / bare (steady)",
                        "harness / fed (steady)", "harness / fed (whole)"], parts))
    if max(loads) > common.QUIET:
        print(f"warning: other processes used up to {max(loads):.2f} cores during a run: noisy figures")
    if scaling:
        import scaling as bagging
        print("\nbagging on 2 ranks (bench/scaling.py):")
        bagging.main()


if __name__ == "__main__":
    os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    sys.path.insert(0, common.ROOT)
    p = argparse.ArgumentParser()
    p.add_argument("--bare", choices=sorted(CASES))
    p.add_argument("--steps", type=int, default=8)
    p.add_argument("--feed", action="store_true", help="bare loop fed by the harness's training feed")
    p.add_argument("--runs", type=int, default=RUNS, help=f"harness/bare pairs per case (default {RUNS})")
    p.add_argument("--cases", default=None, help="default: the framework's (DEFAULT_CASES)")
    p.add_argument("--ranks", default="1,2")
    p.add_argument("--no-scaling", action="store_true")
    p.add_argument("--framework", choices=("tensorflow", "pytorch", "mindspore"), default="tensorflow")
    p.add_argument("--bind-to-core", action="store_true", help="both loops' ranks bound to a core each (BIND_TO_CORE)")
    a = p.parse_args()
    BIND_TO_CORE = a.bind_to_core
    if a.bare:
        {"pytorch": bare_ddp_loop, "mindspore": bare_ms_loop, "tensorflow": bare_loop}[a.framework](
            a.bare, a.steps, a.feed)
    else:
        main(a.runs, (a.cases or DEFAULT_CASES[a.framework]).split(","), [int(r) for r in a.ranks.split(",")], not a.no_scaling, a.framework)
