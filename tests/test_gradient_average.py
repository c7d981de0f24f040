"""harness/frameworks/tensorflow/train.train's step on 2 ranks under one real mpirun (`train_checks`):

* The linear scaling rule (LR = base x P) is right only if a job's ranks *average* their
  gradients: one real step, checked against the update computed by hand in numpy (a sum
  instead of a mean would double it), through the graph step and the XLA step alike.
* The warm-up before the clock (train.WARMUP_STEPS) is undone: a model with batch norm,
  dropout and momentum trained 3 epochs is bit-identical with 0, 1 and 2 warm-up steps.
* The XLA step (line 33) trains a model with batch norm and dropout and keeps the
  replicas equal.
The pure guard against random ops with hidden state is tested in-process.
"""
import json

import numpy as np
import pytest

from tests.conftest import ROOT, mpirun

SCRIPT = r'''
import os, sys, json
sys.path.insert(0, os.environ["ROOT"])
os.environ["TF_USE_LEGACY_KERAS"] = "1"
import numpy as np
import tensorflow as tf
import horovod.tensorflow as hvd
from mpi4py import MPI
from harness import train
from harness.frameworks.tensorflow import train as tf_train

X = np.arange(16, dtype=np.float32).reshape(8, 2) / 10.0
Y = np.array([1, -1, 2, 0, 3, 1, -2, 0.5], np.float32)


class Linear:      # a workload of one Dense(1) without bias, mean squared error; its own TensorFlow module
    NAME = "linear"
    MOMENTUM = 0.9
    OPTIMIZER_OPTIONS = {}   # none: the harness's optimizers as made
    stream = None   # workloads.training_feed chains batches() per epoch
    predict = None  # models.Model asks for one; train() never predicts
    @staticmethod
    def build_model(data):
        return tf.keras.Sequential([tf.keras.layers.Input((2,)),
                                    tf.keras.layers.Dense(1, use_bias=False, kernel_initializer="ones")])
    @staticmethod
    def loss(y, out):
        return tf.square(out[:, 0] - y)
    @staticmethod
    def input_signature(data, batch):
        return tf.TensorSpec((batch, 2), tf.float32), tf.TensorSpec((batch,), tf.float32)
    @staticmethod
    def batches(data, rows, batch, *, training, seed):
        for s in range(len(rows) // batch):
            yield X[rows[s * batch:(s + 1) * batch]], Y[rows[s * batch:(s + 1) * batch]]


RNG = np.random.default_rng(0)
XS, YS, ROWS = RNG.random((64, 6), dtype=np.float32), RNG.integers(0, 3, 64), RNG.integers(0, 64, 64)


class Small(Linear):  # batch norm (statistics), dropout (random state), a softmax classifier
    NAME = "small"
    @staticmethod
    def build_model(data):
        L = tf.keras.layers
        return tf.keras.Sequential([L.Input((6,)), L.Dense(8), L.BatchNormalization(), L.ReLU(),
                                    L.Dropout(0.5), L.Dense(3)])
    traced = 0    # times the step was traced: the loss runs in Python once a trace
    @staticmethod
    def loss(y, out):
        Small.traced += 1
        return tf.keras.losses.sparse_categorical_crossentropy(y, out, from_logits=True)
    @staticmethod
    def input_signature(data, batch):
        return tf.TensorSpec((batch, 6), tf.float32), tf.TensorSpec((batch,), tf.int64)
    fed = 0       # batches this rank was fed, warm-up included
    @staticmethod
    def batches(data, rows, batch, *, training, seed):
        for s in range(len(rows) // batch):
            idx = rows[s * batch:(s + 1) * batch]
            Small.fed += 1
            yield XS[idx], YS[idx]


# train.py takes a workload's Keras members from models.get(NAME), which imports
# harness.frameworks.tensorflow.<NAME>: each fake is its own module there
sys.modules["harness.frameworks.tensorflow.linear"] = Linear
sys.modules["harness.frameworks.tensorflow.small"] = Small
world = MPI.COMM_WORLD
hvd.init(comm=world)
out = {}
for compiler in ("none", "xla"):    # one step of the linear model: the mean gradient
    model = Linear.build_model(None)
    recipe = train.Recipe(batch=4, epochs=1, base_lr=0.1, warmup_epochs=0, compiler=compiler)
    res = tf_train.train(Linear, None, model, np.arange(8), recipe, seed=1, job=0, world_barrier=world.Barrier)
    out[f"linear_{compiler}"] = {"w": model.trainable_variables[0].numpy().ravel().tolist(),
                                 "steps": res.steps_per_epoch}
    tf.keras.backend.clear_session()
model = Linear.build_model(None)     # one step with int8 communication (line 21)
recipe = train.Recipe(batch=4, epochs=1, base_lr=0.1, warmup_epochs=0, comm_precision="int8")
tf_train.train(Linear, None, model, np.arange(8), recipe, seed=1, job=0, world_barrier=world.Barrier)
out["linear_int8"] = {"w": model.trainable_variables[0].numpy().ravel().tolist()}
tf.keras.backend.clear_session()
for name, compiler, warmup in (("warm0", "none", 0), ("warm1", "none", 1), ("warm2", "none", 2),
                               ("xla", "xla", 1)):
    model, Small.fed, Small.traced = tf_train.build(Small, None, seed=7, job=0), 0, 0
    recipe = train.Recipe(batch=4, epochs=3, base_lr=0.05, warmup_epochs=1, compiler=compiler)
    res = tf_train.train(Small, None, model, ROWS, recipe, seed=7, job=0,
                      world_barrier=world.Barrier, warmup_steps=warmup)
    out[name] = {"weights": [v.numpy().ravel().tolist() for v in model.variables], "loss": res.final_loss,
                 "diff": res.weights_diff, "digest": res.weights_digest, "samples": res.samples,
                 "fed": Small.fed, "traced": Small.traced}
    tf.keras.backend.clear_session()
out["init"] = [v.numpy().ravel().tolist() for v in tf_train.build(Small, None, seed=7, job=0).variables]
if world.rank == 0:
    print("OUT=" + json.dumps(out))
'''


@pytest.fixture(scope="module")
def train_checks(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("train_checks")
    script = tmp / "train_checks.py"
    script.write_text(SCRIPT)
    p = mpirun(2, [], tmp, env={"ROOT": str(ROOT)}, program=(str(script),))
    assert p.returncode == 0, p.stderr[-3000:]
    return json.loads(next(l for l in p.stdout.splitlines() if l.startswith("OUT="))[4:])


@pytest.mark.parametrize("compiler", ["none", "xla"])
def test_one_step_on_two_ranks_uses_the_mean_gradient(train_checks, compiler):
    got = train_checks[f"linear_{compiler}"]
    assert got["steps"] == 1                # one step: 8 samples = P x B
    w = np.array(got["w"])
    x = np.arange(16, dtype=np.float64).reshape(8, 2) / 10.0
    y = np.array([1, -1, 2, 0, 3, 1, -2, 0.5])
    w0 = np.ones(2)
    grad = (2 * (x @ w0 - y)[:, None] * x).mean(axis=0)   # mean over all 8 samples of both ranks
    lr = 0.1 * 2                                         # base x P; cosine at step 0 = peak
    np.testing.assert_allclose(w, w0 - lr * grad, rtol=1e-5)   # momentum's first step is plain SGD
    assert not np.allclose(w, w0 - 2 * lr * grad, rtol=1e-3)  # a sum would land here


def test_int8_communication_still_averages_within_half_a_quantisation_step(train_checks):
    """Each rank's gradient g_r is the mean of 4 per-sample gradients, so |g_r| <= G, the
    largest per-sample |gradient|; the job's scale s = max |g_r| / 127 <= G / 127, and the
    int8 average is within s / 2 of the mean gradient: the weights within lr x G / 254."""
    w = np.array(train_checks["linear_int8"]["w"])
    x = np.arange(16, dtype=np.float64).reshape(8, 2) / 10.0
    y = np.array([1, -1, 2, 0, 3, 1, -2, 0.5])
    w0, lr = np.ones(2), 0.1 * 2
    per_sample = 2 * (x @ w0 - y)[:, None] * x
    exact = w0 - lr * per_sample.mean(axis=0)
    bound = lr * np.abs(per_sample).max() / 254
    assert np.all(np.abs(w - exact) <= bound + 1e-7), (w, exact, bound)
    assert not np.allclose(w, w0 - 2 * lr * per_sample.mean(axis=0), atol=10 * bound)   # not a sum


def test_int8_arithmetic_by_hand():
    """Two ranks' gradients (0.504, -1.0) and (1.27, 0.0): the job's max 1.27, scale 0.01;
    q = (50, -100) and (127, 0) (0.504 / 0.01 = 50.4 rounds to 50); their mean x 0.01 =
    (0.885, -0.5), where the FP32 mean is (0.887, -0.5): 0.002 off, within s / 2 = 0.005."""
    import tensorflow as tf
    from harness.frameworks.tensorflow import communication as c
    g1, g2 = tf.constant([0.504, -1.0]), tf.constant([1.27, 0.0])
    s = c.scales(tf.constant([1.27]))[0]
    q = [c.quantise(g, s) for g in (g1, g2)]
    assert [v.numpy().tolist() for v in q] == [[50, -100], [127, 0]] and q[0].dtype == tf.int8
    mean = c.dequantised_mean(tf.stack(q), s, 2).numpy()
    np.testing.assert_allclose(mean, [0.885, -0.5], rtol=1e-6)
    assert c.scales(tf.constant([0.0, 2.54])).numpy().tolist() == pytest.approx([1.0, 0.02])   # all-zero: any scale
    # an overflowed gradient (fp16's loss scaling) stays non-finite through the exchange, so the step is
    # skipped: a NaN or inf anywhere makes the rank's maximum +inf (MPI's Max keeps an inf, may drop a NaN),
    # and an infinite scale makes every element NaN (int8 casts NaN and inf to 0: they would vanish)
    assert c.maximum(tf.constant([1.0, -3.0])).numpy() == 3.0
    assert c.maximum(tf.constant([1.0, float("nan")])).numpy() == float("inf")
    s = c.scales(tf.constant([float("inf")]))[0]
    q = c.quantise(tf.constant([1.0, float("nan")]), s)
    assert q.numpy().tolist() == [0, 0] and np.isnan(c.dequantised_mean(tf.stack([q, q]), s, 2).numpy()).all()


def test_warm_up_is_undone_bit_for_bit(train_checks):
    """Weights, batch-norm statistics, loss and digest equal to the last bit, whatever
    the warm-up; and the warm-up did run steps that would have changed them."""
    runs = [train_checks[k] for k in ("warm0", "warm1", "warm2")]
    for other in runs[1:]:
        assert other["weights"] == runs[0]["weights"]
        assert (other["loss"], other["digest"], other["samples"]) == (runs[0]["loss"], runs[0]["digest"], 64 * 3)
    assert runs[0]["diff"] == 0.0
    # 64 samples / (P 2 x B 4) = 8 steps an epoch, 3 epochs, then the warm-up's steps on top
    assert [r["fed"] for r in runs] == [24, 25, 26]
    assert len(runs[0]["weights"]) == 8     # 2 dense kernels and biases, BN's gamma, beta, moving mean, variance
    assert any(abs(v) > 1e-4 for v in runs[0]["weights"][4])  # the BN moving mean left its start (zeros)


def test_the_step_is_traced_once(train_checks):
    """The optimizer's slots exist before the step is traced: a tf.function that creates
    variables on its first trace is traced again (measured before the fix: [2, 2, 2, 1],
    the graph step twice, ~15 % of a small test's run; the XLA step once)."""
    assert [train_checks[k]["traced"] for k in ("warm0", "warm1", "warm2", "xla")] == [1, 1, 1, 1]


def test_xla_step_trains_and_keeps_replicas_equal(train_checks):
    got = train_checks["xla"]
    assert got["diff"] == 0.0 and got["samples"] == 64 * 3 and np.isfinite(got["loss"])
    assert got["fed"] == 25                  # 24 steps and the warm-up
    # it trained from the same start (XLA's dropout draws another stream than the graph's,
    # so the path differs from warm0's: the linear model above checks the update itself)
    assert train_checks["init"][0] != got["weights"][0]
    assert train_checks["init"][0] != train_checks["warm0"]["weights"][0]


def test_hidden_state_random_ops_are_refused():
    """A step drawing from a kernel with hidden state (tf.random.uniform) cannot be
    warmed up and undone; one drawing from a tf.random.Generator can."""
    import tensorflow as tf

    from harness.frameworks.tensorflow import train
    gen = tf.random.Generator.from_seed(1)
    hidden = tf.function(lambda x: x + tf.random.uniform(tf.shape(x)), autograph=False)
    held = tf.function(lambda x: x + gen.uniform(tf.shape(x)), autograph=False)
    spec = tf.TensorSpec((2,), tf.float32)
    with pytest.raises(RuntimeError, match="workload w: the training step uses random op.s. RandomUniform"):
        train._refuse_hidden_random_state(hidden.get_concrete_function(spec).graph, "w")
    train._refuse_hidden_random_state(held.get_concrete_function(spec).graph, "w")


@pytest.mark.parametrize("nodes, rows, rule", [
    ([0, 0, 1, 1], [[0, 1], [2, 3]], "nodes"),            # 2 nodes x 2 ranks: a row a node
    ([0, 1, 0, 1], [[0, 2], [1, 3]], "nodes"),            # ranks dealt round robin: still a row a node
    ([0, 0, 0, 1, 1, 1, 2, 2, 2], [[0, 1, 2], [3, 4, 5], [6, 7, 8]], "nodes"),
    ([0, 0, 0, 0], [[0, 1], [2, 3]], "square"),           # one node: 4 = 2 x 2
    ([0] * 6, [[0, 1, 2], [3, 4, 5]], "square"),          # 6 = 3 x 2 (X >= Y)
    ([0] * 12, [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9, 10, 11]], "square"),
    ([0, 1, 2, 3], [[0, 1], [2, 3]], "square"),           # a rank a node: no node rows, the square
    ([0, 0, 0, 1, 1], [[0, 1, 2, 3, 4]], "square"),       # uneven nodes, P = 5 prime: one row (the ring)
    ([0], [[0]], "square"),
])
def test_the_torus_grid_follows_the_nodes_else_the_square(nodes, rows, rule):
    from harness import communication as c
    g = c.grid(nodes)
    assert [list(r) for r in g.rows] == rows and g.rule == rule
    assert g.X * g.Y == len(nodes) and sorted(sum(g.columns, ())) == list(range(len(nodes)))


def test_each_rank_gets_its_row_and_column_and_every_rank_registers_the_same_sets():
    """Horovod's process sets: every set of 2 or more ranks but the job itself (a duplicate
    of the global set, which Horovod refuses), the same list in the same order on every
    rank; a rank's row and column are among them, or the global set where one is the job."""
    from harness.communication import grid
    from harness.frameworks.tensorflow import communication as c

    class Set:
        def __init__(self, ranks):
            self.ranks = ranks

    hvd = type("H", (), {"ProcessSet": Set, "global_process_set": "global"})
    g = grid([0, 0, 1, 1])
    tori = [c.Torus.of(g, r, hvd) for r in range(4)]
    assert [[s.ranks for s in t.sets] for t in tori] == [[[0, 1], [2, 3], [0, 2], [1, 3]]] * 4
    assert (tori[3].row.ranks, tori[3].column.ranks) == ([2, 3], [1, 3])
    assert (tori[0].row.ranks, tori[0].column.ranks) == ([0, 1], [0, 2])
    one_row = c.Torus.of(grid([0, 0, 0, 1, 1]), 4, hvd)
    assert one_row.sets == () and one_row.row == "global"


def test_the_library_that_carried_the_exchange_is_what_horovods_build_says():
    from harness.frameworks.tensorflow import facts as c
    assert c.library("ring", gpu=False, nccl=True, mpi=True) == "MPI"        # CPU tensors: MPI, NCCL or not
    assert c.library("ring", gpu=True, nccl=True, mpi=True) == "NCCL"
    assert c.library("torus", gpu=True, nccl=False, mpi=True) == "MPI"       # GPU tensors, no NCCL: MPI
    assert c.library("hierarchical", gpu=True, nccl=True, mpi=True) == "NCCL within a node, MPI across"
    assert c.library("adasum", gpu=True, nccl=True, mpi=False) == "NCCL within a node, Gloo across"
    assert c.library("hierarchical", gpu=False, nccl=False, mpi=True) == "MPI (flat: hierarchical needs NCCL)"


def test_the_exchange_in_words_and_the_report_line_counting_alike_jobs():
    from harness import communication as c
    from harness.report import exchange_line
    from tests.conftest import result
    g = c.grid([0, 0, 1, 1])
    assert c.exchange("fp16", "torus", 4, g, "MPI", "ring's word") == "torus 2 x 2 (rows: a node's ranks), fp16, MPI"
    assert c.exchange("int8", "torus", 4, None, "NCCL", "ring's word") == "int8 all-gather, NCCL"
    assert c.exchange("fp32", "adasum", 1, None, "MPI", "ring's word") == "none (P = 1)"
    assert c.exchange("fp16", "ring", 2, None, "Gloo", "DDP all-reduce") == "DDP all-reduce, fp16, Gloo"   # the framework's word
    t = result(M=3, exchange=["a", "b", "a"])
    assert exchange_line(t) == "Exchange    : a (2 of 3 jobs); b (1 of 3 jobs)"
    assert exchange_line(result(M=2, exchange=["a", "a"])) == "Exchange    : a"


def test_the_report_states_horovods_build():
    from harness.frameworks.tensorflow.facts import build_line
    gpu = build_line({"mpi": True, "gloo": False, "cuda": True, "nccl": 22105})
    assert gpu.startswith("Horovod build: MPI, NCCL 2.21.5, CUDA: a GPU tensor's collectives go through NCCL,"
                          " a CPU tensor's through MPI")
    cpu = build_line({"mpi": True, "gloo": True, "cuda": False, "nccl": 0})
    assert cpu.startswith("Horovod build: MPI, Gloo, no NCCL: every collective goes through MPI, Gloo (GPU tensors")
