"""Discriminator regularizers, per example ([B]), registered by name.

Each penalty has the signature
    penalty(discriminator, *, real, fake, noise) -> [B]
where `real`/`fake` are this replica's batches [B, ...] and `noise` is uniform [B] in [0, 1)
drawn from `latents` (so interpolation points are the same on 1 or N replicas). The
trainer multiplies the result by `penalty_weight` and adds it to the D loss before the
single global reduction.
"""

import tensorflow as tf

from tf_gan_scale import errors

# Keeps sqrt differentiable where the input gradient is exactly zero (e.g. a dead ReLU
# critic): d sqrt(x)/dx is infinite at 0 and would turn the penalty gradient into NaN.
_NORM_EPS = 1e-12


def _input_gradients(discriminator, x):
    """dD(x)/dx per example, [B, ...], for double backprop inside the D tape."""
    with tf.GradientTape() as tape:
        tape.watch(x)
        # Row i of d(sum of logits)/dx is example i's gradient when examples are independent;
        # batch norm in D couples them (as in every reference implementation), which is why
        # WGAN-GP recommends no batch norm in the critic.
        total = tf.reduce_sum(discriminator(x, training=True))
    return tape.gradient(total, x)


def _sum_squares(g):
    return tf.reduce_sum(tf.reshape(tf.square(g), [tf.shape(g)[0], -1]), axis=1)


def wgan_gp(discriminator, *, real, fake, noise):
    """Gulrajani et al. 2017: (||grad D(x_hat)||_2 - 1)^2, x_hat uniform between real and fake."""
    eps = tf.reshape(noise, [-1] + [1] * (len(real.shape) - 1))
    x_hat = eps * real + (1.0 - eps) * fake
    grads = _input_gradients(discriminator, x_hat)
    norm = tf.sqrt(_sum_squares(grads) + _NORM_EPS)
    return tf.square(norm - 1.0)


def r1(discriminator, *, real, fake, noise):
    """Mescheder et al. 2018: ||grad D(real)||_2^2 (set penalty_weight to gamma/2)."""
    del fake, noise
    return _sum_squares(_input_gradients(discriminator, real))


PENALTIES = {"none": None, "wgan_gp": wgan_gp, "r1": r1}


def get(name):
    """Penalty by name (None for "none"); unknown names raise ConfigError."""
    if name is None or callable(name):
        return name
    return errors.choose("penalty", name, PENALTIES)
