"""Cross-replica batch norm with ONE all-reduce per layer per pass.

Keras' `BatchNormalization(synchronized=True)` all-reduces the per-channel sum, the sum of
squares and the count separately: three collectives per layer in the forward pass and
two more in the backward pass, each paying the full latency of a cross-worker round
trip. Here the three are packed into one vector [sum (C), sum of squares (C), count (1)]
and all-reduced once (so the backward pass has one all-reduce too). The statistics are
the same: mean = S / n, var = max(Q / n - mean^2, 0) over the GLOBAL batch; the moving
statistics, parameters and checkpoint layout are those of `BatchNormalization`.

With one replica (or outside any strategy) it computes `tf.nn.moments` exactly like
`BatchNormalization`, so one device and N replicas agree to float rounding.
"""

import keras
import tensorflow as tf


@keras.saving.register_keras_serializable(package="tf_gan_scale")
class SyncBatchNormalization(keras.layers.BatchNormalization):
    """`keras.layers.BatchNormalization` over the global batch of all replicas and workers.

    Same arguments as `BatchNormalization` (`synchronized` is always True). Inputs
    [B, ..., C] (channels last); statistics are per channel, over every other axis of
    every replica's batch.
    """

    def __init__(self, **kwargs):
        kwargs["synchronized"] = True
        super().__init__(**kwargs)

    def _moments(self, inputs, mask):
        ctx = tf.distribute.get_replica_context()
        if mask is not None or ctx is None or ctx.num_replicas_in_sync == 1:
            if mask is None:
                return tf.nn.moments(inputs, self._reduction_axes)
            return super()._moments(inputs, mask)
        x = tf.cast(inputs, tf.float32)  # Statistics in float32, also under mixed precision.
        axes = self._reduction_axes
        local_sum = tf.reduce_sum(x, axes)  # [C]
        channels = tf.shape(local_sum)[0]
        count = tf.cast(tf.size(x) // channels, tf.float32)
        packed = tf.concat([local_sum, tf.reduce_sum(tf.square(x), axes), count[None]], 0)
        total = ctx.all_reduce(tf.distribute.ReduceOp.SUM, packed)  # The one collective.
        s, q, n = total[:channels], total[channels:2 * channels], total[-1]
        mean = s / n
        variance = tf.maximum(q / n - tf.square(mean), 0.0)
        return tf.cast(mean, inputs.dtype), tf.cast(variance, inputs.dtype)
