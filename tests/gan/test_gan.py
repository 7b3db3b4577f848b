"""In-process GAN tests on 1 device and 2 logical CPU replicas."""

import keras
import numpy as np
import pytest
import tensorflow as tf

from conftest import shared
from helpers.tiny_gan import GB, LATENT, digits, fit, make, samples
from tf_gan_scale import architectures, data, errors, gan, latents, replica
from tf_gan_scale.gan.step import ortho_weights
from tf_gan_scale.layers import ReplicaDropout

def test_logged_losses_are_the_true_global_means(one_device):
    model = make(one_device, d_norm="none")
    g0 = [w.numpy() for w in model.generator.weights]
    history = fit(model, one_device, 1)
    real = next(iter(digits()))["x"]
    # D loss: initial D on the first batch and on G(z) with the phase-0 latents of step 0.
    d_after = [w.numpy() for w in model.discriminator.weights]
    model.generator.set_weights(g0)
    g_init = make(one_device, d_norm="none").discriminator
    fake = model.generator(latents.global_normal(5, 0, 0, GB, [LATENT]), training=True)
    d_loss = np.mean(tf.nn.softplus(-g_init(real, training=True))
                     + tf.nn.softplus(g_init(fake, training=True)))
    np.testing.assert_allclose(history["d_loss"][0], d_loss, rtol=1e-5)
    # G loss: updated D on G(z) with the G-phase latents, before G's update.
    model.discriminator.set_weights(d_after)
    fake = model.generator(latents.global_normal(5, 0, latents.G_PHASE, GB, [LATENT]),
                           training=True)
    g_loss = np.mean(tf.nn.softplus(-model.discriminator(fake, training=True)))
    np.testing.assert_allclose(history["g_loss"][0], g_loss, rtol=1e-5)


def weights(model):
    return [w.numpy() for w in model.generator.weights + model.discriminator.weights]


@pytest.mark.slow
def test_two_replicas_match_one_device_and_log_the_same(one_device, mirrored2):
    # Plain SGD: a wrong gradient scale would show (tests/integration/test_equivalence.py has the
    # measured tolerance and the full set of cases).
    a, b = shared(make, one_device, sgd=True), shared(make, mirrored2, sgd=True)
    ha, hb = fit(a, one_device, 4), fit(b, mirrored2, 4)
    for wa, wb in zip(weights(a), weights(b)):
        assert np.abs(wa - wb).max() <= 1e-5 * (1 + np.abs(wa).max())
    np.testing.assert_allclose(ha["d_loss"], hb["d_loss"], rtol=1e-5)
    np.testing.assert_allclose(ha["g_loss"], hb["g_loss"], rtol=1e-5)


@pytest.mark.slow
def test_local_batch_norm_breaks_equivalence(one_device, mirrored2):
    a, b = make(one_device, sync_bn=False), make(mirrored2, sync_bn=False)
    fit(a, one_device, 4)
    fit(b, mirrored2, 4)
    assert np.abs(samples(a) - samples(b)).max() > 1e-3


@pytest.mark.slow
def test_d_steps_counts_optimizer_iterations(mirrored2):
    model = make(mirrored2, d_steps=3)
    fit(model, mirrored2, 4)
    assert int(model.g_optimizer.iterations.numpy()) == 4
    assert int(model.d_optimizer.iterations.numpy()) == 12


@pytest.mark.slow
def test_steps_per_execution_gives_the_same_weights(mirrored2):
    # Plain SGD (an update is lr x the gradient: nothing divides an error away).
    a, b = shared(make, mirrored2, sgd=True), make(mirrored2, sgd=True, spe=2)
    after_3 = []  # a's samples after its third step: what a lost step would leave.

    class Third(keras.callbacks.Callback):
        def on_train_batch_end(self, batch, logs=None):
            if batch == 2:
                after_3.append(samples(a))

    a.fit(mirrored2.experimental_distribute_dataset(digits()), epochs=1, steps_per_epoch=4,
          verbose=0, callbacks=[Third()])
    fit(b, mirrored2, 4)
    assert int(a.step.numpy()) == int(b.step.numpy()) == 4
    np.testing.assert_allclose(samples(a), samples(b), atol=1e-6)
    # The check can fail: one step fewer (or a batch used twice) moves the samples by
    # far more than the tolerance.
    assert np.abs(after_3[0] - samples(a)).max() > 100 * 1e-6


def test_replica_latents_are_rows_of_the_global_batch(mirrored2):
    @tf.function
    def draw():
        return mirrored2.run(lambda: latents.replica_normal(1, 7, 0, 3, [LATENT]))

    per_replica = mirrored2.experimental_local_results(draw())
    np.testing.assert_array_equal(np.concatenate(per_replica),
                                  latents.global_normal(1, 7, 0, 6, [LATENT]).numpy())
    assert not np.allclose(per_replica[0], per_replica[1])


def test_dropout_masks_differ_across_replicas(mirrored2):
    with mirrored2.scope():
        layer = ReplicaDropout(0.5, seed=3)

    @tf.function
    def masks():
        return mirrored2.run(lambda: layer(tf.ones([4, 64]), training=True))

    m0, m1 = mirrored2.experimental_local_results(masks())
    assert not np.array_equal(m0.numpy(), m1.numpy())
    assert set(np.unique(m0.numpy())) <= {0.0, 2.0}
    # Keras' own Dropout repeats the same mask on every replica: what this layer fixes.
    with mirrored2.scope():
        plain = keras.layers.Dropout(0.5, seed=3)
    p0, p1 = mirrored2.experimental_local_results(
        tf.function(lambda: mirrored2.run(lambda: plain(tf.ones([4, 64]), training=True)))())
    np.testing.assert_array_equal(p0.numpy(), p1.numpy())


def test_dropout_masks_follow_global_rows_not_replicas(one_device, mirrored2):
    # D sees [real; fake] as one batch: on one device rows [0, 8) then [8, 16); each replica
    # declares its halves' global rows the same way, so its masks are one device's rows.
    def masks(strategy):
        with strategy.scope():
            layer = ReplicaDropout(0.5, seed=3)

        def fn():
            b = 8 // strategy.num_replicas_in_sync
            rows = replica.global_rows(b)
            with latents.example_rows(tf.concat([rows, 8 + rows], 0)):
                first = layer(tf.ones([2 * b, 6]), training=True)
            return first, layer(tf.ones([2 * b, 6]), training=True)  # Next call: new masks.

        out = tf.function(lambda: strategy.run(fn))()
        parts = [[t.numpy() for t in strategy.experimental_local_results(o)] for o in out]
        # Reassemble one device's order: every replica's real half, then every fake half.
        first = np.concatenate([p[:len(p) // 2] for p in parts[0]]
                               + [p[len(p) // 2:] for p in parts[0]])
        return first, np.concatenate(parts[1])

    one, two = masks(one_device), masks(mirrored2)
    np.testing.assert_array_equal(one[0], two[0])
    assert set(np.unique(one[0])) == {0.0, 2.0}
    assert not np.array_equal(one[0], one[1])  # Each call draws fresh masks.


@pytest.mark.parametrize("batch", ["tensor", "tuple"])
def test_fit_accepts_plain_batches(one_device, batch):
    x = data.load("embedded:digits").arrays["x"][:64]
    ds = tf.data.Dataset.from_tensor_slices(x if batch == "tensor" else (x, np.zeros(64)))
    model = make(one_device)
    history = model.fit(ds.batch(GB, drop_remainder=True), epochs=2, verbose=0).history
    assert len(history["d_loss"]) == 2 and int(model.step.numpy()) == 8  # Finite: 4/epoch.


# Bounds that bind on every step (SGD: the global gradient norms are ~4 (G) and ~6 (D),
# every variable's with a gradient >= 0.05; elements up to ~1), yet large enough that
# the clipped updates move the samples far above float32 rounding.
CLIPS = [{"global_clipnorm": 0.05}, {"clipnorm": 0.01}, {"clipvalue": 1e-3}]


@pytest.mark.parametrize("clip", CLIPS)
def test_optimizer_clipping_acts_on_global_gradients(one_device, mirrored2, clip):
    # Keras clips before its own all-reduce, i.e. per replica; the GAN reduces first.
    # Plain SGD: the update is lr x the clipped gradient.
    models = [make(s, sgd=True, **clip) for s in (one_device, mirrored2)]
    for model, strategy in zip(models, (one_device, mirrored2)):
        fit(model, strategy, 2)
    np.testing.assert_allclose(samples(models[0]), samples(models[1]), atol=2e-6)
    # The check can fail: the bound binds (twice the bound moves the samples by 5e-4 to
    # 9e-4, measured), 100x the tolerance.
    (key, bound), = clip.items()
    loose = make(one_device, sgd=True, **{key: 2 * bound})
    fit(loose, one_device, 2)
    assert np.abs(samples(loose) - samples(models[0])).max() > 100 * 2e-6


def test_loss_scale_overflow_check_sees_an_inf_on_any_replica(mirrored2):
    # An inf gradient on replica 1 only: the update must be skipped on BOTH replicas (and
    # the loss scale halved); Keras' own check looked at replica 0's local gradient.
    with mirrored2.scope():
        var = tf.Variable([1.0, 2.0])
        opt = keras.optimizers.LossScaleOptimizer(keras.optimizers.SGD(0.1),
                                                  initial_scale=8.0)
        opt.build([var])

    @tf.function
    def step(bad):
        def replica_fn():
            rid = tf.distribute.get_replica_context().replica_id_in_sync_group
            g = tf.where(tf.logical_and(bad, rid == 1), np.inf, 8.0) * tf.ones([2])
            replica.apply_global_gradients(opt, [g], [var])
        mirrored2.run(replica_fn)

    step(tf.constant(True))
    for v in mirrored2.experimental_local_results(var):
        np.testing.assert_array_equal(v.numpy(), [1.0, 2.0])
    assert float(opt.dynamic_scale.numpy()) == 4.0
    step(tf.constant(False))  # Global gradient 2 x 8 / scale 4 = 4 per element.
    for v in mirrored2.experimental_local_results(var):
        np.testing.assert_allclose(v.numpy(), [0.6, 1.6], rtol=1e-6)


def test_nan_to_num_cleans_the_global_gradients_on_every_replica(mirrored2):
    # StyleGAN2-ADA's cleaning (NaN -> 0, +-inf -> +-1e5) acts on the all-reduced sums:
    # a NaN on replica 1 only zeroes that element on both replicas, the rest is the
    # ordinary global SGD step, and the step counts as finite. Without it the same
    # gradients make the step non-finite.
    with mirrored2.scope():
        var = tf.Variable(tf.zeros([4]))
        opt = keras.optimizers.SGD(1.0)
        opt.build([var])

    @tf.function
    def step(clean):
        def replica_fn():
            rid = tf.cast(tf.distribute.get_replica_context().replica_id_in_sync_group,
                          tf.float32)
            g = tf.stack([tf.where(rid > 0, np.nan, 0.0), np.inf, -np.inf, 1.0 + rid])
            _, finite, _, _ = replica.apply_global_gradients(opt, [g], [var],
                                                             nan_to_num=clean)
            return finite
        return mirrored2.experimental_local_results(mirrored2.run(replica_fn))

    assert all(bool(f) for f in step(True))
    for v in mirrored2.experimental_local_results(var):
        np.testing.assert_array_equal(v.numpy(), [0.0, -1e5, 1e5, -3.0])
    assert not any(bool(f) for f in step(False))



def test_compile_refuses_gradient_cleaning_with_loss_scaling():
    # The config path refuses it in training.validate; a notebook's compile must too.
    keras.utils.set_random_seed(0)
    g, d = architectures.build("dcgan", data_shape=(8, 8, 1), latent_dim=LATENT,
                               g_channels=(8, 4, 4), d_channels=(4, 4))
    model = gan.GAN(g, d, LATENT)
    scaled = keras.optimizers.LossScaleOptimizer(keras.optimizers.SGD())
    with pytest.raises(errors.ConfigError, match="grad_nan_to_num=True cannot run with a "
                                                 "LossScaleOptimizer"):
        model.compile(g_optimizer=scaled, d_optimizer="sgd", grad_nan_to_num=True)
    model.compile(g_optimizer=scaled, d_optimizer="sgd")

def test_packed_gradients_are_all_reduced_last_layers_first(mirrored2, monkeypatch):
    # grad_pack_bytes issues the collectives in REVERSE variable order (backprop makes
    # the last layers' gradients first, so their packs can travel early); the sums are
    # the same in either order, so only the order handed to the all-reduce shows it.
    with mirrored2.scope():
        variables = [tf.Variable(tf.zeros([n])) for n in (3, 5, 7)]
        opt = keras.optimizers.SGD(1.0)
        opt.build(variables)
    seen = []
    all_reduce = tf.distribute.ReplicaContext.all_reduce

    def recording(self, op, values, options=None):
        seen.append([tuple(v.shape) for v in tf.nest.flatten(values)])
        return all_reduce(self, op, values, options)

    monkeypatch.setattr(tf.distribute.ReplicaContext, "all_reduce", recording)

    @tf.function
    def step(pack_bytes):
        def replica_fn():
            grads = [tf.ones([n]) for n in (3, 5, 7)]
            replica.apply_global_gradients(opt, grads, variables, riders=[1.0],
                                           pack_bytes=pack_bytes)
        mirrored2.run(replica_fn)

    step(64)
    assert seen[0] == [(7,), (5,), (3,), ()]  # Riders last, after every gradient.
    for v in variables:  # Each gradient lands on its own variable: SGD(1) of 2 x ones.
        np.testing.assert_array_equal(mirrored2.experimental_local_results(v)[1].numpy(),
                                      -2 * np.ones(v.shape))
    seen.clear()
    step(0)
    assert seen[0] == [(3,), (5,), (7,), ()]


def test_preemption_callback_gives_sigterm_back_after_training(one_device, tmp_path):
    import signal
    from tf_gan_scale.training import callbacks
    model = make(one_device)
    manager = tf.train.CheckpointManager(tf.train.Checkpoint(**model.checkpoint_items()),
                                         str(tmp_path), 1)
    before = signal.getsignal(signal.SIGTERM)
    seen = []

    class Probe(keras.callbacks.Callback):
        def on_train_batch_end(self, batch, logs=None):
            seen.append(signal.getsignal(signal.SIGTERM))

    model.fit(one_device.experimental_distribute_dataset(digits()), epochs=1, steps_per_epoch=1,
              verbose=0, callbacks=[callbacks.Preemption(one_device, manager), Probe()])
    assert seen and seen[0] is not before  # The handler's, during training.
    assert signal.getsignal(signal.SIGTERM) is before


def test_networks_that_do_not_fit_together_fail_before_any_step():
    def g(shape):
        return keras.Sequential([keras.Input((4,)), keras.layers.Dense(int(np.prod(shape))),
                                 keras.layers.Reshape(shape)])

    def d(shape, logits=1):
        return keras.Sequential([keras.Input(shape), keras.layers.Flatten(),
                                 keras.layers.Dense(logits)])

    with pytest.raises(ValueError, match=r"samples have shape \(8, 8, 1\) but the "
                                         r"discriminator takes \(28, 28, 1\)"):
        gan.GAN(g((8, 8, 1)), d((28, 28, 1)), 4)
    with pytest.raises(ValueError, match=r"logits of shape \[B, 1\] or \[B\]; "
                                         r"Received: \[B, 3\]"):
        gan.GAN(g((8, 8, 1)), d((8, 8, 1), logits=3), 4)
    with pytest.raises(ValueError, match="compile"):  # Keras' own check, before any step.
        gan.GAN(g((8, 8, 1)), d((8, 8, 1)), 4).fit(np.zeros((16, 8, 8, 1), np.float32),
                                                    batch_size=8, verbose=0)


@pytest.mark.parametrize("strategy_name", ["one_device", "mirrored2"])
def test_logged_gradient_norms_are_the_global_ones(strategy_name, request):
    # With plain SGD an update is -lr * the global gradient: its norm over a network's
    # trainable weights, divided by lr, is the gradient norm the step must log.
    strategy = request.getfixturevalue(strategy_name)
    model = shared(make, strategy, sgd=True)
    before = {n: [v.numpy() for v in getattr(model, n).trainable_variables]
              for n in ("generator", "discriminator")}
    logs = fit(model, strategy, 1)
    for name, key in (("generator", "g_grad_norm"), ("discriminator", "d_grad_norm")):
        after = [v.numpy() for v in getattr(model, name).trainable_variables]
        step = np.sqrt(sum(np.sum((a - b) ** 2) for a, b in zip(after, before[name])))
        np.testing.assert_allclose(logs[key][0], step / 0.05, rtol=1e-4)


def sgd_dcgan(**compile_kwargs):
    """A tiny DCGAN (dropout in D, batch norm in both) compiled with SGD and
    `compile_kwargs`, from seed 0."""
    keras.utils.set_random_seed(0)
    g, d = architectures.build("dcgan", data_shape=(8, 8, 1), latent_dim=LATENT,
                               d_dropout=0.3, d_norm="batch", g_channels=(16, 8, 4),
                               d_channels=(4, 8))
    model = gan.GAN(g, d, LATENT, seed=5)
    model.compile(g_optimizer=keras.optimizers.SGD(), d_optimizer=keras.optimizers.SGD(),
                  **compile_kwargs)
    return model


@pytest.mark.parametrize("ortho_weight", [0.0, 0.1])
def test_g_gradient_in_two_stages_is_the_one_tape_gradient(ortho_weight):
    # _g_grads back-propagates D's stage to d loss / d fake, then G's (so a placement can
    # run each on its device): it must be the gradient of one tape over G, D and the
    # orthogonal regularizer. Dropout on in D, batch norm in both.
    from tf_gan_scale.gan import regularizers
    model = sgd_dcgan(ortho_weight=ortho_weight)
    rows, step = tf.range(GB), tf.constant(3, tf.int64)
    state = [w.numpy() for w in model.generator.weights + model.discriminator.weights]
    grads, share, _ = model.gan_step.g_grads(rows, GB, step)
    for w, value in zip(model.generator.weights + model.discriminator.weights, state):
        w.assign(value)  # The same BN statistics and dropout counters again.
    z = latents.rows_normal(latents.key(model.seed, step, latents.G_PHASE), rows, [LATENT])
    with tf.GradientTape() as tape:
        fake = gan.call_generator(model.generator, z, training=True)
        logits = model.gan_step.discriminate(fake, None, training=True)
        want = replica.global_mean(model.loss_fn(real_logits=logits, fake_logits=logits).g, GB)
        if ortho_weight:
            want += ortho_weight * regularizers.orthogonal(ortho_weights(model.generator))
    expected = tape.gradient(want, model.generator.trainable_variables)
    np.testing.assert_allclose(float(share), float(want), rtol=1e-6)
    for got, ref in zip(grads, expected):
        np.testing.assert_allclose(got.numpy(), ref.numpy(), rtol=1e-5, atol=1e-7)


@pytest.mark.parametrize("penalty", [None, "r1"])
def test_d_gradient_is_the_gradient_of_the_loss_share_it_reports(penalty):
    # The absolute scale of D's gradient on ONE device: the equivalence runs compare
    # topologies, so a factor on every topology alike (e.g. the share scaled before the
    # tape) passes them; the logged-loss test checks the share itself. An outer tape over
    # the same forward pass gives the true gradient of the reported share. Dropout and
    # batch norm in D; R1 adds a double backprop.
    model = sgd_dcgan(penalty=penalty, penalty_weight=10.0 if penalty else 0.0)
    real = tf.random.stateless_uniform([GB, 8, 8, 1], [1, 2], -1.0, 1.0)
    with tf.GradientTape() as tape:
        grads, share, _ = model.gan_step.d_grads(real, tf.zeros([GB], tf.int32), tf.range(GB),
                                                 GB, tf.constant(3, tf.int64), 0)
    expected = tape.gradient(share, model.discriminator.trainable_variables)
    for got, ref in zip(grads, expected):
        np.testing.assert_allclose(got.numpy(), ref.numpy(), rtol=1e-5, atol=1e-7)


def test_the_own_step_is_traced_without_autograph_a_subclass_step_with_it(one_device,
                                                                           monkeypatch):
    # Autograph would change nothing in the step's graph (plain Python around ops) and
    # converting its ~90 functions cost ~3.6 CPU-s per process
    # (gan.step_function.unconverted_if_own).
    from tensorflow.python.autograph.impl import api
    converted, convert = [], api._convert_actual
    monkeypatch.setattr(api, "_convert_actual", lambda entity, ctx: (
        converted.append(f"{entity.__module__}:{entity.__qualname__}"), convert(entity, ctx))[1])
    fit(make(one_device), one_device, 1)
    # Of the step, only the loop's own wrapper (its `tf.range` loop needs autograph) is
    # converted (tf.data converts the input pipeline's map functions, as it always does).
    step = {name for name in converted if not name.startswith("tf_gan_scale.data.")}
    assert step <= {"tf_gan_scale.gan.step_function:make_train_function.<locals>.compiled",
                    "tf_gan_scale.gan.step_function:make_train_function.<locals>.one_step"}, \
        converted

    class Flagged(gan.GAN):
        def train_step(self, data):  # A Python `if` on a tensor: autograph's job.
            logs = super().train_step(data)
            if tf.reduce_sum(logs["d_loss"]) > 1e9:
                logs["d_loss"] = logs["d_loss"] * 0.0
            return logs

    keras.utils.set_random_seed(0)
    g, d = architectures.build("dcgan", data_shape=(8, 8, 1), latent_dim=LATENT,
                               g_channels=(16, 8, 4), d_channels=(4, 8))
    model = Flagged(g, d, LATENT, seed=5)
    model.compile(g_optimizer="sgd", d_optimizer="sgd")
    history = fit(model, one_device, 1)
    assert np.isfinite(history["d_loss"][0])
    assert any(name.endswith("Flagged.train_step") for name in converted), converted
