"""Dropout whose masks are a function of the example, not of the replica it lands on.

Keras' `Dropout` draws its mask from a `SeedGenerator`, whose state is mirrored: every
replica gets the SAME mask stream, so N replicas apply identical masks to different
examples -- correlated noise a single device never has. Its state is also not saved by
`tf.train.Checkpoint`, so a resumed run draws other masks than an uninterrupted one.

Here the mask of example i in call c of the layer is drawn from the key
(seed, c, DROPOUT_PHASE) with the example's GLOBAL index i folded in
(`latents.rows_uniform`): one device and N replicas, on any number of workers, drop exactly the same units of the same
example, and each replica draws only its own rows. The call counter c is a checkpointed
non-trainable weight, so a resumed run continues the same mask sequence. Global indices
come from `latents.current_rows` (the trainer declares them when D sees [real; fake]).
"""

import keras
import numpy as np
import tensorflow as tf

from tf_gan_scale import latents


@keras.saving.register_keras_serializable(package="tf_gan_scale")
class ReplicaDropout(keras.layers.Dropout):
    """`keras.layers.Dropout` with per-example, replica-count-independent, resumable masks.

    Args:
        rate: float in [0, 1), fraction of inputs to drop.
        seed: int, base seed of the layer's masks.
        **kwargs: passed to `keras.layers.Dropout` (e.g. `name`, `noise_shape`).

    Inputs [B, ...] -> same shape; each kept value is scaled by 1 / (1 - rate).

    Example:
        >>> layer = ReplicaDropout(0.3, seed=1)
        >>> y = layer(tf.ones([4, 8]), training=True)   # each input 0 or 1/0.7
    """

    def __init__(self, rate, seed=0, **kwargs):
        super().__init__(rate, seed=int(seed), **kwargs)

    def build(self, input_shape):
        # Replicas run in lockstep, so the first replica's count is everyone's.
        self.calls = self.add_weight(name="calls", shape=(), dtype="int64",
                                     initializer="zeros", trainable=False,
                                     aggregation="only_first_replica")
        self.built = True

    def _mask_shape(self, inputs):
        """Per-example mask shape (static), from noise_shape with None = input dim."""
        shape = list(inputs.shape[1:])
        if self.noise_shape is not None:
            shape = [s if s is not None else d
                     for s, d in zip(list(self.noise_shape)[1:], shape)]
        if any(s is None for s in shape):
            raise ValueError(f"ReplicaDropout needs static non-batch dimensions; "
                             f"Received: inputs.shape={inputs.shape}")
        return shape

    def call(self, inputs, training=False):
        if not training or self.rate == 0:
            return inputs
        count = self.calls.assign_add(1)
        key = latents.key(self.seed, count, latents.DROPOUT_PHASE)
        rows = latents.current_rows(tf.shape(inputs)[0])
        shape = self._mask_shape(inputs)
        keep = latents.rows_uniform(key, rows, shape) >= self.rate  # [B, *shape]
        scale = np.float32(1.0 / (1.0 - self.rate))
        return inputs * tf.cast(keep, inputs.dtype) * tf.cast(scale, inputs.dtype)
