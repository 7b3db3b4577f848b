"""GroupedConv2D: every implementation equals per-group convolutions (the definition),
forward and in first and second derivatives, and they agree with each other."""

import keras
import numpy as np
import pytest
import tensorflow as tf

from tf_gan_scale.layers import grouped_conv
from tf_gan_scale.layers.grouped_conv import GroupedConv2D

GROUPS = 3
HAS_GPU = bool(tf.config.list_logical_devices("GPU"))
# Native grouped conv gradients exist only in cuDNN; its CPU forward alone is checked.
TRAINABLE = [n for n in grouped_conv.IMPLEMENTATIONS if n != "native" or HAS_GPU]


def reference(x, kernel, groups):
    """The definition: group i's output channels see group i's input channels only."""
    cin_g, cout_g = kernel.shape[2], kernel.shape[3] // groups
    return tf.concat([tf.nn.conv2d(x[..., i * cin_g:(i + 1) * cin_g],
                                   kernel[..., i * cout_g:(i + 1) * cout_g], 1, "SAME")
                      for i in range(groups)], axis=-1)


def derivatives(fn, x, kernel):
    """(y, d L / d(x, kernel), d ||d L / dx||^2 / d(x, kernel)) of L = sum(w * y^2) / 2
    (squared: a nonlinear "D", so dL/dx depends on x): the second derivatives are R1's (a
    penalty on D's input gradient, differentiated again)."""
    w = tf.cast(tf.reshape(tf.range(tf.size(fn(x, kernel)), dtype=tf.float64) % 7 - 3,
                           fn(x, kernel).shape), x.dtype)
    with tf.GradientTape(persistent=True) as outer:
        outer.watch([x, kernel])
        with tf.GradientTape() as inner:
            inner.watch([x, kernel])
            y = fn(x, kernel)
            loss = tf.reduce_sum(w * y * y) / 2
        gx, gk = inner.gradient(loss, [x, kernel])
        penalty = tf.reduce_sum(gx * gx)
    return [y, gx, gk] + outer.gradient(penalty, [x, kernel])


@pytest.fixture(scope="module")
def inputs():
    rng = np.random.default_rng(0)
    x = tf.constant(rng.standard_normal((2, 5, 6, 6)))          # Cin 6: 2 per group.
    kernel = tf.constant(rng.standard_normal((3, 3, 2, 9)))     # Cout 9: 3 per group.
    return x, kernel


@pytest.mark.parametrize("name", TRAINABLE)
def test_equals_per_group_convolutions_to_second_order(name, inputs):
    x, kernel = inputs  # float64
    ours = derivatives(lambda a, k: grouped_conv.grouped_conv2d(a, k, GROUPS, name), x, kernel)
    ref = derivatives(lambda a, k: reference(a, k, GROUPS), x, kernel)
    for what, a, b in zip(["y", "dx", "dk", "d2x", "d2k"], ours, ref):
        assert float(tf.reduce_max(tf.abs(b))) > 1.0, what  # Not trivially zero.
        np.testing.assert_allclose(a.numpy(), b.numpy(), rtol=1e-10, atol=1e-10, err_msg=what)


def test_native_forward_and_grouping(inputs):
    x, kernel = inputs
    np.testing.assert_allclose(grouped_conv.native(x, kernel, GROUPS).numpy(),
                               reference(x, kernel, GROUPS).numpy(), rtol=1e-10, atol=1e-10)
    # The grouping is the point: a dense conv over every input channel differs.
    dense = tf.nn.conv2d(x, tf.tile(kernel, [1, 1, GROUPS, 1]), 1, "SAME")
    assert float(tf.reduce_max(tf.abs(dense - reference(x, kernel, GROUPS)))) > 1.0


def test_implementations_agree_in_float32():
    rng = np.random.default_rng(1)
    x = tf.constant(rng.standard_normal((2, 8, 8, 32)).astype(np.float32))
    kernel = tf.constant(rng.standard_normal((3, 3, 4, 32)).astype(np.float32) * 0.1)
    outs = {n: grouped_conv.grouped_conv2d(x, kernel, 8, n).numpy()
            for n in grouped_conv.IMPLEMENTATIONS}
    for name, out in outs.items():
        np.testing.assert_allclose(out, outs["split"], rtol=1e-5, atol=1e-5, err_msg=name)


def test_auto_is_native_on_gpu_else_the_measured_cpu_choice():
    assert grouped_conv.resolve("auto") == ("native" if HAS_GPU else grouped_conv.AUTO_CPU)
    assert grouped_conv.AUTO_CPU == "split"
    with pytest.raises(ValueError, match="unknown grouped conv implementation 'fft'"):
        grouped_conv.resolve("fft")


def test_layer_kernel_shape_config_and_errors():
    layer = GroupedConv2D(12, groups=4, kernel_initializer="ones", name="g")
    x = tf.ones((1, 4, 4, 8))
    y = layer(x)
    assert layer.kernel.shape == (3, 3, 2, 12) and y.shape == (1, 4, 4, 12)
    assert len(layer.weights) == 1  # No bias.
    assert float(y[0, 1, 1, 0]) == 18.0  # 3x3 x 2 input channels of its group, all ones.
    clone = GroupedConv2D.from_config(layer.get_config())
    assert (clone.filters, clone.groups, clone.kernel_size, clone.implementation) == (
        12, 4, 3, "auto")
    with pytest.raises(ValueError, match="filters=10, groups=4"):
        GroupedConv2D(10, groups=4)
    with pytest.raises(ValueError, match="input channels 6 not divisible by groups=4"):
        GroupedConv2D(8, groups=4)(tf.ones((1, 4, 4, 6)))


def test_layer_computes_in_its_policy():
    layer = GroupedConv2D(8, groups=2, dtype="mixed_bfloat16")
    y = layer(tf.ones((1, 4, 4, 4)))
    assert y.dtype == tf.bfloat16 and layer.kernel.dtype == "float32"
    assert keras.backend.standardize_dtype(layer.compute_dtype) == "bfloat16"
