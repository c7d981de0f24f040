"""A base model trained on from a checkpoint ends with the weights of one trained without a
stop (issue 70): harness/train.run's `start` and `checkpoint`, PyTorch's Trainer.state and
restore, P = 1 on a CPU (where training is deterministic), in an MPI singleton of its own.
Digits, 4 epochs of B 32 with SGD, its dropout drawing from the generator the state carries."""
import json
import subprocess
import sys

import pytest

from tests.conftest import ROOT, mpi_env

pytest.importorskip("torch")

PROGRAM = r'''
import json, sys
sys.path.insert(0, sys.argv[1])
from mpi4py import MPI
from harness import frameworks, sampler, train
from harness.workloads import Dataset, get

pt = frameworks.get("pytorch")
pt.setup_devices(0, 1)
wl = get("digits")
data = wl.load(Dataset.parse("embedded"), "")
indices = sampler.resample(data.n_train, "bootstrap", 42, 0)
recipe = train.Recipe(32, 4, 0.05, 1.0)


def training(start=None, checkpoint=None, restore=True):
    fw = pt.open_job(frameworks.JobSpec(MPI.COMM_SELF, (0,), (0,), "fp32", "ring", "data", 1, 32, 0))
    model = fw.build(wl, data, 42, 0, "fp32")
    if start is not None and not restore:   # the control: the epochs skipped, the state not put back
        import harness.frameworks.pytorch.train as ptrain
        ptrain.Trainer.restore = lambda self, state: None
    res = fw.train(wl, data, model, indices, recipe, seed=42, job=0, world_barrier=lambda: None,
                   evaluate=lambda epoch: False, eval_every=2, start=start, checkpoint=checkpoint)
    fw.close()
    return res


saved = {}
whole = training(checkpoint=lambda epoch, state: saved.setdefault(epoch, state()))
resumed = training(start=train.Start(2, saved[2]))
blind = training(start=train.Start(2, saved[2]), restore=False)
print(json.dumps({"saved": sorted(saved), "whole": [whole.weights_digest, whole.epochs, whole.samples],
                  "resumed": [resumed.weights_digest, resumed.epochs, resumed.samples],
                  "blind": blind.weights_digest, "state_bytes": len(saved[2])}), flush=True)
'''


@pytest.mark.mpi   # an MPI singleton: with the tests that start MPI
def test_a_p1_model_resumed_from_its_checkpoint_ends_with_the_uninterrupted_weights(tmp_path):
    (tmp_path / "prog.py").write_text(PROGRAM)
    p = subprocess.run([sys.executable, str(tmp_path / "prog.py"), str(ROOT)], cwd=tmp_path, env=mpi_env(True, {}),
                       capture_output=True, text=True, timeout=600)
    assert p.returncode == 0, p.stderr[-3000:]
    out = json.loads(p.stdout.strip().splitlines()[-1])
    assert out["saved"] == [2]            # after the evaluation of epoch 2; none after the last (4)
    digest, epochs, samples = out["whole"]
    assert out["resumed"] == [digest, 4, samples // 2]   # the same weights, 2 epochs trained, their samples alone
    assert out["blind"] != digest         # the epochs skipped without the state: not the same model
    assert out["state_bytes"] > 0
