"""The optimizers of Table 2: SGD with momentum (the default), Adam, AdaGrad, LARS, LAMB.

    opt = make("lars", 0.05, momentum=0.9, weight_decay=1e-4)
    opt.learning_rate.assign(lr)      # per step, inside the tf.function: works for all five

`learning_rate` may be a float or a tf.Variable; like every tf-keras optimizer, the
optimizer copies it into its own `opt.learning_rate` variable, so the training loop
assigns the scheduled value there (assigning the variable passed in has no effect).

SGD, Adam and AdaGrad are the tf-keras ones. Keras only offers decoupled weight decay
(w -= lr * wd * w after the step); with weight_decay > 0 we pass it on and exclude
biases and batch-norm gamma/beta by name, the public API's only way to exclude.

LARS and LAMB are ours, subclasses of the tf-keras (Keras 2) new-style optimizer, so
they run under `apply_gradients` in a tf.function (XLA too, which Keras turns on for
GPUs) and behind Horovod's DistributedGradientTape. Both skip the layer-wise trust
ratio and weight decay for *excluded* variables, which are those of rank <= 1:
biases and batch-norm gamma/beta are vectors, kernels and filters have rank >= 2.
Using the rank makes the rule work whatever names a model gives its layers (MLPerf's
reference matches names instead).
"""
import tensorflow as tf

def _excluded(variable) -> bool:
    """Biases and batch-norm gamma/beta: no trust ratio, no weight decay."""
    return variable.shape.rank <= 1


def _trust(ratio, w_norm, other_norm):
    """`ratio`, or 1 where ||w|| or the other norm is 0 (a zero-initialised layer, a zero
    gradient): there the ratio is 0, inf or nan and would freeze or blow up the layer."""
    return tf.where(tf.logical_and(w_norm > 0, other_norm > 0), ratio, tf.ones_like(ratio))


class _LayerwiseOptimizer(tf.keras.optimizers.Optimizer):
    """What LARS and LAMB share: the LR variable, our weight decay and the config."""

    def __init__(self, learning_rate, weight_decay, name, **kwargs):
        # The base class's weight_decay is the decoupled kind, applied to every variable
        # before update_step; ours enters the update itself, so the base gets None.
        super().__init__(name=name, weight_decay=None, **kwargs)
        self._learning_rate = self._build_learning_rate(learning_rate)
        self.weight_decay_rate = float(weight_decay or 0.0)

    def _slots(self, var_list, *names):
        return [[self.add_variable_from_reference(v, n) for v in var_list] for n in names]

    def get_config(self):
        config = super().get_config()
        config.update(learning_rate=self._serialize_hyperparameter(self._learning_rate),
                      weight_decay=self.weight_decay_rate)
        return config


@tf.keras.utils.register_keras_serializable(package="hpcai500")
class LARS(_LayerwiseOptimizer):
    """LARS (You, Gitman, Ginsburg 2017), the variant of MLPerf's ResNet reference
    (TF's lars_optimizer): momentum accumulates the trust-ratio-scaled gradient,
        trust = eta * ||w|| / (||g|| + wd * ||w||)       (1 if ||w|| or ||g|| is 0)
        v = momentum * v + lr * trust * (g + wd * w);   w = w - v
    Excluded variables (rank <= 1) take plain momentum SGD: v = momentum * v + lr * g."""

    def __init__(self, learning_rate=0.1, momentum=0.9, weight_decay=0.0, eta=0.001,
                 name="LARS", **kwargs):
        super().__init__(learning_rate, weight_decay, name, **kwargs)
        self.momentum, self.eta = float(momentum), float(eta)

    def build(self, var_list):
        super().build(var_list)
        if getattr(self, "_built", False):
            return
        (self.velocities,) = self._slots(var_list, "v")
        self._built = True

    def update_step(self, gradient, variable):
        dtype = variable.dtype
        g = tf.convert_to_tensor(gradient)  # IndexedSlices (embeddings): norms need the dense gradient
        lr = tf.cast(self.learning_rate, dtype)
        v = self.velocities[self._index_dict[self._var_key(variable)]]
        if not _excluded(variable):
            wd = tf.cast(self.weight_decay_rate, dtype)
            w_norm, g_norm = tf.norm(variable), tf.norm(g)
            trust = _trust(self.eta * w_norm / (g_norm + wd * w_norm), w_norm, g_norm)
            g = trust * (g + wd * variable)
        v.assign(self.momentum * v + lr * g)
        variable.assign_sub(v)

    def get_config(self):
        return {**super().get_config(), "momentum": self.momentum, "eta": self.eta}


@tf.keras.utils.register_keras_serializable(package="hpcai500")
class LAMB(_LayerwiseOptimizer):
    """LAMB (You et al. 2019): Adam's bias-corrected moments, then a layer-wise trust ratio,
        u = m_hat / (sqrt(v_hat) + eps) + wd * w;   w = w - lr * (||w|| / ||u||) * u
    (ratio 1 if either norm is 0). Excluded variables (rank <= 1): no wd, ratio 1."""

    def __init__(self, learning_rate=0.001, beta_1=0.9, beta_2=0.999, epsilon=1e-6,
                 weight_decay=0.0, name="LAMB", **kwargs):
        super().__init__(learning_rate, weight_decay, name, **kwargs)
        self.beta_1, self.beta_2, self.epsilon = float(beta_1), float(beta_2), float(epsilon)

    def build(self, var_list):
        super().build(var_list)
        if getattr(self, "_built", False):
            return
        self.moments, self.velocities = self._slots(var_list, "m", "v")
        self._built = True

    def update_step(self, gradient, variable):
        dtype = variable.dtype
        g = tf.convert_to_tensor(gradient)
        lr = tf.cast(self.learning_rate, dtype)
        step = tf.cast(self.iterations + 1, dtype)  # iterations counts finished steps
        index = self._index_dict[self._var_key(variable)]
        m, v = self.moments[index], self.velocities[index]
        # Bias corrections 1 - b**t as -expm1(t log b): in float32, 1 - 0.999**t cancels
        # ~4 digits, and 1 - b must come from the same float32 b as b**t does.
        b1, b2 = tf.cast(self.beta_1, dtype), tf.cast(self.beta_2, dtype)
        m.assign(b1 * m + (1 - b1) * g)
        v.assign(b2 * v + (1 - b2) * tf.square(g))
        m_hat = m / -tf.math.expm1(step * tf.math.log(b1))
        v_hat = v / -tf.math.expm1(step * tf.math.log(b2))
        u = m_hat / (tf.sqrt(v_hat) + self.epsilon)
        if not _excluded(variable):
            u += tf.cast(self.weight_decay_rate, dtype) * variable
            w_norm, u_norm = tf.norm(variable), tf.norm(u)
            u *= _trust(w_norm / u_norm, w_norm, u_norm)
        variable.assign_sub(lr * u)

    def get_config(self):
        return {**super().get_config(), "beta_1": self.beta_1, "beta_2": self.beta_2,
                "epsilon": self.epsilon}


def make(name: str, learning_rate, *, momentum: float = 0.9, weight_decay: float = 0.0,
         epsilon: float | None = None, global_clipnorm: float | None = None) -> tf.keras.optimizers.Optimizer:
    """The optimizer `name` (one of harness/train.OPTIMIZERS). `momentum` is used by sgd
    and lars; adam, adagrad and lamb keep their own defaults (lamb: beta_1 0.9, beta_2
    0.999, eps 1e-6) unless `epsilon` is given. `global_clipnorm`: the gradients (the
    job's average) are scaled to that global norm when theirs is larger, before the
    update (Keras' own clipping; apex's FusedLAMB max_grad_norm)."""
    key = name.lower()
    made = {"sgd": lambda **kw: tf.keras.optimizers.SGD(momentum=momentum, **kw),
            "adam": tf.keras.optimizers.Adam, "adagrad": tf.keras.optimizers.Adagrad,
            "lars": lambda **kw: LARS(momentum=momentum, **kw), "lamb": LAMB}
    if key not in made:
        raise ValueError(f"unknown optimizer {name!r}; choose one of {', '.join(made)}")
    extra = {"global_clipnorm": global_clipnorm} if global_clipnorm else {}
    if epsilon is not None and key in ("adam", "adagrad", "lamb"):
        extra["epsilon"] = epsilon
    if key in ("lars", "lamb"):
        return made[key](learning_rate=learning_rate, weight_decay=weight_decay, **extra)
    opt = made[key](learning_rate=learning_rate, weight_decay=weight_decay or None, **extra)
    if weight_decay:
        opt.exclude_from_weight_decay(var_names=["bias", "gamma", "beta"])
    return opt
