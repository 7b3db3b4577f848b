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

An engine runs this code and supplies a `Topology`: how [real; fake] is joined along
examples and under which device scope each network runs. tf.distribute strategies (and
one device) use the default, `REPLICAS`; `parallel.placement` puts G and D on two devices;
`parallel.step` runs the same methods on a DTensor mesh, for the global batch.
"""

import contextlib
import warnings

import keras
import tensorflow as tf

from tf_gan_scale import latents, replica
from tf_gan_scale.architectures import stylegan2
from tf_gan_scale.architectures.calls import call_generator
from tf_gan_scale.gan import ada as ada_lib
from tf_gan_scale.gan import augment as augment_lib
from tf_gan_scale.gan import checks, losses, penalties, regularizers
from tf_gan_scale.gan.step_config import ADA

NONFINITE = "nonfinite"  # train()'s output: which check failed (0: none).
NONFINITE_D, NONFINITE_G, UNEVEN = 1, 2, 3


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


def unpack(batch, need_labels=False):
    """Real images and labels from a batch: a dict {"x"|"image", "label"}, an (x, y) tuple,
    or a bare tensor. Returns (x [B, ...] float32, labels [B] int32: zeros when the batch
    has none, unless need_labels: then ValueError)."""
    if isinstance(batch, dict):
        x = batch["x"] if "x" in batch else batch["image"]
        labels = batch.get("label")
    elif isinstance(batch, (tuple, list)):
        x, labels = batch[0], (batch[1] if len(batch) > 1 else None)
    else:
        x, labels = batch, None
    x = tf.cast(x, tf.float32)
    if labels is None:
        if need_labels:  # A conditional GAN would train every real example as class 0.
            raise ValueError("a conditional GAN (num_classes > 0) needs labelled batches: "
                             "{'x': images, 'label': labels} or (images, labels)")
        labels = tf.zeros([tf.shape(x)[0]], tf.int32)
    return x, tf.cast(labels, tf.int32)


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
            variables, else None; pl_mean: the path-length mean (float32 scalar
            variable) with pl_weight > 0, else None. Checkpointed by `GAN`.
        trackers: {name: keras.metrics.Mean} of "d_loss", "g_loss", "d_grad_norm",
            "g_grad_norm", "d_skip_rate", "g_skip_rate" (missing names are not logged).
        topology: the engine's `Topology`.
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
        self.penalty_fn = penalties.get(config.penalty)
        self.ada_state, self.pl_mean = ada_state, pl_mean
        # A style generator runs as its two networks (mixing, path length); its
        # virtual chunk (D's minibatch-std chunk) keys the per-chunk draws.
        self.style = (stylegan2.parts(generator) if stylegan2.is_style_generator(generator)
                      else None)
        self.chunk = stylegan2.mbstd_chunk(discriminator) or max(
            1, int(config.pl_batch_shrink))

    @property
    def sampler(self):
        """The generator to sample and score: the EMA generator if any, else G."""
        return self.ema.model if self.ema is not None else self.generator

    def _record(self, name, value):
        if name in self.trackers:
            self.trackers[name].update_state(value)

    # ---- pieces ------------------------------------------------------------------------

    def discriminate(self, x, labels, training):
        """D's logits [B] float32 for x [B, ...] with class labels [B] (ignored if
        unconditional)."""
        if self.num_classes:
            logits = self.discriminator([x, labels], training=training)
        else:
            logits = self.discriminator(x, training=training)
        return tf.cast(logits, tf.float32)  # Losses in float32 (precision.py).

    def fake_labels(self, step, phase, rows):
        """Labels int32 [len(rows)] of the fakes of latents phase `phase` (zeros when
        unconditional): uniform over the classes, one draw per global row."""
        if not self.num_classes:
            return tf.zeros(tf.shape(rows)[:1], tf.int32)
        return latents.rows_labels(latents.key(self.seed, step, latents.LABEL_PHASE + phase),
                                   rows, self.num_classes)

    def d_inputs(self, x, rows, step, phase):
        """What D sees of images x [L, ...] with global rows [L]: DiffAugment, then
        instance noise. Every draw is per example (keyed by the global row) and drawn
        afresh per update (phase), so N replicas match one device and resume is exact."""
        c = self.config
        if c.augment == ADA:
            x = ada_lib.augment(x, tf.convert_to_tensor(self.ada_state[0]),
                                latents.key(self.seed, step, latents.AUGMENT_PHASE + phase),
                                rows)
        elif c.augment:
            x = augment_lib.augment(
                x, c.augment, latents.key(self.seed, step, latents.AUGMENT_PHASE + phase), rows)
        if c.instance_noise:
            std = tf.constant(float(c.instance_noise))
            if c.instance_noise_steps:  # Linear annealing to 0.
                done = tf.cast(step, tf.float32) / float(c.instance_noise_steps)
                std = std * tf.maximum(0.0, 1.0 - done)
            noise = latents.rows_normal(latents.key(self.seed, step, latents.NOISE_PHASE + phase),
                                        rows, list(x.shape[1:]))
            x = x + std * noise
        return x

    def fakes(self, z, labels, rows, step, phase, training=True):
        """G's images [m, ...] float32 for latents z [m, latent_dim] and labels [m] of the
        global rows `rows` [m], in latents phase `phase`. Also returns w [m, w_dim] of a
        style generator (else None), for its w_avg. Layers that draw per example (a
        style generator's noise inputs, dropout) see `rows`."""
        if self.style is None:
            with latents.example_rows(rows):
                return call_generator(self.generator, z, labels, training=training), None
        ws, w = self.styles(z, labels, rows, step, phase, training)
        return self.synthesize(ws, rows, training), w

    def styles(self, z, labels, rows, step, phase, training=True):
        """A style generator's per-layer styles ws [m, num_ws, w_dim] and w [m, w_dim].

        Style mixing (StyleGAN2, training/loss.py:StyleGAN2Loss.run_G): with probability
        style_mixing the layers from a cut-off uniform in [1, num_ws - 1] on take the
        w of a second latent. The official code draws one cut-off per GPU and
        accumulation round, so its result depends on the GPU count; here the cut-off is
        one draw per CHUNK of global rows (D's minibatch-std chunk, the official
        per-GPU batch), keyed by (seed, step, phase, chunk), and the second latent one
        per row: the same on every topology."""
        mapping, synthesis = self.style
        w = self._map(mapping, z, labels, training)
        num_ws = stylegan2.num_ws_of(synthesis)
        ws = tf.tile(w[:, None, :], [1, num_ws, 1])
        if not (training and self.config.style_mixing):
            return ws, w
        chunks = tf.cast(rows, tf.int64) // self.chunk
        u = latents.rows_uniform(latents.key(self.seed, step, latents.MIX_PHASE + phase),
                                 chunks, [2])
        cutoff = tf.minimum(1 + tf.cast(u[:, 1] * (num_ws - 1), tf.int32), num_ws - 1)
        cutoff = tf.where(u[:, 0] < float(self.config.style_mixing), cutoff, num_ws)
        z2 = latents.rows_normal(
            latents.key(self.seed, step, latents.MIX_LATENT_PHASE + phase), rows,
            [self.latent_dim])
        w2 = self._map(mapping, z2, labels, training)
        keep = tf.range(num_ws)[None, :] < cutoff[:, None]  # [m, num_ws]
        return tf.where(keep[..., None], ws, w2[:, None, :]), w

    def _map(self, mapping, z, labels, training):
        out = mapping([z, labels] if self.num_classes else z, training=training)
        return tf.cast(out, tf.float32)

    def synthesize(self, ws, rows, training=True):
        """A style generator's images [m, ...] float32 from styles ws [m, num_ws, w_dim];
        its noise inputs are drawn for the global rows `rows`."""
        with latents.example_rows(rows):
            return tf.cast(self.style[1](ws, training=training), tf.float32)

    def d_micro_batches(self, real, real_labels, rows, gb, step, k, penalty_due=None):
        """D's gradients of one update summed over the micro-batches (`micro_batches`),
        one after the other, in order: (grads, [each one's loss share], riders summed)."""
        grads, shares, means = None, [], []
        for part in self.micro_batches():
            g, share, m = self.d_grads(real[part], real_labels[part], rows[part], gb,
                                       step, k, penalty_due)
            grads = g if grads is None else [add_grads(x, y) for x, y in zip(grads, g)]
            shares.append(share)
            means = m if not means else [x + y for x, y in zip(means, m)]
        return grads, shares, means

    def g_micro_batches(self, rows, gb, step):
        """G's gradients of one update summed over the micro-batches, in order: (grads,
        [each one's loss share], [each one's sum of w] of a style generator, else [])."""
        grads, shares, w_sums = None, [], []
        for j, part in enumerate(self.micro_batches()):
            g, share, w_sum = self.g_grads(rows[part], gb, step, regularize=j == 0)
            grads = g if grads is None else [add_grads(x, y) for x, y in zip(grads, g)]
            shares.append(share)
            if w_sum is not None:
                w_sums.append(w_sum)
        return grads, shares, w_sums

    def micro_batches(self):
        """Slices of this replica's rows for gradient accumulation: micro-batch j of K
        (K = accumulation_steps) holds the rows j, j + K, j + 2K, ... (rows % K == 0 is
        checked before each step: `checks.assert_accumulation_split`).

        Strided, not contiguous, so that micro-batch j is the same set of GLOBAL rows on
        every topology: a replica's rows start at a multiple of its row count, a multiple
        of K, so global row i falls in micro-batch i mod K everywhere. Batch-norm
        statistics (per micro-batch, over every replica's micro-batch j) then match one
        device with the same K."""
        k = self.config.accumulation_steps
        if k == 1:
            return [slice(None)]
        return [slice(j, None, k) for j in range(k)]

    def penalty_due(self, step, k):
        """Whether D update k of step `step` carries a lazy penalty (penalty_every = e:
        every e-th D update, counted over all steps): a bool tensor for a step tensor, a
        Python bool for a Python int."""
        update = step * self.config.d_steps + k
        return update % self.config.penalty_every == 0

    def penalty(self, real, fake, labels, rows, step, k, due=None):
        """penalty_weight x the per-example penalty [B] (penalties.py) on what D saw; with
        penalty_every = e > 1 only in every e-th D update, times e (lazy regularization).
        A conditional D is evaluated with the real labels. `due`: None (decided in the
        graph, a cond on the step) or the Python bool `penalty_due` gave the caller for
        this update (an engine that cannot run the cond: a DTensor mesh has no layout
        propagation for its OptionalFromValue)."""
        c = self.config
        noise = latents.rows_uniform(
            latents.key(self.seed, step, latents.PENALTY_PHASE + k), rows, [])

        def discriminator(x, training=True):
            return self.discriminate(x, labels, training=training)

        def compute(weight):
            return weight * self.penalty_fn(discriminator, real=real, fake=fake, noise=noise)

        e = c.penalty_every
        if e == 1:
            return compute(float(c.penalty_weight))
        if isinstance(due, bool):  # Decided by the caller: one traced step for each.
            return compute(float(c.penalty_weight) * e) if due else tf.zeros(
                tf.shape(real)[:1])
        # The D update number is the same on every replica, so every replica takes the
        # same branch (D has no batch norm: no collective inside).
        return tf.cond(self.penalty_due(tf.cast(step, tf.int64), k),
                       lambda: compute(float(c.penalty_weight) * e),
                       lambda: tf.zeros(tf.shape(real)[:1]))

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
        fake_labels = self.fake_labels(step, k, rows)
        with self.topology.on("g"):
            fake, _ = self.fakes(z, fake_labels, rows, step, k)
        join = self.topology.join
        # One device sees [real rows 0..GB-1; fake rows 0..GB-1]: per-example noise in D
        # (dropout, augmentation, instance noise) is keyed by that global position.
        both_rows = join([rows, gb + rows])
        labels = join([real_labels, fake_labels])
        x = self.d_inputs(join([real, fake]), both_rows, step, k)
        with tf.GradientTape() as tape:
            # Real and fake go through D as ONE batch [2B, ...] (as in BigGAN-PyTorch): one
            # forward pass instead of two, and batch-norm statistics in D cover both halves.
            with latents.example_rows(both_rows):
                logits = self.discriminate(x, labels, training=True)
            real_logits, fake_logits = logits[:b], logits[b:]
            per_example = self.loss_fn(real_logits=real_logits, fake_logits=fake_logits).d
            if c.lecam_weight:
                per_example += float(c.lecam_weight) * regularizers.lecam(
                    real_logits, fake_logits, self.lecam_anchors[0], self.lecam_anchors[1])
            if self.penalty_fn is not None and not c.lazy_phases:
                per_example += self.penalty(x[:b], x[b:], real_labels, rows, step, k,
                                            penalty_due)
            # This replica's share of the global mean; the all-reduce sums the shares.
            share = replica.global_mean(per_example, gb)
            loss = self.d_optimizer.scale_loss(share)
        grads = tape.gradient(loss, self.discriminator.trainable_variables)
        # LeCam's anchors move with D's GLOBAL mean outputs: their shares ride along.
        means = [replica.global_mean(tf.reshape(v, [-1]), gb)
                 for v in (real_logits, fake_logits)] if c.lecam_weight else []
        if self.ada_state is not None:  # ADA's statistic: summed over every replica.
            means.append(tf.reduce_sum(tf.sign(real_logits)))
        return grads, share, means

    def g_grads(self, rows, gb, step, regularize=True):
        """G's local gradients for the fakes of global rows `rows` [m] of a global batch
        of gb: (grads, this replica's share of the global mean G loss, plus the orthogonal
        regularizer's 1/N if `regularize`: once per update, not per micro-batch; the sum
        of w [w_dim] over the rows for a style generator, else None)."""
        c = self.config
        on = self.topology.on
        z = latents.rows_normal(latents.key(self.seed, step, latents.G_PHASE), rows,
                                [self.latent_dim])
        labels = self.fake_labels(step, latents.G_PHASE, rows)
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
                x = self.d_inputs(fake, rows, step, latents.G_PHASE)
                fake_logits = self.discriminate(x, labels, training=True)
                # real_logits only feed the D term, which G's gradient ignores.
                per_example = self.loss_fn(real_logits=fake_logits,
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
        if k == 0:  # Before this step's first augmentation.
            self.ada_adjust(step, gb)
        with self.topology.on("d"):  # G's forward passes inside go to G's device.
            grads, shares, means = self.topology.d_micro_batches(
                self, real, real_labels, rows, gb, step, k, penalty_due)
            (d_loss, count, *means), finite, norm, skipped = self.apply(
                self.d_optimizer, grads, self.discriminator.trainable_variables,
                [tf.add_n(shares), b] + means)
        if self.config.lecam_weight:
            self.lecam_anchors.assign(regularizers.update_anchor(
                self.lecam_anchors, tf.stack(means[:2]), float(self.config.lecam_decay)))
        if self.ada_state is not None:
            self.ada_record(means[-1], gb)
        self._record("d_grad_norm", norm)
        self._count_skips(self.d_optimizer, skipped, "d_skip_rate")
        return d_loss, finite, count

    def g_update(self, b, step, uneven):
        """One G update on a fresh latent batch of size b (as K micro-batches with
        accumulation, as in `d_update`); returns (global mean G loss, finite, global sum
        of `uneven`) as `d_update`: `uneven` (this replica's verdict on the split of the
        D batches) rides along, so every replica and worker reaches the same verdict."""
        gb = replica.global_batch_size(b)
        rows = replica.global_rows(b)
        with self.topology.on("g"):  # D's passes inside go to D's device.
            grads, shares, w_sums = self.topology.g_micro_batches(self, rows, gb, step)
            riders = [tf.add_n(shares), uneven] + ([tf.add_n(w_sums)] if w_sums else [])
            (g_loss, uneven, *w_sum), finite, norm, skipped = self.apply(
                self.g_optimizer, grads, self.generator.trainable_variables, riders)
        if w_sum:  # The global mean w moves w_avg (used for truncation only).
            stylegan2.update_w_avg(self.style[0], w_sum[0] / tf.cast(gb, tf.float32))
        self._record("g_grad_norm", norm)
        if self.ema is not None and not self.config.lazy_phases:
            # Reads G's weights and the step after the update (automatic control
            # dependencies order reads after writes of the same variable).
            self.ema.update(self.generator, self.g_optimizer.iterations)
        self._count_skips(self.g_optimizer, skipped, "g_skip_rate")
        return g_loss, finite, uneven

    # ---- StyleGAN2: ADA's p and the lazy regularization phases ---------------------------

    def ada_record(self, sign_sum, count):
        """Adds a D pass's GLOBAL sum of sign(D(real)) over `count` reals to ADA's
        statistic (an integer sum: exactly the same on every topology)."""
        stats = self.ada_state[1]
        stats.assign(stats + tf.stack([sign_sum, tf.cast(count, tf.float32)]))

    def ada_adjust(self, step, gb):
        """ADA's controller (training_loop.py, "Execute ADA heuristic"): every
        ada_interval steps, p += sign(r_t - target) x gb x interval / (ada_kimg x 1000),
        p >= 0, with r_t the mean sign of D(real) over the reals of the Dmain and Dreg
        passes since the last adjustment; then the statistic restarts. Runs at the start
        of step t for the steps before it (the official runs after step t - 1: the same
        order). p, the statistic and the step are checkpointed: resume is exact."""
        c = self.config
        if self.ada_state is None or not c.ada_interval:
            return
        p, stats = self.ada_state
        due = tf.logical_and(step > 0, tf.equal(step % c.ada_interval, 0))
        due = tf.logical_and(due, stats[1] > 0)
        new = ada_lib.adjust_p(p, stats[0], stats[1], gb, c.ada_interval,
                               float(c.ada_target), float(c.ada_kimg))
        p.assign(tf.where(due, new, p))
        # An elementwise condition: a scalar one selecting between [2] tensors crashes a
        # DTensor step (a segmentation fault, TF 2.21); the values are the same.
        stats.assign(tf.where(tf.fill([2], due), tf.zeros([2]), stats))

    def apply(self, optimizer, grads, variables, riders):
        """`replica.apply_global_gradients` with this step's packing and gradient cleaning:
        every update of every phase goes through the one gradient reduction."""
        if not self.topology.sparse_updates:  # The same update, written densely.
            grads = [tf.convert_to_tensor(g) if isinstance(g, tf.IndexedSlices) else g
                     for g in grads]
        return replica.apply_global_gradients(optimizer, grads, variables, riders,
                                              self.config.grad_pack_bytes,
                                              self.config.grad_nan_to_num)

    def _phase_update(self, optimizer, grads, variables, riders):
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
        real, labels = unpack(data, need_labels=bool(self.num_classes))
        b = batch_rows(real)  # Static where it can be (a mesh cannot range over a tensor).
        gb = replica.global_batch_size(b)
        rows = replica.global_rows(b)
        weight = float(c.penalty_weight) * c.penalty_every  # The lazy gain.
        variables = self.discriminator.trainable_variables
        with tf.GradientTape() as tape:
            with tf.GradientTape() as inner:
                inner.watch(real)
                x = self.d_inputs(real, rows, step, latents.DREG_PHASE)
                with latents.example_rows(rows):
                    logits = self.discriminate(x, labels, training=True)
                total = tf.reduce_sum(logits)
            g = inner.gradient(total, real)
            r1 = tf.reduce_sum(tf.reshape(tf.square(g), [b, -1]), axis=1)
            share = replica.global_mean(weight * r1, gb)
            loss = self.d_optimizer.scale_loss(share)
        grads = tape.gradient(loss, variables)
        riders = [share]
        if self.ada_state is not None:  # The Dreg reals count in ADA's statistic too.
            riders.append(tf.reduce_sum(tf.sign(tf.reshape(logits, [-1]))))
        (pen, *signs), finite, _, _ = self._phase_update(self.d_optimizer, grads, variables,
                                                          riders)
        if signs:
            self.ada_record(signs[0], gb)
        return {"d_reg": pen, NONFINITE: tf.where(finite, 0, NONFINITE_D)}

    def pl_rows(self, b):
        """The global rows [m] of this replica's path-length pass: the first
        chunk / pl_batch_shrink rows of each chunk (the official pass uses
        gen_z[:batch_gpu // 2] of each GPU's round), and m."""
        shrink = int(self.config.pl_batch_shrink)
        chunk = self.chunk
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
        c = self.config
        real, _ = unpack(data)
        b = batch_rows(real)  # As in d_reg.
        rows = self.pl_rows(b)
        count = tf.cast(replica.global_batch_size(tf.shape(rows)[0]), tf.float32)
        z = latents.rows_normal(latents.key(self.seed, step, latents.PL_PHASE), rows,
                                [self.latent_dim])
        labels = self.fake_labels(step, latents.PL_PHASE, rows)
        weight = float(c.pl_weight) * c.pl_every
        decay = float(c.pl_decay)
        variables = self.generator.trainable_variables
        with tf.GradientTape() as tape:
            ws, _ = self.styles(z, labels, rows, step, latents.PL_PHASE)
            with tf.GradientTape() as inner:
                inner.watch(ws)
                img = self.synthesize(ws, rows)
                h, w = img.shape[1], img.shape[2]
                noise = latents.rows_normal(latents.key(self.seed, step, latents.PL_PHASE + 1),
                                            rows, list(img.shape[1:])) / float(h * w) ** 0.5
                total = tf.reduce_sum(img * noise)
            g = inner.gradient(total, ws)  # [m, num_ws, w_dim]
            lengths = tf.sqrt(tf.reduce_mean(tf.reduce_sum(tf.square(g), 2), 1))  # [m]
            mean = _global_sum(tf.stop_gradient(tf.reduce_sum(lengths))) / count
            new_mean = self.pl_mean + decay * (mean - self.pl_mean)
            slope = tf.stop_gradient(2.0 * (mean - new_mean))
            surrogate = tf.square(lengths - new_mean) - decay * slope * lengths
            share = tf.reduce_sum(weight * surrogate) / count
            loss = self.g_optimizer.scale_loss(share)
        grads = tape.gradient(loss, variables)
        penalty = tf.reduce_sum(weight * tf.square(lengths - new_mean)) / count
        (pen,), finite, _, _ = self._phase_update(self.g_optimizer, grads, variables,
                                                  [penalty])
        self.pl_mean.assign(new_mean)
        return {"pl_penalty": pen, NONFINITE: tf.where(finite, 0, NONFINITE_G)}

    def lazy_phases(self):
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

    def _count_skips(self, optimizer, skipped, name):
        """Logs the update dynamic loss scaling skipped (mixed_float16), if it can."""
        if isinstance(optimizer, keras.optimizers.LossScaleOptimizer):
            self._record(name, tf.cast(skipped, tf.float32))

    # ---- the step ------------------------------------------------------------------------

    def train(self, data, penalty_due=None):
        """One GAN step on this replica.

        Args:
            data: with d_steps == 1 a batch; otherwise a tuple of `d_steps` batches, one
                real batch per D update (the step loop packs them). A batch is
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
        batches = (data,) if self.config.d_steps == 1 else tuple(data)
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
        g_loss, finite, uneven = self.g_update(batch_rows(real), step, uneven)
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

    def evaluate(self, data, offset=0, fid=None):
        """Global-mean losses on one held-out batch, both networks in inference mode.

        Args:
            data: a real batch as in `train` (labels unused); the global batch may split
                unevenly over replicas (a last partial batch): rows are placed by
                `replica.global_rows_uneven`.
            offset: int32 scalar, evaluation examples before this batch. Fake example i
                of an evaluation comes from latents (and a conditional one's class label)
                keyed by (seed, i) alone (`latents.EVAL_PHASE`), so the result depends on
                neither batch size nor topology. The fakes come from `sampler`.
            fid: a `metrics.scoring.FidStreams` to feed (real, fake), or None.

        Returns:
            {"d_loss", "g_loss": running global means over the evaluation so far (the
            adversarial losses; a gradient penalty is not part of them: it needs D in
            training mode), "examples": int32 global rows of this batch}.
        Collectives: one gather of row counts, one all-reduce of the two loss sums.
        """
        real, real_labels = unpack(data)
        b = tf.shape(real)[0]
        rows, n = replica.global_rows_uneven(b)
        z = latents.rows_normal(latents.key(self.seed, latents.SAMPLE_STEP,
                                            latents.EVAL_PHASE), offset + rows,
                                [self.latent_dim])
        fake_labels = self.fake_labels(latents.SAMPLE_STEP, latents.EVAL_PHASE, offset + rows)

        def local_sums():
            fake = call_generator(self.sampler, z, fake_labels, training=False)
            logits = self.discriminate(tf.concat([real, fake], 0),
                                       tf.concat([real_labels, fake_labels], 0),
                                       training=False)
            out = self.loss_fn(real_logits=logits[:b], fake_logits=logits[b:])
            if fid is not None:
                fid.update(real, fake)
            return tf.stack([tf.reduce_sum(out.d), tf.reduce_sum(out.g)])

        # A replica can get no rows of a last partial batch (1 row over 2 replicas), and
        # convolutions fail on empty batches on CPU: it contributes zero sums. The
        # collectives stay outside the branch, so every replica runs them.
        sums = tf.cond(b > 0, local_sums, lambda: tf.zeros([2]))
        # Sums over the global batch, divided once by its size: the per-example mean, as
        # in training, also when the replicas hold different numbers of rows.
        sums = [sums[0], sums[1]]
        ctx = tf.distribute.get_replica_context()
        if ctx is not None and ctx.num_replicas_in_sync > 1:
            sums = ctx.all_reduce(tf.distribute.ReduceOp.SUM, sums)
        count = tf.cast(n, tf.float32)
        # Weighted by the batch's rows: the running mean is per example over the set.
        d_mean, g_mean = self.trackers["d_loss"], self.trackers["g_loss"]
        d_mean.update_state(sums[0] / count, sample_weight=count)
        g_mean.update_state(sums[1] / count, sample_weight=count)
        return {"d_loss": d_mean.result(), "g_loss": g_mean.result(), "examples": n}


def phase_due(step, every):
    """Whether a lazy phase of interval `every` runs after the step whose count BEFORE it
    is `step` (every `every`-th step from step 0): a bool tensor for a step tensor (the
    data-parallel loop's cond), a Python bool for a Python int (a DTensor mesh decides on
    the host: it cannot run the cond)."""
    if isinstance(step, int):
        return step % every == 0
    return tf.equal(step % every, 0)


def batch_rows(x):
    """The rows of x [B, ...]: B as a Python int when the shape says it, else a tensor.
    Static where it can be: a DTensor mesh cannot lay out `tf.range` of a size computed
    at run time ("Shared RangeOp is not supported yet"), and the global rows of a batch
    are such a range (`replica.global_rows`)."""
    return x.shape[0] if x.shape[0] is not None else tf.shape(x)[0]


def _global_sum(x):
    """x summed over every replica (one all-reduce; x itself without a strategy)."""
    ctx = tf.distribute.get_replica_context()
    if ctx is None or ctx.num_replicas_in_sync == 1:
        return x
    return ctx.all_reduce(tf.distribute.ReduceOp.SUM, x)


def add_grads(a, b):
    """Sum of two gradients of one variable (None: not connected). Sparse gradients (an
    embedding's IndexedSlices) are summed by concatenating their rows, as TensorFlow
    aggregates them; `+` is not defined for them."""
    if a is None:
        return b
    if b is None:
        return a
    if isinstance(a, tf.IndexedSlices) and isinstance(b, tf.IndexedSlices):
        return tf.IndexedSlices(tf.concat([a.values, b.values], 0),
                                tf.concat([a.indices, b.indices], 0), a.dense_shape)
    return tf.convert_to_tensor(a) + tf.convert_to_tensor(b)


def ortho_weights(generator):
    """G's weights under orthogonal regularization: trainable kernels of rank >= 2,
    without class embeddings (BigGAN-PyTorch leaves its shared embedding out)."""
    return [w for w in generator.trainable_weights
            if len(w.shape) >= 2 and "embedding" not in w.path.lower()]
