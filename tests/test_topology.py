"""Parallelism Controller: Eq. 5 and the job-to-rank-to-node map (pure, no MPI)."""
import pytest

from harness import topology as tp


@pytest.mark.parametrize("M,P,expect_M,idle", [(2, 2, 2, 0), (4, 1, 4, 0), (0, 2, 2, 0), (1, 2, 1, 2), (0, 3, 1, 1)])
def test_resolve_world_of_4(M, P, expect_M, idle):
    m, warnings = tp.resolve(4, M, P)
    assert m == expect_M
    assert bool(warnings) == bool(idle)
    if idle:
        assert f"{idle} rank(s) idle" in warnings[0]


@pytest.mark.parametrize("M,P,msg", [(3, 2, "M x P = 3 x 2 = 6 exceeds the world size 4"),
                                     (1, 5, "P_degree 5 exceeds the world size 4"),
                                     (1, 0, "P_degree must be >= 1")])
def test_resolve_errors_name_both_numbers(M, P, msg):
    with pytest.raises(tp.TopologyError, match=msg.replace("x", r"x").replace("(", r"\(")):
        tp.resolve(4, M, P)


def test_one_node_jobs_are_consecutive_ranks():
    lay = tp.map_jobs([0, 0, 0, 0], 2, 2, pmap=0)
    assert lay.jobs == ((0, 1), (2, 3)) and lay.idle == ()
    assert lay.job_of(3) == 1


def test_packed_keeps_jobs_inside_nodes():
    nodes = [0, 0, 0, 1, 1, 1]          # two nodes of 3 ranks
    lay = tp.map_jobs(nodes, 2, 2, pmap=0)
    assert lay.jobs == ((0, 1), (3, 4)) and lay.idle == (2, 5)
    lay = tp.map_jobs(nodes, 3, 2, pmap=0)   # the third job must take the leftovers of both
    assert lay.jobs == ((0, 1), (2, 5), (3, 4))
    eight = [0] * 4 + [1] * 4
    assert all(len({eight[r] for r in job}) == 1 for job in tp.map_jobs(eight, 4, 2, 0).jobs)


def test_round_robin_spreads_jobs_over_nodes():
    nodes = [0, 0, 1, 1]
    lay = tp.map_jobs(nodes, 2, 2, pmap=1)
    assert lay.jobs == ((0, 2), (1, 3))
    assert all(len({nodes[r] for r in job}) == 2 for job in lay.jobs)


def test_interleaved_hosts_are_grouped_by_node():
    lay = tp.map_jobs([0, 1, 0, 1], 2, 2, pmap=0)   # ranks placed round-robin by the launcher
    assert lay.jobs == ((0, 2), (1, 3))


def test_describe_compresses_rank_ranges():
    nodes = tp.Nodes((0,) * 6, ("n0",), 0, 6)
    lines = tp.describe(tp.map_jobs(nodes.node_of_rank, 1, 4, 0), nodes)
    assert lines == ["job    0 : ranks 0-3 on 1 node(s) n0", "idle     : ranks 4-5"]
