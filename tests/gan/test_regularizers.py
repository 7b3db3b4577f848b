"""regularizers: BigGAN's orthogonal regularization and LeCam."""

import keras
import numpy as np
import pytest
import tensorflow as tf

from tf_gan_scale.gan import regularizers


def biggan_ortho_grad(kernel):
    """BigGAN-PyTorch utils.ortho's gradient, 2 (W W^T * (1 - I)) W, on the Keras kernel
    (W: one row per output unit, the kernel's last axis)."""
    w = kernel.reshape(-1, kernel.shape[-1]).T.astype(np.float64)
    grad = 2 * ((w @ w.T) * (1 - np.eye(w.shape[0]))) @ w
    return grad.T.reshape(kernel.shape)


def ortho_and_grad(kernels):
    vs = [tf.Variable(k) for k in kernels]
    with tf.GradientTape() as tape:
        value = regularizers.orthogonal(vs)
    return value.numpy(), [None if g is None else g.numpy() for g in tape.gradient(value, vs)]


def test_orthogonal_is_zero_for_orthonormal_rows_and_skips_rank_1():
    q, _ = np.linalg.qr(np.random.default_rng(0).normal(size=(6, 6)))
    kernel = q[:, :4].astype(np.float32)  # Dense [in 6, out 4]: W = kernel^T, W W^T = I.
    bias = np.ones(4, np.float32)  # Rank 1: skipped (it alone would count).
    value, _ = ortho_and_grad([kernel])
    assert abs(value) < 1e-6
    assert float(regularizers.orthogonal([tf.constant(bias)])) == 0.0
    assert float(regularizers.orthogonal([])) == 0.0
    # Rows of any norms, as long as they are orthogonal: only the off-diagonal counts.
    assert abs(float(regularizers.orthogonal([kernel * np.array([1, 2, 3, 4], np.float32)]))) \
        < 1e-5


def test_orthogonal_is_half_the_off_diagonal_squared_norm():
    kernel = np.random.default_rng(1).normal(size=(5, 3)).astype(np.float32)
    w = kernel.T.astype(np.float64)
    off = (w @ w.T) * (1 - np.eye(3))
    value, _ = ortho_and_grad([kernel, np.zeros(3, np.float32)])
    np.testing.assert_allclose(value, 0.5 * np.sum(off ** 2), rtol=1e-6)


def test_orthogonal_gradient_is_biggan_pytorch_ortho():
    dense = keras.layers.Dense(7)
    dense.build((None, 5))
    conv = keras.layers.Conv2D(6, 3)
    conv.build((None, 8, 8, 4))
    kernels = [dense.kernel.numpy(), conv.kernel.numpy()]
    assert kernels[1].shape == (3, 3, 4, 6)
    # The layers' own (Keras) variables, biases included: those are skipped.
    variables = dense.trainable_variables + conv.trainable_variables
    with tf.GradientTape() as tape:
        value = regularizers.orthogonal(variables)
    grads = dict(zip([v.path for v in variables], tape.gradient(value, variables)))
    assert grads[dense.bias.path] is None and grads[conv.bias.path] is None
    singles = [ortho_and_grad([k]) for k in kernels]
    np.testing.assert_allclose(value, sum(v for v, _ in singles), rtol=1e-6)  # Summed.
    for layer, k in [(dense, kernels[0]), (conv, kernels[1])]:
        np.testing.assert_allclose(grads[layer.kernel.path].numpy(), biggan_ortho_grad(k),
                                   atol=1e-6, rtol=1e-6)


def test_orthogonal_scales_with_the_fourth_power():
    kernel = np.random.default_rng(2).normal(size=(3, 3, 2, 4)).astype(np.float32)
    one = float(regularizers.orthogonal([tf.constant(kernel)]))
    two = float(regularizers.orthogonal([tf.constant(2 * kernel)]))
    assert one > 0
    np.testing.assert_allclose(two, 16 * one, rtol=1e-6)


def np_lecam(real, fake, anchor_real, anchor_fake):
    return (np.maximum(real - anchor_fake, 0) ** 2 + np.maximum(anchor_real - fake, 0) ** 2)


def test_lecam_matches_hand_computation():
    real = np.array([0.5, -1.0, 2.0, 0.1], np.float32)
    fake = np.array([[-0.3], [1.5], [-2.0], [0.0]], np.float32)  # [B, 1] accepted too.
    anchor_real, anchor_fake = 0.8, -0.2
    out = regularizers.lecam(real, fake, anchor_real, anchor_fake).numpy()
    # By hand: real - anchor_fake = [0.7, -0.8, 2.2, 0.3] -> [0.49, 0, 4.84, 0.09];
    # anchor_real - fake = [1.1, -0.7, 2.8, 0.8] -> [1.21, 0, 7.84, 0.64].
    np.testing.assert_allclose(out, [1.70, 0.0, 12.68, 0.73], rtol=1e-5)
    np.testing.assert_allclose(out, np_lecam(real, fake[:, 0], anchor_real, anchor_fake),
                               rtol=1e-6)
    # Its batch mean is the official two-mean form.
    official = (np.mean(np.maximum(real - anchor_fake, 0) ** 2)
                + np.mean(np.maximum(anchor_real - fake[:, 0], 0) ** 2))
    np.testing.assert_allclose(out.mean(), official, rtol=1e-6)


def test_lecam_is_zero_on_the_right_side_of_the_anchors():
    # Real outputs below the fake anchor, fake outputs above the real anchor.
    out = regularizers.lecam([-1.0, -0.5], [[2.0], [1.0]], 0.5, 0.0).numpy()
    np.testing.assert_array_equal(out, [0.0, 0.0])


def test_lecam_gradient_treats_anchors_as_constants():
    real = tf.Variable([1.0, -1.0])
    fake = tf.Variable([0.0, 2.0])
    anchors = tf.Variable([0.5, 0.2])  # real, fake
    with tf.GradientTape() as tape:
        total = tf.reduce_sum(regularizers.lecam(real, fake, anchors[0], anchors[1]))
    g_real, g_fake, g_anchor = tape.gradient(total, [real, fake, anchors])
    np.testing.assert_allclose(g_real.numpy(), [2 * (1.0 - 0.2), 0.0], rtol=1e-6)
    np.testing.assert_allclose(g_fake.numpy(), [-2 * (0.5 - 0.0), 0.0], rtol=1e-6)
    assert g_anchor is None


def test_lecam_rejects_multi_column_logits():
    with pytest.raises(ValueError, match=r"real_logits must be \[B\] or \[B, 1\]"):
        regularizers.lecam(tf.zeros([3, 2]), tf.zeros([3]), 0.0, 0.0)


def test_update_anchor_is_an_exponential_moving_average():
    np.testing.assert_allclose(float(regularizers.update_anchor(1.0, 3.0)), 0.99 + 0.03,
                               rtol=1e-6)
    np.testing.assert_allclose(float(regularizers.update_anchor(1.0, 3.0, decay=0.9)), 1.2,
                               rtol=1e-6)
    assert float(regularizers.update_anchor(1000.0, -2.0, decay=0.0)) == -2.0
    anchor = tf.constant(0.0)
    for value in [1.0, 2.0, 3.0]:
        anchor = regularizers.update_anchor(anchor, value, decay=0.5)
    np.testing.assert_allclose(float(anchor), (0.5 * (0.5 * 1.0) + 0.5 * 2.0) * 0.5 + 1.5,
                               rtol=1e-6)
