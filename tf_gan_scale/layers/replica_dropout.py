"""Dropout whose masks differ across replicas and survive a resume.

Keras' `Dropout` draws its mask from a `SeedGenerator`, whose state is mirrored: every
replica gets the SAME mask stream, so N replicas apply identical masks to different
examples -- correlated noise a single device never has. Its state is also not saved by
`tf.train.Checkpoint`, so a resumed run draws other masks than an uninterrupted one.

This layer keeps its own call counter as a (checkpointed) non-trainable weight and draws
each mask from the stateless seed (seed, counter, replica id).
"""

import keras
import tensorflow as tf

from tf_gan_scale import replica


@keras.saving.register_keras_serializable(package="tf_gan_scale")
class ReplicaDropout(keras.layers.Dropout):
    """`keras.layers.Dropout` with per-replica, resumable masks under `tf.distribute`.

    Args:
        rate: float in [0, 1), fraction of inputs to drop.
        seed: int, base seed of the layer's masks.
        **kwargs: passed to `keras.layers.Dropout` (e.g. `name`, `noise_shape`).

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

    def call(self, inputs, training=False):
        if not training or self.rate == 0:
            return inputs
        count = self.calls.assign_add(1)
        seed = tf.random.experimental.stateless_fold_in(
            tf.constant([self.seed, 0], tf.int64), tf.cast(count, tf.int64))
        seed = tf.random.experimental.stateless_fold_in(
            seed, tf.cast(replica.replica_id(), tf.int64))
        return tf.nn.experimental.stateless_dropout(
            inputs, rate=self.rate, seed=seed, noise_shape=self.noise_shape)
