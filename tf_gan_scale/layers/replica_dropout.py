"""Dropout whose masks differ across replicas.

Keras' `Dropout` draws its mask from a `SeedGenerator`, whose state is mirrored: every
replica gets the SAME mask stream, so N replicas apply identical masks to different
examples -- correlated noise a single device never has. This layer takes the seed from
the same generator and folds in the replica id, so each replica draws its own mask.
"""

import keras
import tensorflow as tf

from tf_gan_scale import replica


@keras.saving.register_keras_serializable(package="tf_gan_scale")
class ReplicaDropout(keras.layers.Dropout):
    """`keras.layers.Dropout` with per-replica masks under `tf.distribute`.

    Args:
        rate: float in [0, 1), fraction of inputs to drop.
        seed: int, base seed of the layer's stream.
        **kwargs: passed to `keras.layers.Dropout` (e.g. `name`).

    Example:
        >>> layer = ReplicaDropout(0.3, seed=1)
        >>> y = layer(tf.ones([4, 8]), training=True)   # inputs scaled by 1/0.7 or 0
    """

    def call(self, inputs, training=False):
        if not training or self.rate == 0:
            return inputs
        seed = self.seed_generator.next()
        seed = tf.random.experimental.stateless_fold_in(
            tf.cast(seed, tf.int64), tf.cast(replica.replica_id(), tf.int64))
        return tf.nn.experimental.stateless_dropout(
            inputs, rate=self.rate, seed=seed, noise_shape=self.noise_shape)
