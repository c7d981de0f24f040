"""harness/frameworks/tensorflow/optimizers.py: LARS and LAMB against their update rules replayed in numpy,
every optimizer trains under a per-step LR assign in a tf.function, and the errors."""
import os

os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")  # tf-keras (Keras 2), as Horovod needs
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np
import pytest
import tensorflow as tf

from harness import train
from harness.frameworks.tensorflow import optimizers
from tests.optimizer_rules import LRS, WD, assert_close, far, lamb_numpy, lars_numpy


def small_model():
    """BatchNormalization (gamma, beta: excluded) then Dense(3) (kernel: layer-wise; bias:
    excluded). BN first, so the bias has a real gradient. Weights are set far from the
    usual init so that every trust ratio, taken or wrongly skipped, is far from 1."""
    tf.keras.utils.set_random_seed(0)
    model = tf.keras.Sequential([tf.keras.Input((4,)), tf.keras.layers.BatchNormalization(),
                                 tf.keras.layers.Dense(3)])
    gamma, beta, kernel, bias = model.trainable_variables
    gamma.assign([3.0, 2.5, 4.0, 3.5])
    beta.assign([-2.0, 3.0, 1.5, -4.0])
    kernel.assign(5 * np.random.default_rng(1).normal(size=(4, 3)))
    bias.assign([3.0, -2.0, 4.0])
    return model


def run_tf(opt):
    """Three steps in a tf.function; returns the initial weights, each step's gradients and
    the final weights."""
    model = small_model()
    rng = np.random.default_rng(2)
    x = tf.constant(rng.normal(size=(8, 4)), tf.float32)
    y = tf.constant(rng.normal(size=(8, 3)), tf.float32)

    @tf.function
    def step(lr):
        opt.learning_rate.assign(lr)
        with tf.GradientTape() as tape:
            loss = tf.reduce_mean(tf.square(model(x, training=True) - y))
        grads = tape.gradient(loss, model.trainable_variables)
        opt.apply_gradients(zip(grads, model.trainable_variables))
        return grads

    start = [v.numpy().astype(np.float64) for v in model.trainable_variables]
    grads = [[g.numpy().astype(np.float64) for g in step(tf.constant(lr))] for lr in LRS]
    return start, grads, [v.numpy() for v in model.trainable_variables]


@pytest.mark.parametrize("wd", [0.0, WD])
@pytest.mark.parametrize("name, replay", [("lars", lars_numpy), ("lamb", lamb_numpy)])
def test_matches_update_rule(name, replay, wd):
    start, grads, got = run_tf(optimizers.make(name, tf.Variable(LRS[0]), weight_decay=wd))
    ratios = []
    want = replay(start, grads, wd, ratios=ratios)
    assert_close(got, want)
    assert far(got, start)  # the weights moved well beyond the tolerance
    # The test has teeth: the kernel's trust ratio is far from 1 at every step, and a
    # replay without the ratio, or without the exclusion, lands far from what TF did.
    assert all(r < 0.5 or r > 2 for r in ratios), ratios
    assert far(got, replay(start, grads, wd, layerwise=False))
    assert far(got, replay(start, grads, wd, exclude=False))


@pytest.mark.parametrize("name, wd", [("lars", WD), ("lamb", 0.0)])
def test_zero_norms_give_ratio_one(name, wd):
    """A zero weight (fresh zero-initialised layer) and a zero gradient (LARS) or update
    (LAMB without wd): ratio 1, no nan."""
    zero, two = tf.Variable(tf.zeros((2, 2))), tf.Variable(tf.fill((2, 2), 2.0))
    optimizers.make(name, 0.5, weight_decay=wd).apply_gradients(
        [(tf.ones((2, 2)), zero), (tf.zeros((2, 2)), two)])
    if name == "lars":  # w -= lr * (g + wd w)
        np.testing.assert_allclose(zero.numpy(), -0.5, rtol=1e-6)
        np.testing.assert_allclose(two.numpy(), 2.0 - 0.5 * WD * 2.0, rtol=1e-6)
    else:  # w -= lr * g / (|g| + eps) on the first step; nothing for a zero gradient
        np.testing.assert_allclose(zero.numpy(), -0.5 / (1 + 1e-6), rtol=1e-6)
        np.testing.assert_allclose(two.numpy(), 2.0, rtol=1e-6)


@pytest.mark.parametrize("name", train.OPTIMIZERS)
@pytest.mark.parametrize("lr_type", [float, tf.Variable])
def test_trains_with_scheduled_lr(name, lr_type):
    """A toy regression in a tf.function, the LR assigned every step from a warm-up + decay
    schedule as train.py does; the loss drops and the optimizer holds the last LR."""
    peak = {"sgd": 0.05, "adam": 0.02, "adagrad": 0.2, "lars": 0.2, "lamb": 0.02}[name]
    steps, warmup = 60, 10
    schedule = lambda s: peak * tf.minimum((s + 1) / warmup, (steps - s) / (steps - warmup))
    tf.keras.utils.set_random_seed(0)
    rng = np.random.default_rng(0)
    x = rng.normal(size=(64, 4)).astype(np.float32)
    y = (x @ rng.normal(size=(4, 1)) + 0.5).astype(np.float32)
    model = tf.keras.Sequential([tf.keras.Input((4,)), tf.keras.layers.Dense(16, activation="tanh"),
                                 tf.keras.layers.BatchNormalization(), tf.keras.layers.Dense(1)])
    opt = optimizers.make(name, lr_type(float(schedule(0))), weight_decay=1e-4)

    @tf.function
    def step(i):
        opt.learning_rate.assign(schedule(tf.cast(i, tf.float32)))
        with tf.GradientTape() as tape:
            loss = tf.reduce_mean(tf.square(model(x, training=True) - y))
        grads = tape.gradient(loss, model.trainable_variables)
        opt.apply_gradients(zip(grads, model.trainable_variables))
        return loss

    before = [v.numpy() for v in model.trainable_variables]
    losses = [float(step(tf.constant(i))) for i in range(steps)]
    assert all(not np.allclose(b, v.numpy()) for b, v in zip(before, model.trainable_variables))
    assert np.isfinite(losses).all()
    assert np.mean(losses[-5:]) < 0.3 * np.mean(losses[:5]), (losses[:5], losses[-5:])
    assert float(opt.learning_rate) == pytest.approx(float(schedule(steps - 1)), rel=1e-6)


@pytest.mark.parametrize("name", ["lars", "lamb"])
def test_xla_and_config(name):
    """Keras XLA-compiles update_step on GPUs: the step compiles; get_config round-trips."""
    opt = optimizers.make(name, 0.1, momentum=0.8, weight_decay=1e-3)
    w = tf.Variable(tf.ones((3, 2)))
    tf.function(lambda g: opt.apply_gradients([(g, w)]), jit_compile=True)(tf.fill((3, 2), 0.5))
    assert np.isfinite(w.numpy()).all() and not np.allclose(w.numpy(), 1.0)
    config = opt.get_config()
    assert config["weight_decay"] == 1e-3 and config["learning_rate"] == pytest.approx(0.1)
    again = type(opt).from_config(config)
    assert again.get_config() == config
    assert again.weight_decay is None  # the base class's decoupled decay stays off


def test_unknown_name():
    with pytest.raises(ValueError, match="'rmsprop'.*sgd, adam, adagrad, lars, lamb"):
        optimizers.make("rmsprop", 0.1)


def test_global_clipnorm_and_epsilon_reach_every_optimizer():
    """deepcam's recipe (apex FusedLAMB's max_grad_norm 1, eps 1e-6) through make(): a
    gradient (3, 4) of norm 5 is scaled to norm 1 before the update, (0.6, 0.8)."""
    w = tf.Variable([0.0, 0.0])
    opt = optimizers.make("sgd", 0.5, momentum=0.0, global_clipnorm=1.0)
    opt.apply_gradients([(tf.constant([3.0, 4.0]), w)])
    assert w.numpy() == pytest.approx([-0.3, -0.4])             # lr 0.5 x (0.6, 0.8)
    for name in ("lamb", "adam", "adagrad"):
        assert optimizers.make(name, 0.1, epsilon=1e-6).epsilon == pytest.approx(1e-6)
    # LAMB clipped on two steps of different norms = LAMB fed the pre-clipped gradients
    grads = [tf.constant([30.0, 40.0]), tf.constant([0.3, -0.4])]
    a, b = tf.Variable([[1.0, 2.0]]), tf.Variable([[1.0, 2.0]])
    clipped, plain = optimizers.make("lamb", 0.1, global_clipnorm=1.0), optimizers.make("lamb", 0.1)
    for g in grads:
        clipped.apply_gradients([(tf.reshape(g, (1, 2)), a)])
        plain.apply_gradients([(tf.reshape(g / max(1.0, float(tf.norm(g))), (1, 2)), b)])
    assert a.numpy() == pytest.approx(b.numpy(), rel=1e-6)
