"""Exponential moving average (EMA) of the generator's weights: the generator you sample.

    ema = GeneratorEMA(generator, decay=0.9999, start=1000, warmup=0)   # in strategy scope
    ema.update(generator, step)   # after each G update, in replica context
    ema.model(z)                  # a Keras model like `generator`

BigGAN (Brock et al. 2018), ProGAN, StyleGAN and BigGAN-PyTorch sample and score an EMA
of G's weights: it averages out the oscillation of adversarial training and typically
gives a clearly lower FID than the raw generator.

Schedule, for the generator step t counted AFTER the update (t = 1 after the first):
    t <= start:          ema <- w                               (a copy: decay 0)
    t > start:           ema <- d_t * ema + (1 - d_t) * w,
                         d_t = decay * min(1, (t - start) / warmup)   (d_t = decay if warmup=0)
so the average starts from the weights at `start` (BigGAN-PyTorch's `ema_start`) and its
horizon grows linearly over `warmup` steps instead of averaging in the random init.

StyleGAN2-ADA's schedule (training_loop.py, "Update G_ema") instead, with `half_life_kimg`
> 0: a half-life in images, optionally ramped up with the images seen so far,
    nimg = (t - 1) x B   (the images before this update; B = the global batch)
    h    = half_life_kimg x 1000, or min(that, nimg x rampup) when rampup > 0
    d_t  = 0.5 ^ (B / max(h, 1e-8))
(paper256: 20 kimg at B = 64 gives 0.997784; with a ramp-up the first update copies).

R3GAN's (training_loop.py:310, 350-353), with `cosine` = (base_kimg, final_kimg, T): the
half-life in images on a cosine (schedules.py) in the images seen before the iteration,
    h   = 1000 x cosine_value((t - 1) x B, base_kimg, final_kimg, T)
    d_t = 0.5 ^ (B / max(h, 1e-8))
(its presets start at h = 0: the first updates copy G).

Batch-norm statistics: the moving mean and variance are averaged like the weights
(BigGAN-PyTorch's `ema` does the same to its buffers): the EMA model normalizes with
an EMA of the statistics the live generator tracked, not statistics measured on the
EMA weights themselves. BigGAN's alternative, "standing statistics" (re-estimating
them by running the EMA model in training mode over many batches), is not implemented.
Integer state (call counters of per-example dropout) is copied.

Distributed: every replica holds the same weights, so every replica computes the same
average from its local copies; the update is a local assign (mirrored variables with
aggregation NONE update the replica's own copy in replica context) and costs no
collective. The EMA weights are checkpointed (key "ema_generator"), so resume is exact.
"""

import numbers

import keras
import tensorflow as tf

from tf_gan_scale import errors, schedules


def check_kimg(half_life_kimg, rampup, batch_size, prefix="ema_"):
    """ConfigError for a bad StyleGAN-style schedule (one line naming the key)."""
    for name, value in (("kimg", half_life_kimg), ("rampup", rampup)):
        if not (isinstance(value, numbers.Real) and float(value) >= 0):
            raise errors.ConfigError(f"{prefix}{name} must be a number >= 0; Received: "
                                     f"{value!r}")
    if half_life_kimg and not (errors.is_int(batch_size) and batch_size >= 1):
        raise errors.ConfigError(f"{prefix}kimg={half_life_kimg} needs the global batch "
                                 f"size (an integer >= 1); Received: {batch_size!r}")


def check(decay, start, warmup, num_steps=None, prefix="ema_"):
    """ConfigError for settings that make no sense (one line, naming the key as
    `prefix` + decay/start/warmup and the valid range)."""
    if not (isinstance(decay, numbers.Real) and 0.0 <= float(decay) < 1.0):
        raise errors.ConfigError(f"{prefix}decay must be in [0, 1) (0 = no EMA); Received: "
                                 f"{decay!r}")
    for name, value in (("start", start), ("warmup", warmup)):
        if not errors.is_int(value) or value < 0:
            raise errors.ConfigError(f"{prefix}{name} must be an integer >= 0; Received: "
                                     f"{value!r}")
    if decay and num_steps is not None and start >= num_steps:
        raise errors.ConfigError(
            f"{prefix}start={start} is not before the end of training (num_steps="
            f"{num_steps}): the EMA would be a plain copy; valid: 0 <= start < {num_steps}")


class GeneratorEMA:
    """The EMA copy of a generator. Create it in the strategy scope the generator lives in.

    Args:
        generator: a built Keras model (Functional or Sequential: it is cloned).
        decay: float in (0, 1), e.g. 0.999 (BigGAN-PyTorch: 0.9999).
        start: G steps during which the EMA just copies the weights.
        warmup: G steps after `start` over which the decay ramps linearly to `decay`.
        half_life_kimg / rampup / batch_size: StyleGAN2-ADA's schedule (module
            docstring) when half_life_kimg > 0; batch_size is the global batch.
        cosine: R3GAN's schedule (module docstring) instead, (base_kimg, final_kimg,
            total_images), or None.
    """

    def __init__(self, generator, decay, start=0, warmup=0, half_life_kimg=0.0, rampup=0.0,
                 batch_size=0, cosine=None):
        check(decay, start, warmup)
        check_kimg(half_life_kimg, rampup, batch_size)
        self.cosine = None
        if cosine:
            if not (errors.is_int(batch_size) and batch_size >= 1):
                raise errors.ConfigError(f"cosine.ema_kimg={tuple(cosine[:2])} needs the "
                                         f"global batch size (an integer >= 1); Received: "
                                         f"{batch_size!r}")
            self.cosine = schedules.Cosine(*cosine)
        self.decay, self.start, self.warmup = float(decay), int(start), int(warmup)
        self.half_life_kimg, self.rampup = float(half_life_kimg), float(rampup)
        self.batch_size = int(batch_size)
        self.model = keras.models.clone_model(generator)
        self.model.build(generator.inputs[0].shape if len(generator.inputs) == 1
                         else [i.shape for i in generator.inputs])
        self._pairs(generator)  # Checks the structure once.
        self.model.set_weights(generator.get_weights())

    def _pairs(self, generator):
        pairs = list(zip(self.model.weights, generator.weights))
        if len(self.model.weights) != len(generator.weights) or any(
                tuple(e.shape) != tuple(w.shape) for e, w in pairs):
            raise ValueError("the EMA model's weights do not match the generator's")
        return pairs

    def decay_at(self, step):
        """d_t (float32 scalar tensor) for generator step `step` (counted after the update)."""
        if self.cosine is not None or self.half_life_kimg:
            # A half-life of h images: d = 0.5 ^ (B / max(h, 1e-8)).
            batch = float(self.batch_size)
            if self.cosine is not None:  # At the images before this iteration.
                images = 1000.0 * self.cosine.value64(tf.cast(step, tf.int64) - 1, batch)
            else:
                images = tf.constant(self.half_life_kimg * 1000.0, tf.float64)
                if self.rampup:
                    seen = (tf.cast(step, tf.float64) - 1.0) * batch
                    images = tf.minimum(images, seen * self.rampup)
            decay = tf.pow(tf.constant(0.5, tf.float64), batch / tf.maximum(images, 1e-8))
            return tf.cast(decay, tf.float32)
        t = tf.cast(step, tf.float32) - float(self.start)
        if self.warmup:
            ramp = tf.minimum(1.0, t / float(self.warmup))
        else:
            ramp = tf.constant(1.0)
        return tf.where(t > 0, self.decay * ramp, 0.0)

    def update(self, generator, step):
        """Moves the EMA towards `generator`'s weights (see the module docstring). Call in
        replica context after the G update of step `step` - 1 (so `step` counts it)."""
        d = self.decay_at(step)
        ops = []
        for e, w in self._pairs(generator):
            value = tf.convert_to_tensor(w)
            if value.dtype.is_floating:
                value = d * e + (1.0 - d) * value
            ops.append(e.assign(value))
        return tf.group(ops)
