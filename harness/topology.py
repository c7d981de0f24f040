"""Parallelism Controller (Model Parallelism Management): ranks -> nodes -> jobs.

Eq. 5 of the paper: Sys_scale = M x P_degree. `resolve` and `map_jobs` are pure; the
MPI edge is `discover` (who shares a node) and `split` (one communicator per job).
"""
from __future__ import annotations

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


def node_comm(world):
    """The ranks of this rank's node: those that share memory (MPI_COMM_TYPE_SHARED)."""
    from mpi4py import MPI
    return world.Split_type(MPI.COMM_TYPE_SHARED, key=world.rank)


def discover(world) -> Nodes:
    """Nodes are the groups of ranks that share memory."""
    from mpi4py import MPI
    local = node_comm(world)
    leader = local.bcast(world.rank, root=0)
    leaders = world.allgather(leader)
    order = sorted(set(leaders))
    host = MPI.Get_processor_name()
    hosts = world.allgather(host if local.rank == 0 else None)
    nodes = Nodes(tuple(order.index(ld) for ld in leaders),
                  tuple(hosts[ld] for ld in order), local.rank, local.size)
    local.Free()
    return nodes


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
        lines.append(f"job {j:4d} : ranks {_ranges(ranks)} on {len(hosts)} node(s) {','.join(hosts)}")
    if layout.idle:
        lines.append(f"idle     : ranks {_ranges(layout.idle)}")
    return lines


def _ranges(ranks) -> str:
    """[0,1,2,5] -> '0-2,5' so that maps stay readable at thousands of ranks."""
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
