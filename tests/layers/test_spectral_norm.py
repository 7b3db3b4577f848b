"""layers.SpectralNormalization: Keras' spectral norm, its zero-kernel guard a select."""

import keras
import numpy as np
import pytest
import tensorflow as tf

from tf_gan_scale.layers import SpectralNormalization


def _pair(make, zero=False):
    """Keras' wrapper and ours around `make()`, built, with the same kernel and u."""
    x = np.random.default_rng(0).standard_normal((4, 6, 6, 3)).astype(np.float32)
    theirs, ours = keras.layers.SpectralNormalization(make()), SpectralNormalization(make())
    theirs(x), ours(x)
    for a, b in zip(theirs.weights, ours.weights):
        b.assign(np.zeros(a.shape, np.float32) if zero and "kernel" in a.path else a.numpy())
        if zero:
            a.assign(b.numpy())
    return theirs, ours, x


@pytest.mark.parametrize("make", [lambda: keras.layers.Conv2D(5, 3, padding="same"),
                                  lambda: keras.layers.Dense(7)], ids=["conv", "dense"])
def test_training_calls_equal_keras_bit_for_bit(make):
    theirs, ours, x = _pair(make)
    for _ in range(3):  # Each training call moves u and projects the kernel in place.
        a, b = theirs(x, training=True), ours(x, training=True)
    np.testing.assert_array_equal(a.numpy(), b.numpy())
    for wa, wb in zip(theirs.weights, ours.weights):
        np.testing.assert_array_equal(wa.numpy(), wb.numpy(), err_msg=wa.path)


def test_a_zero_kernel_keeps_its_kernel_and_u_as_keras_does():
    theirs, ours, x = _pair(lambda: keras.layers.Dense(7), zero=True)
    u = ours.vector_u.numpy()
    theirs(x, training=True), ours(x, training=True)
    np.testing.assert_array_equal(ours.kernel.numpy(), 0.0)  # Not NaN: 0 / 1.
    np.testing.assert_array_equal(ours.vector_u.numpy(), u)
    np.testing.assert_array_equal(theirs.vector_u.numpy(), u)


def test_the_traced_call_has_no_cond():
    """The point of the layer: a double backprop through it holds no cond (cond_v2's
    OptionalNone has no DTensor layout propagation)."""
    _, ours, x = _pair(lambda: keras.layers.Conv2D(5, 3, padding="same"))
    x = tf.constant(x)

    @tf.function
    def penalty():
        with tf.GradientTape() as outer:
            with tf.GradientTape() as inner:
                inner.watch(x)
                y = tf.reduce_sum(ours(x, training=True))
            g = inner.gradient(y, x)
            r1 = tf.reduce_sum(tf.square(g))
        return outer.gradient(r1, ours.kernel)  # (The bias has no R1 gradient.)

    graph = penalty.get_concrete_function().graph
    ops = {op.type for op in graph.get_operations()}
    assert not ops & {"If", "StatelessIf", "OptionalNone"}, ops
    assert np.abs(penalty().numpy()).max() > 0


def test_serializes_as_itself_under_keras_name():
    """The class name is Keras': weight paths (and so checkpoints, mesh plans) match."""
    layer = SpectralNormalization(keras.layers.Dense(3), power_iterations=2)
    assert layer.name.startswith("spectral_normalization")
    again = keras.layers.deserialize(keras.layers.serialize(layer))
    assert type(again) is SpectralNormalization and again.power_iterations == 2
