"""harness/frameworks/pytorch/distributed.py: torch.distributed wired from MPI, for real
(4 ranks under mpirun, Gloo) on two simulated nodes, where the ranks of n2 reach rank 0's
store at n1's address on the cluster's network and job 0 stays on n1 (one node's case
inside the two-node one; the suite's time is spent once): two jobs of 2 ranks, each a
process group of exactly its ranks, made and destroyed twice (two tests of one
invocation) on world rank 0's one store; DistributedDataParallel averages gradients
within the job only. The address logic alone, in-process."""
import json
import socket

import pytest

from tests.conftest import ROOT, cluster_mpirun

torch = pytest.importorskip("torch")

RANKS = 4
PROGRAM = r'''
import json, sys
sys.path.insert(0, sys.argv[1])
import numpy as np
from mpi4py import MPI
import torch
from harness.frameworks.pytorch import distributed

from harness import topology

world = MPI.COMM_WORLD
topology.discover(world)   # as the harness starts: bindings widened where simulated nodes share a core
job = world.rank // 2
comm = world.Split(job, world.rank)
store = distributed.serve(world)
out = {"rank": world.rank, "job": job, "tests": [], "address": store.address}
for test in (1, 2):
    with distributed.job_group(store, f"t{test}/r0/j{job}", comm.rank, comm.size, "gloo"):
        x = torch.tensor([float(world.rank + 1)])
        torch.distributed.all_reduce(x)                       # the job's ranks only
        torch.manual_seed(test)                               # the same initial weights on the job's ranks
        model = torch.nn.Linear(3, 1)
        ddp = torch.nn.parallel.DistributedDataParallel(model)
        data = torch.full((4, 3), float(world.rank + test))   # a different batch on every rank
        ddp(data).sum().backward()
        grad = model.weight.grad.numpy().ravel().tolist()
        out["tests"].append({"sum": x.item(), "grad": grad, "size": torch.distributed.get_world_size()})
out["imported"] = sorted(m for m in ("tensorflow", "horovod") if m in sys.modules)
print(json.dumps(out), flush=True)
'''


def test_each_job_is_a_process_group_of_its_own_ranks_across_nodes(cluster, tmp_path):
    """2 simulated nodes x 2 ranks: job 0 (ranks 0-1) on n1 with rank 0's store, job 1
    (ranks 2-3) on n2, reaching the store at n1's address on the cluster's network."""
    (tmp_path / "prog.py").write_text(PROGRAM)
    ranks = _check(cluster_mpirun(cluster, "n1:2,n2:2", [tmp_path / "prog.py", ROOT], tmp_path, timeout=180,
                                  program=()))
    assert [r["address"].startswith("127.") for r in ranks[2:]] == [False, False], ranks   # n2: the network


def _check(p):
    assert p.returncode == 0, p.stderr[-3000:]
    ranks = sorted((json.loads(ln) for ln in p.stdout.splitlines() if ln.startswith("{")), key=lambda r: r["rank"])
    assert [r["rank"] for r in ranks] == list(range(RANKS))
    for r in ranks:
        assert r["imported"] == []                          # torch alone: no TensorFlow, no Horovod
        for t, test in enumerate(r["tests"], 1):
            members = [q for q in range(RANKS) if q // 2 == r["job"]]
            assert test["size"] == 2
            assert test["sum"] == sum(q + 1 for q in members)   # job 0: 1 + 2, job 1: 3 + 4
            # d(sum of 4 rows of w.x + b)/dw = 4 x the row (rank + test, 3 times): averaged over the job
            assert test["grad"] == pytest.approx([4 * sum(q + t for q in members) / 2] * 3)
    return ranks


def test_the_first_address_that_answers_is_taken():
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen()
    port = server.getsockname()[1]
    try:
        from harness.frameworks.pytorch import distributed
        assert distributed.reachable(["127.0.0.1"], port) == "127.0.0.1"
        closed = socket.socket()
        closed.bind(("127.0.0.1", 0))
        dead = closed.getsockname()[1]
        closed.close()
        assert distributed.reachable(["127.0.0.1"], dead, seconds=0.5) is None
        assert distributed.candidates()[-1].startswith("127.")          # loopback last
    finally:
        server.close()
