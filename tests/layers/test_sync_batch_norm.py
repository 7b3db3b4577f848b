"""SyncBatchNormalization: Keras' synchronized BN numbers with one all-reduce per pass."""

import keras
import pytest
import numpy as np
import tensorflow as tf

from tf_gan_scale.layers import SyncBatchNormalization


def run_bn(strategy, layer_fn, x):
    """Outputs, input gradients and moving stats of a fresh BN layer on x [8, 3, 3, 4],
    split over the strategy's replicas."""
    with strategy.scope():
        layer = layer_fn()
        layer.build(x.shape)
    channel_weights = tf.constant([1.0, -2.0, 0.5, 3.0])

    @tf.function
    def step(xs):
        def fn(xr):
            with tf.GradientTape() as tape:
                tape.watch(xr)
                y = layer(xr, training=True)
                # Cubed: the gradient flows through the global mean and variance.
                loss = tf.reduce_sum(y ** 3 * channel_weights)
            return y, tape.gradient(loss, xr)
        return strategy.run(fn, args=(xs,))

    ds = strategy.experimental_distribute_dataset(
        tf.data.Dataset.from_tensors(x).unbatch().batch(x.shape[0]))
    ys, gs = step(next(iter(ds)))
    cat = lambda v: np.concatenate([t.numpy() for t in strategy.experimental_local_results(v)])
    return cat(ys), cat(gs), layer.moving_mean.numpy(), layer.moving_variance.numpy()


def test_matches_keras_synchronized_and_one_device(one_device, mirrored2):
    x = tf.random.stateless_normal([8, 3, 3, 4], seed=[1, 2]) * 3.0 + 1.0
    ours = run_bn(mirrored2, SyncBatchNormalization, x)
    keras_sync = run_bn(mirrored2, lambda: keras.layers.BatchNormalization(synchronized=True), x)
    one = run_bn(one_device, SyncBatchNormalization, x)
    for a, b, c in zip(ours, keras_sync, one):
        np.testing.assert_allclose(a, b, atol=1e-5)
        np.testing.assert_allclose(a, c, atol=1e-5)


def all_reduces_per_pass(strategy, layer_fn):
    """All-reduces per replica issued by one forward + backward pass of layer_fn()'s layer
    (built in `strategy`'s scope) on [2, 4] inputs."""
    with strategy.scope():
        layer = layer_fn()
        layer.build([None, 4])
    calls = []
    original = tf.distribute.ReplicaContext.all_reduce

    def counting(self, *args, **kwargs):
        calls.append(1)
        return original(self, *args, **kwargs)

    tf.distribute.ReplicaContext.all_reduce = counting
    try:
        @tf.function
        def step():
            def fn():
                x = tf.ones([2, 4])
                with tf.GradientTape() as tape:
                    tape.watch(x)
                    y = layer(x, training=True)
                return tape.gradient(y, x)
            return strategy.run(fn)
        step()
    finally:
        tf.distribute.ReplicaContext.all_reduce = original
    return len(calls) // strategy.num_replicas_in_sync


def test_one_all_reduce_per_pass(mirrored2):
    def count(layer_fn):
        return all_reduces_per_pass(mirrored2, layer_fn)

    # One forward + one backward (the gradient of an all-reduce is an all-reduce).
    assert count(SyncBatchNormalization) == 2
    # Keras: sum, sum of squares and count forward; sum and sum of squares backward.
    assert count(lambda: keras.layers.BatchNormalization(synchronized=True)) == 5


@pytest.mark.parametrize("ratio", [1.0, 1e2, 3e3, 1e4])
def test_statistics_match_float64_for_large_means(one_device, mirrored2, ratio):
    # Mean `ratio` times the spread: E[x^2] - E[x]^2 in float32 gives a variance of 2.0
    # instead of 1.0 at 3e3 on 2 replicas; the shifted float64 sums keep float32 accuracy.
    x = (np.random.default_rng(0).standard_normal([16, 5, 5, 4]) + ratio).astype(np.float32)
    x64 = x.astype(np.float64)
    for strategy in (one_device, mirrored2):
        # momentum 0: after one training call the moving statistics ARE the batch's.
        _, _, mean, var = run_bn(strategy, lambda: SyncBatchNormalization(momentum=0.0),
                                 tf.constant(x))
        np.testing.assert_allclose(mean, x64.mean((0, 1, 2)), rtol=1e-6)  # Seen: <= 4e-8.
        np.testing.assert_allclose(var, x64.var((0, 1, 2)), rtol=1e-6)  # Seen: <= 3.2e-7.


class MomentsBN(SyncBatchNormalization):
    """The former one-device formula: tf.nn.moments (stop_gradient on the mean inside the
    variance)."""

    def _moments(self, inputs, mask):
        return tf.nn.moments(inputs, self._reduction_axes)


class FrozenVarianceBN(SyncBatchNormalization):
    """A wrong formula (no gradient through the variance), to show the check can fail."""

    def _moments(self, inputs, mask):
        mean, variance = super()._moments(inputs, mask)
        return mean, tf.stop_gradient(variance)


def r1_of_bn(strategy, layer_cls, x, gamma):
    """R = sum_i ||d/dx_i sum tanh(BN(x)) * c||^2 over the global batch x [8, 3, 3, 4],
    float64: the double backprop an R1 / WGAN-GP penalty takes through a batch-normalized
    D. Returns R, dR/dx [8, 3, 3, 4] (second order in x: it is what reaches D's weights
    before the BN) and dR/dgamma [4], summed over replicas."""
    with strategy.scope():
        bn = layer_cls(dtype="float64")
        bn.build(x.shape)
    bn.gamma.assign(gamma)
    c = tf.constant([1.0, -2.0, 0.5, 3.0], tf.float64)

    def fn(xr):
        with tf.GradientTape(persistent=True) as outer:
            outer.watch(xr)
            with tf.GradientTape() as inner:
                inner.watch(xr)
                out = tf.reduce_sum(tf.tanh(bn(xr, training=True)) * c)
            # The all-reduce's gradient brings every replica's share: global rows of dOut/dx.
            r = tf.reduce_sum(tf.square(inner.gradient(out, xr)))
        dx, dgamma = outer.gradient(r, [xr, bn.gamma])
        ctx = tf.distribute.get_replica_context()
        if ctx.num_replicas_in_sync > 1:
            r, dgamma = ctx.all_reduce(tf.distribute.ReduceOp.SUM, [r, dgamma])
        return r, dx, dgamma

    ds = strategy.experimental_distribute_dataset(
        tf.data.Dataset.from_tensors(x).unbatch().batch(x.shape[0]))
    r, dx, dgamma = tf.function(lambda xs: strategy.run(fn, args=(xs,)))(next(iter(ds)))
    local = lambda v: [t.numpy() for t in strategy.experimental_local_results(v)]
    return local(r)[0], np.concatenate(local(dx)), local(dgamma)[0]


def test_second_order_gradients_are_true_on_every_path(one_device, mirrored2):
    x = tf.random.stateless_normal([8, 3, 3, 4], seed=[3, 4], dtype=tf.float64) * 2.0 + 1.0
    gamma = np.array([1.5, 0.5, -1.0, 2.0])
    r = lambda x, g: r1_of_bn(one_device, SyncBatchNormalization, x, g)[0]
    h = 1e-6
    # Central finite differences of R, float64: in gamma, and in 4 input entries.
    fd_gamma = np.array([(r(x, gamma + h * e) - r(x, gamma - h * e)) / (2 * h)
                         for e in np.eye(4)])
    where = [(0, 0, 0, 0), (3, 1, 2, 1), (5, 2, 0, 2), (7, 2, 2, 3)]
    fd_x = []
    for idx in where:
        e = tf.scatter_nd([idx], tf.constant([h], tf.float64), x.shape)
        fd_x.append((r(x + e, gamma) - r(x - e, gamma)) / (2 * h))
    _, one_dx, one_dgamma = r1_of_bn(one_device, SyncBatchNormalization, x, gamma)
    _, two_dx, two_dgamma = r1_of_bn(mirrored2, SyncBatchNormalization, x, gamma)
    np.testing.assert_allclose(one_dgamma, fd_gamma, rtol=1e-6)
    np.testing.assert_allclose([one_dx[i] for i in where], fd_x, rtol=1e-6)
    np.testing.assert_allclose(two_dgamma, one_dgamma, rtol=1e-9)
    np.testing.assert_allclose(two_dx, one_dx, rtol=1e-9, atol=1e-12)
    # tf.nn.moments agrees: the Hessian term its stop_gradient drops multiplies the batch
    # sum of BN's input gradients, which is zero. A wrong formula fails by far.
    _, old_dx, _ = r1_of_bn(one_device, MomentsBN, x, gamma)
    np.testing.assert_allclose(old_dx, one_dx, rtol=1e-9, atol=1e-12)
    _, bad_dx, _ = r1_of_bn(one_device, FrozenVarianceBN, x, gamma)
    bad = np.array([bad_dx[i] for i in where])
    assert np.abs(bad - fd_x).max() > 1e-2 * np.abs(fd_x).max()


def test_only_the_last_axis():
    with pytest.raises(ValueError, match="normalizes the last axis"):
        SyncBatchNormalization(axis=1).build((8, 4, 3, 4))
    SyncBatchNormalization(axis=3).build((8, 4, 3, 4))
