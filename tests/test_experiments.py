"""The paper's two experiments (harness/experiments.py) and their charts, from hand-made
results (tests/conftest.result): bagging against data parallelism (Fig. 9), quality against speed at
a fixed scale (Fig. 7), one layout in several parallel modes (line 37). No MPI, no TensorFlow."""
from dataclasses import replace

from harness import experiments, plots
from tests.conftest import result

PNG = b"\x89PNG\r\n\x1a\n"


def _t(index, M, P, flops, vflops=None, ttq=None, quality=0.95, base=None, wl="digits", B=32, prec="fp32"):
    """One folded test, as the report's caller gives it."""
    return result(index=index, workload=wl, B=B, precision=prec, M=M, P=P, flops=flops,
                  vflops=flops if vflops is None else vflops, quality=quality, base_quality=base or [quality] * M,
                  time_to_quality=ttq, target_quality=0.95)


# -- experiment 1: bagging against data parallelism -------------------------------------
def test_bagging_against_data_parallelism_ratios():
    # Sys_scale 4: DP (1 x 4) 1 Tflops, VTflops 0.9, 12.5 s; bagging (4 x 1) 2 Tflops, VTflops 1.9, 7.75 s:
    # FLOPS 2/1 = x2.00, VFLOPS 1.9/0.9 = 2.111 -> x2.11, TTQ bagging/DP 7.75/12.5 = x0.62
    tests = [_t(1, 1, 4, 1e12, 0.9e12, ttq=12.5), _t(2, 4, 1, 2e12, 1.9e12, ttq=7.75)]
    lines = experiments.comparison_lines(tests)
    assert lines[0] == "Bagging vs data parallelism (digits, B 32, fp32, Sys_scale 4):"
    assert "TTQ bagging/DP" in lines[1]
    assert lines[2].split() == ["DP", "1", "1", "4", "1.0000e+00", "9.000e-01", "12.50"]
    assert lines[3].split() == ["bagging", "2", "4", "1", "2.0000e+00", "1.900e+00", "7.75", "x2.00", "x2.11",
                                "x0.62"]
    assert lines[4].startswith("  Ratios x = bagging / DP") and len(lines) == 5


def test_time_to_quality_not_reached_gives_no_ratio():
    # bagging (2 x 2) never reached: its TTQ cell says so and the ratio is n/a; DP not reached: n/a too
    tests = [_t(1, 1, 4, 1e12, ttq=10.0), _t(3, 2, 2, 1.5e12, ttq=None), _t(4, 1, 2, 1e12, ttq=None),
             _t(5, 2, 1, 3e12, ttq=2.0)]
    lines = experiments.comparison_lines(tests)
    scale2, scale4 = lines[:5], lines[5:]
    assert scale2[2].split()[-2:] == ["not", "reached"]                    # DP row at scale 2
    assert scale2[3].split()[-3:] == ["x3.00", "x3.00", "n/a"]
    assert scale4[3].split()[-5:] == ["not", "reached", "x1.50", "x1.50", "n/a"]


def test_several_bagging_layouts_one_line_each_most_models_first():
    tests = [_t(3, 2, 2, 1.5e12), _t(1, 1, 4, 1e12), _t(2, 4, 1, 2e12)]
    rows = experiments.comparison_lines(tests)[2:5]
    assert [r.split()[:4] for r in rows] == [["DP", "1", "1", "4"], ["bagging", "2", "4", "1"],
                                             ["bagging", "3", "2", "2"]]


def test_no_pair_no_comparison():
    assert experiments.comparison_lines([]) == []
    # bagging at Sys_scale 2, DP at Sys_scale 4: different scales
    assert experiments.comparison_lines([_t(1, 2, 1, 1e12), _t(2, 1, 4, 1e12)]) == []
    # same scale, different batch or precision: not comparable
    assert experiments.comparison_lines([_t(1, 2, 1, 1e12), _t(2, 1, 2, 1e12, B=64)]) == []
    assert experiments.comparison_lines([_t(1, 2, 1, 1e12), _t(2, 1, 2, 1e12, prec="fp16")]) == []
    # two bagging layouts at one scale, no DP: a trade-off, not a comparison
    assert experiments.comparison_lines([_t(1, 4, 1, 1e12), _t(2, 2, 2, 1e12)]) == []


# -- experiment 2: quality against speed at a fixed scale -------------------------------
def test_tradeoff_marks_best_vflops_and_shortest_reached_time():
    tests = [_t(1, 1, 4, 1.0e12, 0.90e12, ttq=12.5, quality=0.94, base=[0.94]),
             _t(2, 4, 1, 2.0e12, 1.90e12, ttq=None, quality=0.97, base=[0.93, 0.92, 0.94, 0.93]),
             _t(3, 2, 2, 1.5e12, 1.20e12, ttq=7.75, quality=0.955, base=[0.94, 0.93])]
    lines = experiments.tradeoff_lines(tests)
    assert lines[0] == "Quality vs speed at Sys_scale 4 (digits, B 32, fp32):"
    assert "Ens Top-1" in lines[1] and "Base mean" in lines[1]
    # M descending; base mean 0.93 = (0.93 + 0.92 + 0.94 + 0.93) / 4, 0.935 = (0.94 + 0.93) / 2
    assert lines[2].split() == ["2", "4", "1", "0.9700", "0.9300", "2.0000e+00", "1.900e+00*",
                                "not", "reached"]
    assert lines[3].split() == ["3", "2", "2", "0.9550", "0.9350", "1.5000e+00", "1.200e+00", "7.75*"]
    assert lines[4].split() == ["1", "1", "4", "0.9400", "0.9400", "1.0000e+00", "9.000e-01", "12.50"]
    assert lines[5].startswith("  * best VTflops and shortest time to quality (target 0.9500)")
    assert len(lines) == 6


def test_tradeoff_ties_all_marked_and_nothing_reached():
    tests = [_t(1, 2, 1, 1e12, ttq=None), _t(2, 1, 2, 1e12, ttq=None)]
    lines = experiments.tradeoff_lines(tests)
    assert [r.split()[-3] for r in lines[2:4]] == ["1.000e+00*", "1.000e+00*"]   # equal VFLOPS: both best
    assert all(r.endswith("not reached") for r in lines[2:4])                       # no time marked
    assert lines[4] == "  * best VTflops (time to quality: no layout reached the target 0.9500)"


def test_tradeoff_needs_two_layouts_at_one_scale():
    assert experiments.tradeoff_lines([]) == []
    assert experiments.tradeoff_lines([_t(1, 2, 1, 1e12), _t(2, 4, 1, 2e12)]) == []          # scales 2 and 4
    assert experiments.tradeoff_lines([_t(1, 2, 1, 1e12), _t(2, 2, 1, 1.1e12)]) == []        # one layout twice
    assert experiments.tradeoff_lines([_t(1, 2, 1, 1e12), _t(2, 1, 2, 1e12, wl="ic")]) == []  # two workloads


def test_blocks_ordered_by_workload_batch_precision_scale():
    tests = [_t(i + 1, M, P, 1e12, wl=wl, B=B, prec=prec, ttq=1.0)
             for i, (wl, B, prec, M, P) in enumerate([
                 ("ic", 32, "fp32", 2, 1), ("ic", 32, "fp32", 1, 2),
                 ("digits", 64, "fp32", 2, 1), ("digits", 64, "fp32", 1, 2),
                 ("digits", 32, "fp32", 4, 1), ("digits", 32, "fp32", 1, 4),
                 ("digits", 32, "fp16", 2, 1), ("digits", 32, "fp16", 1, 2),
                 ("digits", 32, "fp32", 2, 1), ("digits", 32, "fp32", 1, 2)])]
    expected = ["(digits, B 32, fp16, Sys_scale 2)", "(digits, B 32, fp32, Sys_scale 2)",
                "(digits, B 32, fp32, Sys_scale 4)", "(digits, B 64, fp32, Sys_scale 2)",
                "(ic, B 32, fp32, Sys_scale 2)"]
    titles = [ln for ln in experiments.comparison_lines(tests) if ln.startswith("Bagging")]
    assert [t[t.index("("):-1] for t in titles] == expected
    titles = [ln for ln in experiments.tradeoff_lines(tests) if ln.startswith("Quality")]
    assert [t[len("Quality vs speed at "):] for t in titles] == [
        "Sys_scale 2 (digits, B 32, fp16):", "Sys_scale 2 (digits, B 32, fp32):", "Sys_scale 4 (digits, B 32, fp32):",
        "Sys_scale 2 (digits, B 64, fp32):", "Sys_scale 2 (ic, B 32, fp32):"]


def test_lines_fit_in_100_characters():
    big = [_t(101, 1, 1024, 1.23456e18, 9.87e17, ttq=None, quality=0.5), _t(102, 1024, 1, 1e20, 1e20, ttq=99999.99),
           _t(103, 512, 2, 1e12, 1e12, ttq=123456.78, quality=1.0)]
    big = [replace(t, quality_name="mAP@0.5", workload="ewa") for t in big]
    for ln in experiments.comparison_lines(big) + experiments.tradeoff_lines(big):
        assert len(ln) <= 100, ln
        assert ln == ln.rstrip()


def test_grouping_helpers():
    tests = [_t(1, 1, 1, 1e12), _t(2, 2, 1, 2e12), _t(3, 1, 2, 1.5e12), _t(4, 4, 1, 4e12), _t(5, 1, 4, 2e12)]
    assert [(g.scale, [t.index for t in g.tests]) for g in experiments.groups(tests)] == [
        (1, [1]), (2, [2, 3]), (4, [4, 5])]
    assert [g.layouts for g in experiments.fixed_scale_groups(tests)] == [[(2, 1), (1, 2)], [(4, 1), (1, 4)]]
    assert [(c.dp.index, [t.index for t in c.bagging]) for c in experiments.comparisons(tests)] == [
        (3, [2]), (5, [4])]
    # bagging P=1 over scales 1, 2, 4; data parallelism M=1 over 1, 2, 4; P=2 and P=4 hold one scale each
    assert [(s.kind, s.P, [t.index for t in s.tests]) for s in experiments.scaling_series(tests)] == [
        ("bagging", 1, [1, 2, 4]), ("data parallelism", None, [1, 3, 5])]


# -- charts ------------------------------------------------------------------------------
def test_scaling_chart_draws_data_parallelism_beside_bagging(tmp_path):
    tests = [_t(1, 1, 1, 1e12), _t(2, 2, 1, 2e12), _t(3, 1, 2, 1.5e12), _t(4, 4, 1, 4e12), _t(5, 1, 4, 2e12)]
    out = tmp_path / "scaling.png"
    assert plots.scaling(tests, str(out)) == 6          # 3 bagging (P=1) + 3 data parallelism, test 1 in both
    assert out.read_bytes()[:8] == PNG
    assert plots.scaling(tests[2:3] + tests[1:2], str(tmp_path / "none.png")) == 0   # one scale per series
    assert not (tmp_path / "none.png").exists()


def test_tradeoff_chart(tmp_path):
    tests = [_t(1, 1, 4, 1e12, ttq=3.0), _t(2, 4, 1, 2e12), _t(3, 2, 2, 1.5e12),   # scale 4: three layouts
             _t(4, 2, 1, 1e12), _t(5, 1, 2, 1e12, wl="ic"),                         # no group of two
             _t(6, 2, 1, 1e12, B=64), _t(7, 1, 2, 1.1e12, B=64)]                    # scale 2, B 64: two
    out = tmp_path / "tradeoff.png"
    assert plots.tradeoff(tests, str(out)) == 5
    assert out.read_bytes()[:8] == PNG
    assert plots.tradeoff(tests[3:5], str(tmp_path / "none.png")) == 0
    assert not (tmp_path / "none.png").exists()


def test_quality_curve_chart(tmp_path):
    test = replace(_t(1, 2, 1, 1e12), evaluations=[
        {"epoch": 1, "seconds": 1.5, "quality": 0.90, "base_quality": [0.85, 0.86]},
        {"epoch": 2, "seconds": 3.0, "quality": 0.96, "base_quality": [0.93, 0.94]}])
    out = tmp_path / "quality.png"
    assert plots.quality_curve(test, str(out)) == 6      # 2 evaluations x (ensemble + 2 base models)
    assert out.read_bytes()[:8] == PNG
    assert plots.quality_curve(replace(test, evaluations=[]), str(tmp_path / "none.png")) == 0
    assert not (tmp_path / "none.png").exists()


# ---- the report's use: repetitions folded, the footer's lines ----------------------

def test_fold_gives_a_repeated_test_its_summary_figures():
    from harness import metrics, report
    runs = [result(index=1, repetition=r, M=2, P=1, flops=f, vflops=f, quality=q, time_to_quality=s,
                   base_quality=[q - 0.01, q - 0.02]) for r, f, q, s in ((0, 1e12, 0.9, 3.0), (1, 2e12, 0.8, None))]
    other = result(index=2, repetition=0, M=1, P=2, flops=5e11, vflops=4e11, quality=0.7, time_to_quality=None,
                   base_quality=[0.7])
    summary = metrics.Repeats(index=1, runs=2, kept=2, ordered_by="train_seconds", flops=1.5e12, vflops=1.2e12,
                              quality=0.85, cv_flops=0.0, cv_quality=0.0, reached=1, time_to_quality=None,
                              cv_epochs_to_quality=None)
    folded = report.fold(runs + [other], [summary])
    assert [t.index for t in folded] == [1, 2] and folded[1] is other
    assert (folded[0].flops, folded[0].vflops, folded[0].quality, folded[0].time_to_quality) == \
        (1.5e12, 1.2e12, 0.85, None)
    assert folded[0].base_quality == [0.89, 0.88, 0.79, 0.78]     # every run's base models
    assert folded[0].repetition == 0 and runs[0].flops == 1e12      # the first run's record, itself unchanged


def test_the_footer_counts_each_skip_under_its_cause():
    """A split mode on P = 1 is not a layout larger than the run: the footer counts it
    apart; a record of schema 2.7 or before (no cause) reads as its report then said."""
    from harness import report
    skipped = [{"index": 2, "reason": "P = 1 ...", "cause": "mode"}, {"index": 3, "reason": "P = 1", "cause": "mode"},
               {"index": 5, "reason": "M x P ...", "cause": "ranks"}, {"index": 6, "reason": "M x P ..."}]
    lines = report.footer([], skipped, []).splitlines()
    assert lines[4:6] == ["              2 tests skipped because they need more ranks than the run has.",
                          "              2 tests skipped because their parallel mode (line 37) needs P >= 2."]
    old = report.footer([], skipped[2:], []).splitlines()
    assert old[4] == "              2 tests skipped because they need more ranks than the run has."
    assert "parallel mode" not in old[5]
    # schema 2.9: a test the sweep forces that cannot run is skipped, each cause a line saying why, in one order
    forced = [{"index": 6, "reason": "...", "cause": "split"}, {"index": 7, "reason": "...", "cause": "framework"},
              {"index": 8, "reason": "...", "cause": "split"}, {"index": 9, "reason": "...", "cause": "batch"}]
    assert report.footer([], forced, []).splitlines()[4:8] == [
        "              0 tests skipped because they need more ranks than the run has.",
        "              1 tests skipped because their framework (line 35) cannot carry them (lines 7, 22, 33).",
        "              2 tests skipped because their parallel mode (line 37) cannot run with their other values.",
        "              1 tests skipped because P x B (lines 11, 14) exceeds their training set."]


def test_a_huge_ratio_keeps_its_column():
    """A DP layout far below the target (quality 0.11 of 0.5 at n = 5 scores ~5e-4 of its
    FLOPS) makes VFLOPS ratios of ~5e4: they print in e-notation and the rows align."""
    assert experiments.ratio(999.994, 1.0) == "x999.99" and experiments.ratio(51804.02, 1.0) == "x5.18e+04"
    tests = [_t(1, 1, 8, 1e12, 2.254e7, ttq=None), _t(2, 8, 1, 1.15e12, 1.168e12, ttq=2.49)]
    lines = experiments.comparison_lines(tests)
    assert lines[3].split()[-3:] == ["x1.15", "x5.18e+04", "n/a"]
    assert len(lines[3]) == len(lines[1])          # the bagging row as wide as the header


# -- the parallel modes of one layout (line 37) ------------------------------------------
def _mode(index, mode, flops, idle=None, sent=0.0, replicas=1, theory=0.2, vflops=None, quality=0.95, micro=8,
          norm=0):
    t = replace(_t(index, 1, 4, flops, vflops, quality=quality), framework="pytorch", mode=mode, weights=150_000,
                flops_by_operator={"dense": 10, "normalization": norm})   # 0.6 MB of FP32 gradients
    if mode == "data":
        return t
    return replace(t, pipeline={"replicas": replicas, "idle": idle, "bubble_theory": theory, "microbatch": micro,
                                "bytes_between_stages": sent, "gradient_bytes": 4 * 149_000})


def _reading(lines):
    """The block's reading: its lines after the legend, unwrapped."""
    return " ".join(ln.strip() for ln in lines[lines.index(experiments.MODE_LEGEND[-1]) + 1:])


def test_modes_of_one_layout_side_by_side_and_the_reading():
    tests = [_mode(1, "data", 1e12), _mode(2, "pipeline", 2.5e12, [0.1, 0.3], 0.2e6),
             _mode(3, "mixed:2", 1.5e12, [0.2, 0.2], 0.1e6, replicas=2, theory=0.1), _t(4, 1, 4, 3e12)]
    lines = experiments.mode_lines(tests)
    assert lines[0] == "Parallel modes (digits, pytorch, B 32, fp32, M 1 x P 4):"
    # MB/step: data 4 x 150,000 B; pipeline 0.2 MB between stages; mixed 0.1 MB + its stages' 0.596 MB of gradients
    assert lines[2:5] == [
        "     1 data                1.0000e+00    x1.00  1.000e+00 not reached       0.6      -      -",
        "     2 pipeline            2.5000e+00    x2.50  2.500e+00 not reached       0.2   20 %   20 %",
        "     3 mixed:2             1.5000e+00    x1.50  1.500e+00 not reached     0.696   20 %   10 %"]
    assert lines[5:9] == list(experiments.MODE_LEGEND)
    # the test numbers are the blocks' (report.test_line); idle is a cost, said as one
    assert _reading(lines) == (
        "Highest FLOPS: pipeline (test 2), x2.50 of data (test 1). Why: it sent 0.2 MB a step where data"
        " parallelism averaged 0.6 MB of gradients, though its stages idled 20 % of the schedule (theory 20 %).")
    assert all(len(ln) <= 100 for ln in lines)
    assert experiments.groups(tests)[0].tests == (tests[0], tests[3])   # Fig. 7/9: data-parallel tests only


def test_modes_reading_follows_its_figures_where_they_do_not_explain_the_winner():
    """Issue 45's 4-rank digits sweep: model trained x1.61 data's FLOPS though it sent 8.39 MB a
    step against 0.606 MB and its stages idled 79 % (theory 75 %); schema 2.8's reading said its
    stages 'kept computing'. mixed:2 had the best VFLOPS (quality 0.844 against model's 0.540),
    and batch norm saw 32 samples in data, 128 in model (one batch of B x S), 8 and 16 in the
    pipelines' micro-batches."""
    tests = [_mode(1, "data", 1e12, vflops=1.0e10, quality=0.546, norm=5),
             _mode(2, "model", 1.61e12, [0.78, 0.80], 8.39e6, theory=0.75, vflops=1.603e9, quality=0.540,
                   micro=128, norm=5),
             _mode(3, "pipeline:4", 0.4e12, [0.77, 0.77], 8.39e6, theory=0.16, vflops=1.1e10, quality=0.747, micro=8,
                   norm=5),
             _mode(4, "mixed:2", 0.5e12, [0.67, 0.67], 2.1e6, replicas=2, theory=0.11, vflops=5.77e9,
                   quality=0.844, micro=16, norm=5)]
    text = _reading(experiments.mode_lines(tests))
    assert "kept computing" not in text
    assert text == (
        "Highest FLOPS: model (test 2), x1.61 of data (test 1)."
        " Highest VFLOPS: pipeline:4 (test 3), 1.100e-02 against 1.603e-03: its quality 0.7470 against 0.5400."
        " Not from these figures: it sent more (8.39 MB a step against 0.6 MB of gradients) and its stages idled"
        " 79 % of the schedule (theory 75 %); the lead comes from what the block does not measure (the speed of"
        " each stage's kernels on its batch against the whole model's on B)."
        " Not the same computation: batch norm normalises over 32 samples in data, 128 in model, 8 in pipeline:4,"
        " 16 in mixed:2, so the modes' qualities compare their recipes as well as how the work is spread.")
    # no normalisation in the model (or every mode over as many samples): the same computation, no such clause
    plain = [replace(t, flops_by_operator={"dense": 10}) for t in tests]
    assert "Not the same computation" not in _reading(experiments.mode_lines(plain))


def test_modes_reading_when_data_wins():
    data_wins = experiments.mode_lines([_mode(1, "data", 3e12), _mode(2, "model", 1e12, [0.5, 0.7], 8e6),
                                        _mode(3, "pipeline", 2e12, [None, None], 0.1e6)])
    assert _reading(data_wins) == (
        "Highest FLOPS: data (test 1). Why: against data parallelism's 0.6 MB of gradients a step, model sent 8 MB"
        " and its stages idled 60 % of the schedule (theory 20 %). pipeline sent less and measured no idle time,"
        " yet trained slower: not from these figures (the speed of each stage's kernels on its batch against the"
        " whole model's on B).")
    assert experiments.mode_lines([_mode(1, "data", 1e12)]) == []       # one mode: nothing to compare


def test_modes_reading_as_schema_2_8_wrote_it():
    """--verify re-renders a 2.8 report as it was written (results.SCHEMA's note)."""
    data_wins = experiments.mode_lines([_mode(1, "data", 3e12), _mode(2, "model", 1e12, [0.5, 0.7], 8e6)], (2, 8))
    assert " ".join(ln.strip() for ln in data_wins[-2:]).endswith(
        "Highest FLOPS: data. Why: averaging its gradients (0.6 MB a step) cost less than the split modes lost to"
        " their stages' idle time (model 60 %).")
    more = experiments.mode_lines([_mode(1, "data", 1e12), _mode(2, "model", 2e12, [0.5, 0.5], 8e6, theory=0.5)],
                                  (2, 8))
    assert "Why: though it moved more (8 MB a step against 0.6 MB of gradients), its stages kept computing" in \
        " ".join(ln.strip() for ln in more)
