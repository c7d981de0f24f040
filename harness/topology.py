"""Parallelism Controller (Model Parallelism Management): ranks -> nodes -> jobs.

Eq. 5 of the paper: Sys_scale = M x P_degree. `resolve`, `map_jobs`, `machines`,
`contested` and `sharing` are pure; the MPI edge is `discover` (who shares a node, which
nodes share a machine, and the bindings it widens) and `split` (one communicator per job).

Machines: a node is the group of ranks that share memory (MPI_COMM_TYPE_SHARED, as the
launcher placed them); a machine is the group of nodes that run on one kernel (the same
Linux boot id). On a cluster every node is its own machine. Nodes simulated on one
machine (namespaces, containers: scripts/cluster/) share its cores, and each node's
launcher daemon, believing the cores its own, binds its ranks to core 0, 1, ... of the
machine: ranks of different nodes end up bound to the same core. Two ranks of one job so
bound never progress: each busy-polls in MPI (Horovod's background thread spins in
MPI_Allreduce) on the core its partner needs; measured on two simulated nodes, the first
all-reduce of a job spanning them made no progress in 7 minutes, and 8 s with the
bindings widened (DESIGN.md §11). `discover` therefore widens the binding of every rank
of a machine where ranks of different nodes share a core to every core of the machine
(every thread of the process, before TensorFlow starts its own), and the
report says so; bindings inside one node, and every binding on a real cluster, are left
as the launcher made them.
"""
from __future__ import annotations

import os
import socket
from dataclasses import dataclass

class TopologyError(ValueError):
    pass


@dataclass(frozen=True)
class Nodes:
    """What every rank knows about placement: node index and host of each world rank."""
    node_of_rank: tuple[int, ...]
    hosts: tuple[str, ...]          # host name of each node index
    local_rank: int                 # this rank's index among the ranks of its node
    local_size: int                 # ranks on this rank's node
    machine_of_node: tuple[int, ...] = ()   # machine index of each node (one kernel); () = each node its own
    machine_cores: tuple[int, ...] = ()     # logical CPUs of each machine
    machine_size: int = 0                   # ranks on this rank's machine (0: local_size, a node per machine)
    widened: tuple[int, ...] = ()           # world ranks whose binding discover() widened

    @property
    def ranks_sharing_cores(self) -> int:
        """Ranks that share this rank's machine's cores: its node's, or its machine's when
        several nodes run on one machine. Threads per rank divide the cores by this."""
        return self.machine_size or self.local_size


@dataclass(frozen=True)
class Layout:
    M: int
    P: int
    jobs: tuple[tuple[int, ...], ...]   # world ranks of each job; jobs[j][0] is its root
    idle: tuple[int, ...]               # ranks in no job

    def job_of(self, rank: int) -> int | None:
        for j, ranks in enumerate(self.jobs):
            if rank in ranks:
                return j
        return None


def resolve(world_size: int, M: int, P: int) -> tuple[int, list[str]]:
    """Check Eq. 5 against the world; M = 0 means as many jobs as fit. Returns (M, warnings)."""
    if P < 1:
        raise TopologyError(f"P_degree must be >= 1, found {P}")
    if P > world_size:
        raise TopologyError(f"P_degree {P} exceeds the world size {world_size}")
    if M == 0:
        M = world_size // P
    if M * P > world_size:
        raise TopologyError(f"M x P = {M} x {P} = {M * P} exceeds the world size {world_size}")
    warnings = []
    if M * P < world_size:
        warnings.append(f"M x P = {M * P} < world size {world_size}: "
                        f"{world_size - M * P} rank(s) idle in this test")
    return M, warnings


def map_jobs(node_of_rank: tuple[int, ...] | list[int], M: int, P: int, pmap: int) -> Layout:
    """Assign M jobs of P world ranks each.

    PMAP 0 (node-packed): whole jobs inside one node first, so a job's all-reduce stays
    on the node; the leftovers of all nodes then make the remaining jobs.
    PMAP 1 (round-robin): ranks dealt across nodes, so each job spans as many nodes as it
    can (stresses the network, like HPL's column-major process mapping does).
    """
    by_node: dict[int, list[int]] = {}
    for rank, node in enumerate(node_of_rank):
        by_node.setdefault(node, []).append(rank)
    nodes = sorted(by_node.values(), key=lambda ranks: ranks[0])
    if pmap == 0:
        jobs, rest = [], []
        for ranks in nodes:
            full = len(ranks) // P
            jobs += [ranks[i * P:(i + 1) * P] for i in range(full)]
            rest += ranks[full * P:]
        jobs += [rest[i * P:(i + 1) * P] for i in range(len(rest) // P)]
    elif pmap == 1:
        order = [ranks[i] for i in range(max(map(len, nodes))) for ranks in nodes if i < len(ranks)]
        jobs = [order[i * P:(i + 1) * P] for i in range(len(order) // P)]
    else:
        raise TopologyError(f"PMAP must be 0 or 1, found {pmap}")
    if len(jobs) < M:
        raise TopologyError(f"only {len(jobs)} jobs of P = {P} ranks fit in {len(node_of_rank)} ranks, M = {M}")
    jobs = sorted(jobs[:M], key=lambda ranks: min(ranks))  # job 0 holds the lowest rank (rank 0)
    used = {r for ranks in jobs for r in ranks}
    idle = tuple(r for r in range(len(node_of_rank)) if r not in used)
    return Layout(M, P, tuple(tuple(j) for j in jobs), idle)


def machines(boot_ids: list[str], node_of_rank: tuple[int, ...] | list[int]) -> tuple[int, ...]:
    """The machine index of each node: nodes whose ranks report one kernel boot id run on
    one machine, numbered in order of their first node."""
    order: dict[str, int] = {}
    of_node: dict[int, int] = {}
    for boot, node in zip(boot_ids, node_of_rank):
        of_node.setdefault(node, order.setdefault(boot, len(order)))
    return tuple(of_node[n] for n in range(len(of_node)))


def contested(node_of_rank, machine_of_node, masks: list[int], machine_cores) -> dict[int, int]:
    """Bindings to widen: world rank -> new CPU mask (bit c = logical CPU c). On a machine
    where a CPU is in the masks of ranks of two or more nodes, every rank not already on
    all of that machine's CPUs gets them all (the kernel keeps a rank inside its cgroup's
    cpuset). Nothing else: bindings inside one node, or on a machine a node, stand."""
    by_machine: dict[int, list[int]] = {}
    for rank, node in enumerate(node_of_rank):
        by_machine.setdefault(machine_of_node[node], []).append(rank)
    out = {}
    for m, ranks in by_machine.items():
        claimed: dict[int, int] = {}     # node -> union of its ranks' masks
        for r in ranks:
            claimed[node_of_rank[r]] = claimed.get(node_of_rank[r], 0) | masks[r]
        seen, clash = 0, 0
        for mask in claimed.values():
            clash |= seen & mask
            seen |= mask
        if clash:
            every = (1 << machine_cores[m]) - 1
            out.update({r: every for r in ranks if masks[r] != every})
    return out


def machine_of_each_node(machine_of_node, nodes: int) -> list[int]:
    """The machine index of each of `nodes` nodes: `machine_of_node` as recorded, where ()
    means every node its own machine (a cluster, or a record that predates machines)."""
    return list(machine_of_node) or list(range(nodes))


def sharing(nodes: Nodes) -> list[str]:
    """The report's lines on shared machines, oversubscribed cores and widened bindings
    (none on a cluster whose ranks have a core each)."""
    lines = []
    machine_of_node = machine_of_each_node(nodes.machine_of_node, len(nodes.hosts))
    cores = nodes.machine_cores
    for m in sorted(set(machine_of_node)):
        members = [n for n, mm in enumerate(machine_of_node) if mm == m]
        ranks = sum(1 for n in nodes.node_of_rank if machine_of_node[n] == m)
        where = "a node" if len(members) == 1 else "one machine"
        if len(members) > 1:
            lines.append(f"Shared machine: nodes {','.join(nodes.hosts[n] for n in members)} run on one machine"
                         f" (one kernel) and share its {cores[m] if cores else '?'} cores and its memory: figures"
                         " measure the launch, the protocol and the network, not the nodes")
        if cores and ranks > cores[m]:
            lines.append(f"Oversubscribed: {ranks} ranks on {cores[m]} cores of {where}"
                         f"{'' if len(members) == 1 else ' (' + nodes.hosts[members[0]] + '...)'}: ranks shared"
                         " cores; a test with idle ranks gives its ranks more than the share the kernels ran with")
    if nodes.widened:
        lines.append(f"Bindings widened: ranks {ranges(nodes.widened)} were bound by their nodes' launchers to cores"
                     " that ranks of another node on the same machine were bound to (MPI's busy polling then makes"
                     " no progress); each now runs on every core of its machine")
    return lines


def boot_id() -> str:
    """This kernel's boot id (one per machine and boot); the host name where there is none."""
    try:
        with open("/proc/sys/kernel/random/boot_id") as f:
            return f.read().strip()
    except OSError:
        return socket.gethostname()


def cpu_mask() -> int:
    """This process's CPU binding as a bit mask (every CPU where binding is unknown)."""
    cpus = os.sched_getaffinity(0) if hasattr(os, "sched_getaffinity") else range(os.cpu_count() or 1)
    return sum(1 << c for c in cpus)


def bind_all_threads(mask: int) -> None:
    """Bind every thread of this process (MPI's and PMIx's included) to the CPUs of `mask`;
    threads started later inherit it from the main thread."""
    cpus = {c for c in range(mask.bit_length()) if mask >> c & 1}
    for tid in os.listdir("/proc/self/task"):
        try:
            os.sched_setaffinity(int(tid), cpus)
        except (ProcessLookupError, FileNotFoundError):
            pass   # a thread that has just ended


def node_comm(world):
    """The ranks of this rank's node: those that share memory (MPI_COMM_TYPE_SHARED)."""
    from mpi4py import MPI
    return world.Split_type(MPI.COMM_TYPE_SHARED, key=world.rank)


def discover(world) -> Nodes:
    """Nodes are the groups of ranks that share memory, machines the groups of nodes on
    one kernel. Widens this rank's binding where `contested` says so (before TensorFlow
    starts its threads: the driver calls this first)."""
    from mpi4py import MPI
    local = node_comm(world)
    leader = local.bcast(world.rank, root=0)
    local_rank, local_size = local.rank, local.size
    local.Free()
    mine = (leader, MPI.Get_processor_name() if local_rank == 0 else None, boot_id(), cpu_mask(),
            os.cpu_count() or 1)
    every = world.allgather(mine)   # one small tuple a rank: O(world size), as the other gathers
    leaders = [e[0] for e in every]
    order = sorted(set(leaders))
    node_of_rank = tuple(order.index(ld) for ld in leaders)
    machine_of_node = machines([e[2] for e in every], node_of_rank)
    cores = {machine_of_node[node_of_rank[r]]: e[4] for r, e in enumerate(every)}
    machine_cores = tuple(cores[m] for m in range(len(cores)))
    widen = contested(node_of_rank, machine_of_node, [e[3] for e in every], machine_cores)
    if world.rank in widen:
        bind_all_threads(widen[world.rank])
    here = machine_of_node[node_of_rank[world.rank]]
    return Nodes(node_of_rank, tuple(every[ld][1] for ld in order), local_rank, local_size, machine_of_node,
                 machine_cores,
                 sum(1 for n in node_of_rank if machine_of_node[n] == here), tuple(sorted(widen)))


def split(world, layout: Layout):
    """This rank's job index and the job's communicator (None, None for an idle rank).
    The key orders ranks as in layout.jobs, so job rank 0 is the job's root."""
    from mpi4py import MPI
    job = layout.job_of(world.rank)
    color = MPI.UNDEFINED if job is None else job
    key = 0 if job is None else layout.jobs[job].index(world.rank)
    comm = world.Split(color, key)
    return (None, None) if job is None else (job, comm)


def describe(layout: Layout, nodes: Nodes) -> list[str]:
    """The job -> rank -> node map, one line per job, for --check and the report."""
    lines = []
    for j, ranks in enumerate(layout.jobs):
        hosts = sorted({nodes.hosts[nodes.node_of_rank[r]] for r in ranks})
        lines.append(f"job {j:4d} : ranks {ranges(ranks)} on {len(hosts)} node(s) {','.join(hosts)}")
    if layout.idle:
        lines.append(f"idle     : ranks {ranges(layout.idle)}")
    return lines


def ranges(ranks) -> str:
    """[0,1,2,5] -> '0-2,5' so that maps stay readable at thousands of ranks (and lists of tests at
    thousands of tests: harness/plan.py)."""
    out, ranks = [], sorted(ranks)
    start = prev = ranks[0]
    for r in ranks[1:] + [None]:
        if r is not None and r == prev + 1:
            prev = r
            continue
        out.append(f"{start}" if start == prev else f"{start}-{prev}")
        if r is not None:
            start = prev = r
    return ",".join(out)
