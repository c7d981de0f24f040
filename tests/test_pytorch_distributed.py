"""harness/frameworks/pytorch/distributed.py: torch.distributed wired from MPI, for real
(4 ranks under mpirun, Gloo) on two simulated nodes: two jobs of 2 ranks spread over the
nodes (job = world rank mod 2), so that each job's second rank, on n2, reaches its root's
store at n1's address over the cluster's network; each job a process group of exactly its
ranks, made and destroyed three times (three tests of one invocation);
DistributedDataParallel averages gradients within the job only. The address order alone,
in-process."""
import json

import pytest

from tests.conftest import ROOT, cluster_mpirun

torch = pytest.importorskip("torch")

RANKS, TESTS = 4, 3
PROGRAM = r'''
import gc, json, sys
sys.path.insert(0, sys.argv[1])
from mpi4py import MPI
import torch
from harness.frameworks.pytorch import distributed

from harness import topology

world = MPI.COMM_WORLD
topology.discover(world)   # as the harness starts: bindings widened where simulated nodes share a core
job = world.rank % 2
out = {"rank": world.rank, "job": job, "tests": []}
for test in range(1, TESTS + 1):
    comm = world.Split(job, world.rank)        # each test its own job communicators, as the harness makes them
    with distributed.job_group(comm, "gloo") as group:
        x = torch.tensor([float(world.rank + 1)])
        torch.distributed.all_reduce(x)                       # the job's ranks only
        torch.manual_seed(test)                               # the same initial weights on the job's ranks
        model = torch.nn.Linear(3, 1)
        ddp = torch.nn.parallel.DistributedDataParallel(model)
        data = torch.full((4, 3), float(world.rank + test))   # a different batch on every rank
        ddp(data).sum().backward()
        grad = model.weight.grad.numpy().ravel().tolist()
        out["tests"].append({"sum": x.item(), "grad": grad, "size": torch.distributed.get_world_size(),
                             "address": group.address})
        del ddp          # as the harness's Job.close: no DDP left holding the group's Gloo threads at exit
        gc.collect()
    comm.Free()
out["imported"] = sorted(m for m in ("tensorflow", "horovod") if m in sys.modules)
print(json.dumps(out), flush=True)
'''.replace("TESTS", str(TESTS))


def test_each_job_is_a_process_group_of_its_own_ranks_across_nodes(cluster, tmp_path):
    """2 simulated nodes x 2 ranks; job 0 = ranks 0 (n1, the root) and 2 (n2), job 1 =
    ranks 1 (n1) and 3 (n2): n2's ranks reach their roots' stores over the network."""
    (tmp_path / "prog.py").write_text(PROGRAM)
    p = cluster_mpirun(cluster, "n1:2,n2:2", [tmp_path / "prog.py", ROOT], tmp_path, program=())
    assert p.returncode == 0, p.stderr[-3000:]
    ranks = sorted((json.loads(ln) for ln in p.stdout.splitlines() if ln.startswith("{")), key=lambda r: r["rank"])
    assert [r["rank"] for r in ranks] == list(range(RANKS))
    for r in ranks:
        assert r["imported"] == []                          # torch alone: no TensorFlow, no Horovod
        assert len(r["tests"]) == TESTS
        members = [q for q in range(RANKS) if q % 2 == r["job"]]
        for t, test in enumerate(r["tests"], 1):
            assert test["size"] == 2
            assert test["sum"] == sum(q + 1 for q in members)   # job 0: 1 + 3, job 1: 2 + 4
            # d(sum of 4 rows of w.x + b)/dw = 4 x the row (rank + test, 3 times): averaged over the job
            assert test["grad"] == pytest.approx([4 * sum(q + t for q in members) / 2] * 3)
            if r["rank"] >= 2:   # n2's ranks: the root's store reached at an address of n1's network
                assert test["address"] and not test["address"].startswith("127."), test
            else:
                assert test["address"] == ""                    # the roots serve


def test_loopback_comes_last():
    from harness.frameworks.pytorch import distributed
    found = distributed.candidates()
    assert found and found[-1].startswith("127.") and len(set(found)) == len(found)


def test_nccls_lost_peer_fails_the_survivors_collective_within_a_step_timeout():
    """Issue 67, item 11 (a GPU proves the rest: bench/gpu_check.sh): NCCL's watchdog set
    to abort the communicators and keep the process (TORCH_NCCL_ASYNC_ERROR_HANDLING=2,
    before torch starts); from the timed epochs on, a timeout of 4 x the slowest warm-up step,
    at least 2 minutes, under half the watchdog limit and never above set-up's 30 minutes; a
    group that lost a member aborted under NCCL, destroyed under Gloo."""
    from datetime import timedelta
    from harness import frameworks
    from harness.frameworks.pytorch import distributed, facts
    assert facts.ENVIRONMENT == {"TORCH_NCCL_ASYNC_ERROR_HANDLING": "2"}
    assert frameworks.environment()["TORCH_NCCL_ASYNC_ERROR_HANDLING"] == "2"
    t = distributed.step_timeout
    assert t(0.5, 1800) == timedelta(seconds=120)             # a fast step: the floor
    assert t(60.0, 1800) == timedelta(seconds=240)            # a compiled first step of 60 s: 4 x
    assert t(600.0, 1800) == timedelta(seconds=900)           # under half the watchdog's 1800 s
    assert t(600.0, 0) == timedelta(minutes=30)               # watchdog off: set-up's timeout at most
    assert t(1.0, 100) == timedelta(seconds=50)               # a short watchdog wins over the floor
    assert (distributed.ending("nccl"), distributed.ending("gloo")) == ("abort", "destroy")


def test_bf16_is_refused_on_a_gpu_without_bf16_tensor_cores_only():
    from harness import gpus
    from harness.frameworks.pytorch import kernels
    volta = "GPU Tesla V100-SXM2-16GB (compute capability 7.0)"
    assert gpus.bf16_problem("bf16", volta, False) == f"{volta} has no bf16 tensor cores (Ampere, compute" \
                                                       " capability 8.0, or newer)"
    assert gpus.bf16_problem("bf16", "GPU NVIDIA A100-SXM4-80GB (compute capability 8.0)", True) is None
    assert gpus.bf16_problem("fp16", volta, False) is None and gpus.bf16_problem("fp32", volta, False) is None
    assert gpus.bf16_problem("bf16", None, False) is None                  # a CPU: autocast's bf16 runs
    assert kernels.precision_problem("bf16") is None                        # this machine: a CPU

