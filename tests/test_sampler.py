"""Data Sampler statistics: the bootstrap must look like the paper's bagging."""
import math

import numpy as np
import pytest

from harness import sampler

N = 100_000


def test_bootstrap_out_of_bag_is_about_36_8_percent():
    idx = sampler.resample(N, "bootstrap", seed=42, job=0)
    assert len(idx) == N and idx.min() >= 0 and idx.max() < N
    # (1 - 1/N)^N -> 1/e; the standard deviation at N = 1e5 is ~0.0015
    assert abs(sampler.out_of_bag_fraction(idx, N) - math.exp(-1)) < 0.006


@pytest.mark.parametrize("method", ["bootstrap", "poisson"])
def test_draw_counts_are_poisson_1(method):
    counts = np.bincount(sampler.resample(N, method, seed=7, job=3), minlength=N)
    assert abs(counts.mean() - 1.0) < 0.015
    assert abs(counts.var() - 1.0) < 0.03
    for k in range(4):  # P(k) = e^-1 / k!
        assert abs(np.mean(counts == k) - math.exp(-1) / math.factorial(k)) < 0.006


def test_poisson_size_varies_around_n():
    sizes = [len(sampler.resample(N, "poisson", seed=1, job=j)) for j in range(4)]
    assert all(abs(s - N) < 5 * math.sqrt(N) for s in sizes)
    assert len(set(sizes)) > 1


def test_none_is_a_permutation():
    idx = sampler.resample(1000, "none", seed=1, job=0)
    assert sorted(idx.tolist()) == list(range(1000))


def test_reproducible_and_different_across_jobs_and_seeds():
    a = sampler.resample(N, "bootstrap", seed=42, job=1)
    assert np.array_equal(a, sampler.resample(N, "bootstrap", seed=42, job=1))
    assert sampler.digest(a) == sampler.digest(sampler.resample(N, "bootstrap", seed=42, job=1))
    assert not np.array_equal(a, sampler.resample(N, "bootstrap", seed=42, job=2))
    assert not np.array_equal(a, sampler.resample(N, "bootstrap", seed=43, job=1))
    assert sampler.digest(a) != sampler.digest(sampler.resample(N, "bootstrap", seed=42, job=2))


def test_rejects_bad_input():
    with pytest.raises(ValueError, match="unknown sampler"):
        sampler.resample(10, "jackknife", 0, 0)
    with pytest.raises(ValueError, match="empty"):
        sampler.resample(0, "bootstrap", 0, 0)


@pytest.mark.parametrize("size,batch", [(1, 32), (2, 32), (3, 7)])
def test_epoch_shards_have_equal_steps_and_cover_the_resample_once(size, batch):
    idx = sampler.resample(1003, "bootstrap", seed=5, job=0)
    shards = [sampler.epoch_shard(idx, 5, 0, epoch=2, rank=r, size=size, batch=batch) for r in range(size)]
    steps = len(idx) // (size * batch)
    assert all(len(s) == steps * batch for s in shards)  # same number of all-reduces everywhere
    used = np.concatenate(shards)
    # the shards are disjoint positions of the resample: their multiset is inside it
    assert np.all(np.bincount(used, minlength=1003) <= np.bincount(idx, minlength=1003))
    other = sampler.epoch_shard(idx, 5, 0, epoch=3, rank=0, size=size, batch=batch)
    assert not np.array_equal(shards[0], other)  # reshuffled every epoch


def test_a_resample_is_awaited_through_the_given_wait():
    """distribute's waits go through `wait(request, phase)` (run.py passes the
    watchdog's), including the arrival of a message whose size is not known yet.
    In-process on MPI.COMM_SELF: one job, rank 0 its own root."""
    from mpi4py import MPI
    comm, phases = MPI.COMM_SELF, []

    def wait(request, phase):
        phases.append(phase)
        while not request.Test():
            pass
    got = sampler.distribute(comm, [[0]], 10, "bootstrap", 3, comm, 0, wait=wait)
    assert np.array_equal(got, sampler.resample(10, "bootstrap", 3, 0))
    assert phases == ["waiting for job 0's resample from its root"]
    # a wave of --on-fault retrain trains job 2 alone: jobs 0 and 1 have no ranks, and job 2's
    # resample is the one the test drew for it (seed and job alone)
    got = sampler.distribute(comm, [[], [], [0]], 10, "bootstrap", 3, comm, 2, wait=wait)
    assert np.array_equal(got, sampler.resample(10, "bootstrap", 3, 2))
    arrival = sampler._Arrival(comm, 0, 7)
    assert not arrival.Test()
    req = comm.Isend([np.arange(5, dtype=np.int64), MPI.INT64_T], dest=0, tag=7)
    wait(arrival, "arrival")
    assert arrival.status.Get_count(MPI.INT64_T) == 5          # the size, before the receive
    buf = np.empty(5, np.int64)
    comm.Recv([buf, MPI.INT64_T], source=0, tag=7)
    req.Wait()
    assert list(buf) == [0, 1, 2, 3, 4]
