"""SyncBatchNormalization: Keras' synchronized BN numbers with one all-reduce per pass."""

import keras
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


def test_one_all_reduce_per_pass(mirrored2):
    # Count all-reduces issued by the layer's forward + backward pass under a strategy.
    def count(layer_fn):
        with mirrored2.scope():
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
                return mirrored2.run(fn)
            step()
        finally:
            tf.distribute.ReplicaContext.all_reduce = original
        return len(calls) // mirrored2.num_replicas_in_sync

    # One forward + one backward (the gradient of an all-reduce is an all-reduce).
    assert count(SyncBatchNormalization) == 2
    # Keras: sum, sum of squares and count forward; sum and sum of squares backward.
    assert count(lambda: keras.layers.BatchNormalization(synchronized=True)) == 5
