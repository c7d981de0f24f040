"""Aggregation and the paper's metrics as pure functions."""
from dataclasses import replace

import numpy as np
import pytest

from harness import ensemble, metrics
from tests.conftest import result


def _ensemble(per_model, method):
    """The run's path: each model's contribution, summed (the world reduction), averaged."""
    total = sum(ensemble.contribution(p, method, j, len(per_model), False) for j, p in enumerate(per_model))
    return ensemble.ensemble_scores(total, len(per_model), False)


def test_mean_aggregation_averages_probabilities():
    a = np.array([[0.6, 0.4], [0.2, 0.8]])
    b = np.array([[0.1, 0.9], [0.3, 0.7]])
    assert np.allclose(_ensemble([a, b], "mean"), [[0.35, 0.65], [0.25, 0.75]])


def test_vote_counts_predicted_classes():
    m = [np.array([[0.9, 0.1, 0.0]]), np.array([[0.4, 0.5, 0.1]]), np.array([[0.1, 0.6, 0.3]])]
    assert np.allclose(_ensemble(m, "vote"), [[1 / 3, 2 / 3, 0]])
    # mean and vote can disagree: one confident model outweighs two lukewarm ones
    assert np.argmax(_ensemble(m, "mean")) == 0 and np.argmax(_ensemble(m, "vote")) == 1


def test_unknown_aggregation():
    with pytest.raises(ValueError, match="unknown aggregation"):
        ensemble.model_scores(np.ones((1, 2)), "median")


@pytest.mark.parametrize("n,size", [(10, 3), (3, 4), (359, 2), (0, 2)])
def test_rows_split_the_validation_set_exactly(n, size):
    parts = [ensemble.my_rows(n, r, size) for r in range(size)]
    assert sum(p.stop - p.start for p in parts) == n
    assert all(parts[i].stop == parts[i + 1].start for i in range(size - 1))


def test_flops_and_vflops():
    total = metrics.total_flops([1000, 1200], 3e6)
    assert total == 2200 * 3e6
    f = metrics.flops(total, 2.0)
    assert f == pytest.approx(3.3e9)
    assert metrics.vflops(f, 0.9, 0.9, 5) == pytest.approx(f)
    assert metrics.vflops(f, 0.45, 0.9, 2) == pytest.approx(f / 4)
    assert metrics.penalty(0.99, 0.9, 5) > 1.0          # awarded, not capped (Eq. 8)
    with pytest.raises(ValueError):
        metrics.flops(1.0, 0.0)


def test_weak_scaling():
    s = metrics.weak_scaling([(1, 10.0), (2, 19.0), (4, 36.0)])
    assert (s.scale_from, s.scale_to) == (1, 4)
    assert s.speedup == pytest.approx(3.6) and s.efficiency == pytest.approx(0.9)
    assert metrics.weak_scaling([(2, 1.0)]) is None


def test_intensity_of_a_training_step():
    # F = 1e6 FLOPs/sample, A = 1e3 activations/sample, W = 1e4 weights, B = 10, fp32:
    # FLOPs 3 F B = 3e7 over bytes 4 (3 W + 3 A B) = 4 x 6e4 = 2.4e5 -> 125 FLOP/byte
    assert metrics.intensity(1e6, 1e3, 1e4, 10, 4) == pytest.approx(125.0)
    assert metrics.intensity(1e6, 1e3, 1e4, 1000, 4) > metrics.intensity(1e6, 1e3, 1e4, 10, 4)


def test_weak_scaling_averages_repeated_runs_at_a_scale():
    s = metrics.weak_scaling([(1, 10.0), (1, 12.0), (2, 20.0), (2, 24.0)])
    assert s.speedup == pytest.approx(2.0) and s.efficiency == pytest.approx(1.0)


def _runs(rows, ttq=None, target=0.7, n=2, **same):
    """One test's runs (results.TestResult): rows of (train s, FLOPs, quality, time to
    solution s); ttq: per run (time to quality s, epochs to quality), or None: every run
    reached at its end; `same`: fields every run shares."""
    ttq = ttq or [(tts, 10) for *_, tts in rows]
    return [result(train_seconds=t, total_flops=w, flops=w / t, quality=q, time_to_solution=tts,
                   time_to_quality=tq, epochs_to_quality=eq, target_quality=target, penalty_n=n, **same)
            for (t, w, q, tts), (tq, eq) in zip(rows, ttq)]


def test_olympic_repeats_sum_the_kept_runs_work_over_their_time():
    runs = _runs([(10, 1000, 0.90, 10), (9, 990, 0.92, 9), (30, 1200, 0.10, 30), (5, 2500, 0.99, 5),
                  (11, 990, 0.91, 11)])                     # rates 100, 110, 40, 500, 90
    r = metrics.repeats(runs)
    assert (r.index, r.runs, r.kept, r.ordered_by) == (1, 5, 3, "train_seconds")   # 5 s and 30 s dropped
    assert r.flops == pytest.approx(2980 / 30)              # 99.33, where the mean of rates says 100
    assert r.quality == pytest.approx(0.91)
    assert r.vflops == pytest.approx(2980 / 30 * (0.91 / 0.7) ** 2)   # Eq. 7-8 of the summary's own figures
    import numpy as np
    assert r.cv_flops == pytest.approx(np.std([100, 110, 40, 500, 90], ddof=1) / np.mean([100, 110, 40, 500, 90]))
    two = metrics.repeats(runs[:2])
    assert (two.kept, two.flops) == (2, pytest.approx(1990 / 19))     # fewer than 3: all kept
    assert metrics.repeats(runs[:1]).cv_flops == 0.0


def test_time_to_quality_has_its_own_olympic_order_and_v2s_cv_of_epochs():
    rows = [(10, 1000, 0.9, 10)] * 5
    runs = _runs(rows, [(8.0, 4), (6.0, 3), (20.0, 9), (7.0, 3), (2.0, 1)], target=0.9, n=1)
    r = metrics.repeats(runs)
    assert r.reached == 5
    assert r.time_to_quality == pytest.approx((8.0 + 6.0 + 7.0) / 3)   # 2 s and 20 s dropped
    import numpy as np
    assert r.cv_epochs_to_quality == pytest.approx(np.std([4, 3, 9, 3, 1], ddof=1) / np.mean([4, 3, 9, 3, 1]))
    runs[2] = replace(runs[2], time_to_quality=None, epochs_to_quality=None)   # one run never reached the target
    r = metrics.repeats(runs)
    assert (r.reached, r.time_to_quality, r.cv_epochs_to_quality) == (4, None, None)


def test_first_reaching_is_the_first_evaluation_at_or_over_the_target():
    curve = [{"epoch": e, "seconds": 1.5 * e, "quality": q} for e, q in ((1, 0.5), (2, 0.8), (3, 0.79), (4, 0.9))]
    assert metrics.first_reaching(curve, 0.8) is curve[1]
    assert metrics.first_reaching(curve, 0.9)["seconds"] == 6.0
    assert metrics.first_reaching(curve, 0.95) is None


def test_time_to_quality_counts_the_points_with_as_many_models_as_the_last():
    def point(q, *bases):
        return {"quality": q, "base_quality": list(bases)}
    # retrain: model 1 lost after the first point, trained again by a wave (the last two points)
    curve = [point(0.5, 0.5, 0.4), point(0.9, 0.9, None), point(0.7, 0.9, 0.3), point(0.92, 0.9, 0.8)]
    assert metrics.counted(curve) == [curve[0], curve[2], curve[3]]
    assert metrics.first_reaching(metrics.counted(curve), 0.9) is curve[3]   # not the one-model point
    # drop: the last point has one model too, so every point counts
    assert metrics.counted(curve[:2]) == curve[:2]


def test_a_kept_sum_reads_back_each_chunk_as_written():
    kept = ensemble.Kept()
    a, b = np.arange(6.0).reshape(3, 2), np.full((1, 2), 7.5)
    kept.add(a)
    kept.add(b)
    assert np.array_equal(kept.chunk(1), b) and np.array_equal(kept.chunk(0), a)


def test_evaluation_epochs_every_k_and_always_the_last():
    from harness import train
    assert train.evaluation_epochs(10, 1) == list(range(1, 11))
    assert train.evaluation_epochs(10, 3) == [3, 6, 9, 10]
    assert train.evaluation_epochs(10, 5) == [5, 10]
    assert train.evaluation_epochs(10, 0) == [10] == train.evaluation_epochs(10, 12)


def test_with_staging_the_olympic_order_is_time_to_solution():
    # by training time run 0 is the fastest; with its staging it is the slowest
    runs = _runs([(5, 500, 0.9, 50), (10, 1000, 0.9, 12), (11, 1100, 0.9, 13), (12, 1200, 0.9, 14)],
                 target=0.9, n=1, staging={"seconds": 1.0})
    r = metrics.repeats(runs)
    assert r.ordered_by == "time_to_solution"
    assert r.flops == pytest.approx((1100 + 1200) / (11 + 12))        # runs 1 (12 s) and 0 (50 s) dropped


def test_stacked_contributions_sum_to_every_models_own_slot():
    """Detection: one world sum of the M contributions must give back each model's
    predictions intact, in job order, for the workload to fuse."""
    rng = np.random.default_rng(0)
    preds = [rng.random((5, 6)) for _ in range(3)]
    assert ensemble.reduced_shape(5, 6, 3, stack=True) == (5, 18)
    total = sum(ensemble.contribution(p, "mean", j, 3, stack=True) for j, p in enumerate(preds))
    stacked = ensemble.ensemble_scores(total, 3, stack=True)
    assert stacked.shape == (5, 3, 6)
    for j, p in enumerate(preds):
        np.testing.assert_array_equal(stacked[:, j], p)


def test_summed_contributions_average_to_the_mean():
    rng = np.random.default_rng(1)
    preds = [rng.random((4, 3)) for _ in range(2)]
    assert ensemble.reduced_shape(4, 3, 2, stack=False) == (4, 3)
    total = sum(ensemble.contribution(p, "mean", j, 2, stack=False) for j, p in enumerate(preds))
    np.testing.assert_allclose(ensemble.ensemble_scores(total, 2, stack=False), (preds[0] + preds[1]) / 2)


# ---- lower is better (an error: cosmoflow's MAE) -------------------------------------
def test_penalty_of_an_error_is_the_ratio_turned_round():
    # MAE 0.248 against a target of 0.124: twice as bad, n = 5 -> 1/32; 0.062: twice as good -> 32
    assert metrics.penalty(0.248, 0.124, 5, higher_is_better=False) == pytest.approx(1 / 32)
    assert metrics.penalty(0.062, 0.124, 5, higher_is_better=False) == pytest.approx(32.0)
    assert metrics.penalty(0.124, 0.124, 5, higher_is_better=False) == 1.0
    # the same relative miss costs the same in both directions: Top-1 half the target, MAE twice it
    assert metrics.penalty(0.38, 0.76, 5) == pytest.approx(metrics.penalty(0.248, 0.124, 5, False))
    assert metrics.vflops(1e12, 0.248, 0.124, 5, False) == pytest.approx(1e12 / 32)
    with pytest.raises(ValueError, match="no finite penalty"):
        metrics.penalty(0.0, 0.124, 5, higher_is_better=False)


def test_reaching_best_and_gain_follow_the_direction():
    assert metrics.reaches(0.12, 0.124, False) and metrics.reaches(0.124, 0.124, False)
    assert not metrics.reaches(0.13, 0.124, False)
    assert metrics.reaches(0.8, 0.763) and not metrics.reaches(0.12, 0.124)   # higher-is-better reading
    assert metrics.best([0.3, 0.2, 0.25], False) == 0.2 and metrics.best([0.3, 0.2, 0.25]) == 0.3
    # ensemble MAE 0.20 against base models' mean 0.25: 0.05 better; Top-1 0.9 against 0.85: 0.05 better
    assert metrics.gain(0.20, 0.25, False) == pytest.approx(0.05)
    assert metrics.gain(0.9, 0.85) == pytest.approx(0.05)
    assert metrics.gain(0.30, 0.25, False) == pytest.approx(-0.05)


def test_first_reaching_an_error_target_is_the_first_at_or_below_it():
    curve = [{"epoch": 1, "seconds": 1.0, "quality": 0.4}, {"epoch": 2, "seconds": 2.0, "quality": 0.124},
             {"epoch": 3, "seconds": 3.0, "quality": 0.1}]
    assert metrics.first_reaching(curve, 0.124, False)["epoch"] == 2
    assert metrics.first_reaching(curve, 0.05, False) is None
    assert metrics.first_reaching(curve, 0.124)["epoch"] == 1   # the same curve read as an accuracy


def test_repeats_price_an_error_by_its_direction():
    runs = _runs([(s, 1e12, q, s) for s, q in ((1.0, 0.3), (2.0, 0.2), (4.0, 0.1))], [(None, None)] * 3,
                 target=0.124, n=5, higher_is_better=False)
    r = metrics.repeats(runs)
    # olympic by time: the 2 s run alone; FLOPS 1e12 / 2; VFLOPS x (0.124 / 0.2)^5
    assert (r.kept, r.quality) == (1, 0.2)
    assert r.vflops == pytest.approx(0.5e12 * (0.124 / 0.2) ** 5)


def test_utilisation_against_the_ranks_roofline_by_hand():
    ceilings = {"per_rank": {0: {"gemm": {"flops": 10.0}, "conv": {"flops": 20.0}},
                             1: {"gemm": {"flops": 20.0}, "conv": {"flops": 40.0}},
                             2: {"gemm": {"flops": 1e9}, "conv": {"flops": 1e9}}},   # did not train: not counted
                "peak": {"flops": 5.0}}
    assert metrics.utilisation(6.0, ceilings, [0, 1]) == {"gemm": 0.2, "conv": 0.1, "peak": 0.6}
    assert metrics.utilisation(6.0, dict(ceilings, peak={"flops": None}), [0, 1])["peak"] is None
    assert metrics.utilisation(6.0, None, [0, 1]) is None      # no roofline run (line 30 at 0)


def test_replica_consistency_passes_at_the_bound_and_not_above():
    assert metrics.consistency(1e-6) == {"max_diff": 1e-6, "tolerance": 1e-6, "passed": True}
    assert metrics.consistency(2e-6)["passed"] is False


def test_chunks_of_an_evaluation_by_hand(monkeypatch):
    # 10 rows of 5 float64 columns, 120 bytes a chunk = 3 rows: 0-3, 3-6, 6-9, 9-10
    monkeypatch.setattr(ensemble, "EVAL_CHUNK_BYTES", 8 * 5 * 3)
    assert ensemble.chunks(10, 5, True) == [slice(0, 3), slice(3, 6), slice(6, 9), slice(9, 10)]
    assert ensemble.chunks(10, 5, False) == [slice(0, 10)]          # not a mean over samples: the whole set
    assert ensemble.chunks(10, 5, True, rows=4) == [slice(0, 4), slice(4, 8), slice(8, 10)]   # HPCAI500_EVAL_CHUNK
    assert ensemble.chunks(10, 10**9, True) == [slice(k, k + 1) for k in range(10)]          # at least one row
    assert ensemble.chunks(0, 5, True) == []


def test_chunk_mean_weighs_chunks_by_their_rows():
    assert metrics.chunk_mean([(3, 0.5), (1, 1.0)]) == pytest.approx((3 * 0.5 + 1.0) / 4)   # 0.625
    assert metrics.chunk_mean([(7, 0.1234)]) == 0.1234   # one chunk: its figure as it is (mAP is no mean)
