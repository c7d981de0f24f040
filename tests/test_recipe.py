"""harness/train.run, the one recipe of a base model's training (issue 47), driven with a
framework's side (a Trainer) that only records what it is asked: pure logic, in process.
The real runs (tests/test_run.py, test_pytorch_run.py, test_options.py) train through it
in both frameworks."""
import numpy as np
import pytest

from harness import sampler, train


class Recording:
    """A Trainer whose step returns 1.0 / its step number and records every call in order."""

    def __init__(self, size=2, share=1, step_batch=4, lr_factor=2.0):
        self.size, self.share, self.shares, self.step_batch, self.lr_factor = size, share, size, step_batch, lr_factor
        self.mean_of, self.calls, self.schedule = None, [], None

    def prepare(self, schedule):
        self.schedule = schedule
        self.calls.append("prepare")
        taken = []

        def step(x, y):
            taken.append(x)
            self.calls.append(("step", x))
            return 1.0 / len(taken)
        return step, {"momentum": 0.9}

    def warm_up(self, rows, steps, feed_seed):
        self.calls.append(("warm_up", list(rows), steps, feed_seed))

    def feed(self, shards, epochs, steps, feed_seed):
        self.calls.append(("feed", epochs, steps, feed_seed))
        return ((f"e{e}s{s}", None) for e in range(epochs) for s in range(steps))

    def sync(self):
        self.calls.append("sync")

    def consistency(self):
        self.calls.append("consistency")
        return 0.0, "digest"

    def stage(self):
        return None


class Hooks:
    def __init__(self, calls):
        self.calls = calls

    def recipe(self, name, config, peak, warmup, total):
        self.calls.append(("recipe", name, config, peak, warmup, total))

    def run_start(self):
        self.calls.append("run_start")

    def epoch_start(self, epoch):
        pass

    def epoch_stop(self, epoch, epochs, loss, elapsed):
        pass


def test_the_recipe_in_its_order_with_hand_computed_figures():
    """20 samples, P = 2, B = 4: 20 // 8 = 2 steps an epoch, 3 epochs, 6 steps; warm-up 1.5
    epochs = 3 steps; peak = 0.1 x 2 (the trainer's factor). The warm-up reads epoch 1's
    first batch of this rank's shard; the barrier follows the feed; the root's statistics
    are synced before each evaluation (after epochs 2 and 3, line 31's every 2), not again
    at the end; the job trained 2 x 3 x 4 x 2 = 48 samples."""
    t = Recording()
    indices = np.arange(100, 120)
    recipe = train.Recipe(batch=4, epochs=3, base_lr=0.1, warmup_epochs=1.5, optimizer="sgd")

    def evaluate(epoch):
        t.calls.append(("evaluate", epoch))
        return False
    res = train.run(t, indices, recipe, seed=7, job=3, world_barrier=lambda: t.calls.append("barrier"),
                    hooks=Hooks(t.calls), evaluate=evaluate, eval_every=2)
    assert t.schedule == train.Schedule(peak=0.2, warmup=3, total=6)
    feed_seed = 7 * 1_000_003 + 3 * 1009
    first = list(sampler.epoch_shard(indices, 7, 3, 0, 1, 2, 4)[:4])
    steps = [("step", f"e{e}s{s}") for e in range(3) for s in range(2)]
    assert t.calls == ["prepare", ("recipe", "sgd", {"momentum": 0.9}, 0.2, 3, 6), ("warm_up", first, 1, feed_seed),
                       ("feed", 3, 2, feed_seed), "barrier", "run_start", *steps[:4], "sync", ("evaluate", 2),
                       *steps[4:], "sync", ("evaluate", 3), "consistency"]
    assert (res.steps_per_epoch, res.samples, res.epochs, res.weights_digest) == (2, 48, 3, "digest")
    assert res.final_loss == pytest.approx((1 / 5 + 1 / 6) / 2)      # the last epoch's two steps


def test_without_evaluations_the_root_statistics_are_synced_once_at_the_end():
    t = Recording(size=1, share=0, step_batch=5, lr_factor=1.0)
    recipe = train.Recipe(batch=5, epochs=1, base_lr=0.1, warmup_epochs=0)
    res = train.run(t, np.arange(10), recipe, seed=1, job=0, world_barrier=lambda: None, warmup_steps=0)
    assert [c if isinstance(c, str) else c[0] for c in t.calls] == [
        "prepare", "feed", "step", "step", "consistency", "sync"]
    assert res.samples == 10 and t.schedule.at(0) == pytest.approx(train.lr_at(0, 2, 0, 0.1))


def test_a_resample_smaller_than_a_step_is_refused_before_anything_is_built():
    t = Recording()
    with pytest.raises(ValueError, match="job 3: resample of 7 samples is smaller than P x B = 2 x 4"):
        train.run(t, np.arange(7), train.Recipe(batch=4, epochs=1, base_lr=0.1, warmup_epochs=0), seed=1, job=3,
                  world_barrier=lambda: None)
    assert t.calls == []
