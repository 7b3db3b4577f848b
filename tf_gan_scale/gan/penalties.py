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


def r1_r2(discriminator, *, real, fake, noise):
    """R3GAN (Huang et al. 2024, R3GAN/Trainer.py:10-12,35-36): ||grad D(real)||_2^2 +
    ||grad D(fake)||_2^2, R1 on reals plus R2 on fakes (set penalty_weight to gamma/2).
    The step takes it inside D's main pass on the images BEFORE the augmentation
    (`UpdatePenalty.in_pass`); this standalone form is the same math on given images."""
    del noise
    return (_sum_squares(_input_gradients(discriminator, real))
            + _sum_squares(_input_gradients(discriminator, fake)))


PENALTIES = {"none": None, "wgan_gp": wgan_gp, "r1": r1, "r1_r2": r1_r2}

# Penalties on D's clean inputs: taken in the main D pass, with the gradient through the
# augmentation (R3GAN's choice; it needs a differentiable augmentation, which every
# policy here is), instead of on what D saw in a pass of their own.
# (`StepConfig.in_pass`).
ON_CLEAN_INPUTS = ("r1_r2",)


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

    def weight(self, step, gb):
        """penalty_weight, or its cosine schedule's value (float32) at step `step` of
        global batches of gb rows (config.train.cosine.penalty_weight: R3GAN's gamma/2)."""
        schedule = self.config.schedule("penalty_weight")
        if schedule is None:
            return float(self.config.penalty_weight)
        return schedule.at(step, gb)

    def in_pass(self, forward, clean, rows, labels, step, k, gb, due=None):
        """D's logits [2b] of the clean images `clean` [2b, ...] = [real; fake], and the
        weighted per-example penalty [b] of an ON_CLEAN_INPUTS penalty, both from one
        pass (R3GAN, Trainer.py:28-44): penalty_i = w (||d D(A(x)) / d x||^2 at real i +
        the same at fake i), x the images BEFORE the augmentation A, the gradient taken
        through it.

        forward: (images [n, ...], their global rows [n], labels [n]) -> D's logits [n]
            of what D sees of them (augmentation and instance noise keyed by the rows).
        rows, labels: the global rows [2b] of `clean` (fakes offset by the global
            batch) and its labels [2b].
        One backward pass of sum(logits) gives every example's input gradient: D must not
        couple examples (no batch norm: `StepConfig.validate` refuses it).
        With penalty_fd_sigma = s > 0, ||grad f(x)||^2 is estimated without double
        backprop as ((f(x + s e) - f(x)) / s)^2, e ~ N(0, I) per example (keyed by the
        global row): E_e[(grad f . e)^2] = ||grad f||^2 to first order in s. The
        perturbed images go through D in the SAME pass (one batch [4b]) and the same
        augmentation draws, so it is a directional difference of D(A(.)).
        penalty_every = e > 1: every e-th D update, weight x e (as `__call__`)."""
        c = self.config
        weight = self.weight(step, gb)
        b = tf.shape(clean)[0] // 2

        def penalized(gain):
            if c.penalty_fd_sigma:
                sigma = float(c.penalty_fd_sigma)
                noise = latents.rows_normal(
                    latents.key(self.seed, step, latents.PENALTY_PHASE + k), rows,
                    list(clean.shape[1:]))
                both = tf.reshape(forward(tf.concat([clean, clean + sigma * noise], 0),
                                          tf.concat([rows, rows], 0),
                                          tf.concat([labels, labels], 0)), [-1])
                logits, moved = both[:2 * b], both[2 * b:]
                sq = tf.square((moved - logits) / sigma)
            else:
                with tf.GradientTape() as tape:
                    tape.watch(clean)
                    logits = forward(clean, rows, labels)
                    total = tf.reduce_sum(logits)
                sq = _sum_squares(tape.gradient(total, clean))
            return logits, weight * gain * (sq[:b] + sq[b:])

        def plain():
            return forward(clean, rows, labels), tf.zeros([b])

        return self._lazily(penalized, plain, step, k, due)

    def _lazily(self, penalized, plain, step, k, due):
        """penalized(gain) in every penalty_every-th D update, at gain penalty_every, and
        plain() in the others (lazy regularization); penalized(1.0) when e = 1. `due`:
        None (a cond on the step in the graph) or the caller's Python bool (`due`)."""
        e = self.config.penalty_every
        if e == 1:
            return penalized(1.0)
        if isinstance(due, bool):  # Decided by the caller: one traced step for each.
            return penalized(float(e)) if due else plain()
        # The D update number is the same on every replica, so every replica takes the
        # same branch (D has no batch norm: no collective inside).
        return tf.cond(self.due(tf.cast(step, tf.int64), k),
                       lambda: penalized(float(e)), plain)

    def __call__(self, real, fake, labels, rows, step, k, gb, due=None):
        """penalty_weight x the per-example penalty [B] on what D saw; with
        penalty_every = e > 1 only in every e-th D update, times e (lazy regularization).
        A conditional D is evaluated with the real labels. `due`: None (decided in the
        graph, a cond on the step) or the Python bool `due` gave the caller for this
        update (an engine that cannot run the cond: a DTensor mesh has no layout
        propagation for its OptionalFromValue). gb: the global batch (the weight's
        schedule counts images)."""
        noise = latents.rows_uniform(
            latents.key(self.seed, step, latents.PENALTY_PHASE + k), rows, [])

        def discriminator(x, training=True):
            return self.discriminate(x, labels, training=training)

        weight = self.weight(step, gb)

        def penalized(gain):
            return weight * gain * self.fn(discriminator, real=real, fake=fake, noise=noise)

        return self._lazily(penalized, lambda: tf.zeros(tf.shape(real)[:1]), step, k, due)
