"""Checks around the GAN step: each problem is one error naming it, before the first step
where it can be seen (networks that do not fit together, a batch that does not split over
the replicas) or right after the step, before any callback (non-finite state)."""

import keras
import tensorflow as tf

from tf_gan_scale.architectures.calls import is_conditional

UNEVEN_TAG = "tf_gan_scale: uneven batch split"  # Marks the pre-step assertion's message.
# A step's (and a lazy phase's) output: which in-step check failed (0: none), under key
# NONFINITE. Defined here, below every step module, and offered as `gan.step.NONFINITE`.
NONFINITE = "nonfinite"
NONFINITE_D, NONFINITE_G, UNEVEN = 1, 2, 3


def assert_even_split(strategy, batches):
    """Before a training step: this worker's replicas must hold equal numbers of rows.
    Returns the assertion ops: the step runs under a control dependency on them, so
    nothing is updated when one fails. (`GAN.train_step` checks the global row count too,
    which sees other workers' replicas.)"""
    checks = []
    if strategy.num_replicas_in_sync == 1:  # Also the default strategy (no scope at all),
        return checks                       # whose extended has no worker_devices.
    local = len(strategy.extended.worker_devices)
    if local != strategy.num_replicas_in_sync:
        # One replica, or several workers: a worker whose local check failed would stop
        # while the others wait in the step's collectives (a raw error on them). Across
        # workers the verdict is the global one train_step sums in G's all-reduce.
        return checks
    for batch in batches:
        first = tf.nest.flatten(batch)[0]
        sizes = [tf.shape(v)[0] for v in strategy.experimental_local_results(first)]
        if len(sizes) > 1:
            sizes = tf.stack(sizes)
            checks.append(tf.debugging.Assert(tf.reduce_all(tf.equal(sizes, sizes[0])),
                                              [UNEVEN_TAG, sizes]))
    return checks


ACCUMULATION_TAG = "tf_gan_scale: accumulation_steps does not divide the per-replica rows"


def assert_accumulation_split(strategy, batches, k):
    """Before a training step: every local replica's rows divide into k micro-batches
    (`GanStep.micro_batches`). Outside the per-replica step, so it also holds when XLA
    compiles that step (XLA drops assertions). Returns the assertion ops."""
    if k == 1:
        return []
    checks = []
    for batch in batches:
        first = tf.nest.flatten(batch)[0]
        for value in strategy.experimental_local_results(first):
            rows = tf.shape(value)[0]
            checks.append(tf.debugging.Assert(tf.equal(rows % k, 0),
                                              [ACCUMULATION_TAG, rows]))
    return checks


def uneven_message(strategy, when):
    """The one-line error for a batch that did not split evenly over the replicas."""
    n = strategy.num_replicas_in_sync
    return (f"a batch did not split evenly over the {n} replicas {when}: every replica "
            f"must get the same number of examples, or losses and gradients are scaled "
            f"by a wrong global batch size; batch with a global batch size divisible by "
            f"{n} and drop_remainder=True (NumPy input: a batch_size divisible by {n} and "
            f"a number of examples divisible by batch_size)")


def check_networks(generator, discriminator, num_classes=0):
    """Raises ValueError (one line, before any step) when D does not take G's samples or
    does not return one logit per example, or when the networks' conditioning (two inputs:
    [z or x, labels]) does not match `num_classes` (0: unconditional)."""
    for name, model in (("generator", generator), ("discriminator", discriminator)):
        if bool(num_classes) != is_conditional(model):
            raise ValueError(
                f"num_classes={num_classes} but the {name} is "
                f"{'conditional ([inputs, labels])' if is_conditional(model) else 'unconditional'}"
                f"; a conditional GAN needs num_classes > 0 and both networks taking "
                f"[inputs, labels], an unconditional one num_classes=0 and single inputs")
    g_out = tuple(generator.output_shape[1:])
    try:  # Subclassed models may not know their input or output shapes: skip the check.
        d_in = discriminator.input_shape
        d_in = tuple((d_in[0] if num_classes else d_in)[1:])
    except (AttributeError, ValueError, NotImplementedError):
        d_in = g_out
    if num_classes:
        d_out = tuple(discriminator.output_shape[1:])
        if d_in != g_out or d_out not in ((), (1,)):
            raise ValueError(f"the conditional discriminator takes {d_in} and returns "
                             f"{d_out}; the generator makes {g_out}; it must return [B, 1]")
        return
    if d_in != g_out:
        raise ValueError(f"the generator's samples have shape {g_out} but the discriminator "
                         f"takes {d_in}; build both for the same data shape")
    try:
        d_out = tuple(discriminator.compute_output_shape((None,) + g_out)[1:])
    except (AttributeError, ValueError, NotImplementedError):
        d_out = ()
    if d_out not in ((), (1,)):
        raise ValueError(f"the discriminator must return logits of shape [B, 1] or [B]; "
                         f"Received: [B, {', '.join(map(str, d_out))}]")


def has_batch_norm(model):
    """True when `model` has a batch-norm layer (whose training call runs collectives)."""
    return any(isinstance(layer, keras.layers.BatchNormalization)
               for layer in model._flatten_layers())  # Recursive, wrappers included.


def all_finite(variables):
    """True (bool scalar) when every float variable holds only finite values."""
    checks = [tf.reduce_all(tf.math.is_finite(v)) for v in variables
              if v.dtype in ("float16", "bfloat16", "float32", "float64")]
    return tf.reduce_all(tf.stack(checks)) if checks else tf.constant(True)
