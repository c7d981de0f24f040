"""deepcam: the reference's IoU, loss and padding by hand, the vote per pixel, the port's
FLOPs against TensorFlow's profiler; a bagged run on 2 ranks (mpirun). The run across
simulated nodes is in test_multinode.py."""
import io
import math
import os

os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")

import numpy as np  # noqa: E402
import pytest  # noqa: E402
import tensorflow as tf  # noqa: E402

from harness import ensemble, verify  # noqa: E402
from harness.frameworks.tensorflow import deeplab, flops  # noqa: E402
from harness.frameworks.tensorflow import deepcam as tf_deepcam  # noqa: E402
from harness.workloads import deepcam  # noqa: E402
from tests.conftest import dat_text, mpirun, results  # noqa: E402

L = tf.keras.layers


def test_iou_per_sample_as_the_reference_scores_it():
    # sample A: class 0 TP 2 of union 2 -> 1; class 1 TP 1 of union 2 -> 1/2; class 2 predicted once,
    # never true -> 0: (1 + 0.5 + 0) / 3 = 0.5. Sample B: all background, right: classes 1 and 2 absent
    # from both score 1 -> 1.0
    pred = np.array([[[0, 1], [2, 0]], [[0, 0], [0, 0]]])
    true = np.array([[[0, 1], [1, 0]], [[0, 0], [0, 0]]])
    assert deepcam.iou(pred, true).tolist() == [0.5, 1.0]


def test_loss_is_the_plain_mean_of_the_class_weighted_pixel_losses():
    # uniform logits: every pixel's cross entropy is ln 3; labels 0, 1, 2, 2 weigh w0 + w1 + 2 w2,
    # w_c = f_c^-0.125: 0.9862678^-0.125 = 1.0017299, 0.00045787^-0.125 = 2.6146112, 0.0132743^-0.125 = 1.7164197
    y = tf.constant([[[0, 1], [2, 2]]])
    got = tf_deepcam.loss(y, tf.zeros((1, 2, 2, 3))).numpy()
    assert got == pytest.approx([math.log(3) * (1.0017299 + 2.6146112 + 2 * 1.7164197) / 4], rel=1e-6)


def test_quality_of_a_chunk_of_rows_is_the_mean_iou_of_those_samples(tmp_path):
    from harness.workloads import climate, climate_synthetic
    climate_synthetic.write_synthetic(str(tmp_path / "d"), 8, 32)      # 2 validation samples of 32 x 48
    data = climate.read(str(tmp_path / "d"))
    truth = climate.labels(data, np.arange(data.n_val))
    perfect = np.eye(3)[truth].reshape(data.n_val, -1)                 # one-hot of the labels: IoU 1
    background = np.eye(3)[np.zeros_like(truth)].reshape(data.n_val, -1)
    assert deepcam.quality(perfect, data) == 1.0
    mixed = np.concatenate([perfect[:1], background[1:]])
    both = deepcam.quality(mixed, data)
    assert deepcam.quality(mixed[1:], data, slice(1, 2)) == pytest.approx(2 * both - 1)   # (1 + q1) / 2 = both
    with pytest.raises(ValueError, match=r"scores of shape \(2, 4608\), expected \(1, 4608\)"):
        deepcam.quality(mixed, data, slice(0, 1))


def test_a_vote_chooses_a_class_per_pixel():
    probs = np.array([[0.2, 0.5, 0.3, 0.6, 0.3, 0.1]])      # two pixels of one sample
    assert ensemble.model_scores(probs, "vote", deepcam.VOTE_GROUP).tolist() == [[0, 1, 0, 1, 0, 0]]
    assert ensemble.model_scores(probs, "vote").tolist() == [[0, 0, 0, 1, 0, 0]]   # the whole row: one class


def _apply(layer_fn, x):
    inp = tf.keras.Input(x.shape[1:])
    return tf.keras.Model(inp, layer_fn(inp))(x).numpy()


def _builder():
    return deeplab._Builder(L, lambda c: c, deeplab.ASPP_RATES, deeplab.EXIT_RATES)


def test_taps_on_the_map_by_hand():
    # kernel 3: the outer taps sit `rate` pixels from the centre, on a map of `size` iff rate < size
    assert [deeplab.taps_on_map(4, r, 3) for r in (1, 3, 4, 6, 18)] == [slice(0, 3)] * 2 + [slice(1, 2)] * 3
    assert deeplab.taps_on_map(6, 6, 3) == slice(1, 2) and deeplab.taps_on_map(7, 6, 3) == slice(0, 3)
    assert deeplab.taps_on_map(1, 1, 1) == slice(0, 1) and deeplab.taps_on_map(10, 2, 5) == slice(0, 5)
    assert deeplab.taps_on_map(3, 2, 5) == slice(1, 4)       # 5 taps, 2 apart: the +-4 ones miss a 3-pixel map


def test_the_conventions_say_where_tensorflow_skips_taps_the_count_credits():
    """From results schema 2.16 TensorFlow's conventions name the sizes where its ASPP skips
    padding taps: a map side of 18 (the largest rate) keeps the centre tap only, 19 all three,
    so inputs of 16 x 18 = 288 px or less on a side; a 2.15 run's words (--verify) and an input
    without deepcam have no such line."""
    from types import SimpleNamespace
    from harness.frameworks.tensorflow import facts
    assert deeplab.taps_on_map(288 // 16, 18, 3) == slice(1, 2) and deeplab.taps_on_map(304 // 16, 18, 3) == slice(0, 3)
    line = facts.taps_line()
    assert line.startswith("DeepCAM in TensorFlow: where a side of the encoder's map (the input / 16) is no longer"
                           " than a dilation rate (the ASPP's 6, 12, 18: inputs of 288 px or less on a side)")
    assert line.endswith("At the reference's 768 x 1152 (a 48 x 72 map) every tap is computed")
    cfg = SimpleNamespace(workloads=("digits", "deepcam"), precisions=["fp32"], comm_precision="fp32", allreduce="ring",
                          optimizer="sgd", compiler="none")
    assert facts.option_lines(cfg, False, (2, 16)) == [line]
    assert facts.option_lines(cfg, True, (2, 15)) == [] and facts.stated(cfg, (2, 15)) == [[], []]
    assert facts.option_lines(SimpleNamespace(**{**vars(cfg), "workloads": ("digits",)}), False, (2, 16)) == []


@pytest.mark.parametrize("shape, rate", [((4, 6), 6), ((4, 6), 18), ((4, 12), 6), ((4, 6), 2)])
def test_an_atrous_convolution_computes_keras_own(shape, rate):
    """The ASPP's dilated convolution leaves out the taps that read only padding (both axes at
    4 x 6 with rate 6 or 18, the rows only at 4 x 12; none at rate 2): the output and both
    gradients are the full convolution's (TensorFlow's own, the same kernel)."""
    x = tf.random.stateless_normal((2, *shape, 5), seed=(1, 2))
    layer = deeplab._atrous_conv2d(L)(4, 3, dilation_rate=rate, padding="same", use_bias=False)
    layer.build(x.shape)
    with tf.GradientTape(persistent=True) as tape:
        tape.watch(x)
        ours = layer(x)
        theirs = tf.nn.convolution(x, layer.kernel, padding="SAME", dilations=rate)
        lo, lt = tf.reduce_sum(ours * ours), tf.reduce_sum(theirs * theirs)
    np.testing.assert_allclose(ours.numpy(), theirs.numpy(), rtol=1e-5, atol=1e-6)
    for mine, full in zip(tape.gradient(lo, [x, layer.kernel]), tape.gradient(lt, [x, layer.kernel])):
        np.testing.assert_allclose(mine.numpy(), full.numpy(), rtol=1e-5, atol=1e-5)


def test_a_blocks_branch_is_the_references_layer_for_layer():
    """The reference's Block, as all three ports build it (deepcam.block_rep): entry block 1
    (64 -> 128, 2 reps, stride 2) grows at its first layer, has no ReLU after its last BN
    and ends with a stride-2 separable; a block that grows last (728 -> 1024, as exit block
    20, here dilated 2) carries its dilation on every rep but its closing stride-1
    separable; a middle block (728, 3 reps) closes with no separable at all."""
    s, b, r = "separable", "bn", ("relu",)
    assert deepcam.block_rep(64, 128, 2, stride=2) == [(s, 64, 128, 1, 1), (b, 128), r, (s, 128, 128, 1, 1), (b, 128),
                                                        (s, 128, 128, 2, 1)]
    assert deepcam.block_rep(728, 1024, 2, dilation=2, grow_first=False, is_last=True) == [
        (s, 728, 728, 1, 2), (b, 728), r, (s, 728, 1024, 1, 2), (b, 1024), (s, 1024, 1024, 1, 1)]
    assert deepcam.block_rep(728, 728, 3) == [(s, 728, 728, 1, 1), (b, 728), r] * 2 + [(s, 728, 728, 1, 1), (b, 728)]


def test_stride_two_convolution_pads_one_pixel_each_side_as_pytorch():
    # 4 x 4 input 0..15, 3x3 ones kernel, stride 2, padding 1: windows centred on (0,0), (0,2), (2,0), (2,2):
    # x[0:2,0:2] = 0+1+4+5 = 10, x[0:2,1:4] = 24, x[1:4,0:2] = 51, x[1:4,1:4] = 90 (Keras' "same" would
    # centre them on (1,1), ... instead)
    x = np.arange(16, dtype=np.float32).reshape(1, 4, 4, 1)
    y = _apply(lambda t: _builder().conv(t, 1, 3, "c", stride=2, init="ones"), x)
    assert y[0, :, :, 0].tolist() == [[10, 24], [51, 90]]


def test_transposed_convolution_aligns_as_pytorch_output_padding():
    # ConvTranspose2d(k 3, stride 2, padding 1, output_padding 1), ones kernel, input [[1, 2], [3, 4]]:
    # output pixel o takes the inputs i with 2i - 1 <= o <= 2i + 1: rows {0}, {0,1}, {1}, {1}
    x = np.array([[1, 2], [3, 4]], np.float32).reshape(1, 2, 2, 1)
    b = _builder()
    b.torch_default = lambda: "ones"
    y = _apply(lambda t: b.transposed(t, 1, "t"), x)
    assert y[0, :, :, 0].tolist() == [[1, 3, 2, 2], [4, 10, 6, 6], [3, 7, 4, 4], [3, 7, 4, 4]]


def test_the_profiler_counts_a_cropped_transposed_convolution_on_its_uncropped_output():
    # ours, per input pixel: 2 x 9 x 16 x 8 x (4 x 6) = 55,296; the profiler: per output pixel of the
    # "valid" (2H + 1) x (2W + 1) = 9 x 13 result over stride^2 = 4: 55,296 x 117 / 96 = 67,392
    inp = tf.keras.Input((4, 6, 16))
    model = tf.keras.Model(inp, L.Conv2DTranspose(8, 3, strides=2, padding="valid", use_bias=False)(inp))
    assert flops.count(model).forward == 55_296
    assert flops.profiler_flops(model) == 67_392


@pytest.mark.parametrize("size, shrunk, within", [((768, 1152), {}, 0.01),
                                                  ((64, 96), {"rates": ((1, 1, 1, 1), (1, 1)), "scale": 0.25,
                                                              "middle": 2}, 0.02)])
def test_flops_agree_with_tensorflows_profiler(size, shrunk, within):
    """At 768 x 1152 the reference model: +0.59 % from the profiler (it counts no ReLU or
    batch norm, and counts the 4 transposed convolutions on their uncropped outputs, above).
    At 64 x 96 the 4 x 6 feature map is smaller than the dilated kernels (rates up to 18):
    TensorFlow runs a dilated convolution on a SpaceToBatch grid padded to multiples of the
    rate, and the profiler counts that padding (1.9 x ours there); so the small size is
    compared undilated, where the taps are the same operations, and at a quarter of the
    width with 2 middle blocks: every kind of layer still, +0.98 % (+0.95 % at full width,
    which took 10.9 s to build and profile against 1.5 s)."""
    model = deeplab.build(*size, 16, 3, **shrunk)
    ours, theirs = flops.count(model).forward, flops.profiler_flops(model)
    assert abs(theirs / ours - 1) < within, (ours, theirs)
    if size == (768, 1152):
        # the reference's trainable parameters, summed module by module from its PyTorch code (conv
        # Cin/groups x Cout x k^2 (+ bias), BN 2 x C, the affine 2 x 256): 56,454,720
        assert sum(int(np.prod(v.shape)) for v in model.trainable_variables) == 56_454_720
        # PyTorch's build (harness/frameworks/pytorch/deepcam.py), counted on the meta device: the
        # same count by operator and the same weights (batch-norm statistics included in both)
        torch = pytest.importorskip("torch")
        from harness.frameworks.pytorch import deepcam as torch_deepcam, flops as torch_flops
        with torch.device("meta"):
            twin_model = torch_deepcam.DeepLab(16, 3)
            twin = torch_flops.count(twin_model, torch.zeros(1, 16, *size))
        ours = flops.count(model)
        assert twin.by_operator == ours.by_operator and twin.weights == ours.weights
        assert sum(p.numel() for p in twin_model.parameters()) == 56_454_720


# ---- real runs (mpirun) ------------------------------------------------------------------
SMALL = {"HPCAI500_DEEPCAM_WIDTH": "4", "HPCAI500_DEEPCAM_MIDDLE": "1"}   # the port at 1/8 width, 1 middle block


def deepcam_dat(folder, **lines) -> str:
    """A deepcam input: synthetic 32 x 48 samples (12 training, 4 validation), B 2, 2 epochs,
    Adam at 1e-3, no roofline; `lines` as dat_text's."""
    return dat_text(**{"l5": folder / "runs", "l7": "deepcam", "l8": "synthetic:16:32", "l9": 1, "l14": 2,
                       "l15": 2, "l18": "adam", "l19": 0.001, "l30": 0, **lines})


def test_a_bagged_run_on_two_ranks_votes_stages_and_verifies(tmp_path):
    """M = 2 base models of one rank, a per-pixel vote, each node's copy in the published
    layout, LAMB with the reference's options, the step compiled by XLA (an UpSampling2D
    tile had no XLA gradient on the CPU), evaluations in two chunks: consistent replicas, an IoU, an open division
    saying why, --verify passes (FLOPs re-derived from the layer records, the MLLOG
    checker with MLPerf's DeepCAM keys)."""
    (tmp_path / "d.dat").write_text(deepcam_dat(tmp_path, l10=2, l11=1, l18="lamb", l24="vote",
                                                l28=tmp_path / "copy", l33="xla"))
    p = mpirun(2, [tmp_path / "d.dat"], tmp_path, env={**SMALL, "HPCAI500_EVAL_CHUNK": "3"})   # 4 samples: 3 + 1
    assert p.returncode == 0, p.stderr[-3000:]
    (t,) = results(tmp_path / "runs")["tests"]
    assert (t["workload"], t["M"], t["P"], t["aggregation"], t["tv"][-1]) == ("deepcam", 2, 1, "vote", "X")
    assert t["consistency"]["passed"] and len(t["base_quality"]) == 2 and 0 < t["quality"] <= 1
    assert t["staging"]["copies"] == 1 and t["quality_name"] == "IoU" and t["division"] == "open"
    assert any("MLPerf HPC's workload" in r for r in t["open_reasons"])
    assert any("32 x 48 samples, not 768 x 1152" in r for r in t["open_reasons"])
    run = next(d for d in (tmp_path / "runs").iterdir() if not d.name.startswith("."))
    out = io.StringIO()
    assert verify.main(str(run), out=out) == 0, out.getvalue()[-3000:]
