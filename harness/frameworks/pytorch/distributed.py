"""torch.distributed inside each job, wired from MPI: mpirun and srun stay the only
launchers (no torchrun), as mlcommons/hpc's DeepCAM reference wires its process group
from Open MPI's or Slurm's environment.

Each job of each test makes the default process group of exactly its ranks
(`job_group`, a collective over the job's MPI communicator): the job's root serves a
key-value store (torch.distributed.TCPStore) on a port its kernel picks, its addresses
(interfaces first, loopback last) and the port reach the job's ranks in one MPI
broadcast, and each connects a store client to the first address that answers. Gloo (on
CPUs) or NCCL (on GPUs) then meets on that store. A job's P ranks meet only each other,
no process group spans two jobs, and the group and its store live exactly as long as the
job: every rank leaves the job's last collective (an MPI barrier) before any tears the
group down, and the root's store outlives every client's use of it (a second barrier).
(The first version served one store from world rank 0 for the whole invocation, every
job's group under its own prefix; it failed once in a fresh-clone run of the suite, Gloo
reporting a broken pipe while making a group: history, commit 0ae4c68.)

A failure on any rank of the job (no store, no address answering, the group's
rendezvous) is agreed over the job's communicator and raised on each of its ranks as the
same RuntimeError naming the lowest failing rank: inside a test the driver then ends the
whole run (MPI_Abort), so no rank of another job is left waiting.

MPI at the edges (`job_group`: a broadcast, agreements, barriers); `candidates` is a
plain function over the host's interfaces.
"""
from __future__ import annotations

import datetime
import socket
from contextlib import contextmanager
from dataclasses import dataclass

import psutil

from harness.errors import first_failure

TIMEOUT = datetime.timedelta(minutes=30)   # a rendezvous or collective this slow is the watchdog's to end
CONNECT = datetime.timedelta(seconds=5)    # a store client's connection to one of the root's addresses
# Under NCCL a dead peer does not fail a collective: NCCL's kernels wait for it (within a node
# forever; across nodes until its network transport notices, if it does), and PyTorch's own
# watchdog only acts at the group's timeout. With TORCH_NCCL_ASYNC_ERROR_HANDLING=2 (the
# facts' ENVIRONMENT: CleanUpOnly) that watchdog aborts the communicators at the timeout or
# at NCCL's asynchronous error and leaves the process alive, so that the stuck step returns
# and the next collective raises ("NCCL communicator was aborted"): harness/elastic.py's
# survivors then confirm the loss over ULFM and go on. 1 (TearDown) and 3 (SkipCleanUp,
# torch's default) end the survivor's process too: a lost rank would take its job's others.
# From the timed epochs on, the groups' timeout is one that suits a step (step_timeout).
STEP_FLOOR = 120.0    # s: a step's collective may wait this long for a slow partner (a feed's hiccup)
STEP_FACTOR = 4       # x the slowest warm-up step (the first step: autotuning and compilation in it)


def step_timeout(warm_up_step: float, watchdog: float) -> datetime.timedelta:
    """The NCCL groups' timeout for the timed epochs: STEP_FACTOR x the slowest warm-up step
    `warm_up_step` (s), at least STEP_FLOOR; at most half the run's watchdog limit `watchdog`
    (s, 0: off; harness/watchdog.py), so that a survivor's collective fails before its watchdog
    would end it (a rank blocked in a dead collective beats no more), and at most the set-up's
    TIMEOUT. What a lost peer costs its job's survivors on GPUs, beyond the others' waits. Pure."""
    cap = TIMEOUT.total_seconds() if watchdog <= 0 else min(TIMEOUT.total_seconds(), watchdog / 2)
    return datetime.timedelta(seconds=min(max(STEP_FLOOR, STEP_FACTOR * warm_up_step), cap))


def shorten(timeout: datetime.timedelta, groups) -> None:
    """`timeout` for the NCCL process groups `groups` (None: the job's default group) from
    their next collective on; Gloo's keep TIMEOUT (a dead Gloo peer closes its socket: the
    survivors' collective fails at once)."""
    import torch.distributed as dist
    for group in groups:
        if group is not None or dist.is_initialized():
            if dist.get_backend(group) == "nccl":
                dist.distributed_c10d._set_pg_timeout(timeout, group)


def ending(backend: str) -> str:
    """How a rank leaves a group that lost a member: NCCL's communicators are aborted
    (ncclCommAbort: local, returns with peers dead or stuck; destroying one first waits for
    its pending work, which a dead peer never completes); Gloo's group is destroyed, as
    before. Pure."""
    return "abort" if backend == "nccl" else "destroy"


def leave(backend: str) -> None:
    """This process's groups gone without a collective (Job.abandon): every group (the job's
    and a split model's) aborted at once under NCCL, in one NCCL group call so that no
    communicator's abort waits for another's; destroyed under Gloo."""
    import torch.distributed as dist
    abort = getattr(dist.distributed_c10d, "_abort_process_group", None)
    if ending(backend) == "abort" and abort is not None:
        abort()
    else:
        dist.destroy_process_group()


def candidates() -> list[str]:
    """This host's IPv4 addresses, the interfaces' first and loopback last (a rank on
    the same node reaches loopback; one on another node, an interface address)."""
    found = [a.address for addrs in psutil.net_if_addrs().values() for a in addrs if a.family == socket.AF_INET]
    return sorted(set(found), key=lambda a: (a.startswith("127."), found.index(a)))


@dataclass(frozen=True)
class Group:
    """This rank's view of its job's process group."""
    rank: int           # in the job
    size: int           # the job's ranks
    backend: str        # gloo | nccl
    address: str        # where this rank reached the root's store ("" on the root, which serves it)


def agree(comm, err: str | None) -> None:
    """The lowest failing rank of the job's `comm` (its rank in the job) and its error,
    raised on every rank of the job as a RuntimeError (inside a test: the driver's abort)."""
    first_failure(comm, err and f"torch.distributed in the job: {err}", RuntimeError)


def _connect(addresses: list[str], port: int):
    """(store client, address): the first of `addresses` whose store answers, or (None, None)."""
    import torch.distributed as dist
    for address in addresses:
        try:
            store = dist.TCPStore(address, port, is_master=False, timeout=CONNECT)
        except (RuntimeError, OSError):   # refused or unreachable: the next address
            continue
        store.set_timeout(TIMEOUT)
        return store, address
    return None, None


@contextmanager
def job_group(comm, backend: str = "gloo"):
    """COLLECTIVE over the job's MPI communicator `comm`: the default process group of
    its ranks, on a store its root serves; destroyed on leaving normally (an exception
    leaves it to the process's end: the run is being aborted)."""
    import torch.distributed as dist
    server, where, err = None, None, None
    if comm.rank == 0:
        try:
            server = dist.TCPStore("0.0.0.0", 0, world_size=comm.size, is_master=True, wait_for_workers=False,
                                   timeout=TIMEOUT)
            where = (candidates(), server.port)
        except (RuntimeError, OSError) as e:
            err = f"found no store served ({e}), expected the job root's TCPStore on a free port"
    addresses, port = comm.bcast(where, root=0) or ([], 0)
    store, address = server, ""
    if comm.rank != 0 and addresses:
        store, address = _connect(addresses, port)
        if store is None:
            err = (f"found none of the job root's addresses {', '.join(addresses)} answering on port {port},"
                   " expected one: a firewall, or the root's node unreachable from this one")
    agree(comm, err)
    try:
        dist.init_process_group(backend, store=store, rank=comm.rank, world_size=comm.size, timeout=TIMEOUT)
    except (RuntimeError, OSError, ValueError) as e:
        err = f"the process group's rendezvous failed: {type(e).__name__}: {e}"
    agree(comm, err)
    yield Group(comm.rank, comm.size, backend, address)
    comm.Barrier()      # every rank out of the group's last collective before any tears it down
    dist.destroy_process_group()
    comm.Barrier()      # every client done with the store before the root's server goes
    del store, server
