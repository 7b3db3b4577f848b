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

import keras
import tensorflow as tf

from tf_gan_scale import errors, latents, losses, penalties, replica
from tf_gan_scale import gan_checks as checks
from tf_gan_scale.replica import apply_global_gradients

NONFINITE = "nonfinite"  # train_step output: which check failed (0: none).
NONFINITE_D, NONFINITE_G, UNEVEN = 1, 2, 3


def _unpack(batch):
    """Real images and labels from a batch: a dict {"x"|"image", "label"}, an (x, y) tuple,
    or a bare tensor. Returns (x [B, ...] float32, labels [B] int32)."""
    if isinstance(batch, dict):
        x = batch["x"] if "x" in batch else batch["image"]
        labels = batch.get("label")
    elif isinstance(batch, (tuple, list)):
        x, labels = batch[0], (batch[1] if len(batch) > 1 else None)
    else:
        x, labels = batch, None
    x = tf.cast(x, tf.float32)
    if labels is None:
        labels = tf.zeros([tf.shape(x)[0]], tf.int32)
    return x, tf.cast(labels, tf.int32)


@keras.saving.register_keras_serializable(package="tf_gan_scale")
class GAN(keras.Model):
    """A generator/discriminator pair with a distributed GAN train step.

    Args:
        generator: keras.Model, [B, latent_dim] -> [B, *data_shape].
        discriminator: keras.Model, [B, *data_shape] -> [B, 1] (or [B]) logits.
        latent_dim: int, size of z ~ N(0, I).
        seed: int, seeds all training randomness (latents, penalty noise).
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
                 sync_batch_norm="auto", **kwargs):
        super().__init__(**kwargs)
        if not generator.built:
            generator.build((None, int(latent_dim)))
        if not discriminator.built:
            discriminator.build((None,) + tuple(generator.output_shape[1:]))
        checks.check_networks(generator, discriminator)
        # Plain Keras BatchNormalization is per replica: swap in SyncBatchNormalization
        # (same weights) before the networks are tracked here (see convert.for_gan).
        from tf_gan_scale import convert
        generator, discriminator = convert.for_gan(generator, discriminator, sync_batch_norm)
        self.generator = generator
        self.discriminator = discriminator
        self.latent_dim = int(latent_dim)
        self.seed = int(seed)
        self._sync_batch_norm = sync_batch_norm
        self._eval_offset = 0  # Evaluation examples seen in this `evaluate` call.
        self.d_loss_tracker = keras.metrics.Mean(name="d_loss")
        self.g_loss_tracker = keras.metrics.Mean(name="g_loss")
        # Global gradient norms (of the summed gradients: no collective), for TensorBoard.
        self.d_grad_norm_tracker = keras.metrics.Mean(name="d_grad_norm")
        self.g_grad_norm_tracker = keras.metrics.Mean(name="g_grad_norm")
        # The wrapper has no call graph of its own; Keras' fit would try to trace one.
        self.built = True

    def get_config(self):
        return {"latent_dim": self.latent_dim, "seed": self.seed, "name": self.name,
                "sync_batch_norm": self._sync_batch_norm,
                "generator": keras.saving.serialize_keras_object(self.generator),
                "discriminator": keras.saving.serialize_keras_object(self.discriminator)}

    @classmethod
    def from_config(cls, config):
        config = dict(config)
        g = keras.saving.deserialize_keras_object(config.pop("generator"))
        d = keras.saving.deserialize_keras_object(config.pop("discriminator"))
        return cls(g, d, **config)

    def compile(self, *, g_optimizer, d_optimizer, loss="hinge", d_steps=1, penalty="none",
                penalty_weight=0.0, steps_per_execution=1, fid_extractor=None):
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
        """
        if int(d_steps) < 1:
            raise ValueError(f"d_steps must be >= 1; Received: d_steps={d_steps}")
        super().compile(steps_per_execution=steps_per_execution, jit_compile=False)
        self.g_optimizer = keras.optimizers.get(g_optimizer)
        self.d_optimizer = keras.optimizers.get(d_optimizer)
        # Keras' compile left its default optimizer (an unused, unbuilt RMSprop) in
        # `self.optimizer`, which callbacks read (BackupAndRestore builds it, outside the
        # strategy scope, and fails). The step counter is G's optimizer: it stands in.
        self.optimizer = self.g_optimizer
        self.loss_fn = losses.get(loss)
        self.penalty_fn = penalties.get(penalty)
        self.penalty_weight = float(penalty_weight)
        self.d_steps = int(d_steps)
        # What `get_compile_config` saves: names stay names; a custom loss callable must be
        # registered with keras.saving.register_keras_serializable to be reloaded.
        self._gan_compile_config = {
            "loss": _saved_name(loss, losses.LOSSES),
            "d_steps": self.d_steps,
            "penalty": _saved_name(penalty, penalties.PENALTIES),
            "penalty_weight": self.penalty_weight,
            "steps_per_execution": int(steps_per_execution), "fid_extractor": None}
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
        return [self.d_loss_tracker, self.g_loss_tracker, self.d_grad_norm_tracker,
                self.g_grad_norm_tracker]

    @property
    def step(self):
        """Generator steps taken so far (int64 variable)."""
        return self.g_optimizer.iterations

    def call(self, z, training=False):
        return self.generator(z, training=training)

    def checkpoint_items(self):
        """What a checkpoint must hold for an exact resume (the step is g_optimizer's)."""
        return {"generator": self.generator, "discriminator": self.discriminator,
                "g_optimizer": self.g_optimizer, "d_optimizer": self.d_optimizer}

    def load_weights(self, filepath, *args, **kwargs):
        """`keras.Model.load_weights`, inside the model's strategy scope: Keras'
        `BackupAndRestore` (and users) call it outside, and variables created under a
        strategy can only be restored within it."""
        with self.distribute_strategy.scope():
            return super().load_weights(filepath, *args, **kwargs)

    # ---- per-replica step -------------------------------------------------------------

    def _d_update(self, real, step, k):
        """One D update on this replica's real batch [B, ...].

        Returns (global mean D loss, finite, global row count): the loss of the whole
        global batch (its share rides on the gradient all-reduce, as does this replica's
        row count, so checking the split costs no collective) and whether it and the
        global gradients are finite (True when a LossScaleOptimizer handles overflow).
        """
        b = tf.shape(real)[0]
        gb = replica.global_batch_size(b)
        rows = replica.global_rows(b)  # The global rows of `real`: latents follow them.
        z = latents.rows_normal(latents.key(self.seed, step, k), rows, [self.latent_dim])
        fake = self.generator(z, training=True)
        with tf.GradientTape() as tape:
            # Real and fake go through D as ONE batch [2B, ...] (as in BigGAN-PyTorch): one
            # forward pass instead of two, and batch-norm statistics in D cover both halves.
            # One device sees [real rows 0..GB-1; fake rows 0..GB-1]: per-example noise in D
            # (dropout) is keyed by that global position.
            with latents.example_rows(tf.concat([rows, gb + rows], 0)):
                logits = self.discriminator(tf.concat([real, fake], 0), training=True)
            real_logits, fake_logits = logits[:b], logits[b:]
            per_example = self.loss_fn(real_logits=real_logits, fake_logits=fake_logits).d
            if self.penalty_fn is not None:
                noise = latents.rows_uniform(
                    latents.key(self.seed, step, latents.PENALTY_PHASE + k), rows, [])
                per_example += self.penalty_weight * self.penalty_fn(
                    self.discriminator, real=real, fake=fake, noise=noise)
            # This replica's share of the global mean; the all-reduce sums the shares.
            share = replica.global_mean(per_example, gb)
            loss = self.d_optimizer.scale_loss(share)
        grads = tape.gradient(loss, self.discriminator.trainable_variables)
        (d_loss, count), finite, norm = apply_global_gradients(
            self.d_optimizer, grads, self.discriminator.trainable_variables, [share, b])
        self.d_grad_norm_tracker.update_state(norm)
        return d_loss, finite, count

    def _g_update(self, b, step, uneven):
        """One G update on a fresh latent batch of size b; returns (global mean G loss,
        finite, global sum of `uneven`) as `_d_update`: `uneven` (this replica's verdict
        on the split of the D batches) rides along, so every replica and worker reaches
        the same verdict."""
        gb = replica.global_batch_size(b)
        z = latents.replica_normal(self.seed, step, latents.G_PHASE, b, [self.latent_dim])
        with tf.GradientTape() as tape:
            fake = self.generator(z, training=True)
            fake_logits = self.discriminator(fake, training=True)
            # real_logits only feed the D term, which G's gradient ignores.
            per_example = self.loss_fn(real_logits=fake_logits, fake_logits=fake_logits).g
            share = replica.global_mean(per_example, gb)
            loss = self.g_optimizer.scale_loss(share)
        grads = tape.gradient(loss, self.generator.trainable_variables)
        (g_loss, uneven), finite, norm = apply_global_gradients(
            self.g_optimizer, grads, self.generator.trainable_variables, [share, uneven])
        self.g_grad_norm_tracker.update_state(norm)
        return g_loss, finite, uneven

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
            real, _ = _unpack(batch)
            d_loss, finite, count = self._d_update(real, step, k)
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

        def one_step(iterator, first):
            """Runs one GAN step; returns (code, step) of the first non-finite one."""
            code, at = first
            before = tf.identity(self.step)
            batches = tuple(next(iterator) for _ in range(d_steps))
            # The step's ops wait for the split check: nothing is updated when it fails.
            with tf.control_dependencies(checks.assert_even_split(strategy, batches)):
                out = strategy.run(self.train_step,
                                   args=(batches if d_steps > 1 else batches[0],))
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
                `evaluate` call. Fake example i of an evaluation comes from latents keyed
                by (seed, i) alone (`latents.EVAL_PHASE`), so the result depends on
                neither batch size nor topology.

        Returns:
            {"d_loss", "g_loss": running global means over the evaluation so far (the
            adversarial losses; a gradient penalty is not part of them: it needs D in
            training mode), "examples": int32 global rows of this batch}.
        Collectives: one gather of row counts, one all-reduce of the two loss sums.
        """
        real, _ = _unpack(data)
        b = tf.shape(real)[0]
        rows, n = replica.global_rows_uneven(b)
        z = latents.rows_normal(latents.key(self.seed, latents.SAMPLE_STEP,
                                            latents.EVAL_PHASE), offset + rows,
                                [self.latent_dim])

        def local_sums():
            fake = self.generator(z, training=False)
            logits = self.discriminator(tf.concat([real, fake], 0), training=False)
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
            out = strategy.run(self.test_step, args=(next(iterator), offset))
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
        """Generator outputs [B, *data_shape] for a batch of latents z [B, latent_dim] (or
        (z, labels) for a generator with two inputs; an unconditional one ignores the
        labels), in inference mode. Keras' predict loop distributes the batches and
        concatenates the outputs in input order."""
        if isinstance(data, (tuple, list)) and len(data) == 1:
            data = data[0]
        if isinstance(data, (tuple, list)):
            z, labels = data[0], data[1]
            inputs = [z, labels] if len(self.generator.inputs or [z]) == 2 else z
        else:
            inputs = data
        z = inputs[0] if isinstance(inputs, list) else inputs
        # A replica with no rows of a last partial batch: convolutions fail on empty
        # batches on CPU, so it returns an empty output of the right shape.
        out_shape = tf.concat([[0], tf.constant(self.generator.output_shape[1:])], 0)
        outputs = getattr(self.generator, "outputs", None)  # None for some subclasses.
        dtype = outputs[0].dtype if outputs else "float32"
        return tf.cond(tf.shape(z)[0] > 0, lambda: self.generator(inputs, training=False),
                       lambda: tf.zeros(out_shape, dtype))

    def _maybe_symbolic_build(self, iterator=None, data_batch=None):
        # Keras' version pulls a batch off the iterator (shifting the data order) and calls
        # strategy.reduce on it eagerly, which fails under MultiWorkerMirroredStrategy
        # (keras-team/keras#20585). Both networks are built in __init__, so skip it.
        return

    def generate(self, z, batch_size=256):
        """Generator outputs for latents z [N, latent_dim] -> [N, *data_shape], inference mode."""
        return generate(self.generator, z, batch_size)


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


def generate(generator, z, batch_size=256):
    """generator(z) in inference mode, in chunks: z [N, latent_dim] -> [N, *data_shape]."""
    out = [generator(z[i:i + batch_size], training=False)
           for i in range(0, int(z.shape[0]), batch_size)]
    return tf.concat(out, 0)
