"""GanStep: the math of one GAN training step, on one replica, knowing no engine.

One step = `d_steps` discriminator updates, each on its own real batch, then one generator
update. Distributed math, in one place each:
  * losses are per example and reduced with `replica.global_mean` (divide by the GLOBAL
    batch once); `replica.apply_global_gradients` then SUMS each network's gradients
    across replicas in one fused all-reduce, before the optimizer (so its clipping and
    loss-scale checks see global gradients);
  * latents, penalty noise, augmentation, instance noise and dropout masks come from
    `latents`, a function of (seed, step, phase, the example's global row:
    `replica.global_rows`);
  * batch statistics are cross-replica (`layers.SyncBatchNormalization`, one all-reduce
    per layer and pass).

This module is the step's skeleton: both phases' gradients (`d_grads`, `g_grads`) and
updates (`d_update`, `g_update`), the one gradient reduction (`apply`) and the step
(`train`). What varies by technique lives in units named for it, which GanStep owns:
  step_inputs.py     StepInputs: what G and D are fed (labels, latents, styles, synthesis,
                     augmentation and instance noise, D's logits); `unpack`, `batch_rows`
  micro_batches.py   gradient accumulation: which rows, the sequential loop, `add_grads`
  penalties.py       UpdatePenalty: the penalty a main D update carries, and when
  ada_controller.py  AdaController: ADA's p and its sign statistic
  lazy_phases.py     LazyPhases: StyleGAN2's Dreg and Greg phases, `phase_due`
  step_evaluation.py `evaluate`: held-out global-mean losses

An engine runs this code and supplies a `Topology`: how [real; fake] is joined along
examples and under which device scope each network runs. tf.distribute strategies (and
one device) use the default, `REPLICAS`; `parallel.placement` puts G and D on two devices;
`parallel.step` runs the same methods on a DTensor mesh, for the global batch.
"""

import contextlib

import keras
import tensorflow as tf

from tf_gan_scale import latents, replica
from tf_gan_scale.architectures import stylegan2
from tf_gan_scale.gan import checks, losses, regularizers, step_evaluation
from tf_gan_scale.gan import micro_batches as micro_lib
from tf_gan_scale.gan.ada_controller import AdaController
# NONFINITE codes, add_grads, phase_due, unpack and batch_rows live with their units and
# are offered here too: engines (parallel/) and the step loop import them from gan.step.
from tf_gan_scale.gan.checks import NONFINITE, NONFINITE_D, NONFINITE_G, UNEVEN
from tf_gan_scale.gan.lazy_phases import LazyPhases, phase_due
from tf_gan_scale.gan.micro_batches import add_grads
from tf_gan_scale.gan.penalties import UpdatePenalty
from tf_gan_scale.gan.step_inputs import StepInputs, batch_rows, unpack

__all__ = ["GanStep", "NONFINITE", "NONFINITE_D", "NONFINITE_G", "REPLICAS", "Topology",
           "UNEVEN", "add_grads", "batch_rows", "ortho_weights", "phase_due", "unpack"]


class Topology:
    """Where the step math runs: the seam between GanStep and an engine.

    `join(parts)` concatenates per-example tensors along examples ([real; fake]);
    `on(net)` is the device scope of network "g" or "d". Forward AND backward ops go where
    they are created: each network's gradient is taken inside its own scope.
    `d_micro_batches` / `g_micro_batches`: how an update's micro-batches run.
    `sparse_updates`: whether an embedding's IndexedSlices gradient may reach the
    optimizer as is (a scatter update of the rows it touched) or must be made dense."""

    sparse_updates = True

    def join(self, parts):
        return tf.concat(parts, 0)

    def on(self, net):
        del net
        return contextlib.nullcontext()

    def d_micro_batches(self, step_math, *args):
        """How an update's micro-batches run: one after the other (GanStep's loop). A
        pipeline (parallel/pipeline.py) runs them in its schedule instead."""
        return step_math.d_micro_batches(*args)

    def g_micro_batches(self, step_math, *args):
        return step_math.g_micro_batches(*args)


REPLICAS = Topology()  # tf.distribute strategies and one device.


class GanStep:
    """The per-replica step math of a GAN. Every method runs inside `strategy.run` (or on
    one device, or traced by a mesh engine for the global batch).

    Args:
        generator / discriminator: the Keras networks (conditional when num_classes > 0).
        config: a validated `StepConfig`.
        latent_dim, seed, num_classes: as `GAN`'s.
        g_optimizer / d_optimizer: built Keras optimizers; G's `iterations` is the step.
        ema: a `GeneratorEMA` or None; lecam_anchors: the LeCam anchor variable [2] or None.
        ada_state: with augment="ada", (p float32 scalar, [sum of sign(D(real)), count])
            variables, else None (`ada` holds them); pl_mean: the path-length mean
            (float32 scalar variable) with pl_weight > 0, else None (`phases` holds it).
            Checkpointed by `GAN`.
        trackers: {name: keras.metrics.Mean} of "d_loss", "g_loss", "d_grad_norm",
            "g_grad_norm", "d_skip_rate", "g_skip_rate" (missing names are not logged).
        topology: the engine's `Topology`.

    Its units, made here: `inputs` (StepInputs), `update_penalty` (UpdatePenalty), `ada`
    (AdaController, or None without ADA), `phases` (LazyPhases). `topology` and `trackers`
    stay GanStep's own (an engine replaces them after construction) and are read at call
    time.
    """

    def __init__(self, *, generator, discriminator, config, latent_dim, seed, num_classes,
                 g_optimizer, d_optimizer, ema=None, lecam_anchors=None, trackers=None,
                 topology=REPLICAS, ada_state=None, pl_mean=None):
        self.generator, self.discriminator = generator, discriminator
        self.config = config
        self.latent_dim, self.seed, self.num_classes = latent_dim, seed, num_classes
        self.g_optimizer, self.d_optimizer = g_optimizer, d_optimizer
        self.ema, self.lecam_anchors = ema, lecam_anchors
        self.trackers = dict(trackers or {})
        self.topology = topology
        self.loss_fn = losses.get(config.loss)
        if config.label_smoothing:
            self.loss_fn = losses.smooth_real_labels(self.loss_fn,
                                                     float(config.label_smoothing))
        self.inputs = StepInputs(
            generator=generator, discriminator=discriminator, config=config,
            latent_dim=latent_dim, seed=seed, num_classes=num_classes,
            ada_p=None if ada_state is None else ada_state[0])
        self.update_penalty = UpdatePenalty(config=config, seed=seed,
                                            discriminate=self.inputs.discriminate)
        self.penalty_fn = self.update_penalty.fn
        self.ada = None if ada_state is None else AdaController(config=config,
                                                                state=ada_state)
        self.phases = LazyPhases(
            config=config, inputs=self.inputs, generator=generator,
            discriminator=discriminator, g_optimizer=g_optimizer, d_optimizer=d_optimizer,
            ema=ema, pl_mean=pl_mean, ada=self.ada, apply=self.apply)

    @property
    def sampler(self):
        """The generator to sample and score: the EMA generator if any, else G."""
        return self.ema.model if self.ema is not None else self.generator

    def _record(self, name, value):
        if name in self.trackers:
            self.trackers[name].update_state(value)

    # ---- the engine-facing surface: engines (parallel/), GAN and the step loop call these
    # names on GanStep; each is its unit's method (see the module docstring) -------------

    def discriminate(self, x, labels, training):
        """D's logits [B] float32 (`StepInputs.discriminate`)."""
        return self.inputs.discriminate(x, labels, training)

    def fake_labels(self, step, phase, rows):
        """The fakes' labels int32 [len(rows)] (`StepInputs.fake_labels`)."""
        return self.inputs.fake_labels(step, phase, rows)

    def d_inputs(self, x, rows, step, phase):
        """What D sees of images x [L, ...] (`StepInputs.d_inputs`)."""
        return self.inputs.d_inputs(x, rows, step, phase)

    def seen_logits(self, images, rows, labels, step, phase):
        """D's logits [n] (training mode) of what D sees of images [n, ...] with global
        rows [n] and labels [n] in latents phase `phase`: `d_inputs`, then D, per-example
        draws keyed by the rows."""
        with latents.example_rows(rows):
            return self.discriminate(self.d_inputs(images, rows, step, phase), labels,
                                     training=True)

    def fakes(self, z, labels, rows, step, phase, training=True):
        """G's images [m, ...] and w [m, w_dim] or None (`StepInputs.fakes`)."""
        return self.inputs.fakes(z, labels, rows, step, phase, training)

    def micro_batches(self):
        """Slices of this replica's rows, one per micro-batch (`micro_batches.py`)."""
        return micro_lib.micro_batches(self.config.accumulation_steps)

    def d_micro_batches(self, real, real_labels, rows, gb, step, k, penalty_due=None):
        """D's micro-batches one after the other (`micro_batches.d_micro_batches`)."""
        return micro_lib.d_micro_batches(self, real, real_labels, rows, gb, step, k,
                                         penalty_due)

    def g_micro_batches(self, rows, gb, step, real=None, real_labels=None):
        """G's micro-batches one after the other (`micro_batches.g_micro_batches`)."""
        return micro_lib.g_micro_batches(self, rows, gb, step, real, real_labels)

    def penalty_due(self, step, k):
        """Whether D update k of step `step` carries a lazy penalty (`UpdatePenalty.due`)."""
        return self.update_penalty.due(step, k)

    def penalty(self, real, fake, labels, rows, step, k, gb, due=None):
        """The weighted per-example penalty [B] of D update k (`UpdatePenalty`)."""
        return self.update_penalty(real, fake, labels, rows, step, k, gb, due)

    def lazy_phases(self):
        """[(phase, interval)] run after the main updates (`LazyPhases.phases`)."""
        return self.phases.phases()

    def end_of_step(self, step):
        """What follows a step's lazy phases (`LazyPhases.end_of_step`)."""
        return self.phases.end_of_step(step)

    def evaluate(self, data, offset=0, fid=None):
        """Held-out global-mean losses of one batch (`step_evaluation.evaluate`)."""
        return step_evaluation.evaluate(data, offset, fid, inputs=self.inputs,
                                        sampler=self.sampler, loss_fn=self.loss_fn,
                                        trackers=self.trackers)

    # ---- gradients -----------------------------------------------------------------------

    def d_grads(self, real, real_labels, rows, gb, step, k, penalty_due=None):
        """D's local gradients on real rows [m, ...] (global rows `rows` [m], of a global
        batch of gb) and as many fakes, in D update k of the step: (grads, this replica's
        share of the global mean D loss, riders: [its shares of D's global mean real and
        fake outputs] for LeCam, then [its sum of sign(D(real))] for ADA). penalty_due:
        see `penalty`."""
        c = self.config
        b = tf.shape(real)[0]
        z = latents.rows_normal(latents.key(self.seed, step, k), rows, [self.latent_dim])
        # A paired loss conditions fake i on real i's label (R3GAN: G(z, real_c)).
        fake_labels = real_labels if c.paired else self.fake_labels(step, k, rows)
        with self.topology.on("g"):
            fake, _ = self.fakes(z, fake_labels, rows, step, k)
        join = self.topology.join
        # One device sees [real rows 0..GB-1; fake rows 0..GB-1]: per-example noise in D
        # (dropout, augmentation, instance noise) is keyed by that global position.
        both_rows = join([rows, gb + rows])
        labels = join([real_labels, fake_labels])
        clean = join([real, fake])

        def forward(images, images_rows, images_labels):
            return self.seen_logits(images, images_rows, images_labels, step, k)

        in_pass = c.in_pass
        if not in_pass:
            x = self.d_inputs(clean, both_rows, step, k)
        with tf.GradientTape() as tape:
            # Real and fake go through D as ONE batch [2B, ...] (as in BigGAN-PyTorch): one
            # forward pass instead of two, and batch-norm statistics in D cover both halves.
            if in_pass:  # R1 + R2 through the augmentation, from this same pass.
                logits, penalty = self.update_penalty.in_pass(
                    forward, clean, both_rows, labels, step, k, gb, penalty_due)
            else:
                with latents.example_rows(both_rows):
                    logits = self.discriminate(x, labels, training=True)
            real_logits, fake_logits = logits[:b], logits[b:]
            per_example = self.loss_fn(real_logits=real_logits, fake_logits=fake_logits).d
            if c.lecam_weight:
                per_example += float(c.lecam_weight) * regularizers.lecam(
                    real_logits, fake_logits, self.lecam_anchors[0], self.lecam_anchors[1])
            if in_pass:
                per_example += penalty
            elif self.penalty_fn is not None and not c.lazy_phases:
                per_example += self.penalty(x[:b], x[b:], real_labels, rows, step, k, gb,
                                            penalty_due)
            # This replica's share of the global mean; the all-reduce sums the shares.
            share = replica.global_mean(per_example, gb)
            loss = self.d_optimizer.scale_loss(share)
        grads = tape.gradient(loss, self.discriminator.trainable_variables)
        # LeCam's anchors move with D's GLOBAL mean outputs: their shares ride along.
        means = [replica.global_mean(tf.reshape(v, [-1]), gb)
                 for v in (real_logits, fake_logits)] if c.lecam_weight else []
        if self.ada is not None:  # ADA's statistic: summed over every replica.
            means.append(tf.reduce_sum(tf.sign(real_logits)))
        return grads, share, means

    def g_grads(self, rows, gb, step, regularize=True, real=None, real_labels=None):
        """G's local gradients for the fakes of global rows `rows` [m] of a global batch
        of gb: (grads, this replica's share of the global mean G loss, plus the orthogonal
        regularizer's 1/N if `regularize`: once per update, not per micro-batch; the sum
        of w [w_dim] over the rows for a style generator, else None). A paired loss
        also reads G's own real rows `real` [m, ...] with labels [m]: fake i (with real
        i's label) is judged against real i."""
        c = self.config
        on = self.topology.on
        z = latents.rows_normal(latents.key(self.seed, step, latents.G_PHASE), rows,
                                [self.latent_dim])
        labels = (real_labels if c.paired else
                  self.fake_labels(step, latents.G_PHASE, rows))
        variables = self.generator.trainable_variables
        with on("g"), tf.GradientTape() as g_tape:
            fake, w = self.fakes(z, labels, rows, step, latents.G_PHASE)
            targets = [fake]
            reg = None
            if c.ortho_weight and regularize:
                # Not per example: every replica adds 1/N of it, so the summed gradient
                # is the one-device gradient of the regularizer (regularizers.orthogonal).
                reg = float(c.ortho_weight) * regularizers.orthogonal(
                    ortho_weights(self.generator)) / replica.num_replicas()
                targets.append(self.g_optimizer.scale_loss(reg))
        # Back-propagated in two stages joined by the chain rule through `fake`: D's
        # (to d loss / d fake), then G's, so that under a placement each runs on its
        # network's device (gradient ops go where `gradient` is called). The same
        # gradient ops as one tape over both.
        with on("d"):
            with tf.GradientTape() as d_tape:
                d_tape.watch(fake)
                if c.paired:  # [real; fake] in one pass, keyed as in D's update.
                    join = self.topology.join
                    logits = self.seen_logits(join([real, fake]), join([rows, gb + rows]),
                                              join([labels, labels]), step, latents.G_PHASE)
                    m = tf.shape(fake)[0]
                    real_logits, fake_logits = logits[:m], logits[m:]
                else:
                    x = self.d_inputs(fake, rows, step, latents.G_PHASE)
                    fake_logits = self.discriminate(x, labels, training=True)
                    # real_logits only feed the D term, which G's gradient ignores.
                    real_logits = fake_logits
                per_example = self.loss_fn(real_logits=real_logits,
                                           fake_logits=fake_logits).g
                share = replica.global_mean(per_example, gb)
                loss = self.g_optimizer.scale_loss(share)
            d_fake = d_tape.gradient(loss, fake)
        with on("g"):
            # d loss / d fake into G, plus the regularizer's own gradient (weight 1).
            grads = g_tape.gradient(targets, variables, output_gradients=[d_fake] + [
                tf.ones_like(t) for t in targets[1:]])
        # A style generator's w_avg follows the mean w of the GLOBAL batch: its sum
        # rides on G's all-reduce (the official code keeps one per GPU, from its rows).
        w_sum = None if w is None else tf.reduce_sum(w, 0)
        return grads, share if reg is None else share + reg, w_sum

    # ---- updates -------------------------------------------------------------------------

    def d_update(self, real, real_labels, step, k, penalty_due=None):
        """One D update on this replica's real batch [B, ...] with labels [B].

        With accumulation_steps K > 1 the batch runs as K micro-batches of B/K rows
        (`micro_batches`), one forward/backward pass each; their gradients are summed
        locally and all-reduced ONCE, each micro-batch's losses divided by the FULL
        global batch, so the update is the one of the whole batch (exactly, for a D
        without batch norm: batch-norm statistics are per micro-batch, over every
        replica's micro-batch j, as in BigGAN's accumulation, and the moving statistics
        take K updates). Every random draw is keyed by the example's global row, which
        does not depend on K.

        Returns (global mean D loss, finite, global row count): the loss of the whole
        global batch (its share rides on the gradient all-reduce, as does this replica's
        row count, so checking the split costs no collective) and whether it and the
        global gradients are finite (with a LossScaleOptimizer non-finite gradients
        skip the update instead: see `replica.apply_global_gradients`).
        """
        b = batch_rows(real)
        gb = replica.global_batch_size(b)
        rows = replica.global_rows(b)  # The global rows of `real`: latents follow them.
        if k == 0 and self.ada is not None:  # Before this step's first augmentation.
            self.ada.adjust(step, gb)
        with self.topology.on("d"):  # G's forward passes inside go to G's device.
            grads, shares, means = self.topology.d_micro_batches(
                self, real, real_labels, rows, gb, step, k, penalty_due)
            (d_loss, count, *means), finite, norm, skipped = self.apply(
                self.d_optimizer, grads, self.discriminator.trainable_variables,
                [tf.add_n(shares), b] + means)
        if self.config.lecam_weight:
            self.lecam_anchors.assign(regularizers.update_anchor(
                self.lecam_anchors, tf.stack(means[:2]), float(self.config.lecam_decay)))
        if self.ada is not None:
            self.ada.record(means[-1], gb)
        self._record("d_grad_norm", norm)
        self._count_skips(self.d_optimizer, skipped, "d_skip_rate")
        return d_loss, finite, count

    def g_update(self, b, step, uneven, real=None, real_labels=None):
        """One G update on a fresh latent batch of size b (as K micro-batches with
        accumulation, as in `d_update`); returns (global mean G loss, finite, global sum
        of `uneven`) as `d_update`: `uneven` (this replica's verdict on the split of the
        D batches) rides along, so every replica and worker reaches the same verdict.
        A paired loss passes G's own real batch [b, ...] and labels [b]."""
        gb = replica.global_batch_size(b)
        rows = replica.global_rows(b)
        reals = () if real is None else (real, real_labels)
        with self.topology.on("g"):  # D's passes inside go to D's device.
            grads, shares, w_sums = self.topology.g_micro_batches(self, rows, gb, step,
                                                                  *reals)
            riders = [tf.add_n(shares), uneven] + ([tf.add_n(w_sums)] if w_sums else [])
            (g_loss, uneven, *w_sum), finite, norm, skipped = self.apply(
                self.g_optimizer, grads, self.generator.trainable_variables, riders)
        if w_sum:  # The global mean w moves w_avg (used for truncation only).
            stylegan2.update_w_avg(self.inputs.style[0], w_sum[0] / tf.cast(gb, tf.float32))
        self._record("g_grad_norm", norm)
        if self.ema is not None and not self.config.lazy_phases:
            # Reads G's weights and the step after the update (automatic control
            # dependencies order reads after writes of the same variable).
            self.ema.update(self.generator, self.g_optimizer.iterations)
        self._count_skips(self.g_optimizer, skipped, "g_skip_rate")
        return g_loss, finite, uneven

    def apply(self, optimizer, grads, variables, riders):
        """`replica.apply_global_gradients` with this step's packing and gradient cleaning:
        every update of every phase goes through the one gradient reduction."""
        if not self.topology.sparse_updates:  # The same update, written densely.
            grads = [tf.convert_to_tensor(g) if isinstance(g, tf.IndexedSlices) else g
                     for g in grads]
        return replica.apply_global_gradients(optimizer, grads, variables, riders,
                                              self.config.grad_pack_bytes,
                                              self.config.grad_nan_to_num)

    def _count_skips(self, optimizer, skipped, name):
        """Logs the update dynamic loss scaling skipped (mixed_float16), if it can."""
        if isinstance(optimizer, keras.optimizers.LossScaleOptimizer):
            self._record(name, tf.cast(skipped, tf.float32))

    # ---- the step ------------------------------------------------------------------------

    def train(self, data, penalty_due=None):
        """One GAN step on this replica.

        Args:
            data: with `config.batches_per_step` == 1 a batch; otherwise a tuple of
                that many batches (the step loop packs them): one real batch per D
                update, then, with a paired loss, G's own real batch. A batch is
                {"x": [B, ...], "label": [B]}, an (x, y) tuple or a tensor.
            penalty_due: None, or for a lazy penalty a Python bool per D update
                (`penalty_due`), decided by the caller instead of in the graph.

        Returns:
            {"d_loss": scalar, "g_loss": scalar, NONFINITE: int32 scalar}: the GLOBAL
            mean losses of this step (the last D update's for d_loss), the same on every
            replica, and 0, or NONFINITE_D / NONFINITE_G when that network's global loss
            or gradients, or its variables after the step, were not finite, or UNEVEN
            when the global batch did not split evenly over the replicas (every replica
            divided by a global batch of replicas x its own rows: wrong).
        """
        c = self.config
        batches = (data,) if c.batches_per_step == 1 else tuple(data)
        # A paired loss reads one more batch, G's own reals (the last one).
        g_real = unpack(batches[-1], need_labels=bool(self.num_classes)) if c.paired \
            else (None, None)
        batches = batches[:c.d_steps]
        step = self.g_optimizer.iterations
        nonfinite = tf.constant(0, tf.int32)
        uneven = tf.constant(0.0)
        for k, batch in enumerate(batches):
            real, labels = unpack(batch, need_labels=bool(self.num_classes))
            d_loss, finite, count = self.d_update(
                real, labels, step, k, None if penalty_due is None else penalty_due[k])
            nonfinite = tf.where(finite, nonfinite, NONFINITE_D)
            # This replica's rows differ from an even share of the global count. The
            # single-worker pre-step check (`step_function`) stops that before the step;
            # across workers it is summed in G's all-reduce, so all agree.
            even = tf.equal(count, tf.cast(replica.global_batch_size(batch_rows(real)),
                                           tf.float32))
            uneven = tf.maximum(uneven, 1.0 - tf.cast(even, tf.float32))
            # Trackers hold global values on every replica: updating them is local, and
            # reading them in replica context (the step loop) needs no collective.
            self._record("d_loss", d_loss)
        g_loss, finite, uneven = self.g_update(batch_rows(real), step, uneven, *g_real)
        nonfinite = tf.where(tf.logical_or(finite, nonfinite > 0), nonfinite, NONFINITE_G)
        nonfinite = tf.where(uneven > 0, UNEVEN, nonfinite)
        # Finite gradients can still overflow a weight or a moving variance (a huge
        # learning rate, activations past 1e19): check the state a checkpoint would hold.
        # Local reads of mirrored variables: no collective.
        for network, code in ((self.discriminator, NONFINITE_D), (self.generator, NONFINITE_G)):
            finite = checks.all_finite(network.weights)
            nonfinite = tf.where(tf.logical_or(finite, nonfinite > 0), nonfinite, code)
        self._record("g_loss", g_loss)
        return {"d_loss": d_loss, "g_loss": g_loss, NONFINITE: nonfinite}


def ortho_weights(generator):
    """G's weights under orthogonal regularization: trainable kernels of rank >= 2,
    without class embeddings (BigGAN-PyTorch leaves its shared embedding out)."""
    return [w for w in generator.trainable_weights
            if len(w.shape) >= 2 and "embedding" not in w.path.lower()]
