"""LazyPhases: StyleGAN2's regularization phases, each its own optimizer update.

With config.train.lazy_phases a step runs, after its main D and G updates: every
penalty_every steps the Dreg phase (`d_reg`: R1 through the augmentation), every pl_every
steps the Greg phase (`g_reg`: path length, on the rows `pl_rows`), then `end_of_step`
(the EMA). `phases()` lists them with their intervals and `phase_due` says whether one
runs after a step; the data-parallel loop (step_function.py) and the mesh
(parallel/step.py) both take them from here. A phase's update does not count as a step
(`update`). A new lazy phase: a method here returning {name: global mean,
NONFINITE: code} and its entry in `phases`.
"""

import warnings

import tensorflow as tf

from tf_gan_scale import latents, replica
from tf_gan_scale.gan.checks import NONFINITE, NONFINITE_D, NONFINITE_G
from tf_gan_scale.gan.step_inputs import batch_rows, unpack


class LazyPhases:
    """StyleGAN2's lazy regularization phases of a GAN step, on one replica.

    Args:
        config: a validated `StepConfig` (lazy_phases, penalty*, pl_* are read).
        inputs: the step's `StepInputs` (D's inputs, styles, synthesis, fake labels).
        generator / discriminator, g_optimizer / d_optimizer: as `GanStep`'s.
        ema: a `GeneratorEMA` or None; pl_mean: the path-length mean (float32 scalar
            variable) with pl_weight > 0, else None.
        ada: the step's `AdaController` or None (the Dreg reals count in its statistic).
        apply: the step's one gradient reduction and update (`GanStep.apply`).
    """

    def __init__(self, *, config, inputs, generator, discriminator, g_optimizer,
                 d_optimizer, ema, pl_mean, ada, apply):
        self.config, self.inputs = config, inputs
        self.generator, self.discriminator = generator, discriminator
        self.g_optimizer, self.d_optimizer = g_optimizer, d_optimizer
        self.ema, self.pl_mean, self.ada, self.apply = ema, pl_mean, ada, apply

    def phases(self):
        """StyleGAN2's regularization phases in the order a step runs them after its main
        D and G updates: [(phase, interval)], `d_reg` (R1) with a penalty, then `g_reg`
        (path length) with pl_weight; [] without lazy_phases. A phase of interval e runs
        after step s when `phase_due(s, e)`; then, with any phase, `end_of_step`. The
        data-parallel loop (step_function) and the mesh (parallel.step) both use this."""
        c = self.config
        if not c.lazy_phases:
            return []
        phases = []
        if c.penalty != "none" and c.penalty_weight:
            phases.append((self.d_reg, int(c.penalty_every)))
        if c.pl_weight:
            phases.append((self.g_reg, int(c.pl_every)))
        return phases

    def end_of_step(self, step):
        """With lazy phases, what follows every phase of step `step` (the step loop runs
        it after them): the EMA update, which the official code makes after all phases
        of an iteration, so it sees the path-length update too. Returns 0 (int32)."""
        if self.ema is not None:
            self.ema.update(self.generator, step + 1)  # The step counted after it.
        return tf.constant(0, tf.int32)

    def update(self, optimizer, grads, variables, riders):
        """A lazy phase's optimizer update, which does not count as a step: the main
        updates' `iterations` stays the step counter (data position, latents,
        checkpoints). So Adam's bias correction counts main updates only (the official
        counts every update: a difference in the first few hundred steps)."""
        with warnings.catch_warnings():
            # Some variables have no gradient in a phase (R1 does not reach D's output
            # bias, path length no toRGB bias): skipped, as the official optimizer does,
            # and Keras' warning about it at every trace is noise.
            warnings.filterwarnings("ignore", message="Gradients do not exist")
            out = self.apply(optimizer, grads, variables, riders)
        optimizer.iterations.assign_sub(1)
        return out

    def d_reg(self, data, step):
        """StyleGAN2's Dreg phase (loss.py:accumulate_gradients, phase 'Dreg'): its own D
        update with R1 = penalty_weight x penalty_every x ||d sum D(A(x)) / d x||^2 on
        the step's reals x, taken with respect to the images BEFORE augmentation A (so
        through ADA's pipe), as the official code does. Set penalty_weight to gamma / 2.

        Returns {"d_reg": global mean penalty, NONFINITE: code}."""
        c = self.config
        real, labels = unpack(data, need_labels=bool(self.inputs.num_classes))
        b = batch_rows(real)  # Static where it can be (a mesh cannot range over a tensor).
        gb = replica.global_batch_size(b)
        rows = replica.global_rows(b)
        weight = float(c.penalty_weight) * c.penalty_every  # The lazy gain.
        variables = self.discriminator.trainable_variables
        with tf.GradientTape() as tape:
            with tf.GradientTape() as inner:
                inner.watch(real)
                x = self.inputs.d_inputs(real, rows, step, latents.DREG_PHASE)
                with latents.example_rows(rows):
                    logits = self.inputs.discriminate(x, labels, training=True)
                total = tf.reduce_sum(logits)
            g = inner.gradient(total, real)
            r1 = tf.reduce_sum(tf.reshape(tf.square(g), [b, -1]), axis=1)
            share = replica.global_mean(weight * r1, gb)
            loss = self.d_optimizer.scale_loss(share)
        grads = tape.gradient(loss, variables)
        riders = [share]
        if self.ada is not None:  # The Dreg reals count in ADA's statistic too.
            riders.append(tf.reduce_sum(tf.sign(tf.reshape(logits, [-1]))))
        (pen, *signs), finite, _, _ = self.update(self.d_optimizer, grads, variables, riders)
        if signs:
            self.ada.record(signs[0], gb)
        return {"d_reg": pen, NONFINITE: tf.where(finite, 0, NONFINITE_D)}

    def pl_rows(self, b):
        """The global rows [m] of this replica's path-length pass: the first
        chunk / pl_batch_shrink rows of each chunk (the official pass uses
        gen_z[:batch_gpu // 2] of each GPU's round), and m."""
        shrink = int(self.config.pl_batch_shrink)
        chunk = self.inputs.chunk
        keep = max(1, chunk // shrink)
        rows = tf.reshape(replica.global_rows(b), [-1, chunk])[:, :keep]
        return tf.reshape(rows, [-1])

    def g_reg(self, data, step):
        """StyleGAN2's Greg phase (loss.py, 'Greg'): its own G update with the path-length
        penalty pl_weight x pl_every x (|J_w^T y| - pl_mean)^2, y = image-space noise /
        sqrt(H W), |.| = sqrt of the mean over the num_ws styles of the squared norm.

        pl_mean <- pl_mean + pl_decay (mean |J_w^T y| - pl_mean): the mean over the
        GLOBAL path-length batch, one all-reduce (the official keeps one per GPU and
        never saves it: here it is the same on every topology and checkpointed). The
        official penalty is not detached from the 0.01 x mean term; its gradient is kept
        exactly without differentiating through the all-reduce: with l_i the lengths, m
        the new mean, M rows and S = 2 (mean(l) - m), d/dtheta of mean_i (l_i - m)^2 is
        mean_i [2 (l_i - m) - decay S] dl_i/dtheta, the gradient of the local surrogate
        (l_i - stop(m))^2 - decay stop(S) l_i.

        Returns {"pl_penalty": global mean penalty, NONFINITE: code}."""
        c, inputs = self.config, self.inputs
        real, _ = unpack(data)
        b = batch_rows(real)  # As in d_reg.
        rows = self.pl_rows(b)
        count = tf.cast(replica.global_batch_size(tf.shape(rows)[0]), tf.float32)
        z = latents.rows_normal(latents.key(inputs.seed, step, latents.PL_PHASE), rows,
                                [inputs.latent_dim])
        labels = inputs.fake_labels(step, latents.PL_PHASE, rows)
        weight = float(c.pl_weight) * c.pl_every
        decay = float(c.pl_decay)
        variables = self.generator.trainable_variables
        with tf.GradientTape() as tape:
            ws, _ = inputs.styles(z, labels, rows, step, latents.PL_PHASE)
            with tf.GradientTape() as inner:
                inner.watch(ws)
                img = inputs.synthesize(ws, rows)
                h, w = img.shape[1], img.shape[2]
                noise = latents.rows_normal(latents.key(inputs.seed, step, latents.PL_PHASE + 1),
                                            rows, list(img.shape[1:])) / float(h * w) ** 0.5
                total = tf.reduce_sum(img * noise)
            g = inner.gradient(total, ws)  # [m, num_ws, w_dim]
            lengths = tf.sqrt(tf.reduce_mean(tf.reduce_sum(tf.square(g), 2), 1))  # [m]
            # The mean length over the GLOBAL path-length batch: one all-reduce.
            mean = _global_sum(tf.stop_gradient(tf.reduce_sum(lengths))) / count
            new_mean = self.pl_mean + decay * (mean - self.pl_mean)
            slope = tf.stop_gradient(2.0 * (mean - new_mean))
            surrogate = tf.square(lengths - new_mean) - decay * slope * lengths
            share = tf.reduce_sum(weight * surrogate) / count
            loss = self.g_optimizer.scale_loss(share)
        grads = tape.gradient(loss, variables)
        penalty = tf.reduce_sum(weight * tf.square(lengths - new_mean)) / count
        (pen,), finite, _, _ = self.update(self.g_optimizer, grads, variables, [penalty])
        self.pl_mean.assign(new_mean)
        return {"pl_penalty": pen, NONFINITE: tf.where(finite, 0, NONFINITE_G)}


def phase_due(step, every):
    """Whether a lazy phase of interval `every` runs after the step whose count BEFORE it
    is `step` (every `every`-th step from step 0): a bool tensor for a step tensor (the
    data-parallel loop's cond), a Python bool for a Python int (a DTensor mesh decides on
    the host: it cannot run the cond)."""
    if isinstance(step, int):
        return step % every == 0
    return tf.equal(step % every, 0)


def _global_sum(x):
    """x summed over every replica (one all-reduce; x itself without a strategy)."""
    ctx = tf.distribute.get_replica_context()
    if ctx is None or ctx.num_replicas_in_sync == 1:
        return x
    return ctx.all_reduce(tf.distribute.ReduceOp.SUM, x)
