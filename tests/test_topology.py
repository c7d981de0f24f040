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


def test_machines_group_nodes_by_kernel():
    # ranks 0-1 on node 0, 2-3 on node 1 (both boot "a"), 4 on node 2 (boot "b")
    assert tp.machines(["a", "a", "a", "a", "b"], [0, 0, 1, 1, 2]) == (0, 0, 1)
    assert tp.machines(["x", "y"], [0, 1]) == (0, 1)                 # a cluster: a machine per node


def test_ranks_of_two_nodes_bound_to_one_core_are_widened():
    # Two simulated nodes on one 2-core machine: each node's daemon bound its ranks to
    # CPU 0 and CPU 1, so ranks 0 and 2 share CPU 0 and ranks 1 and 3 CPU 1.
    assert tp.contested([0, 0, 1, 1], (0, 0), [0b01, 0b10, 0b01, 0b10], (2,)) == {0: 3, 1: 3, 2: 3, 3: 3}
    # one rank a node, both on CPU 0 of a 4-CPU machine: both get CPUs 0-3
    assert tp.contested([0, 1], (0, 0), [0b01, 0b01], (4,)) == {0: 0b1111, 1: 0b1111}
    # a rank already on every CPU keeps its binding (not counted as widened)
    assert tp.contested([0, 1], (0, 0), [0b11, 0b01], (2,)) == {1: 0b11}


def test_bindings_inside_a_node_or_on_separate_machines_are_left_alone():
    # two ranks of one node on one core: the launcher's (or the user's) choice
    assert tp.contested([0, 0], (0,), [0b01, 0b01], (2,)) == {}
    # a real cluster: two machines, each node binds from CPU 0
    assert tp.contested([0, 0, 1, 1], (0, 1), [0b01, 0b10, 0b01, 0b10], (2, 2)) == {}
    # nodes on one machine with disjoint cores (cpusets): nothing contested
    assert tp.contested([0, 1], (0, 0), [0b01, 0b10], (2,)) == {}
    # unbound ranks (every CPU) of two nodes on one machine: already the union
    assert tp.contested([0, 1], (0, 0), [0b11, 0b11], (2,)) == {}


def test_sharing_lines_say_what_shares_what():
    two = tp.Nodes((0, 0, 1, 1), ("n1", "n2"), 0, 2, (0, 0), (2,), 4, (0, 1, 2, 3))
    lines = tp.sharing(two)
    assert lines[0].startswith("Shared machine: nodes n1,n2 run on one machine (one kernel) and share its 2 cores")
    assert lines[1].startswith("Oversubscribed: 4 ranks on 2 cores of one machine (n1...)")
    assert lines[2].startswith("Bindings widened: ranks 0-3 were bound")
    assert two.ranks_sharing_cores == 4
    cluster = tp.Nodes((0, 0, 1, 1), ("a", "b"), 0, 2, (0, 1), (2, 2), 2)
    assert tp.sharing(cluster) == [] and cluster.ranks_sharing_cores == 2
    one = tp.Nodes((0,) * 3, ("a",), 0, 3, (0,), (2,), 3)
    assert tp.sharing(one) == ["Oversubscribed: 3 ranks on 2 cores of a node: ranks shared cores; a test with idle"
                               " ranks gives its ranks more than the share the kernels ran with"]
