"""The sampler's distribution at scale: rank 0's memory does not grow with M, and every
job receives exactly its `sampler.resample`. Real mpirun on 12 ranks, one job each
(the jobs' roots are ranks 1..11); no TensorFlow, a plain script."""
import json

import pytest

from tests.conftest import ROOT, mpirun

SCRIPT = r"""
import json, sys, tracemalloc
sys.path.insert(0, sys.argv[1])
from mpi4py import MPI
from harness import sampler
world = MPI.COMM_WORLD
n, M = int(sys.argv[2]), int(sys.argv[3])
jobs = [[r] for r in range(M)]                      # M jobs of one rank: each its own root
my_job = world.rank if world.rank < M else None
job_comm = world.Split(my_job if my_job is not None else MPI.UNDEFINED, 0)
tracemalloc.start()
idx = sampler.distribute(world, jobs, n, "bootstrap", 42, job_comm, my_job)
peak = tracemalloc.get_traced_memory()[1]
ok = idx is None or sampler.digest(idx) == sampler.digest(sampler.resample(n, "bootstrap", 42, my_job))
out = world.gather({"rank": world.rank, "peak": peak, "ok": ok}, root=0)
if world.rank == 0:
    print(json.dumps(out))
"""


def _distribute(tmp_path, np_: int, n: int, M: int) -> list[dict]:
    script = tmp_path / "distribute.py"
    script.write_text(SCRIPT)
    p = mpirun(np_, [ROOT, n, M], tmp_path, program=(str(script),))
    assert p.returncode == 0, p.stderr[-2000:]
    return json.loads(p.stdout.strip().splitlines()[-1])


@pytest.mark.mpi
def test_rank_0_memory_is_bounded_whatever_m_and_every_job_gets_its_resample(tmp_path):
    from harness import sampler
    n = 1 << 20                                   # 8 MiB a resample
    per = n * 8
    small, large = _distribute(tmp_path, 12, n, 2), _distribute(tmp_path, 12, n, 12)
    assert all(r["ok"] for r in small + large)    # each job's digest = resample(n, ..., job)
    # rank 0 holds its own resample and at most IN_FLIGHT in flight (+ one being drawn,
    # + the generator's temporaries: a resample's worth), whatever M
    bound = (sampler.IN_FLIGHT + 3) * per
    assert large[0]["peak"] <= bound, (large[0]["peak"] / per, sampler.IN_FLIGHT)
    # M = 12: measured 6.1 resamples' worth (the unbounded distribution held 12.1)
    assert large[0]["peak"] < 8 * per and small[0]["peak"] < 3 * per
