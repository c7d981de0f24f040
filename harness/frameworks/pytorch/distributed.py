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
