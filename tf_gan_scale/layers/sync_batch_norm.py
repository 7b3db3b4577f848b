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

Group-wise statistics (`group_size=G`, BigGAN's cross-replica BN on TPU pods): the
replicas form groups [g*G, (g+1)*G) by `replica_id_in_sync_group`, and each replica
normalizes with the statistics of its GROUP's rows only. This is ghost batch norm, NOT
full-batch equivalence: the contract is "one device whose global batch is split into
R/G contiguous groups of rows, each normalized by its own statistics"
(`virtual_groups=R // G` on one device; replica r holds the r-th contiguous chunk of the
global batch, as `replica.global_rows` says for one worker). Moving statistics are
updated with the mean over groups of the group means and variances (Keras 2's
`virtual_batch_size` convention), so they agree on every replica.

The collective stays ONE per pass, in one of two forms:
  * TPUStrategy: `CrossReplicaSum` with a `group_assignment`, a real subgroup sum whose
    latency grows with G, not with R. A replica then only sees its own group's sums, so
    its moving statistics follow its own group (the checkpoint holds group 0's); a
    second collective would be needed to average them. Untested here (no TPU).
  * MirroredStrategy / MultiWorkerMirroredStrategy: ONE all-reduce over ALL replicas of
    a [R/G, 2C+1] tensor in which each replica fills only its group's row. The numbers
    are the grouped ones, but the latency stays O(R) (it is the same all-reduce as full
    sync, R/G times the bytes). tf.distribute has no public subgroup all-reduce;
    `CollectiveReduceV2` with a per-group key deadlocked inside `strategy.run` (it is
    ordered by automatic control dependencies, so one device's op waits for another's),
    and the V1 `CollectiveReduce` worked in a 4-CPU MirroredStrategy sketch but needs
    hand-managed group/instance keys that must match across workers and never collide
    with the strategy's own: not worth the risk for a latency win that only matters at
    pod scale.
"""


import keras
import tensorflow as tf

from tf_gan_scale import errors


def _on_tpu():
    return isinstance(tf.distribute.get_strategy(), tf.distribute.TPUStrategy)


def _accumulation_dtype():
    # TPUs have no float64; there the moving-mean shift carries the accuracy, once the
    # moving mean is within ~100 standard deviations of the data's mean (at first it is 0:
    # inputs of mean 3,000 and spread 1 then get variances off by up to 3x). Untested on a
    # TPU here.
    return tf.float32 if _on_tpu() else tf.float64


def _divisors(n):
    return [d for d in range(1, n + 1) if n % d == 0]


def check_group_size(group_size, num_replicas, name="group_size"):
    """Replicas per statistics group for `group_size` on `num_replicas` replicas.

    0 or None means all replicas; so does any group_size >= num_replicas. A smaller one
    must divide num_replicas, else a one-line ConfigError naming `name` and the valid
    values.
    """
    if group_size is None:
        group_size = 0
    if not errors.is_int(group_size) or group_size < 0:
        raise errors.ConfigError(f"{name} must be an integer >= 0 (0: all replicas); "
                                 f"Received: {name}={group_size!r}")
    if group_size == 0 or group_size >= num_replicas:
        return num_replicas
    if num_replicas % group_size:
        raise errors.ConfigError(
            f"{name}={group_size} does not divide the {num_replicas} replicas; valid: 0 "
            f"(all) or {', '.join(map(str, _divisors(num_replicas)))}")
    return group_size


@keras.saving.register_keras_serializable(package="tf_gan_scale")
class SyncBatchNormalization(keras.layers.BatchNormalization):
    """`keras.layers.BatchNormalization` over the global batch of all replicas and workers.

    Same arguments as `BatchNormalization` (`synchronized` is always True). Inputs
    [B, ..., C] (channels last); statistics are per channel, over every other axis of
    every replica's batch. Outside a strategy, or with one replica, the same formula runs
    without the all-reduce.

    Args:
        group_size: int, replicas per statistics group (module doc: ghost batch norm
            over groups of replicas). 0 or None: all replicas (full sync). A value >= the
            number of replicas, or a run with one replica, is full sync too; a smaller
            one must divide the replica count.
        virtual_groups: int >= 1, ONE device only: split the batch into this many
            contiguous groups of rows, each normalized with its own statistics. With
            `virtual_groups=R // G` one device computes what R replicas compute with
            `group_size=G` on the same global batch (what the tests compare). Must be 1
            under a strategy with several replicas.
        **kwargs: `BatchNormalization` arguments.

    Example:
        >>> bn = SyncBatchNormalization()
        >>> y = bn(tf.random.normal([8, 4, 4, 16]) * 3.0 + 3000.0, training=True)
        >>> ghost = SyncBatchNormalization(virtual_groups=2)  # Rows 0-3 and 4-7 apart.
    """

    def __init__(self, group_size=0, virtual_groups=1, **kwargs):
        kwargs["synchronized"] = True
        super().__init__(**kwargs)
        check_group_size(group_size, 1)  # The type and sign; the replicas come later.
        self.group_size = int(group_size or 0)
        if not errors.is_int(virtual_groups) or virtual_groups < 1:
            raise errors.ConfigError(f"virtual_groups must be an integer >= 1; "
                                     f"Received: virtual_groups={virtual_groups!r}")
        self.virtual_groups = int(virtual_groups)

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

    def get_config(self):
        return {**super().get_config(), "group_size": self.group_size,
                "virtual_groups": self.virtual_groups}

    def _num_groups(self):
        """(statistics groups, replicas) of this call: R // G replica groups under a
        strategy with R > 1 replicas, else `virtual_groups` groups of rows."""
        ctx = tf.distribute.get_replica_context()
        replicas = ctx.num_replicas_in_sync if ctx is not None else 1
        if replicas == 1:
            return self.virtual_groups, 1
        if self.virtual_groups != 1:
            raise errors.ConfigError(
                f"virtual_groups={self.virtual_groups} stands for replica groups on ONE "
                f"device; under {replicas} replicas use group_size")
        return replicas // check_group_size(self.group_size, replicas), replicas

    def call(self, inputs, training=None, mask=None):
        groups, replicas = self._num_groups()
        if groups == 1 or not training or not self.trainable:
            return super().call(inputs, training=training, mask=mask)  # Full sync.
        if self.renorm:
            raise ValueError("SyncBatchNormalization with groups does not support renorm; "
                             "Received: renorm=True")
        x = tf.cast(inputs, keras.backend.result_type(inputs.dtype, "float32"))
        # Rows in contiguous groups: [local groups, rows per group, ..., C]. A replica
        # holds one group's share; one device holds all the virtual groups.
        local = groups if replicas == 1 else 1
        if local > 1 and x.shape[0] is not None and x.shape[0] % local:
            raise ValueError(f"virtual_groups={local} does not divide the batch of "
                             f"{x.shape[0]} rows")
        xg = tf.reshape(x, tf.concat([[local, -1], tf.shape(x)[1:]], 0))
        wg = None if mask is None else tf.reshape(
            mask, tf.concat([[local, -1], tf.shape(mask)[1:]], 0))
        mean, variance = self._group_moments(xg, wg, groups, replicas)  # [groups, C]
        # The moving statistics follow the mean over groups (identical on every replica).
        momentum = tf.cast(self.momentum, x.dtype)
        self.moving_mean.assign(tf.cast(self.moving_mean, x.dtype) * momentum
                                + tf.reduce_mean(mean, 0) * (1.0 - momentum))
        self.moving_variance.assign(tf.cast(self.moving_variance, x.dtype) * momentum
                                    + tf.reduce_mean(variance, 0) * (1.0 - momentum))
        if replicas > 1:  # This replica's group only.
            g = tf.cast(tf.distribute.get_replica_context().replica_id_in_sync_group,
                        tf.int32) // (replicas // groups)
            own = 0 if _on_tpu() else g
            mean, variance = mean[own][None], variance[own][None]
        shape = [-1] + [1] * (xg.shape.rank - 2) + [x.shape[-1]]  # [groups, 1, ..., 1, C]
        y = tf.nn.batch_normalization(
            xg, tf.reshape(mean, shape), tf.reshape(variance, shape),
            offset=tf.cast(self.beta, x.dtype) if self.center else None,
            scale=tf.cast(self.gamma, x.dtype) if self.scale else None,
            variance_epsilon=self.epsilon)
        return tf.cast(tf.reshape(y, tf.shape(x)), self.compute_dtype)

    def _group_moments(self, xg, wg, groups, replicas):
        """Means and variances [groups, C] of each group of xg [k, rows, ..., C] (k = 1
        on a replica, k = groups on one device), by the module doc's formula."""
        axes = list(range(1, xg.shape.rank - 1))
        k = tf.shape(xg)[0]
        if wg is None:
            w = None
            per_group = tf.size(xg) // (k * tf.shape(xg)[-1])  # Rows x spatial positions.
            n = tf.fill([k], tf.cast(per_group, xg.dtype))
        else:
            w = tf.cast(tf.broadcast_to(tf.expand_dims(wg, -1), tf.shape(xg)), xg.dtype)
            n = tf.reduce_sum(w[..., 0], axes)

        def local_sum(v):  # [k, rows, ..., C] -> [k, 1, ..., 1, C], masked rows weighted 0.
            return tf.reduce_sum(v if w is None else v * w, axes, keepdims=True)

        n_b = tf.reshape(n, [-1] + [1] * (xg.shape.rank - 1))
        local_mean = tf.math.divide_no_nan(local_sum(xg), n_b)
        d = xg - local_mean
        correction = tf.math.divide_no_nan(local_sum(d), n_b)
        m2 = local_sum(tf.square(d - correction))
        channels = xg.shape[-1]

        def flat(v):  # [k, 1, ..., 1, C] -> [k, C].
            return tf.reshape(v, [-1, channels])

        acc = tf.float64 if xg.dtype == tf.float64 else _accumulation_dtype()
        shift = tf.stop_gradient(tf.cast(self.moving_mean, acc))
        n_acc = tf.cast(n, acc)[:, None]
        offset = (tf.cast(flat(local_mean), acc) - shift) + tf.cast(flat(correction), acc)
        a = n_acc * offset
        q = tf.cast(flat(m2), acc) + n_acc * tf.square(offset)
        if replicas > 1:
            ctx = tf.distribute.get_replica_context()
            packed = tf.concat([a[0], q[0], n_acc[0]], 0)  # [2C + 1]
            group_size = replicas // groups
            if _on_tpu():
                # THE collective, TPU: a real subgroup sum over this replica's group.
                from tensorflow.python.tpu.ops import tpu_ops  # noqa: PLC0415 (TPU only)
                assignment = [[g * group_size + i for i in range(group_size)]
                              for g in range(groups)]
                total = tpu_ops.cross_replica_sum(packed, assignment)[None]
            else:
                # THE collective, tf.distribute: one all-reduce of [groups, 2C + 1], each
                # replica filling only its group's row (module doc: why not a subgroup).
                g = tf.cast(ctx.replica_id_in_sync_group, tf.int32) // group_size
                rows = tf.scatter_nd([[g]], packed[None], [groups, 2 * channels + 1])
                total = ctx.all_reduce(tf.distribute.ReduceOp.SUM, rows)
            a, q = total[:, :channels], total[:, channels:2 * channels]
            n_acc = total[:, 2 * channels:]
        mean_offset = tf.math.divide_no_nan(a, n_acc)
        variance = tf.maximum(tf.math.divide_no_nan(q, n_acc) - tf.square(mean_offset), 0.0)
        return tf.cast(shift + mean_offset, xg.dtype), tf.cast(variance, xg.dtype)
