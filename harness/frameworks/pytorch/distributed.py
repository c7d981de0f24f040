"""torch.distributed inside each job, wired from MPI: mpirun and srun stay the only
launchers (no torchrun), as mlcommons/hpc's DeepCAM reference wires its process group
from Open MPI's or Slurm's environment.

World rank 0 serves one key-value store (torch.distributed.TCPStore) for the whole
invocation, on a port its kernel picks. Its addresses (interfaces first, loopback last)
and the port reach every rank in one MPI broadcast; each other rank keeps a client of the
store, connected to the first of those addresses that answers a TCP connect (loopback on
rank 0's own node, an interface address from the others). Every rank agrees on the
outcome (errors.first_failure), so a rank that reaches none of them stops the whole run with one
message instead of leaving the others waiting.

Each job of each test then makes the default process group of exactly its ranks
(`job_group`) on that store, under a prefix of its own (test, repetition, job): a job's P
ranks meet only each other, no process group spans two jobs, and the group is destroyed
at the job's end, before the next test makes the next one. Gloo on CPUs, NCCL where the
job's ranks drive GPUs (the caller names the backend).

MPI at the edges (`serve`: a broadcast and an agreement); `candidates` and `reachable` are
plain functions over sockets.
"""
from __future__ import annotations

import datetime
import socket
from contextlib import contextmanager
from dataclasses import dataclass

import psutil

from harness.errors import first_failure

TIMEOUT = datetime.timedelta(minutes=30)   # a rendezvous or collective this slow is the watchdog's to end
CONNECT_SECONDS = 2.0                      # a TCP connect to one of rank 0's addresses


def candidates() -> list[str]:
    """This host's IPv4 addresses, the interfaces' first and loopback last (a rank on
    the same node reaches loopback; one on another node, an interface address)."""
    found = [a.address for addrs in psutil.net_if_addrs().values() for a in addrs if a.family == socket.AF_INET]
    return sorted(set(found), key=lambda a: (a.startswith("127."), found.index(a)))


def reachable(addresses: list[str], port: int, seconds: float = CONNECT_SECONDS) -> str | None:
    """The first address at which something accepts a TCP connection on `port`, or None."""
    for address in addresses:
        try:
            with socket.create_connection((address, port), timeout=seconds):
                return address
        except OSError:
            continue
    return None


@dataclass(frozen=True)
class Store:
    """Rank 0's store as this rank holds it (the server on rank 0, a client elsewhere)."""
    store: object       # torch.distributed.TCPStore
    address: str        # where this rank reached it
    port: int


def serve(world) -> Store:
    """COLLECTIVE over `world`: rank 0 starts the store; every other rank connects to it."""
    import torch.distributed as dist
    server, where, err = None, None, None
    if world.rank == 0:
        try:
            server = dist.TCPStore("0.0.0.0", 0, is_master=True, wait_for_workers=False, timeout=TIMEOUT)
            where = (candidates(), server.port)
        except Exception as e:   # noqa: BLE001 - agreed below
            err = f"rank 0 could not serve torch.distributed's store: {e}"
    addresses, port = world.bcast(where, root=0) or ([], 0)
    address = "0.0.0.0"
    if world.rank != 0 and not err:
        address = reachable(addresses, port)
        if address is None:
            err = (f"found none of rank 0's addresses {', '.join(addresses) or '(none)'} answering on port {port},"
                   " expected one (torch.distributed's store): a firewall, or rank 0's node unreachable")
    first_failure(world, err)
    store = server or dist.TCPStore(address, port, is_master=False, timeout=TIMEOUT)
    return Store(store, address, port)


@contextmanager
def job_group(store: Store, key: str, rank: int, size: int, backend: str = "gloo"):
    """The default process group of one job's `size` ranks (this one `rank` of them), on
    the invocation's store under the prefix `key` (unique to the test, repetition and
    job); destroyed on leaving, so that the next test can make its own."""
    import torch.distributed as dist
    dist.init_process_group(backend, store=dist.PrefixStore(key, store.store), rank=rank, world_size=size,
                            timeout=TIMEOUT)
    try:
        yield dist.group.WORLD
    finally:
        dist.destroy_process_group()
