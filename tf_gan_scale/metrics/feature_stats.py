"""Streaming feature mean / covariance across replicas and workers, in O(D^2) memory.

Each replica keeps float64 partial sums of the rows it has seen:
    n = number of rows,  a = sum (x - s) [D],  Q = sum (x - s)(x - s)^T [D, D]
about a fixed shift s [D] that every replica knows (zeros unless given). At the end the
three are packed into ONE vector [1 + D + D*D] and summed over every replica of every
worker with ONE all-reduce; then
    mean = s + a / n,   cov = (Q - a a^T / n) / (n - 1)      (unbiased, as np.cov)
50,000 samples of 2,048-d features thus cost a few D x D float64 buffers per replica
(34 MB each: the sums, the packed vector, the reduced one), whatever the number of
samples, instead of the 50,000 x 2,048 feature matrix.

Accuracy: Q - a a^T / n cancels. Its relative rounding error on the covariance is about
eps * (|mean - s| / std)^2, with eps = 1.1e-16 in float64: negligible for Inception pool
features (non-negative, mean and spread of the same order), 3e-8 measured for a mean
1e4 times the spread. Pass `shift` near the data's mean (the reference statistics' mean,
or the mean of a first batch, the SAME on every replica) when the mean dwarfs the spread
(4e-16 then); the shift is exact algebra, so any value gives the same result up to
rounding. TPUs have no float64: this class targets CPU/GPU replicas (untested on TPU).
"""

import numpy as np
import tensorflow as tf


def _count_sum_outer(packed, dim):
    """Unpacks [1 + D + D*D] into (n [], a [D], Q [D, D])."""
    return packed[0], packed[1:1 + dim], tf.reshape(packed[1 + dim:], [dim, dim])


class FeatureStats(tf.Module):
    """Running count, sum and sum of outer products of features, per replica, in float64.

    Create it inside `strategy.scope()` of the strategy whose replicas will call
    `update` (it records that strategy): each replica then has its own partial sums
    (`ON_READ` variables). Outside any strategy it works on one device.

    Args:
        dim: feature dimension D (> 0).
        shift: optional [D] vector subtracted before accumulating (see module docstring:
            only matters when |mean| >> spread). Must be identical on every replica.
        name: module name.

    Example:
        >>> with strategy.scope():
        ...     stats = FeatureStats(2048)
        >>> @tf.function
        ... def step(images):
        ...     strategy.run(lambda x: stats.update(extractor(x)), args=(images,))
        >>> for batch in dist_dataset:
        ...     step(batch)
        >>> mu, sigma = stats.result()   # numpy [D], [D, D]; one all-reduce
    """

    def __init__(self, dim, *, shift=None, name="feature_stats"):
        super().__init__(name=name)
        if int(dim) < 1:
            raise ValueError(f"FeatureStats needs a feature dimension > 0; Received: dim={dim}")
        self.dim = int(dim)
        shift = np.zeros([self.dim]) if shift is None else np.asarray(shift, np.float64)
        if shift.shape != (self.dim,):
            raise ValueError(f"FeatureStats shift must have shape [{self.dim}]; "
                             f"Received: shape={shift.shape}")
        self._shift = tf.constant(shift, tf.float64)
        self._strategy = tf.distribute.get_strategy()
        # ON_READ: every replica accumulates into its own copy; nothing is synchronized
        # until `all_reduce` (a SUM-aggregated read would cost one reduce per variable).
        kw = dict(trainable=False, synchronization=tf.VariableSynchronization.ON_READ,
                  aggregation=tf.VariableAggregation.SUM)
        with self.name_scope:
            self.count = tf.Variable(tf.zeros([], tf.float64), name="count", **kw)
            self.sum = tf.Variable(tf.zeros([self.dim], tf.float64), name="sum", **kw)
            self.outer = tf.Variable(tf.zeros([self.dim, self.dim], tf.float64),
                                     name="outer", **kw)
        self._reduce_fn = None

    def _check_strategy(self, what):
        if tf.distribute.get_strategy() is not self._strategy:
            raise ValueError(f"FeatureStats.{what} ran under another tf.distribute strategy "
                             f"than the one it was created under; create it inside "
                             f"strategy.scope() of the strategy that runs it")

    def update(self, features):
        """Adds features [N, D] (any float dtype, N may be 0) to this replica's sums.

        Call in replica context (inside `strategy.run`, in or out of a tf.function) or
        with no strategy. Returns nothing.
        """
        self._check_strategy("update")
        x = tf.convert_to_tensor(features)
        if x.shape.rank != 2 or (x.shape[1] is not None and x.shape[1] != self.dim):
            raise ValueError(f"FeatureStats.update needs features [N, {self.dim}]; "
                             f"Received: shape={x.shape}")
        # float32 -> float64 is exact; the squares below are where precision is needed.
        x = tf.cast(x, tf.float64) - self._shift
        self.count.assign_add(tf.cast(tf.shape(x)[0], tf.float64))
        self.sum.assign_add(tf.reduce_sum(x, axis=0))
        self.outer.assign_add(tf.linalg.matmul(x, x, transpose_a=True))

    def local_sums(self):
        """This replica's partial sums packed as [1 + D + D*D] float64: (n, a, Q.ravel())."""
        return tf.concat([tf.reshape(tf.identity(self.count), [1]), tf.identity(self.sum),
                          tf.reshape(tf.identity(self.outer), [-1])], axis=0)

    def all_reduce(self):
        """(mean [D], cov [D, D]) float64 tensors over every replica's rows.

        Call in replica context (inside `strategy.run`): every replica must call it, as
        with any collective, and all get the same values. ONE all-reduce of the packed
        sums. With fewer than 2 rows in total the covariance is NaN/inf (`result` raises).
        """
        return self._reduce()[1:]

    def _reduce(self):
        """(n [], mean [D], cov [D, D]) over all replicas; see `all_reduce`."""
        self._check_strategy("all_reduce")
        ctx = tf.distribute.get_replica_context()
        if ctx is None:
            raise ValueError("FeatureStats.all_reduce runs in replica context (inside "
                             "strategy.run); from host code call FeatureStats.result()")
        # Count, sums and outer products in one collective: one launch and one latency
        # instead of three (the payload is dominated by the D*D block either way).
        packed = ctx.all_reduce(tf.distribute.ReduceOp.SUM, self.local_sums())
        n, a, q = _count_sum_outer(packed, self.dim)
        mean = self._shift + a / n
        cov = (q - a[:, None] * a[None, :] / n) / (n - 1.0)
        # Q from matmul is symmetric only up to rounding; a covariance is exactly so.
        return n, mean, 0.5 * (cov + tf.transpose(cov))

    def result(self):
        """(mean [D], cov [D, D]) as float64 NumPy arrays, from host (cross-replica) code.

        Runs `all_reduce` on every replica of the creating strategy (under
        MultiWorkerMirroredStrategy every worker must call it). Raises ValueError if
        fewer than 2 rows were seen.
        """
        if self._reduce_fn is None:
            self._reduce_fn = tf.function(lambda: self._strategy.run(self._reduce),
                                            autograph=False)
        with self._strategy.scope():
            n, mean, cov = self._reduce_fn()

        def first(v):  # Every replica holds the same reduced values.
            return self._strategy.experimental_local_results(v)[0].numpy()

        n, mean, cov = first(n), first(mean), first(cov)
        if n < 2:
            raise ValueError(f"FeatureStats: a covariance needs at least 2 feature rows; "
                             f"Received: {n:.0f} rows over all replicas")
        return mean, cov

    def reset(self):
        """Zeroes every replica's partial sums (call from host code)."""
        for v in (self.count, self.sum, self.outer):
            for component in self._strategy.experimental_local_results(v):
                component.assign(tf.zeros_like(component))
