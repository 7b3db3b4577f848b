import keras
import numpy as np
import pytest
import tensorflow as tf

from tf_gan_scale import errors
from tf_gan_scale.gan import penalties


def linear_critic(w):
    """D(x) = <w, x> on [B, 2, 2, 1] inputs: input gradient is w for every example."""
    model = keras.Sequential([keras.Input((2, 2, 1)), keras.layers.Flatten(),
                              keras.layers.Dense(1, use_bias=False)])
    model.layers[-1].kernel.assign(np.reshape(w, (4, 1)).astype(np.float32))
    return model


REAL = tf.random.stateless_normal([3, 2, 2, 1], seed=[1, 2])
FAKE = tf.random.stateless_normal([3, 2, 2, 1], seed=[3, 4])
NOISE = tf.constant([0.0, 0.5, 1.0])


def test_wgan_gp_matches_hand_value():
    w = np.array([3.0, 0.0, 4.0, 0.0])  # ||w|| = 5 -> (5 - 1)^2 = 16
    out = penalties.wgan_gp(linear_critic(w), real=REAL, fake=FAKE, noise=NOISE)
    np.testing.assert_allclose(out.numpy(), [16.0] * 3, rtol=1e-5)


def test_r1_matches_hand_value():
    w = np.array([1.0, 2.0, 0.0, 2.0])  # ||w||^2 = 9
    out = penalties.r1(linear_critic(w), real=REAL, fake=FAKE, noise=NOISE)
    np.testing.assert_allclose(out.numpy(), [9.0] * 3, rtol=1e-5)


def test_wgan_gp_interpolates_between_real_and_fake():
    seen = []

    class Probe(keras.Model):
        def call(self, x):
            seen.append(x)
            return tf.reduce_sum(x, axis=[1, 2, 3])[:, None]

    penalties.wgan_gp(Probe(), real=REAL, fake=FAKE, noise=NOISE)
    x_hat = seen[0].numpy()
    np.testing.assert_allclose(x_hat[0], FAKE[0], atol=1e-6)      # noise 0 -> fake
    np.testing.assert_allclose(x_hat[2], REAL[2], atol=1e-6)      # noise 1 -> real
    np.testing.assert_allclose(x_hat[1], 0.5 * (REAL[1] + FAKE[1]), atol=1e-6)


def test_wgan_gp_has_no_nan_at_zero_gradient():
    critic = linear_critic(np.zeros(4))  # Input gradient exactly zero.
    with tf.GradientTape() as tape:
        out = penalties.wgan_gp(critic, real=REAL, fake=FAKE, noise=NOISE)
        total = tf.reduce_sum(out)
    grads = tape.gradient(total, critic.trainable_variables)
    assert all(g is not None for g in grads)
    np.testing.assert_allclose(out.numpy(), [1.0] * 3, rtol=1e-5)
    assert all(np.all(np.isfinite(g.numpy())) for g in grads)


def test_penalty_registry():
    assert penalties.get("none") is None
    with pytest.raises(errors.ConfigError, match="valid: none, r1, r1_r2, wgan_gp"):
        penalties.get("gp")
