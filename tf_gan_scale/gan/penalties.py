"""Discriminator regularizers, per example ([B]), registered by name.

Each penalty has the signature
    penalty(discriminator, *, real, fake, noise) -> [B]
where `real`/`fake` are this replica's batches [B, ...] and `noise` is uniform [B] in [0, 1)
drawn from `latents` (so interpolation points are the same on 1 or N replicas).
`UpdatePenalty` is the one a main D update carries: it multiplies the result by
`penalty_weight` (and runs it every `penalty_every`-th D update, times that) and the step
adds it to the D loss before the single global reduction. StyleGAN2's lazy R1 runs as its
own update instead (lazy_phases.py).
"""

import tensorflow as tf

from tf_gan_scale import errors, latents

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


class UpdatePenalty:
    """The penalty a main D update of a GAN step carries (`GanStep.d_grads`).

    Args:
        config: a validated `StepConfig` (penalty, penalty_weight, penalty_every,
            d_steps are read here).
        seed: the run's seed (the penalty noise is keyed by it).
        discriminate: (x, labels, training) -> D's logits [B] (`StepInputs.discriminate`).
    """

    def __init__(self, *, config, seed, discriminate):
        self.config, self.seed, self.discriminate = config, seed, discriminate
        self.fn = get(config.penalty)  # None for "none".

    def due(self, step, k):
        """Whether D update k of step `step` carries a lazy penalty (penalty_every = e:
        every e-th D update, counted over all steps): a bool tensor for a step tensor, a
        Python bool for a Python int."""
        update = step * self.config.d_steps + k
        return update % self.config.penalty_every == 0

    def __call__(self, real, fake, labels, rows, step, k, due=None):
        """penalty_weight x the per-example penalty [B] on what D saw; with
        penalty_every = e > 1 only in every e-th D update, times e (lazy regularization).
        A conditional D is evaluated with the real labels. `due`: None (decided in the
        graph, a cond on the step) or the Python bool `due` gave the caller for this
        update (an engine that cannot run the cond: a DTensor mesh has no layout
        propagation for its OptionalFromValue)."""
        c = self.config
        noise = latents.rows_uniform(
            latents.key(self.seed, step, latents.PENALTY_PHASE + k), rows, [])

        def discriminator(x, training=True):
            return self.discriminate(x, labels, training=training)

        def compute(weight):
            return weight * self.fn(discriminator, real=real, fake=fake, noise=noise)

        e = c.penalty_every
        if e == 1:
            return compute(float(c.penalty_weight))
        if isinstance(due, bool):  # Decided by the caller: one traced step for each.
            return compute(float(c.penalty_weight) * e) if due else tf.zeros(
                tf.shape(real)[:1])
        # The D update number is the same on every replica, so every replica takes the
        # same branch (D has no batch norm: no collective inside).
        return tf.cond(self.due(tf.cast(step, tf.int64), k),
                       lambda: compute(float(c.penalty_weight) * e),
                       lambda: tf.zeros(tf.shape(real)[:1]))
