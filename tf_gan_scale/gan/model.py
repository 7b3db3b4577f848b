"""GAN(keras.Model): a generator/discriminator pair trained with Keras `fit` under any strategy.

    with strategy.scope():
        gan = GAN(generator=g, discriminator=d, latent_dim=100, seed=0)
        gan.compile(g_optimizer=keras.optimizers.Adam(1e-4),
                    d_optimizer=keras.optimizers.Adam(1e-4), loss="hinge", d_steps=1)
    gan.fit(dataset, epochs=..., steps_per_epoch=...)

This module is the Keras glue: the networks, optimizers and trackers as Keras state, the
settings as a `StepConfig` (step_config.py) in `.keras` files, `fit` / `evaluate` /
`predict`. The step math is `GanStep` (step.py); the traced loop around `strategy.run`
is step_function.py. The step counter is `g_optimizer.iterations`.
"""

import keras
import tensorflow as tf

from tf_gan_scale import errors
from tf_gan_scale.architectures import calls
from tf_gan_scale.gan import checks, step_function
from tf_gan_scale.gan import ema as ema_lib
from tf_gan_scale.gan.step import REPLICAS, GanStep
from tf_gan_scale.gan.step_config import ADA_PIPES, StepConfig
from tf_gan_scale.layers import convert
from tf_gan_scale.metrics import scoring


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
        ema_decay / ema_start / ema_warmup: an EMA copy of the generator (`gan/ema.py`),
            `gan.ema_generator`, when ema_decay > 0 (e.g. 0.999).
        ema_kimg / ema_rampup / ema_batch_size: StyleGAN2-ADA's EMA instead (a half-life
            in thousands of images, ramped up with the images seen; the global batch
            size), when ema_kimg > 0. It is what `gan(z)`,
            `predict`, `generate`, sample grids and scores use (`gan.sampler`).
        ema_cosine: R3GAN's EMA instead, (base_kimg, final_kimg, total_images): the
            half-life on a cosine in the images seen (schedules.py; ema_batch_size is
            the global batch); it turns the EMA on by itself.
        sync_batch_norm: "auto" (default), True or False. Plain Keras
            `BatchNormalization` computes per-replica statistics; "auto" replaces it by
            `layers.SyncBatchNormalization` (same config and weights: global-batch
            statistics) when the GAN is created under a strategy with more than one
            replica, True always, False never (see `layers/convert.py`). Use `gan.generator` /
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
                 ema_warmup=0, ema_kimg=0.0, ema_rampup=0.0, ema_batch_size=0,
                 ema_cosine=None, **kwargs):
        super().__init__(**kwargs)
        if not generator.built:
            generator.build((None, int(latent_dim)))
        if not discriminator.built:
            discriminator.build((None,) + tuple(generator.output_shape[1:]))
        checks.check_networks(generator, discriminator, int(num_classes))
        # Plain Keras BatchNormalization is per replica: swap in SyncBatchNormalization
        # (same weights) before the networks are tracked here (see convert.for_gan).
        generator, discriminator = convert.for_gan(generator, discriminator, sync_batch_norm)
        self.generator = generator
        self.discriminator = discriminator
        self.latent_dim = int(latent_dim)
        self.seed = int(seed)
        self.num_classes = int(num_classes)
        self._sync_batch_norm = sync_batch_norm
        self._ema_config = {"ema_decay": float(ema_decay), "ema_start": int(ema_start),
                            "ema_warmup": int(ema_warmup), "ema_kimg": float(ema_kimg),
                            "ema_rampup": float(ema_rampup),
                            "ema_batch_size": int(ema_batch_size)}
        if ema_cosine:  # In .keras files of this version only (older ones had none).
            self._ema_config["ema_cosine"] = [float(v) for v in ema_cosine]
        self.ema = None
        if ema_decay or ema_kimg or ema_cosine:
            self.ema = ema_lib.GeneratorEMA(generator, ema_decay, ema_start, ema_warmup,
                                            ema_kimg, ema_rampup, ema_batch_size,
                                            cosine=ema_cosine)
            self.ema_generator = self.ema.model
        self.eval_offset = 0  # Evaluation examples seen in this `evaluate` call.
        self._topology = REPLICAS  # How an engine runs the step (gan.step.Topology).
        self.gan_step = None  # The step math (GanStep), made by compile.
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

    def compile(self, *, g_optimizer, d_optimizer, steps_per_execution=1, fid_extractor=None,
                **knobs):
        """Configures training.

        Args:
            g_optimizer / d_optimizer: keras optimizers (or names) for G and D.
            steps_per_execution: int >= 1, training steps per call of the step function.
            fid_extractor: optional extractor spec (`metrics.extractors.get`: a .keras
                file, "inception_v3", "fid_inception:PATH.pb"): `evaluate` then also
                reports "fid" between the data it is given and as many fakes, computed
                across replicas (the extractor's name is logged with it).
            **knobs: the step's settings, each a field of `StepConfig` (its docstring and
                field docs): loss, d_steps, penalty, penalty_weight, penalty_every,
                augment, label_smoothing, instance_noise, instance_noise_steps,
                lecam_weight, lecam_decay, ortho_weight, accumulation_steps,
                grad_pack_bytes, jit_compile. A bad one raises ConfigError naming
                config.train.<key>; an unknown one TypeError.
        """
        config = StepConfig(**knobs)
        strategy = self.distribute_strategy
        tpu = isinstance(strategy, tf.distribute.TPUStrategy)
        config.validate(discriminator=self.discriminator, generator=self.generator,
                        num_replicas=strategy.num_replicas_in_sync, tpu=tpu)
        super().compile(steps_per_execution=steps_per_execution, jit_compile=False)
        self.step_config = config
        # A TPUStrategy compiles every step with XLA anyway.
        self.xla = config.xla and not tpu
        self.g_optimizer = keras.optimizers.get(g_optimizer)
        self.d_optimizer = keras.optimizers.get(d_optimizer)
        if config.grad_nan_to_num and any(
                isinstance(o, keras.optimizers.LossScaleOptimizer)
                for o in (self.g_optimizer, self.d_optimizer)):
            # Cleaned gradients would hide from the loss scaler the overflows that steer it
            # (training/prepare.py says the same for the config path, before building).
            raise errors.ConfigError(
                "config.train.grad_nan_to_num=True cannot run with a LossScaleOptimizer "
                "(its loss scaling needs to see overflows); valid: plain optimizers with "
                "float16 blocks (config.model.num_fp16_res), or grad_nan_to_num=False")
        # Keras' compile left its default optimizer (an unused, unbuilt RMSprop) in
        # `self.optimizer`, which callbacks read (BackupAndRestore builds it, outside the
        # strategy scope, and fails). The step counter is G's optimizer: it stands in.
        self.optimizer = self.g_optimizer
        self._fid = None
        if fid_extractor:
            self._fid = scoring.FidStreams(self, fid_extractor)
        # Optimizers must own their slots before the step function is traced under a
        # strategy, or the first step fails with a placeholder error.
        with strategy.scope():
            self.g_optimizer.build(self.generator.trainable_variables)
            self.d_optimizer.build(self.discriminator.trainable_variables)
            # LeCam's anchors: EMAs of D's global mean real / fake outputs, state that a
            # checkpoint must hold. Every replica computes them from the same global
            # means, so each updates its own copy (aggregation NONE) identically.
            if config.lecam_weight and getattr(self, "lecam_anchors", None) is None:
                self.lecam_anchors = keras.Variable([0.0, 0.0], trainable=False,
                                                    name="lecam_anchors")
            # StyleGAN2-ADA's state, updated from global values on every replica like
            # the anchors: ADA's p and its statistic [sum of sign(D(real)), count], the
            # path-length mean.
            if config.augment in ADA_PIPES and getattr(self, "ada_p", None) is None:
                self.ada_p = keras.Variable(float(config.ada_p), trainable=False,
                                            name="ada_p")
                self.ada_stats = keras.Variable([0.0, 0.0], trainable=False,
                                                name="ada_stats")
            if config.pl_weight and getattr(self, "pl_mean", None) is None:
                self.pl_mean = keras.Variable(0.0, trainable=False, name="pl_mean")
        self.gan_step = GanStep(
            generator=self.generator, discriminator=self.discriminator, config=config,
            latent_dim=self.latent_dim, seed=self.seed, num_classes=self.num_classes,
            g_optimizer=self.g_optimizer, d_optimizer=self.d_optimizer, ema=self.ema,
            lecam_anchors=getattr(self, "lecam_anchors", None),
            trackers={m.name: m for m in (
                self.d_loss_tracker, self.g_loss_tracker, self.d_grad_norm_tracker,
                self.g_grad_norm_tracker, self.d_skipped_tracker, self.g_skipped_tracker)},
            topology=self._topology,
            ada_state=(self.ada_p, self.ada_stats) if config.augment in ADA_PIPES else None,
            pl_mean=getattr(self, "pl_mean", None) if config.pl_weight else None)
        self.train_function = None

    def get_compile_config(self):
        """The step's settings (StepConfig.to_config), steps_per_execution, the FID
        extractor's name and both optimizers with their config (their state is in the
        weights file): what `keras.models.load_model` passes back to `compile` (Keras'
        default would record one unused RMSprop)."""
        if not self.compiled:
            return None
        return dict(self.step_config.to_config(),
                    steps_per_execution=int(self.steps_per_execution or 1),
                    fid_extractor=self._fid.extractor.name if self._fid else None,
                    g_optimizer=keras.saving.serialize_keras_object(self.g_optimizer),
                    d_optimizer=keras.saving.serialize_keras_object(self.d_optimizer))

    def compile_from_config(self, config):
        config = dict(config)
        knobs = StepConfig.from_config(config)
        # Inside the strategy scope the GAN was created in: optimizer slots must be
        # mirrored like the variables they belong to.
        with self.distribute_strategy.scope():
            self.compile(g_optimizer=keras.optimizers.deserialize(config["g_optimizer"]),
                         d_optimizer=keras.optimizers.deserialize(config["d_optimizer"]),
                         steps_per_execution=config.get("steps_per_execution", 1),
                         fid_extractor=config.get("fid_extractor"),
                         **{k: getattr(knobs, k) for k in StepConfig.names()})

    # The settings most read from outside (all of them: `step_config`).

    @property
    def d_steps(self):
        return self.step_config.d_steps

    @property
    def loss_fn(self):
        return self.gan_step.loss_fn

    @property
    def penalty_fn(self):
        return self.gan_step.penalty_fn

    @property
    def penalty_weight(self):
        return float(self.step_config.penalty_weight)

    @property
    def accumulation_steps(self):
        return self.step_config.accumulation_steps

    @property
    def lecam_weight(self):
        return float(self.step_config.lecam_weight)

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

    @property
    def topology(self):
        """How the engine runs the step (`gan.step.Topology`): `REPLICAS` under a
        tf.distribute strategy; `parallel.placement.place` and `parallel.step` set their own."""
        return self._topology

    @topology.setter
    def topology(self, topology):
        self._topology = topology
        if self.gan_step is not None:
            self.gan_step.topology = topology

    def call(self, z, training=False):
        """Samples: `gan(z)` or, conditional, `gan([z, labels])` (the EMA generator if any)."""
        if isinstance(z, (tuple, list)):
            z, labels = z
            return calls.call_generator(self.sampler, z, labels, training=training)
        return calls.call_generator(self.sampler, z, training=training)

    def checkpoint_items(self):
        """What a checkpoint must hold for an exact resume (the step is g_optimizer's)."""
        items = {"generator": self.generator, "discriminator": self.discriminator,
                 "g_optimizer": self.g_optimizer, "d_optimizer": self.d_optimizer}
        if self.ema is not None:
            items["ema_generator"] = self.ema.model
        return {**items, **self.step_state()}

    def step_state(self):
        """{name: variable} of the step's own state beyond networks and optimizers, those
        this GAN's knobs create: LeCam's anchors, ADA's p and statistic, the path-length
        mean. Checkpointed (`checkpoint_items`); small, so a mesh replicates them."""
        names = ("lecam_anchors", "ada_p", "ada_stats", "pl_mean")
        return {n: getattr(self, n) for n in names if getattr(self, n, None) is not None}

    def load_weights(self, filepath, *args, **kwargs):
        """`keras.Model.load_weights`, inside the model's strategy scope: Keras'
        `BackupAndRestore` (and users) call it outside, and variables created under a
        strategy can only be restored within it."""
        with self.distribute_strategy.scope():
            return super().load_weights(filepath, *args, **kwargs)

    # ---- the step: GanStep's math, the traced loop of step_function.py ----------------------

    @step_function.own_step
    def train_step(self, data):
        """One GAN step on this replica (`GanStep.train`). Runs inside `strategy.run`.

        Args:
            data: with d_steps == 1 a batch; otherwise a tuple of `d_steps` batches.

        Returns:
            {"d_loss", "g_loss": global mean losses, gan.NONFINITE: int32 code}.
        """
        return self.gan_step.train(data)

    def make_train_function(self, force=False):
        """The step loop (step_function.make_train_function)."""
        if self.train_function is not None and not force:
            return self.train_function
        self.train_function = step_function.make_train_function(self)
        return self.train_function

    @step_function.own_step
    def test_step(self, data, offset=0):
        """Global-mean losses on one held-out batch (`GanStep.evaluate`)."""
        return self.gan_step.evaluate(data, offset, self._fid)

    def make_test_function(self, force=False):
        """The evaluation loop (step_function.make_test_function)."""
        if self.test_function is not None and not force:
            return self.test_function
        self.test_function = step_function.make_test_function(self)
        return self.test_function

    def evaluate(self, *args, **kwargs):
        """`keras.Model.evaluate`; every call scores the same fakes for the same data.
        With `compile(fid_extractor=...)` the logs gain "fid" (last in a list result)."""
        self.eval_offset = 0
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
            inputs = [z, tf.cast(labels, tf.int32)] if calls.is_conditional(generator) else z
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
        return calls.generate(self.sampler, z, batch_size, labels)

