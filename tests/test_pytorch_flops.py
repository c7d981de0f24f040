"""harness/frameworks/pytorch/flops.py: Table 3 counted over a PyTorch model at the
operator level, by harness/flops.py's own rules. Hand-computed answers; the digits CNN
against the Keras count of the same architecture (tests/test_flops.py's numbers); the
convolutions and matmuls against torch.utils.flop_counter."""
import json

import pytest

torch = pytest.importorskip("torch")
from torch import nn  # noqa: E402
from torch.nn import functional as F  # noqa: E402

from harness import flops  # noqa: E402
from harness.frameworks.pytorch import digits as torch_digits  # noqa: E402
from harness.frameworks.pytorch import flops as tflops  # noqa: E402
from harness.workloads import Dataset, digits  # noqa: E402


@pytest.fixture(scope="module")
def digits_data():
    return digits.load(Dataset.parse("embedded"), "")


def test_the_digits_cnn_counts_as_its_keras_twin(digits_data):
    """8 x 8 x 1 input. conv 32: 2*9*1*64*32 = 36,864, bias + ReLU 2 x 2,048; batch norm
    2,048; conv 64: 2*9*32*64*64 = 2,359,296, bias + ReLU 2 x 4,096; max-pool 4*4*64 =
    1,024; dense 128: 2*1,024*128 = 262,144, bias + ReLU 2 x 128; dense 10: 2,560 + bias 10.
    The Keras count of tests/test_flops.py: 2,676,490 forward, weights 151,434 (batch
    norm's moving mean and variance included)."""
    c = tflops.count(torch_digits.build_model(digits_data), torch_digits.sample(digits_data))
    assert c.by_operator == {"convolution": 36864 + 2359296, "depthwise": 0, "dense": 262144 + 2560,
                             "elementwise": 2 * 2048 + 2 * 4096 + 2 * 128 + 10, "pooling": 1024,
                             "normalization": 2048}
    assert c.forward == 2676490 and c.training == 3 * 2676490
    assert c.weights == 151434
    # the records are plain and the neutral rule alone re-derives the count (--verify's way)
    assert json.loads(json.dumps(c.layers)) == c.layers
    assert sum(sum(flops.rule(r).values()) for r in c.layers) == c.forward
    assert [r["layer"] for r in c.layers if r["kind"] == "conv"] == ["0", "3"]


class _Residual(nn.Module):
    """A bottleneck's tail written functionally: F.relu(bn(conv(x)) + x)."""

    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(4, 4, 3, padding=1, bias=False)
        self.bn = nn.BatchNorm2d(4)
        self.head = nn.Linear(4, 3)

    def forward(self, x):
        y = F.relu(self.bn(self.conv(x)) + x)
        return self.head(y.mean(dim=(2, 3)))


def test_functional_ops_count_as_their_modules_do():
    """On 4 x 6 x 6: conv 2*9*4*144 = 10,368 (no bias); batch norm 144; the residual add
    144 and the ReLU 144, both functional; global average pool, one per input: 144;
    dense 2*4*3 = 24 + bias 3."""
    c = tflops.count(_Residual(), torch.zeros(1, 4, 6, 6))
    assert c.by_operator == {"convolution": 10368, "depthwise": 0, "dense": 24, "elementwise": 144 + 144 + 3,
                             "pooling": 144, "normalization": 144}
    assert [r["kind"] for r in c.layers] == ["conv", "normalization", "merge", "activation", "global_pooling",
                                             "dense"]
    assert c.weights == 4 * 4 * 9 + 2 * 4 + 2 * 4 + 4 * 3 + 3


def test_depthwise_and_transposed_convolutions_by_hand():
    """Depthwise 3x3 on 8 channels of 5x5 (groups = 8, padding 1): 2*9*8*25 = 3,600;
    a 1x1 pointwise to 16: 2*8*400 = 6,400 (a separable convolution, as Table 3 splits it);
    transposed 2x2 stride 2 from 16 to 4 channels: 2*4*4*(16*25) = 12,800, counted on the
    input's size."""
    model = nn.Sequential(nn.Conv2d(8, 8, 3, padding=1, groups=8, bias=False), nn.Conv2d(8, 16, 1, bias=False),
                          nn.ConvTranspose2d(16, 4, 2, stride=2, bias=False))
    c = tflops.count(model, torch.zeros(1, 8, 5, 5))
    assert c.by_operator["depthwise"] == 3600 and c.by_operator["convolution"] == 6400 + 12800
    assert [r["kind"] for r in c.layers] == ["depthwise", "conv", "transposed"]


def test_convolutions_and_matmuls_agree_with_torchs_own_counter(digits_data):
    """torch.utils.flop_counter counts convolutions and matmuls (2 per multiply-add):
    ours within 1 % (exactly, here) of its count, on the digits CNN and the residual block."""
    from torch.utils.flop_counter import FlopCounterMode
    for model, sample in ((torch_digits.build_model(digits_data), torch_digits.sample(digits_data)),
                          (_Residual(), torch.zeros(1, 4, 6, 6))):
        ours = tflops.count(model, sample).by_operator
        with FlopCounterMode(display=False) as counter:
            model.eval()
            with torch.no_grad():
                model(sample)
        theirs = counter.get_total_flops()
        assert abs(ours["convolution"] + ours["depthwise"] + ours["dense"] - theirs) <= 0.01 * theirs


def test_an_operator_on_a_parameter_without_a_rule_stops_the_count():
    class Odd(nn.Module):
        def __init__(self):
            super().__init__()
            self.w = nn.Parameter(torch.ones(3))

        def forward(self, x):
            return x * self.w.exp()
    with pytest.raises(TypeError, match=r"no Table 3 rule for operator aten.exp.default in 'Odd'"):
        tflops.count(Odd(), torch.zeros(1, 3))
    with pytest.raises(ValueError, match="found a sample of batch 2, expected batch 1"):
        tflops.count(Odd(), torch.zeros(2, 3))


def test_a_count_on_the_meta_device_is_the_built_models_and_draws_no_random_numbers(digits_data):
    """count_built builds the workload's model again on the meta device (no storage, no
    arithmetic): the same count as the model on the CPU, and the random generator's state
    untouched (the training goes on from it)."""
    state = torch.get_rng_state()
    meta = tflops.count_built(torch_digits, digits_data)
    assert torch.equal(state, torch.get_rng_state())
    real = tflops.count(torch_digits.build_model(digits_data), torch_digits.sample(digits_data))
    assert (meta.forward, meta.weights, meta.by_operator) == (real.forward, real.weights, real.by_operator)


def test_weight_decay_reaches_the_kernels_only():
    """Two 3x3 kernels' worth of weights (conv 2x1x3x3, dense 4x2) decay; the biases and the
    batch norm's gamma and beta (1-D) do not, as harness/frameworks/tensorflow/optimizers.py excludes them. A
    workload's decay is decoupled (Adam becomes AdamW), a model's L2 is coupled."""
    from harness.frameworks.pytorch import train
    model = nn.Sequential(nn.Conv2d(1, 2, 3), nn.BatchNorm2d(2), nn.Flatten(), nn.Linear(2, 4))
    opt, config = train.make_optimizer("adam", model, 0.1, 0.9, {"weight_decay": 0.01, "epsilon": 1e-6})
    decay, plain = opt.param_groups
    assert isinstance(opt, torch.optim.AdamW) and config["weight_decay"] == 0.01 and config["epsilon"] == 1e-6
    assert [tuple(p.shape) for p in decay["params"]] == [(2, 1, 3, 3), (4, 2)] and decay["weight_decay"] == 0.01
    assert [tuple(p.shape) for p in plain["params"]] == [(2,), (2,), (2,), (4,)] and plain["weight_decay"] == 0.0
    opt, _ = train.make_optimizer("adam", model, 0.1, 0.9, {}, l2=3e-5)
    assert type(opt) is torch.optim.Adam and opt.param_groups[0]["weight_decay"] == 3e-5
    opt, config = train.make_optimizer("sgd", model, 0.1, 0.875, {}, l2=3e-5)
    assert opt.param_groups[0]["momentum"] == 0.875 and config == {"momentum": 0.875, "weight_decay": 3e-5}


def test_channels_last_for_2d_models_only():
    """On a GPU, and on a CPU for a module with CPU_CHANNELS_LAST (train.build): a 2-D
    model's kernels go channels-last (NHWC in memory), a model with 3-D kernels is left as
    built (Module.to would refuse a 5-D channels_last)."""
    from harness.frameworks.pytorch import models, train
    conv2d = train.channels_last(nn.Sequential(nn.Conv2d(3, 4, 3), nn.ReLU()))
    assert conv2d[0].weight.is_contiguous(memory_format=torch.channels_last)
    assert not conv2d[0].weight.is_contiguous()
    conv3d = nn.Sequential(nn.Conv3d(2, 4, 3), nn.Flatten(), nn.Linear(4, 1))
    assert train.channels_last(conv3d) is conv3d and conv3d[0].weight.is_contiguous()
    assert [models.channels_last_on(d, c) for d, c in (("cpu", False), ("cpu", True), ("cuda", False))] == [
        False, True, True]
    from harness.frameworks.pytorch import facts as pytorch_facts
    assert [models.get(w).CPU_CHANNELS_LAST for w in pytorch_facts.BUILT] == [True, False, False, False, False]
    import numpy as np
    for w, channels in (("digits", 1), ("ic", 3), ("deepcam", 16)):   # each module's batches follow its flag
        batch = models.get(w).inputs(np.zeros((2, 4, 4, channels), np.float32), "cpu")
        assert (batch.stride()[1] == 1) == models.get(w).CPU_CHANNELS_LAST, (w, batch.stride())
    assert "on CPUs channels-first, but digits channels-last" in pytorch_facts.LAYOUT[(2, 8)]   # the report says so


def test_a_batch_has_its_models_layout_and_each_gradient_its_weights(digits_data):
    """DDP's contract: a gradient has its parameter's strides. digits is channels-last on
    CPUs (CPU_CHANNELS_LAST), model and batch. A channels-first model gets the canonical
    NCHW strides, one channel included: movedim's (64, 1, 8, 1) read as channels-last too,
    the convolutions ran so and made the first kernel's gradient (9, 1, 3, 1) for its
    (9, 9, 3, 1): DDP warned on every rank of every PyTorch digits run."""
    import numpy as np
    from harness import workloads
    from harness.frameworks.pytorch import models, train
    x = np.random.default_rng(0).random((4, 8, 8, 1), np.float32)
    assert models.channels_first(x, "cpu").stride() == (64, 64, 8, 1)
    assert models.channels_first(np.zeros((4, 8, 8, 3), np.float32), "cpu").stride() == (192, 64, 8, 1)
    assert models.channels_first(np.zeros((4, 8, 8, 3), np.float32), "cpu", True).stride() == (192, 1, 24, 3)
    last = train.build(workloads.get("digits"), digits_data, 1, 0, torch.device("cpu"))
    first = torch_digits.build_model(digits_data)
    for model, batch in ((last, torch_digits.inputs(x, "cpu")), (first, models.channels_first(x, "cpu"))):
        model(batch).sum().backward()
        assert [p.grad.stride() for p in model.parameters()] == [p.stride() for p in model.parameters()]
    assert last[0].weight.stride() == (9, 1, 3, 1) and first[0].weight.stride() == (9, 9, 3, 1)
