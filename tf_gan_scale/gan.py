"""GAN(keras.Model): a generator/discriminator pair trained with Keras `fit` under any strategy.

    with strategy.scope():
        gan = GAN(generator=g, discriminator=d, latent_dim=100, seed=0)
        gan.compile(g_optimizer=keras.optimizers.Adam(1e-4),
                    d_optimizer=keras.optimizers.Adam(1e-4), loss="hinge", d_steps=1)
    gan.fit(dataset, epochs=..., steps_per_epoch=...)

One training step = `d_steps` discriminator updates, each on its own real batch, then one
generator update. The step counter is `g_optimizer.iterations`.

This class owns the step loop (`make_train_function`) and so the gradient all-reduce:
Keras 3's own loop cannot run a GAN under multi-worker strategies (see
KERAS3_DISTRIBUTE_NOTES: scalar-log reduction, steps_per_execution > 1), and a GAN needs
two optimizers anyway. Distributed math, in one place each:
  * losses are per example and reduced with `replica.global_mean` (divide by the GLOBAL
    batch once); `apply_global_gradients` then SUMS each network's gradients across
    replicas in one fused all-reduce, before the optimizer (so its clipping and
    loss-scale checks see global gradients);
  * latents, penalty noise and dropout masks come from `latents`, a function of (seed,
    step, phase, the example's global index: `replica.global_rows`);
  * batch statistics are cross-replica (`layers.SyncBatchNormalization`, one all-reduce
    per layer and pass).
"""

import contextlib
import numbers

import keras
import tensorflow as tf

from tf_gan_scale import augment as augment_lib
from tf_gan_scale import ema as ema_lib
from tf_gan_scale import errors, latents, losses, penalties, regularizers, replica
from tf_gan_scale import gan_checks as checks
from tf_gan_scale.gan_checks import is_conditional
from tf_gan_scale.replica import apply_global_gradients

NONFINITE = "nonfinite"  # train_step output: which check failed (0: none).
NONFINITE_D, NONFINITE_G, UNEVEN = 1, 2, 3


def _unpack(batch, need_labels=False):
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


def call_generator(generator, z, labels=None, training=False):
    """generator(z) or, for a conditional generator, generator([z, labels]):
    z [B, latent_dim], labels int32 [B] -> [B, *data_shape]."""
    if is_conditional(generator):
        if labels is None:
            raise ValueError("a conditional generator needs class labels")
        out = generator([z, tf.cast(labels, tf.int32)], training=training)
    else:
        out = generator(z, training=training)
    # float32 whatever the policy (precision.py): what losses, D and samples expect.
    return tf.cast(out, tf.float32)


def _unconverted_if_own(model, name):
    """model.NAME, marked for autograph to leave alone if it is GAN's own.

    The step math is plain Python around TF ops: no Python `if`/`for` on a tensor, so
    autograph would change nothing in its graph, yet converting its ~90 functions costs
    ~3.6 CPU-s at every start of a process (measured on the tiny DCGAN, docs/testing.md).
    What it calls runs unconverted too, a callable loss or penalty included, as Keras 3
    runs every train_step (its trainer's `one_step_on_data` is `do_not_convert`): a
    Python `if` on a tensor there fails when traced, and `print` prints once, at trace
    time (use tf.cond, tf.print). A subclass's own train_step / test_step is still
    converted (with what it calls), as before."""
    method = getattr(model, name)
    if getattr(type(model), name) is getattr(GAN, name):
        return tf.autograph.experimental.do_not_convert(method)
    return method


@keras.saving.register_keras_serializable(package="tf_gan_scale")
class GAN(keras.Model):
    """A generator/discriminator pair with a distributed GAN train step.

    Args:
        generator: keras.Model, [B, latent_dim] -> [B, *data_shape].
        discriminator: keras.Model, [B, *data_shape] -> [B, 1] (or [B]) logits.
        latent_dim: int, size of z ~ N(0, I).
        seed: int, seeds all training randomness (latents, penalty noise).
        num_classes: int, 0 for an unconditional GAN; else the number of classes of a
            conditional generator [z, labels] -> x and discriminator [x, labels] -> logits
            (`architectures`): real labels come from the data, fake labels are drawn
            uniformly per example from `latents`.
        ema_decay / ema_start / ema_warmup: an EMA copy of the generator (`ema.py`),
            `gan.ema_generator`, when ema_decay > 0 (e.g. 0.999). It is what `gan(z)`,
            `predict`, `generate`, sample grids and scores use (`gan.sampler`).
        sync_batch_norm: "auto" (default), True or False. Plain Keras
            `BatchNormalization` computes per-replica statistics; "auto" replaces it by
            `layers.SyncBatchNormalization` (same config and weights: global-batch
            statistics) when the GAN is created under a strategy with more than one
            replica, True always, False never (see `convert.py`). Use `gan.generator` /
            `gan.discriminator` afterwards: the models passed in are not modified.
        **kwargs: passed to keras.Model (e.g. `name`).

    Calling the model, `gan(z)`, runs the generator in inference mode; so does
    `gan.predict(z)`, distributed under the strategy. `gan.evaluate(real_data)` returns
    the global-mean D and G losses on held-out data (`test_step`).

    Saving: `gan.save("gan.keras")` then `keras.models.load_model("gan.keras")` (after
    `import tf_gan_scale`) restores G, D, both optimizers with their state, the loss,
    penalty, `d_steps` and the seed; `save_weights` / `load_weights` round trip too.
    """

    def __init__(self, generator, discriminator, latent_dim, *, seed=0,
                 sync_batch_norm="auto", num_classes=0, ema_decay=0.0, ema_start=0,
                 ema_warmup=0, **kwargs):
        super().__init__(**kwargs)
        if not generator.built:
            generator.build((None, int(latent_dim)))
        if not discriminator.built:
            discriminator.build((None,) + tuple(generator.output_shape[1:]))
        checks.check_networks(generator, discriminator, int(num_classes))
        # Plain Keras BatchNormalization is per replica: swap in SyncBatchNormalization
        # (same weights) before the networks are tracked here (see convert.for_gan).
        from tf_gan_scale import convert
        generator, discriminator = convert.for_gan(generator, discriminator, sync_batch_norm)
        self.generator = generator
        self.discriminator = discriminator
        self.latent_dim = int(latent_dim)
        self.seed = int(seed)
        self.num_classes = int(num_classes)
        self._sync_batch_norm = sync_batch_norm
        self._ema_config = {"ema_decay": float(ema_decay), "ema_start": int(ema_start),
                            "ema_warmup": int(ema_warmup)}
        self.ema = None
        if ema_decay:
            self.ema = ema_lib.GeneratorEMA(generator, ema_decay, ema_start, ema_warmup)
            self.ema_generator = self.ema.model
        self._eval_offset = 0  # Evaluation examples seen in this `evaluate` call.
        self.d_loss_tracker = keras.metrics.Mean(name="d_loss")
        self.g_loss_tracker = keras.metrics.Mean(name="g_loss")
        # Global gradient norms (of the summed gradients: no collective), for TensorBoard.
        self.d_grad_norm_tracker = keras.metrics.Mean(name="d_grad_norm")
        self.g_grad_norm_tracker = keras.metrics.Mean(name="g_grad_norm")
        # The fraction of updates skipped by dynamic loss scaling (mixed_float16) since
        # the last log (x log_every: the count). A Mean of a global 0/1, as the loss
        # trackers: a Sum would add every replica's update.
        self.d_skipped_tracker = keras.metrics.Mean(name="d_skip_rate")
        self.g_skipped_tracker = keras.metrics.Mean(name="g_skip_rate")
        # The wrapper has no call graph of its own; Keras' fit would try to trace one.
        self.built = True

    def get_config(self):
        return {"latent_dim": self.latent_dim, "seed": self.seed, "name": self.name,
                "sync_batch_norm": self._sync_batch_norm, "num_classes": self.num_classes,
                **self._ema_config,
                "generator": keras.saving.serialize_keras_object(self.generator),
                "discriminator": keras.saving.serialize_keras_object(self.discriminator)}

    @classmethod
    def from_config(cls, config):
        config = dict(config)
        g = keras.saving.deserialize_keras_object(config.pop("generator"))
        d = keras.saving.deserialize_keras_object(config.pop("discriminator"))
        return cls(g, d, **config)

    def compile(self, *, g_optimizer, d_optimizer, loss="hinge", d_steps=1, penalty="none",
                penalty_weight=0.0, steps_per_execution=1, fid_extractor=None,
                penalty_every=1, augment="", label_smoothing=0.0, instance_noise=0.0,
                instance_noise_steps=0, lecam_weight=0.0, lecam_decay=0.99,
                ortho_weight=0.0, accumulation_steps=1, jit_compile=False,
                grad_pack_bytes=0):
        """Configures training.

        Args:
            g_optimizer / d_optimizer: keras optimizers (or names) for G and D.
            loss: a name in losses.LOSSES or a callable with the same contract.
            d_steps: int >= 1, discriminator updates per generator update.
            penalty: a name in penalties.PENALTIES ("none", "wgan_gp", "r1").
            penalty_weight: float, multiplies the per-example penalty in the D loss.
            steps_per_execution: int >= 1, training steps per call of the step function.
            fid_extractor: optional extractor spec (`metrics.extractors.get`: a .keras
                file, "inception_v3", "fid_inception:PATH.pb"): `evaluate` then also
                reports "fid" between the data it is given and as many fakes, computed
                across replicas (the extractor's name is logged with it).
            penalty_every: int >= 1, lazy regularization (StyleGAN2): the penalty only
                in every k-th D update, with its weight multiplied by k (same expected
                strength, 1/k of the cost). Needs a D without batch norm.
            augment: DiffAugment policy (`augment.py`: "color,translation,cutout"),
                applied to every D input, real and fake, in the D and G updates.
            label_smoothing: s in [0, 1), one-sided (Salimans et al. 2016): D's real
                target is 1 - s. Cross-entropy losses only.
            instance_noise / instance_noise_steps: std of Gaussian noise added to every
                D input (real and fake, Sonderby et al. 2016), annealed linearly to 0
                over instance_noise_steps G steps (0: constant).
            lecam_weight / lecam_decay: LeCam regularization (Tseng et al. 2021) with
                EMA anchors of D's global mean real and fake outputs. The anchors used in
                a step are those of the steps before it (the official code folds the
                current batch in first; here that would cost one more all-reduce before
                the backward pass); the step's global means then update them.
            ortho_weight: BigGAN's orthogonal regularization of G's kernels (1e-4 in
                the paper).
            accumulation_steps: K >= 1, gradient accumulation: every update runs each
                replica's batch as K micro-batches and all-reduces their summed
                gradients once (`_d_update`); the per-replica batch must be divisible
                by K. Batch-norm statistics are per micro-batch.
            grad_pack_bytes: 0 (one gradient all-reduce per network and update), or
                the size of the packs the gradients are all-reduced in, last layers
                first, so communication can overlap the rest of the backward pass
                (`replica.apply_global_gradients`; multi-worker collectives).
            jit_compile: bool, compile the per-replica step (`train_step`) with XLA.
                TensorFlow supports it on one device (CPU, GPU); under a multi-device
                MirroredStrategy it fails (KERAS3_DISTRIBUTE_NOTES), so that is refused
                here. A TPUStrategy compiles every step anyway. On this project's 2-core
                CPU it was slower than oneDNN's kernels (README, Throughput).
        """
        if int(d_steps) < 1:
            raise ValueError(f"d_steps must be >= 1; Received: d_steps={d_steps}")
        for name, value, low in (("penalty_every", penalty_every, 1),
                                 ("accumulation_steps", accumulation_steps, 1),
                                 ("grad_pack_bytes", grad_pack_bytes, 0),
                                 ("instance_noise_steps", instance_noise_steps, 0)):
            if not isinstance(value, numbers.Integral) or isinstance(value, bool) \
                    or value < low:
                raise errors.ConfigError(f"{name} must be an integer >= {low}; Received: "
                                         f"{value!r}")
        if int(penalty_every) > 1 and checks.has_batch_norm(self.discriminator):
            raise errors.ConfigError(
                f"penalty_every={penalty_every} (lazy regularization) needs a discriminator "
                f"without batch norm (its all-reduces cannot sit in a conditional branch); "
                f"valid: penalty_every=1, or d_norm='none'")
        for name, value, high in (("label_smoothing", label_smoothing, 1.0),
                                  ("lecam_decay", lecam_decay, 1.0)):
            if not 0.0 <= float(value) < high:
                raise errors.ConfigError(f"{name} must be in [0, {high:g}); Received: "
                                         f"{value!r}")
        for name, value in (("instance_noise", instance_noise), ("lecam_weight", lecam_weight),
                            ("ortho_weight", ortho_weight),
                            ("instance_noise_steps", instance_noise_steps)):
            if not float(value) >= 0.0:
                raise errors.ConfigError(f"{name} must be >= 0; Received: {value!r}")
        augment_lib.check_policy(augment)
        if label_smoothing and _saved_name(loss, losses.LOSSES) not in losses.CROSS_ENTROPY:
            raise errors.ConfigError(
                f"label_smoothing needs a cross-entropy loss; Received: loss={loss!r}; "
                f"valid: {', '.join(losses.CROSS_ENTROPY)}")
        strategy = self.distribute_strategy
        if jit_compile and strategy.num_replicas_in_sync > 1 and not isinstance(
                strategy, tf.distribute.TPUStrategy):
            raise errors.ConfigError(
                f"jit_compile=True needs one replica (XLA cannot compile a step whose "
                f"variables are mirrored over {strategy.num_replicas_in_sync} devices); "
                f"valid: jit_compile=False, or one device")
        super().compile(steps_per_execution=steps_per_execution, jit_compile=False)
        self.xla = bool(jit_compile) and not isinstance(strategy, tf.distribute.TPUStrategy)
        self.g_optimizer = keras.optimizers.get(g_optimizer)
        self.d_optimizer = keras.optimizers.get(d_optimizer)
        # Keras' compile left its default optimizer (an unused, unbuilt RMSprop) in
        # `self.optimizer`, which callbacks read (BackupAndRestore builds it, outside the
        # strategy scope, and fails). The step counter is G's optimizer: it stands in.
        self.optimizer = self.g_optimizer
        self.loss_fn = losses.get(loss)
        if label_smoothing:
            self.loss_fn = losses.smooth_real_labels(self.loss_fn, float(label_smoothing))
        self.penalty_fn = penalties.get(penalty)
        self.penalty_weight = float(penalty_weight)
        self.d_steps = int(d_steps)
        self.penalty_every = int(penalty_every)
        self.augment_policy = augment
        self.instance_noise = float(instance_noise)
        self.instance_noise_steps = int(instance_noise_steps)
        self.lecam_weight, self.lecam_decay = float(lecam_weight), float(lecam_decay)
        self.ortho_weight = float(ortho_weight)
        self.accumulation_steps = int(accumulation_steps)
        self.grad_pack_bytes = int(grad_pack_bytes)
        # What `get_compile_config` saves: names stay names; a custom loss callable must be
        # registered with keras.saving.register_keras_serializable to be reloaded.
        self._gan_compile_config = {
            "loss": _saved_name(loss, losses.LOSSES),
            "d_steps": self.d_steps,
            "penalty": _saved_name(penalty, penalties.PENALTIES),
            "penalty_weight": self.penalty_weight,
            "steps_per_execution": int(steps_per_execution), "fid_extractor": None,
            "penalty_every": self.penalty_every, "augment": augment,
            "label_smoothing": float(label_smoothing), "instance_noise": self.instance_noise,
            "instance_noise_steps": self.instance_noise_steps,
            "lecam_weight": self.lecam_weight, "lecam_decay": self.lecam_decay,
            "ortho_weight": self.ortho_weight, "accumulation_steps": self.accumulation_steps,
            "jit_compile": self.xla, "grad_pack_bytes": self.grad_pack_bytes}
        self._fid = None
        if fid_extractor:
            from tf_gan_scale import evaluation
            self._fid = evaluation.FidStreams(self, fid_extractor)
            self._gan_compile_config["fid_extractor"] = self._fid.extractor.name
        # Optimizers must own their slots before the step function is traced under a
        # strategy, or the first step fails with a placeholder error.
        with self.distribute_strategy.scope():
            self.g_optimizer.build(self.generator.trainable_variables)
            self.d_optimizer.build(self.discriminator.trainable_variables)
            # LeCam's anchors: EMAs of D's global mean real / fake outputs, state that a
            # checkpoint must hold. Every replica computes them from the same global
            # means, so each updates its own copy (aggregation NONE) identically.
            if self.lecam_weight and getattr(self, "lecam_anchors", None) is None:
                self.lecam_anchors = keras.Variable([0.0, 0.0], trainable=False,
                                                    name="lecam_anchors")
        self.train_function = None

    def get_compile_config(self):
        """Both optimizers (with their config; their state is in the weights file), the
        loss, penalty, d_steps and steps_per_execution: what `keras.models.load_model`
        passes back to `compile` (Keras' default would record one unused RMSprop)."""
        if not self.compiled:
            return None
        return dict(self._gan_compile_config,
                    g_optimizer=keras.saving.serialize_keras_object(self.g_optimizer),
                    d_optimizer=keras.saving.serialize_keras_object(self.d_optimizer))

    def compile_from_config(self, config):
        config = dict(config)
        for name in ("g_optimizer", "d_optimizer"):
            config[name] = keras.optimizers.deserialize(config[name])
        for name in ("loss", "penalty"):
            if not isinstance(config[name], str):
                config[name] = keras.saving.deserialize_keras_object(config[name])
        # Inside the strategy scope the GAN was created in: optimizer slots must be
        # mirrored like the variables they belong to.
        with self.distribute_strategy.scope():
            self.compile(**config)

    @property
    def metrics(self):
        out = [self.d_loss_tracker, self.g_loss_tracker, self.d_grad_norm_tracker,
               self.g_grad_norm_tracker]
        if any(isinstance(getattr(self, name, None), keras.optimizers.LossScaleOptimizer)
               for name in ("g_optimizer", "d_optimizer")):
            out += [self.d_skipped_tracker, self.g_skipped_tracker]
        return out

    @property
    def step(self):
        """Generator steps taken so far (int64 variable)."""
        return self.g_optimizer.iterations

    @property
    def sampler(self):
        """The generator to sample and score: the EMA generator if any, else G."""
        return self.ema.model if self.ema is not None else self.generator

    def call(self, z, training=False):
        """Samples: `gan(z)` or, conditional, `gan([z, labels])` (the EMA generator if any)."""
        if isinstance(z, (tuple, list)):
            z, labels = z
            return call_generator(self.sampler, z, labels, training=training)
        return call_generator(self.sampler, z, training=training)

    def checkpoint_items(self):
        """What a checkpoint must hold for an exact resume (the step is g_optimizer's)."""
        items = {"generator": self.generator, "discriminator": self.discriminator,
                 "g_optimizer": self.g_optimizer, "d_optimizer": self.d_optimizer}
        if self.ema is not None:
            items["ema_generator"] = self.ema.model
        if getattr(self, "lecam_anchors", None) is not None:
            items["lecam_anchors"] = self.lecam_anchors
        return items

    def load_weights(self, filepath, *args, **kwargs):
        """`keras.Model.load_weights`, inside the model's strategy scope: Keras'
        `BackupAndRestore` (and users) call it outside, and variables created under a
        strategy can only be restored within it."""
        with self.distribute_strategy.scope():
            return super().load_weights(filepath, *args, **kwargs)

    # ---- per-replica step -------------------------------------------------------------

    def _discriminate(self, x, labels, training):
        """D's logits for x [B, ...] with class labels [B] (ignored if unconditional)."""
        if self.num_classes:
            logits = self.discriminator([x, labels], training=training)
        else:
            logits = self.discriminator(x, training=training)
        return tf.cast(logits, tf.float32)  # Losses in float32 (precision.py).

    def _fake_labels(self, step, phase, rows):
        """Labels int32 [len(rows)] of the fakes of latents phase `phase` (zeros when
        unconditional): uniform over the classes, one draw per global row."""
        if not self.num_classes:
            return tf.zeros(tf.shape(rows)[:1], tf.int32)
        return latents.rows_labels(latents.key(self.seed, step, latents.LABEL_PHASE + phase),
                                   rows, self.num_classes)

    def _d_inputs(self, x, rows, step, phase):
        """What D sees of images x [L, ...] with global rows [L]: DiffAugment, then
        instance noise. Every draw is per example (keyed by the global row) and drawn
        afresh per update (phase), so N replicas match one device and resume is exact."""
        if self.augment_policy:
            x = augment_lib.augment(
                x, self.augment_policy,
                latents.key(self.seed, step, latents.AUGMENT_PHASE + phase), rows)
        if self.instance_noise:
            std = tf.constant(self.instance_noise)
            if self.instance_noise_steps:  # Linear annealing to 0.
                done = tf.cast(step, tf.float32) / float(self.instance_noise_steps)
                std = std * tf.maximum(0.0, 1.0 - done)
            noise = latents.rows_normal(latents.key(self.seed, step, latents.NOISE_PHASE + phase),
                                        rows, list(x.shape[1:]))
            x = x + std * noise
        return x

    def _micro_batches(self):
        """Slices of this replica's rows for gradient accumulation: micro-batch j of K
        (K = accumulation_steps) holds the rows j, j + K, j + 2K, ... (rows % K == 0 is
        checked by `train_lib.validate` and, before each step, by
        `gan_checks.assert_accumulation_split`).

        Strided, not contiguous, so that micro-batch j is the same set of GLOBAL rows on
        every topology: a replica's rows start at a multiple of its row count, a multiple
        of K, so global row i falls in micro-batch i mod K everywhere. Batch-norm
        statistics (per micro-batch, over every replica's micro-batch j) then match one
        device with the same K."""
        k = self.accumulation_steps
        if k == 1:
            return [slice(None)]
        return [slice(j, None, k) for j in range(k)]

    def _d_update(self, real, real_labels, step, k):
        """One D update on this replica's real batch [B, ...] with labels [B].

        With accumulation_steps K > 1 the batch runs as K micro-batches of B/K rows
        (`_micro_batches`), one forward/backward pass each; their gradients are summed
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
        b = tf.shape(real)[0]
        gb = replica.global_batch_size(b)
        rows = replica.global_rows(b)  # The global rows of `real`: latents follow them.
        variables = self.discriminator.trainable_variables
        grads, shares, means = None, [], []
        with self._on("d"):  # G's forward passes inside go to G's device.
            for part in self._micro_batches():
                g, share, m = self._d_grads(real[part], real_labels[part], rows[part], gb,
                                            step, k)
                grads = g if grads is None else [_add_grads(x, y) for x, y in zip(grads, g)]
                shares.append(share)
                means = m if not means else [x + y for x, y in zip(means, m)]
            (d_loss, count, *means), finite, norm, skipped = apply_global_gradients(
                self.d_optimizer, grads, variables, [tf.add_n(shares), b] + means,
                self.grad_pack_bytes)
        if self.lecam_weight:
            self.lecam_anchors.assign(regularizers.update_anchor(
                self.lecam_anchors, tf.stack(means), self.lecam_decay))
        self.d_grad_norm_tracker.update_state(norm)
        self._count_skips(self.d_optimizer, skipped, self.d_skipped_tracker)
        return d_loss, finite, count

    # The DTensor mesh the step runs on (set by parallel.step.MeshTrainer), else None.
    _mesh = None
    # {"g": device, "d": device}: G and D on two devices of one process (set by
    # parallel.placement.place), else None.
    placement = None

    def _on(self, net):
        """The device scope of network `net` ("g" or "d") under a placement, else none.
        Forward AND backward ops go where they are created: each network's gradient is
        taken inside its own scope (`_d_grads`, `_g_grads`)."""
        if self.placement is None:
            return contextlib.nullcontext()
        return tf.device(self.placement[net])

    def _join(self, parts):
        """Concatenates per-example tensors along examples ([real; fake]). On a DTensor
        mesh, where DTensor cannot concatenate along the split batch axis, through
        `parallel.layouts.join_examples` (same values)."""
        if self._mesh is None:
            return tf.concat(parts, 0)
        from tf_gan_scale.parallel import layouts
        return layouts.join_examples(parts)

    def _d_grads(self, real, real_labels, rows, gb, step, k):
        """D's local gradients on real rows [m, ...] (global rows `rows` [m]) and as many
        fakes: (grads, this replica's share of the global mean D loss, [its shares of
        D's global mean real and fake outputs] for LeCam, else [])."""
        b = tf.shape(real)[0]
        z = latents.rows_normal(latents.key(self.seed, step, k), rows, [self.latent_dim])
        fake_labels = self._fake_labels(step, k, rows)
        with self._on("g"):
            fake = call_generator(self.generator, z, fake_labels, training=True)
        # One device sees [real rows 0..GB-1; fake rows 0..GB-1]: per-example noise in D
        # (dropout, augmentation, instance noise) is keyed by that global position.
        both_rows = self._join([rows, gb + rows])
        labels = self._join([real_labels, fake_labels])
        x = self._d_inputs(self._join([real, fake]), both_rows, step, k)
        with tf.GradientTape() as tape:
            # Real and fake go through D as ONE batch [2B, ...] (as in BigGAN-PyTorch): one
            # forward pass instead of two, and batch-norm statistics in D cover both halves.
            with latents.example_rows(both_rows):
                logits = self._discriminate(x, labels, training=True)
            real_logits, fake_logits = logits[:b], logits[b:]
            per_example = self.loss_fn(real_logits=real_logits, fake_logits=fake_logits).d
            if self.lecam_weight:
                per_example += self.lecam_weight * regularizers.lecam(
                    real_logits, fake_logits, self.lecam_anchors[0], self.lecam_anchors[1])
            if self.penalty_fn is not None:
                per_example += self._penalty(x[:b], x[b:], real_labels, rows, step, k)
            # This replica's share of the global mean; the all-reduce sums the shares.
            share = replica.global_mean(per_example, gb)
            loss = self.d_optimizer.scale_loss(share)
        grads = tape.gradient(loss, self.discriminator.trainable_variables)
        # LeCam's anchors move with D's GLOBAL mean outputs: their shares ride along.
        means = [replica.global_mean(tf.reshape(v, [-1]), gb)
                 for v in (real_logits, fake_logits)] if self.lecam_weight else []
        return grads, share, means

    @staticmethod
    def _count_skips(optimizer, skipped, tracker):
        """Logs the update dynamic loss scaling skipped (mixed_float16), if it can."""
        if isinstance(optimizer, keras.optimizers.LossScaleOptimizer):
            tracker.update_state(tf.cast(skipped, tf.float32))

    def _penalty(self, real, fake, labels, rows, step, k):
        """penalty_weight x the per-example penalty [B] (penalties.py) on what D saw; with
        penalty_every = e > 1 only in every e-th D update, times e (lazy regularization).
        A conditional D is evaluated with the real labels."""
        noise = latents.rows_uniform(
            latents.key(self.seed, step, latents.PENALTY_PHASE + k), rows, [])

        def discriminator(x, training=True):
            return self._discriminate(x, labels, training=training)

        def compute(weight):
            return weight * self.penalty_fn(discriminator, real=real, fake=fake, noise=noise)

        e = self.penalty_every
        if e == 1:
            return compute(self.penalty_weight)
        # D update number (0-based, all D updates so far): the same on every replica, so
        # every replica takes the same branch (D has no batch norm: no collective inside).
        update = tf.cast(step, tf.int64) * self.d_steps + k
        return tf.cond(tf.equal(update % e, 0), lambda: compute(self.penalty_weight * e),
                       lambda: tf.zeros(tf.shape(real)[:1]))

    def _g_update(self, b, step, uneven):
        """One G update on a fresh latent batch of size b (as K micro-batches with
        accumulation, as in `_d_update`); returns (global mean G loss, finite, global
        sum of `uneven`) as `_d_update`: `uneven` (this replica's verdict on the split of
        the D batches) rides along, so every replica and worker reaches the same verdict."""
        gb = replica.global_batch_size(b)
        rows = replica.global_rows(b)
        grads, shares = None, []
        with self._on("g"):  # D's passes inside go to D's device.
            for j, part in enumerate(self._micro_batches()):
                g, share = self._g_grads(rows[part], gb, step, regularize=j == 0)
                grads = g if grads is None else [_add_grads(x, y) for x, y in zip(grads, g)]
                shares.append(share)
            (g_loss, uneven), finite, norm, skipped = apply_global_gradients(
                self.g_optimizer, grads, self.generator.trainable_variables,
                [tf.add_n(shares), uneven], self.grad_pack_bytes)
        self.g_grad_norm_tracker.update_state(norm)
        if self.ema is not None:
            # Reads G's weights and the step after the update (automatic control
            # dependencies order reads after writes of the same variable).
            self.ema.update(self.generator, self.step)
        self._count_skips(self.g_optimizer, skipped, self.g_skipped_tracker)
        return g_loss, finite, uneven

    def _g_grads(self, rows, gb, step, regularize=True):
        """G's local gradients for the fakes of global rows `rows` [m]: (grads, this
        replica's share of the global mean G loss, plus the orthogonal regularizer's
        1/N if `regularize`: once per update, not per micro-batch)."""
        z = latents.rows_normal(latents.key(self.seed, step, latents.G_PHASE), rows,
                                [self.latent_dim])
        labels = self._fake_labels(step, latents.G_PHASE, rows)
        variables = self.generator.trainable_variables
        with self._on("g"), tf.GradientTape() as g_tape:
            fake = call_generator(self.generator, z, labels, training=True)
            targets = [fake]
            reg = None
            if self.ortho_weight and regularize:
                # Not per example: every replica adds 1/N of it, so the summed gradient
                # is the one-device gradient of the regularizer (regularizers.orthogonal).
                reg = self.ortho_weight * regularizers.orthogonal(
                    _ortho_weights(self.generator)) / replica.num_replicas()
                targets.append(self.g_optimizer.scale_loss(reg))
        # Back-propagated in two stages joined by the chain rule through `fake`: D's
        # (to d loss / d fake), then G's, so that under a placement each runs on its
        # network's device (gradient ops go where `gradient` is called). The same
        # gradient ops as one tape over both.
        with self._on("d"):
            with tf.GradientTape() as d_tape:
                d_tape.watch(fake)
                x = self._d_inputs(fake, rows, step, latents.G_PHASE)
                fake_logits = self._discriminate(x, labels, training=True)
                # real_logits only feed the D term, which G's gradient ignores.
                per_example = self.loss_fn(real_logits=fake_logits,
                                           fake_logits=fake_logits).g
                share = replica.global_mean(per_example, gb)
                loss = self.g_optimizer.scale_loss(share)
            d_fake = d_tape.gradient(loss, fake)
        with self._on("g"):
            # d loss / d fake into G, plus the regularizer's own gradient (weight 1).
            grads = g_tape.gradient(targets, variables, output_gradients=[d_fake] + [
                tf.ones_like(t) for t in targets[1:]])
        return grads, share if reg is None else share + reg

    def train_step(self, data):
        """One GAN step on this replica. Runs inside `strategy.run`.

        Args:
            data: with d_steps == 1 a batch; otherwise a tuple of `d_steps` batches, one
                real batch per D update (the step loop packs them). A batch is
                {"x": [B, ...], "label": [B]}, an (x, y) tuple or a tensor.

        Returns:
            {"d_loss": scalar, "g_loss": scalar, NONFINITE: int32 scalar}: the GLOBAL
            mean losses of this step (the last D update's for d_loss), the same on every
            replica, and 0, or NONFINITE_D / NONFINITE_G when that network's global loss
            or gradients, or its variables after the step, were not finite, or UNEVEN
            when the global batch did not split evenly over the replicas (every replica
            divided by a global batch of replicas x its own rows: wrong).
        """
        batches = (data,) if self.d_steps == 1 else tuple(data)
        step = self.step
        nonfinite = tf.constant(0, tf.int32)
        uneven = tf.constant(0.0)
        for k, batch in enumerate(batches):
            real, labels = _unpack(batch, need_labels=bool(self.num_classes))
            d_loss, finite, count = self._d_update(real, labels, step, k)
            nonfinite = tf.where(finite, nonfinite, NONFINITE_D)
            # This replica's rows differ from an even share of the global count. The
            # single-worker pre-step check (`make_train_function`) stops that before the
            # step; across workers it is summed in G's all-reduce, so all agree.
            even = tf.equal(count, tf.cast(replica.global_batch_size(tf.shape(real)[0]),
                                           tf.float32))
            uneven = tf.maximum(uneven, 1.0 - tf.cast(even, tf.float32))
            # Trackers hold global values on every replica: updating them is local, and
            # reading them in replica context (the step loop) needs no collective.
            self.d_loss_tracker.update_state(d_loss)
        g_loss, finite, uneven = self._g_update(tf.shape(real)[0], step, uneven)
        nonfinite = tf.where(tf.logical_or(finite, nonfinite > 0), nonfinite, NONFINITE_G)
        nonfinite = tf.where(uneven > 0, UNEVEN, nonfinite)
        # Finite gradients can still overflow a weight or a moving variance (a huge
        # learning rate, activations past 1e19): check the state a checkpoint would hold.
        # Local reads of mirrored variables: no collective.
        for network, code in ((self.discriminator, NONFINITE_D), (self.generator, NONFINITE_G)):
            finite = checks.all_finite(network.weights)
            nonfinite = tf.where(tf.logical_or(finite, nonfinite > 0), nonfinite, code)
        self.g_loss_tracker.update_state(g_loss)
        return {"d_loss": d_loss, "g_loss": g_loss, NONFINITE: nonfinite}

    # ---- the step loop ----------------------------------------------------------------

    def make_train_function(self, force=False):
        """`steps_per_execution` GAN steps per call, each pulling `d_steps` batches from the
        distributed iterator and running `train_step` on every replica.

        Returns the running means of the loss trackers. They hold global losses on every
        replica, so they are read from the first local replica: no collective beyond the
        ones the step needs (Keras reduces the trackers once per epoch, for its logs).
        A step whose global loss or gradients, or G's or D's variables after it, are not
        finite raises errors.NonFiniteError after the call, before any callback (so no
        checkpoint of it) runs.
        """
        if self.train_function is not None and not force:
            return self.train_function
        strategy = self.distribute_strategy
        d_steps = self.d_steps
        steps = int(self.steps_per_execution or 1)
        step_fn = _unconverted_if_own(self, "train_step")
        # XLA compiles the per-replica step only: the iterator, the step loop and the
        # strategy's plumbing stay in the surrounding graph.
        if self.xla:
            step_fn = tf.function(step_fn, jit_compile=True)

        def one_step(iterator, first):
            """Runs one GAN step; returns (code, step) of the first non-finite one."""
            code, at = first
            before = tf.identity(self.step)
            batches = tuple(next(iterator) for _ in range(d_steps))
            # The step's ops wait for the split check: nothing is updated when it fails.
            with tf.control_dependencies(
                    checks.assert_even_split(strategy, batches)
                    + checks.assert_accumulation_split(strategy, batches,
                                                       self.accumulation_steps)):
                out = strategy.run(step_fn, args=(batches if d_steps > 1 else batches[0],))
            new = strategy.experimental_local_results(out[NONFINITE])[0]
            fresh = tf.logical_and(code == 0, new > 0)
            return tf.where(fresh, new, code), tf.where(fresh, before, at)

        @tf.function
        def compiled(iterator):
            first = (tf.constant(0, tf.int32), tf.constant(-1, tf.int64))
            if steps == 1:
                first = one_step(iterator, first)
            else:
                for _ in tf.range(steps):
                    first = one_step(iterator, first)
            logs = strategy.run(lambda: {m.name: m.result() for m in self.metrics})
            logs = {k: strategy.experimental_local_results(v)[0] for k, v in logs.items()}
            return logs, first

        def train_function(iterator):
            try:
                logs, (code, at) = compiled(iterator)
            except tf.errors.InvalidArgumentError as e:
                if checks.ACCUMULATION_TAG in e.message:
                    # "assertion failed: [TAG] [16]": the rows follow the tag.
                    rows = e.message.split(checks.ACCUMULATION_TAG)[1].split("[")[1]
                    rows = rows.split("]")[0]
                    raise errors.ConfigError(
                        f"accumulation_steps={self.accumulation_steps} does not divide the "
                        f"per-replica batch of {rows} rows; valid: a divisor of {rows}"
                    ) from None
                if checks.UNEVEN_TAG not in e.message:
                    raise
                raise errors.UnevenBatchError(checks.uneven_message(
                    strategy, "before generator step %d (nothing was updated)"
                    % (int(self.step.numpy()) + 1))) from None
            if int(code) == UNEVEN:
                raise errors.UnevenBatchError(checks.uneven_message(
                    strategy, f"in generator step {int(at) + 1} (its update used a wrong "
                    f"global batch; nothing of it was saved)"))
            if int(code):
                network = {NONFINITE_D: "discriminator", NONFINITE_G: "generator"}[int(code)]
                raise errors.NonFiniteError(
                    f"non-finite {network} loss, gradients or weights in generator step "
                    f"{int(at) + 1}; training stopped before saving it")
            return logs

        self._step_function = compiled  # The traced step (tests count its collectives).
        self.train_function = train_function
        return train_function

    # ---- evaluation and inference ----------------------------------------------------

    def test_step(self, data, offset=0):
        """Global-mean losses on one held-out batch, both networks in inference mode.
        Runs inside `strategy.run`.

        Args:
            data: a real batch as in `train_step` (labels unused); the global batch may
                split unevenly over replicas (a last partial batch): rows are placed by
                `replica.global_rows_uneven`.
            offset: int32 scalar, evaluation examples before this batch in this
                `evaluate` call. Fake example i of an evaluation comes from latents (and
                a conditional one's class label) keyed by (seed, i) alone
                (`latents.EVAL_PHASE`), so the result depends on neither batch size nor
                topology. The fakes come from `sampler` (the EMA generator if any).

        Returns:
            {"d_loss", "g_loss": running global means over the evaluation so far (the
            adversarial losses; a gradient penalty is not part of them: it needs D in
            training mode), "examples": int32 global rows of this batch}.
        Collectives: one gather of row counts, one all-reduce of the two loss sums.
        """
        real, real_labels = _unpack(data)
        b = tf.shape(real)[0]
        rows, n = replica.global_rows_uneven(b)
        z = latents.rows_normal(latents.key(self.seed, latents.SAMPLE_STEP,
                                            latents.EVAL_PHASE), offset + rows,
                                [self.latent_dim])
        fake_labels = self._fake_labels(latents.SAMPLE_STEP, latents.EVAL_PHASE, offset + rows)

        def local_sums():
            fake = call_generator(self.sampler, z, fake_labels, training=False)
            logits = self._discriminate(tf.concat([real, fake], 0),
                                        tf.concat([real_labels, fake_labels], 0),
                                        training=False)
            out = self.loss_fn(real_logits=logits[:b], fake_logits=logits[b:])
            if self._fid is not None:
                self._fid.update(real, fake)
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
        self.d_loss_tracker.update_state(sums[0] / count, sample_weight=count)
        self.g_loss_tracker.update_state(sums[1] / count, sample_weight=count)
        return {"d_loss": self.d_loss_tracker.result(),
                "g_loss": self.g_loss_tracker.result(), "examples": n}

    def make_test_function(self, force=False):
        """`steps_per_execution` evaluation batches per call (fewer at the end of the
        data), each through `test_step` on every replica; logs read on the first local
        replica (the values are global)."""
        if self.test_function is not None and not force:
            return self.test_function
        strategy = self.distribute_strategy

        @tf.function
        def compiled(iterator, offset):
            out = strategy.run(_unconverted_if_own(self, "test_step"),
                               args=(next(iterator), offset))
            return {k: strategy.experimental_local_results(v)[0] for k, v in out.items()}

        def test_function(iterator):
            logs = None
            for _ in range(int(self.steps_per_execution or 1)):
                try:
                    logs = compiled(iterator, tf.constant(self._eval_offset, tf.int32))
                except (tf.errors.OutOfRangeError, StopIteration):
                    if logs is None:
                        raise  # Keras' loop ends the evaluation on it.
                    break
                self._eval_offset += int(logs.pop("examples"))
            return logs

        self.test_function = test_function
        return test_function

    def evaluate(self, *args, **kwargs):
        """`keras.Model.evaluate`; every call scores the same fakes for the same data.
        With `compile(fid_extractor=...)` the logs gain "fid" (last in a list result)."""
        self._eval_offset = 0
        if self._fid is None:
            return super().evaluate(*args, **kwargs)
        self._fid.reset()
        logs = super().evaluate(*args, **kwargs)
        fid = self._fid.result()
        if isinstance(logs, dict):
            return dict(logs, fid=fid)
        return (list(logs) if isinstance(logs, (list, tuple)) else [logs]) + [fid]

    def predict_step(self, data):
        """Samples [B, *data_shape] for a batch of latents z [B, latent_dim] (or (z, labels)
        for a generator with two inputs; an unconditional one ignores the labels), in
        inference mode, from `sampler` (the EMA generator if any). Keras' predict loop
        distributes the batches and concatenates the outputs in input order."""
        if isinstance(data, (tuple, list)) and len(data) == 1:
            data = data[0]
        generator = self.sampler
        if isinstance(data, (tuple, list)):
            z, labels = data[0], data[1]
            inputs = [z, tf.cast(labels, tf.int32)] if is_conditional(generator) else z
        else:
            z = inputs = data
        # A replica with no rows of a last partial batch: convolutions fail on empty
        # batches on CPU, so it returns an empty output of the right shape.
        out_shape = tf.concat([[0], tf.constant(generator.output_shape[1:])], 0)
        outputs = getattr(generator, "outputs", None)  # None for some subclasses.
        dtype = outputs[0].dtype if outputs else "float32"
        return tf.cond(tf.shape(z)[0] > 0, lambda: generator(inputs, training=False),
                       lambda: tf.zeros(out_shape, dtype))

    def _maybe_symbolic_build(self, iterator=None, data_batch=None):
        # Keras' version pulls a batch off the iterator (shifting the data order) and calls
        # strategy.reduce on it eagerly, which fails under MultiWorkerMirroredStrategy
        # (keras-team/keras#20585). Both networks are built in __init__, so skip it.
        return

    def generate(self, z, batch_size=256, labels=None):
        """Samples for latents z [N, latent_dim] (and labels [N] if conditional) ->
        [N, *data_shape], inference mode, from `sampler` (the EMA generator if any)."""
        return generate(self.sampler, z, batch_size, labels)


def _add_grads(a, b):
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


def _ortho_weights(generator):
    """G's weights under orthogonal regularization: trainable kernels of rank >= 2,
    without class embeddings (BigGAN-PyTorch leaves its shared embedding out)."""
    return [w for w in generator.trainable_weights
            if len(w.shape) >= 2 and "embedding" not in w.path.lower()]


def _saved_name(fn, table):
    """How compile config stores a loss or penalty: its registry name when it is one of
    ours (given by name or as the function), else Keras' serialization (which must be
    registered: Keras would otherwise resolve an unregistered `hinge` to its own)."""
    if isinstance(fn, str):
        return fn
    for name, known in table.items():
        if fn is known:
            return name
    return keras.saving.serialize_keras_object(fn)


def generate(generator, z, batch_size=256, labels=None):
    """generator(z) (or generator([z, labels]) if conditional) in inference mode, in
    chunks: z [N, latent_dim], labels int [N] -> [N, *data_shape]."""
    out = [call_generator(generator, z[i:i + batch_size],
                          None if labels is None else labels[i:i + batch_size])
           for i in range(0, int(z.shape[0]), batch_size)]
    return tf.concat(out, 0)
