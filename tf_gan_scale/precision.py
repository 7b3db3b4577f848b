"""Arithmetic precision of a run: `config.train.precision`, one of PRECISIONS.

    with precision.policy("mixed_bfloat16"):
        g, d = architectures.build(...)      # layers compute in bfloat16
    g_opt = precision.optimizer(keras.optimizers.Adam(2e-4), "mixed_bfloat16")

What stays float32 under a mixed policy, and why:
  * variables (Keras' mixed policies keep them float32; layers autocast their reads), so
    gradients, their all-reduce, the optimizer update and checkpoints are float32 and
    move between precisions unchanged;
  * batch-norm statistics and their all-reduce (`SyncBatchNormalization` upcasts half
    inputs, and sums in float64);
  * every architecture's last layer (G's output activation, D's logit layer: `OUTPUT`),
    so losses, gradient penalties and generated samples are float32 (a bfloat16 sample
    has 8 significant bits: 0.016 steps at |x| = 4, a third of a toy mode's width);
    The GAN (`gan/step.py`, `architectures/calls.py`) also casts logits and samples, so
    a user's own networks are safe too.
`mixed_float16` adds dynamic loss scaling (`keras.optimizers.LossScaleOptimizer`): the
step's gradients are all-reduced BEFORE its finite check (`replica.apply_global_gradients`),
so an overflow on any replica skips the update on all of them, and halves the scale;
`GAN` logs the fraction of updates skipped since the last log (`d_skip_rate`,
`g_skip_rate`). bfloat16 has float32's exponent range and needs no scaling.
"""

import contextlib

import keras
import tensorflow as tf
from absl import logging

from tf_gan_scale import errors

PRECISIONS = ("float32", "mixed_bfloat16", "mixed_float16")
OUTPUT = "float32"  # dtype= of every architecture's output layer (see module docstring).


def check(name):
    """`name` if it is one of PRECISIONS, else ConfigError naming the valid ones."""
    if name not in PRECISIONS:
        raise errors.ConfigError(f"unknown precision {name!r}; valid: {', '.join(PRECISIONS)}")
    return name


@contextlib.contextmanager
def policy(name):
    """Layers created inside use dtype policy `name`; the global policy is restored after
    (Keras keeps one process-wide policy: a run must not leak it into tools or tests)."""
    check(name)
    before = keras.config.dtype_policy()
    if name == "mixed_float16" and not tf.config.list_physical_devices("GPU"):
        logging.warning("precision mixed_float16 without a GPU: allowed, but float16 "
                        "arithmetic is emulated on CPU and slow; mixed_bfloat16 is the "
                        "fast choice on CPUs with bfloat16 instructions and on TPUs")
    keras.config.set_dtype_policy(name)
    try:
        yield
    finally:
        keras.config.set_dtype_policy(before)


def optimizer(opt, name):
    """`opt` wrapped in a LossScaleOptimizer for mixed_float16; unchanged otherwise."""
    if check(name) == "mixed_float16" and not isinstance(
            opt, keras.optimizers.LossScaleOptimizer):
        return keras.optimizers.LossScaleOptimizer(opt)
    return opt

