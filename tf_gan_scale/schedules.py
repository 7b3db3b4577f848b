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
