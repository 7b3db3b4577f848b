"""Learning-rate schedules: linear warm-up, then constant, linear or cosine decay to 0.

    lr(t) = base * min(1, (t + 1) / warmup_steps)                      during warm-up
    lr(t) = base * f((t - warmup_steps) / (total_steps - warmup_steps))  after it,
    f(p) = 1 (none), 1 - p (linear), (1 + cos(pi p)) / 2 (cosine), p clipped to [0, 1],

with t the optimizer's update count before the update (`optimizer.iterations`: G's
steps for G; D's updates, d_steps per G step, for D: `training.build_gan` scales
warmup_steps and total_steps by d_steps for D). The rate is a function of the step alone,
so it resumes exactly from a checkpoint and is the same on every replica. Warm-up uses
t + 1 so the first update already moves (lr > 0).
"""

import math

import keras
import tensorflow as tf

from tf_gan_scale import errors

DECAYS = ("none", "linear", "cosine")


def check(decay, warmup_steps, total_steps):
    """ConfigError (one line) for an unknown decay or warm-up outside [0, total_steps)."""
    errors.choose("lr_decay", decay, {d: d for d in DECAYS})
    if int(warmup_steps) != warmup_steps or not 0 <= warmup_steps < max(total_steps, 1):
        raise errors.ConfigError(f"lr_warmup_steps must be an integer in [0, {total_steps}) "
                                 f"(num_steps); Received: {warmup_steps!r}")


@keras.saving.register_keras_serializable(package="tf_gan_scale")
class WarmupDecay(keras.optimizers.schedules.LearningRateSchedule):
    """See the module docstring. Args: base learning rate (float), decay in DECAYS,
    warmup_steps and total_steps (ints, in this optimizer's updates)."""

    def __init__(self, base, decay="none", warmup_steps=0, total_steps=1):
        check(decay, warmup_steps, total_steps)
        self.base, self.decay = float(base), decay
        self.warmup_steps, self.total_steps = int(warmup_steps), int(total_steps)

    def __call__(self, step):
        t = tf.cast(step, tf.float32)
        rate = tf.constant(self.base, tf.float32)
        if self.warmup_steps:
            rate *= tf.minimum(1.0, (t + 1.0) / self.warmup_steps)
        span = max(self.total_steps - self.warmup_steps, 1)
        p = tf.clip_by_value((t - self.warmup_steps) / span, 0.0, 1.0)
        if self.decay == "linear":
            rate *= 1.0 - p
        elif self.decay == "cosine":
            rate *= 0.5 * (1.0 + tf.cos(math.pi * p))
        return rate

    def get_config(self):
        return {"base": self.base, "decay": self.decay, "warmup_steps": self.warmup_steps,
                "total_steps": self.total_steps}


# ---- R3GAN's cosine schedules, in images ------------------------------------------------
#
# R3GAN (Huang et al. 2024; brownvc/R3GAN training/training_loop.py:29-38 and 307-314)
# moves five quantities along one cosine each, evaluated at the images seen before each
# iteration (cur_nimg):
#     value(t) = base + (final - base) * (1 - cos(pi * t / T)) / 2   for t <= T,
#     value(t) = final                                               after T.
# config.train.cosine names them by the config key each one drives; the schedule takes
# that key's place (its base is the value at t = 0):
#     learning_rate   both optimizers' rate (R3GAN: the same for G and D)
#     beta_2          both Adams' beta_2
#     penalty_weight  the penalty's weight (gamma / 2 for R1 + R2)
#     ema_kimg        the EMA half-life in thousands of images (gan/ema.py)
#     ada_p           the augmentation probability (no ADA controller)
# t = step x global batch: a function of the step alone, so a resumed run continues every
# schedule exactly, and every replica and worker evaluates the same values.

COSINE_KEYS = ("learning_rate", "beta_2", "penalty_weight", "ema_kimg", "ada_p")


def cosine_value(images, base, final, total):
    """The schedule's value (float64 tensor) at `images` seen (a tensor or number)."""
    t = tf.cast(images, tf.float64)
    total = float(total)
    decay = 0.5 * (1.0 + tf.cos(math.pi * tf.minimum(t, total) / total))
    return tf.where(t > total, tf.constant(float(final), tf.float64),
                    base + (1.0 - decay) * (float(final) - base))


class Cosine:
    """One cosine schedule in images: `at(step, batch_size)` is the value (float32
    tensor) for the iteration that starts after `step` steps of `batch_size` images (the
    global batch). Args: base, final (floats), total_images (T > 0)."""

    def __init__(self, base, final, total_images):
        self.base, self.final = float(base), float(final)
        self.total_images = float(total_images)

    def value64(self, step, batch_size):
        """The value (float64 tensor) after `step` steps of `batch_size` images."""
        images = tf.cast(step, tf.float64) * tf.cast(batch_size, tf.float64)
        return cosine_value(images, self.base, self.final, self.total_images)

    def at(self, step, batch_size):
        return tf.cast(self.value64(step, batch_size), tf.float32)

    def __repr__(self):
        return f"Cosine({self.base} -> {self.final} over {self.total_images:g} images)"


def cosine_schedules(cosine):
    """{key: Cosine} of config.train.cosine (a mapping: images, and for each key of
    COSINE_KEYS () or (base, final)); {} when images is 0. Bad values raise ConfigError
    naming config.train.cosine.<key>."""
    if not cosine:
        return {}
    cosine = dict(cosine)
    total = cosine.pop("images", 0)
    unknown = sorted(set(cosine) - set(COSINE_KEYS))
    if unknown:
        raise errors.ConfigError(f"config.train.cosine.{unknown[0]} is not a schedule; "
                                 f"valid: images, {', '.join(COSINE_KEYS)}")
    if not (errors.is_real(total) and math.isfinite(total) and total >= 0):
        raise errors.ConfigError(f"config.train.cosine.images must be a number >= 0 (0: "
                                 f"no schedules); Received: {total!r}")
    out = {}
    for key, pair in cosine.items():
        if pair is None:
            continue
        if not isinstance(pair, (tuple, list)):
            raise errors.ConfigError(f"config.train.cosine.{key} must be () or (base, "
                                     f"final); Received: {pair!r}")
        pair = tuple(pair)
        if not pair:
            continue
        if len(pair) != 2 or not all(errors.is_real(v) and math.isfinite(v) and v >= 0
                                     for v in pair):
            raise errors.ConfigError(f"config.train.cosine.{key} must be () or (base, "
                                     f"final), two finite numbers >= 0; Received: {pair!r}")
        if key == "beta_2" and not all(v < 1 for v in pair):
            raise errors.ConfigError(f"config.train.cosine.beta_2 must lie in [0, 1); "
                                     f"Received: {pair!r}")
        out[key] = pair
    if out and not total:
        raise errors.ConfigError(f"config.train.cosine.images=0 with schedules for "
                                 f"{', '.join(out)}; valid: the images T over which they "
                                 f"run (> 0), or () for each")
    return {key: Cosine(base, final, total) for key, (base, final) in out.items()}


@keras.saving.register_keras_serializable(package="tf_gan_scale")
class CosineSchedule(keras.optimizers.schedules.LearningRateSchedule):
    """A `Cosine` as a function of an optimizer's update count (`iterations`, before the
    update): the value for G step iterations // updates_per_step (D makes d_steps updates
    per G step, all at the images seen before that step). A learning-rate schedule, and
    TorchAdam's beta_2. Args: base, final, total_images as `Cosine`'s; batch_size, the
    global batch (images per G step); updates_per_step, this optimizer's updates per step."""

    def __init__(self, base, final, total_images, batch_size, updates_per_step=1):
        self.cosine = Cosine(base, final, total_images)
        self.batch_size, self.updates_per_step = int(batch_size), int(updates_per_step)
        if self.batch_size < 1 or self.updates_per_step < 1:
            raise errors.ConfigError(f"a cosine schedule needs batch_size and "
                                     f"updates_per_step >= 1; Received: {self.batch_size}, "
                                     f"{self.updates_per_step}")

    def value64(self, iterations):
        """The value (float64 tensor) for the update `iterations` counts."""
        step = tf.math.floordiv(tf.cast(iterations, tf.int64), self.updates_per_step)
        return self.cosine.value64(step, self.batch_size)

    def __call__(self, iterations):
        return tf.cast(self.value64(iterations), tf.float32)

    def get_config(self):
        c = self.cosine
        return {"base": c.base, "final": c.final, "total_images": c.total_images,
                "batch_size": self.batch_size, "updates_per_step": self.updates_per_step}


@keras.saving.register_keras_serializable(package="tf_gan_scale")
class TorchAdam(keras.optimizers.Adam):
    """torch.optim.Adam's update (R3GAN's optimizer) with beta_2 a float or a schedule
    of `iterations` (a `CosineSchedule`), read at every update as R3GAN writes it into
    the param groups (training_loop.py:329-331). With t = iterations + 1 and b2 = beta_2
    at `iterations` (the CURRENT value in both places, as torch):
        m <- lerp(m, g, 1 - beta_1);  v <- b2 v + (1 - b2) g^2
        w <- w - (lr / (1 - beta_1^t)) m / (sqrt(v) / sqrt(1 - b2^t) + epsilon)
    Keras' Adam instead adds epsilon to sqrt(v) before the bias correction (and reads a
    constant beta_2). The scalars are float64 (torch's are Python floats), the tensors
    float32. No amsgrad, weight decay or Keras EMA."""

    def __init__(self, learning_rate=0.001, beta_1=0.9, beta_2=0.999, epsilon=1e-8,
                 **kwargs):
        for key in ("amsgrad", "weight_decay", "use_ema"):
            if kwargs.get(key):
                raise errors.ConfigError(f"TorchAdam has no {key}; Received: {key}="
                                         f"{kwargs[key]!r}")
        super().__init__(learning_rate=learning_rate, beta_1=beta_1,
                         beta_2=0.0 if callable(beta_2) else float(beta_2),
                         epsilon=epsilon, **kwargs)
        self._beta_2_schedule = beta_2 if callable(beta_2) else None

    def current_beta_2(self):
        """beta_2 (float64 scalar tensor) for the update `iterations` counts."""
        s = self._beta_2_schedule
        if s is None:
            return tf.constant(float(self.beta_2), tf.float64)
        if isinstance(s, CosineSchedule):
            return s.value64(self.iterations)
        return tf.cast(s(self.iterations), tf.float64)

    def update_step(self, gradient, variable, learning_rate):
        dtype = variable.dtype
        gradient = tf.cast(gradient, dtype)
        t = tf.cast(self.iterations + 1, tf.float64)
        b1 = float(self.beta_1)
        b2 = self.current_beta_2()
        if isinstance(self._learning_rate, CosineSchedule):  # torch's lr: a float64.
            learning_rate = self._learning_rate.value64(self.iterations)
        bc1 = 1.0 - tf.pow(tf.constant(b1, tf.float64), t)
        step_size = tf.cast(tf.cast(learning_rate, tf.float64) / bc1, dtype)
        bc2_sqrt = tf.cast(tf.sqrt(1.0 - tf.pow(b2, t)), dtype)
        m = self._momentums[self._get_variable_index(variable)]
        v = self._velocities[self._get_variable_index(variable)]
        w = tf.constant(1.0 - b1, dtype)  # torch.lerp(m, g, w), its two branches.
        if 1.0 - b1 < 0.5:
            new_m = m + w * (gradient - m)
        else:
            new_m = gradient - (gradient - m) * (1.0 - w)
        # torch's addcmul: v b2 + ((1 - b2) g) g.
        new_v = v * tf.cast(b2, dtype) + tf.cast(1.0 - b2, dtype) * gradient * gradient
        self.assign(m, new_m)
        self.assign(v, new_v)
        denom = tf.sqrt(new_v) / bc2_sqrt + tf.cast(self.epsilon, dtype)
        self.assign_sub(variable, step_size * new_m / denom)  # torch's addcdiv.

    def get_config(self):
        config = super().get_config()
        if self._beta_2_schedule is not None:
            config["beta_2"] = keras.saving.serialize_keras_object(self._beta_2_schedule)
        return config

    @classmethod
    def from_config(cls, config, custom_objects=None):
        config = dict(config)
        if isinstance(config.get("beta_2"), dict):
            config["beta_2"] = keras.saving.deserialize_keras_object(
                config["beta_2"], custom_objects=custom_objects)
        return super().from_config(config, custom_objects=custom_objects)
