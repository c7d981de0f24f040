"""Model parallelism management (harness/parallelism.py): line 37's syntax, its resolution
against a test's P and B, the T/V code, the FLOP-balanced cut, the theoretical bubble.
Pure logic; answers worked by hand."""
import pytest

from harness import parallelism
from harness.parallelism import Mode, bubble, cut, parse, resolve


@pytest.mark.parametrize("token,mode", [
    ("data", Mode("data", text="data")),
    ("MODEL", Mode("model", text="model")),
    ("pipeline", Mode("pipeline", 0, 0, "1f1b", "pipeline")),
    ("pipeline:8", Mode("pipeline", 0, 8, "1f1b", "pipeline:8")),
    ("pipeline:gpipe", Mode("pipeline", 0, 0, "gpipe", "pipeline:gpipe")),
    ("pipeline:8:gpipe", Mode("pipeline", 0, 8, "gpipe", "pipeline:8:gpipe")),
    ("mixed:2", Mode("mixed", 2, 0, "1f1b", "mixed:2")),
    ("mixed:2:6:1F1B", Mode("mixed", 2, 6, "1f1b", "mixed:2:6:1f1b")),
])
def test_parse(token, mode):
    assert parse(token) == mode


@pytest.mark.parametrize("token,message", [
    ("pipe", "found 'pipe', expected a parallel mode (" + parallelism.FORM + ")"),
    ("data:2", "found '2' after data, expected data alone: data and model take no parameters"),
    ("model:gpipe", "found 'gpipe' after model, expected model alone: data and model take no parameters"),
    ("pipeline:0", "found '0' as pipeline's MICROBATCHES, expected an integer >= 1"),
    ("pipeline:-1", "found '-1' as pipeline's MICROBATCHES, expected an integer >= 1"),
    ("pipeline::4", "found '' as pipeline's MICROBATCHES, expected an integer >= 1"),
    ("pipeline:4:zigzag", "found 'zigzag' as pipeline's schedule, expected one of 1f1b, gpipe"),
    ("pipeline:x", "found 'x' as pipeline's schedule, expected one of 1f1b, gpipe"),   # a word last: a schedule
    ("pipeline:8:2", "found '2' as pipeline's schedule, expected one of 1f1b, gpipe: pipeline takes one number"
                     " (MICROBATCHES) before it"),
    ("pipeline:gpipe:4", "found '4' after pipeline's schedule 'gpipe', expected nothing after it:"
                         " pipeline[:MICROBATCHES][:1f1b|gpipe]"),
    ("mixed", "found 'mixed' without its STAGES, expected mixed:STAGES[:MICROBATCHES][:1f1b|gpipe], STAGES >= 2"),
    ("mixed:gpipe", "found 'gpipe' as mixed's STAGES, expected an integer >= 2"),
    ("mixed:1", "found '1' as mixed's STAGES, expected an integer >= 2: one stage is data parallelism"),
    ("mixed:1:4:gpipe", "found '1' as mixed's STAGES, expected an integer >= 2: one stage is data parallelism"),
    ("mixed:2:4:6", "found '6' as mixed's schedule, expected one of 1f1b, gpipe: mixed takes two numbers"
                    " (STAGES, MICROBATCHES) before it"),
    ("mixed:2:x:gpipe", "found 'x' as mixed's MICROBATCHES, expected an integer >= 1"),   # not last: a number
])
def test_parse_refuses_naming_the_part(token, message):
    """Issue 66: the part of line 37's token that is wrong, what it stands as and what that
    place takes; the whole grammar only where the keyword itself is unknown."""
    with pytest.raises(parallelism.ModeError) as info:
        parse(token)
    assert str(info.value) == message


def test_the_grammar_is_written_once():
    """FORM is SHAPES' kinds joined: the messages' forms and the input file's free text agree."""
    assert parallelism.SHAPES == {"pipeline": "pipeline[:MICROBATCHES][:1f1b|gpipe]",
                                  "mixed": "mixed:STAGES[:MICROBATCHES][:1f1b|gpipe]"}
    assert parallelism.FORM == ("data, model, pipeline[:MICROBATCHES][:1f1b|gpipe] or"
                                " mixed:STAGES[:MICROBATCHES][:1f1b|gpipe]; MICROBATCHES >= 1, STAGES >= 2")


def test_resolve():
    # data: the job's P ranks are replicas of one stage
    r = resolve(parse("data"), 4, 32)
    assert (r.stages, r.replicas, r.microbatches, r.pipeline_batch) == (1, 4, 1, 32)
    # model: P stages, one batch of B x P = 64 at a time
    r = resolve(parse("model"), 2, 32)
    assert (r.stages, r.replicas, r.microbatches, r.pipeline_batch, r.microbatch) == (2, 1, 1, 64, 64)
    assert r.schedule == "gpipe"                       # one micro-batch: forward, then backward
    assert resolve(parse("pipeline:2:gpipe"), 4, 32).microbatches == 2   # GPipe takes fewer than S
    # pipeline on 4 ranks: 4 stages, default m = 4 x 4 = 16 micro-batches of 32 x 4 / 16 = 8
    r = resolve(parse("pipeline"), 4, 32)
    assert (r.stages, r.replicas, r.microbatches, r.pipeline_batch, r.microbatch) == (4, 1, 16, 128, 8)
    # mixed:2 on 4 ranks: 2 stages x 2 replicas, each pipeline B x 2 = 64 samples in 8 micro-batches of 8
    r = resolve(parse("mixed:2"), 4, 32)
    assert (r.stages, r.replicas, r.microbatches, r.pipeline_batch, r.microbatch) == (2, 2, 8, 64, 8)
    # mixed:3 on 6 ranks, B = 4: 3 stages x 2 replicas, each pipeline 12 samples in 4 micro-batches of 3
    r = resolve(parse("mixed:3:4:gpipe"), 6, 4)
    assert (r.stages, r.replicas, r.microbatches, r.schedule, r.microbatch) == (3, 2, 4, "gpipe", 3)


@pytest.mark.parametrize("mode,P,B,why", [
    ("model", 1, 32, "P = 1"), ("pipeline:4", 1, 32, "P = 1"),
    ("mixed:2", 2, 32, "STAGES = P is pipeline"), ("mixed:3", 4, 32, "divide P"), ("mixed:1:4", 4, 32, "an integer >= 2"),
    ("pipeline:3", 2, 32, "64 samples a step, which 3 micro-batches"),   # 32 x 2 = 64, not a multiple of 3
    ("pipeline", 2, 3, "6 samples a step, which 8 micro-batches"),       # default m = 8 > 6
    ("pipeline:2", 4, 32, r"at least as many micro-batches as stages \(2 < 4\)"),   # 1F1B's constraint
])
def test_resolve_refuses(mode, P, B, why):
    with pytest.raises(ValueError, match=why):
        resolve(parse(mode), P, B)


@pytest.mark.parametrize("mode,P,B,expected,batch", [
    ("model", 1, 32, "data, or P >= 2", False),
    ("mixed:3", 4, 32, "mixed:STAGES with STAGES 2", False),              # 2 divides 4 into 2 replicas; 3 does not
    ("mixed:3:24", 8, 32, "mixed:STAGES with STAGES 2 or 4", False),
    ("mixed:2", 2, 32, "pipeline or model", False),                        # no STAGES leaves two replicas of 2 ranks
    ("pipeline:2", 4, 32, "MICROBATCHES >= 4, or gpipe", False),
    ("pipeline:3", 2, 32, "MICROBATCHES one of 2, 4, 8, 16, 32, 64", True),   # divisors of 64, at least S = 2 (1F1B)
    ("pipeline:4:gpipe", 2, 3, "MICROBATCHES one of 1, 2, 3, 6", True),       # GPipe takes fewer than S
])
def test_resolve_says_what_would_fit(mode, P, B, expected, batch):
    """What the caller tells the user the line accepts, and whether B (line 14) plays a part."""
    with pytest.raises(parallelism.Unfit) as info:
        resolve(parse(mode), P, B)
    assert (info.value.expected, info.value.batch) == (expected, batch)


def test_the_grammar_is_what_the_parser_takes():
    """Line 37's text (the shipped file's and the parser's message) says STAGES >= 2, as parse holds."""
    assert "STAGES >= 2" in parallelism.FORM and "MICROBATCHES >= 1" in parallelism.FORM
    assert parse("mixed:2").stages == 2 and parse("pipeline:1").microbatches == 1


@pytest.mark.parametrize("mode,P,B,code", [("data", 4, 32, ""), ("model", 2, 32, "MP"), ("pipeline", 2, 32, "PP8"),
                                           ("pipeline:4:gpipe", 2, 32, "GP4"), ("mixed:2", 4, 32, "2SPP8"),
                                           ("mixed:2:4:gpipe", 4, 32, "2SGP4"),
                                           ("pipeline", 1, 32, "PP"), ("pipeline:3", 2, 32, "PP3")])
def test_code(mode, P, B, code):
    """Unresolvable modes (P = 1; 3 micro-batches of 64) keep the written count: --check refuses them anyway."""
    assert parallelism.code(parse(mode), P, B) == code


def test_bubble():
    assert bubble(1, 1) == 0
    assert bubble(2, 1) == 0.5                  # model parallelism on 2 ranks: each idles half the step
    assert bubble(4, 16) == pytest.approx(3 / 19)
    assert bubble(2, 8) == pytest.approx(1 / 9)


@pytest.mark.parametrize("costs,stages,starts", [
    ([1, 1, 1, 1], 2, [0, 2]),
    ([1, 1, 1, 1], 4, [0, 1, 2, 3]),
    ([5, 1, 1, 1, 1, 1], 2, [0, 1]),            # 5 | 5: the big first block alone
    ([1, 2, 3, 4, 5, 6], 2, [0, 4]),            # 10 | 11 beats 15 | 6 and 6 | 15
    ([1, 2, 3, 4, 5, 6], 3, [0, 3, 5]),         # 6 | 9 | 6: the costliest stage 9 (one answer of 9: the earliest)
    ([3, 3], 1, [0]),
    ([0, 0, 0, 9], 2, [0, 1]),                  # every cut costs 9 at most: the earliest
])
def test_cut(costs, stages, starts):
    assert cut(costs, stages) == starts


def test_cut_needs_a_block_a_stage():
    with pytest.raises(ValueError, match="3 blocks cannot make 4 stages"):
        cut([1, 1, 1], 4)


def test_describe():
    assert parallelism.describe(resolve(parse("data"), 2, 32)) == "data parallelism"
    assert parallelism.describe(resolve(parse("model"), 2, 32)) == "2 stages, one batch of 64 at a time"
    assert parallelism.describe(resolve(parse("mixed:2:4:gpipe"), 4, 32)) == \
        "2 stages x 2 replicas, 4 micro-batches of 16 on GPipe (bubble 20% in theory)"


CHAIN = [parallelism.Block("0 Conv2d", 600, 30, 1000, 30), parallelism.Block("1 ReLU", 100, 0, 1000, 0),
         parallelism.Block("2 Conv2d", 600, 90, 500, 90), parallelism.Block("3 Linear", 300, 510, 10, 510)]


def test_stages_of_a_chain():
    """1600 FLOPs: 700 | 900 (blocks 0-1 | 2-3) is the least costliest stage (600 | 1000, 1300 | 300 worse)."""
    got = parallelism.stages(CHAIN, 2)
    assert got == [parallelism.Stage(0, 1, ("0 Conv2d", "1 ReLU"), 700, 700 / 1600, 30, 1000),
                   parallelism.Stage(2, 3, ("2 Conv2d", "3 Linear"), 900, 900 / 1600, 600, 0)]
    # a pipeline of B x S = 64 samples: 1000 elements forward and back, 4 bytes each
    r = resolve(parse("pipeline:4"), 2, 32)
    assert parallelism.step_bytes(got, r) == 2 * 1000 * 64 * 4
    lines = parallelism.describe_stages(got, r, 630)
    assert lines == ["stage 0: blocks 0-1 (0 Conv2d .. 1 ReLU), 43.8% of the FLOPs, 30 weights, sends 1,000"
                     " elements a sample",
                     "stage 1: blocks 2-3 (2 Conv2d .. 3 Linear), 56.2% of the FLOPs, 600 weights",
                     "between stages a step: 0.512 MB a pipeline (activations forward, their gradients back, FP32);"
                     " data parallelism would average 0.00252 MB of gradients"]
    four = parallelism.stages(CHAIN, 4)
    assert [s.first for s in four] == [0, 1, 2, 3] and four[-1].sends == 0 and four[1].sends == 1000
