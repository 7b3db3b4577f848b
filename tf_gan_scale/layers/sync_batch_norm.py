"""Cross-replica batch norm: ONE formula on every path, one all-reduce per layer and pass.

Statistics over the GLOBAL batch (every replica of every worker), the same arithmetic on
one device and on N replicas, so the two agree to rounding, also in the second-order
gradients that WGAN-GP and R1 take through D:

  1. each replica: count n_r, mean m_r and centred sum of squares M2_r = sum (x - m_r)^2
     of its own rows (local passes: mean, the mean of the residuals as a correction to
     it, then the squares; m_r keeps its gradient: `tf.nn.moments` stops it inside the
     variance, which leaves first-order gradients right but second-order ones wrong);
  2. about a shift s that every replica agrees on (the moving mean, gradient stopped):
     a_r = n_r (m_r - s),  q_r = M2_r + n_r (m_r - s)^2,  packed [a (C), q (C), n (1)] and
     summed over replicas in ONE all-reduce (Keras' synchronized BN issues three forward
     and two backward; this one's gradient is one all-reduce too);
  3. mean = s + A / N,  var = Q / N - (A / N)^2.
The sums of step 2 are accumulated in float64 (O(channels) numbers: free), so E[x^2] -
E[x]^2 cannot cancel catastrophically: for a mean 1e4 times the spread the variance
still matches a float64 reference to float32 accuracy (in float32, a mean of 3,000 and a
standard deviation of 1 gave a variance of 2.0). The shift is exact algebra (any s gives
the same result), so it costs no gradient accuracy; where float64 is not available (TPU:
float32 with the shift) it helps once the moving mean has come near the data's mean. With a mask, masked-out rows get
weight 0 on every path, also synchronized (Keras' masked path is per replica).

The moving statistics, parameters and checkpoint layout are those of
`BatchNormalization`.
"""

import keras
import tensorflow as tf


def _accumulation_dtype():
    # TPUs have no float64; there the moving-mean shift carries the accuracy, once the
    # moving mean is within ~100 standard deviations of the data's mean (at first it is 0:
    # inputs of mean 3,000 and spread 1 then get variances off by up to 3x). Untested on a
    # TPU here.
    strategy = tf.distribute.get_strategy()
    return tf.float32 if isinstance(strategy, tf.distribute.TPUStrategy) else tf.float64


@keras.saving.register_keras_serializable(package="tf_gan_scale")
class SyncBatchNormalization(keras.layers.BatchNormalization):
    """`keras.layers.BatchNormalization` over the global batch of all replicas and workers.

    Same arguments as `BatchNormalization` (`synchronized` is always True). Inputs
    [B, ..., C] (channels last); statistics are per channel, over every other axis of
    every replica's batch. Outside a strategy, or with one replica, the same formula runs
    without the all-reduce.

    Example:
        >>> bn = SyncBatchNormalization()
        >>> y = bn(tf.random.normal([8, 4, 4, 16]) * 3.0 + 3000.0, training=True)
    """

    def __init__(self, **kwargs):
        kwargs["synchronized"] = True
        super().__init__(**kwargs)

    def build(self, input_shape):
        super().build(input_shape)
        if self.axis not in (-1, len(input_shape) - 1):
            # The statistics below reduce over every axis but the last.
            raise ValueError(f"SyncBatchNormalization normalizes the last axis (channels "
                             f"last); Received: axis={self.axis} for inputs {input_shape}")

    def _moments(self, inputs, mask):
        """Global mean and (biased) variance [C] of inputs [B, ..., C] (see module doc)."""
        x = tf.convert_to_tensor(inputs)  # float32 at least (Keras upcasts half types).
        axes = self._reduction_axes
        if mask is None:
            w = None
            n = tf.cast(tf.size(x) // tf.shape(x)[-1], x.dtype)  # Rows x spatial positions.
        else:
            w = tf.cast(tf.broadcast_to(tf.expand_dims(mask, -1), tf.shape(x)), x.dtype)
            n = tf.reduce_sum(w[..., 0])

        def local_sum(v):  # [B, ..., C] -> [C], masked rows weighted 0.
            return tf.reduce_sum(v if w is None else v * w, axes)

        # No stop_gradient anywhere: true first- and second-order gradients.
        local_mean = tf.math.divide_no_nan(local_sum(x), n)  # [C]
        d = x - local_mean  # Exact-ish: x and its mean are close.
        # The float32 mean of large values is off by ~ulp(mean); the mean of the residuals
        # recovers that error (it is 0 in exact arithmetic, so its gradient is 0).
        correction = tf.math.divide_no_nan(local_sum(d), n)  # [C]
        m2 = local_sum(tf.square(d - correction))  # [C]

        acc = tf.float64 if x.dtype == tf.float64 else _accumulation_dtype()
        shift = tf.stop_gradient(tf.cast(self.moving_mean, acc))
        n_acc = tf.cast(n, acc)
        offset = (tf.cast(local_mean, acc) - shift) + tf.cast(correction, acc)
        a = n_acc * offset
        q = tf.cast(m2, acc) + n_acc * tf.square(offset)
        ctx = tf.distribute.get_replica_context()
        if ctx is not None and ctx.num_replicas_in_sync > 1:
            channels = tf.shape(a)[0]
            packed = tf.concat([a, q, n_acc[None]], 0)
            # THE collective of this layer: [sum a, sum q, total count] over replicas.
            total = ctx.all_reduce(tf.distribute.ReduceOp.SUM, packed)
            a, q, n_acc = total[:channels], total[channels:2 * channels], total[-1]
        mean_offset = tf.math.divide_no_nan(a, n_acc)
        variance = tf.maximum(tf.math.divide_no_nan(q, n_acc) - tf.square(mean_offset), 0.0)
        return tf.cast(shift + mean_offset, x.dtype), tf.cast(variance, x.dtype)
