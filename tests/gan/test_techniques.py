"""Training techniques of issue 10, each against what it promises: EMA generator, LR
schedules, label smoothing, instance noise, LeCam, lazy penalty, orthogonal
regularization, truncation, class conditioning in the GAN step."""

import keras
import numpy as np
import pytest
import tensorflow as tf

from helpers.tiny_gan import GB, LATENT, digits, fit  # noqa: F401  (tests/ is on sys.path)
from tf_gan_scale import architectures, configs, data, errors, gan, latents, schedules, training
from tf_gan_scale.gan import ema, losses, regularizers
from tf_gan_scale.gan.step import ortho_weights


def networks(d_norm="batch"):
    return architectures.build("dcgan", data_shape=(8, 8, 1), latent_dim=LATENT,
                               d_dropout=0.0, d_norm=d_norm, g_channels=(16, 8, 4),
                               d_channels=(4, 8))


def make(strategy, *, lr=0.05, d_norm="batch", gan_kwargs=None, **compile_kwargs):
    keras.utils.set_random_seed(0)
    with strategy.scope():
        g, d = networks(d_norm)
        model = gan.GAN(g, d, LATENT, seed=5, **(gan_kwargs or {}))
        model.compile(g_optimizer=keras.optimizers.SGD(lr),
                      d_optimizer=keras.optimizers.SGD(lr),
                      loss=compile_kwargs.pop("loss", "non_saturating"), **compile_kwargs)
    return model


def values(variables):
    return [np.array(v.numpy()) for v in variables]


# ---- EMA --------------------------------------------------------------------------------

def test_ema_decay_schedule():
    e = ema.GeneratorEMA(networks()[0], 0.9, start=3, warmup=4)
    got = [float(e.decay_at(t)) for t in range(1, 10)]
    # t <= start: copy; then 0.9 * (t - 3) / 4 until it reaches 0.9.
    np.testing.assert_allclose(got, [0, 0, 0, 0.225, 0.45, 0.675, 0.9, 0.9, 0.9], atol=1e-7)
    assert float(ema.GeneratorEMA(networks()[0], 0.9).decay_at(1)) == pytest.approx(0.9)


def test_ema_follows_the_generator_step_by_step(one_device):
    """The EMA (weights AND batch-norm moving statistics) equals the recursion applied to
    the generator's weights after every step; the raw generator differs from it."""
    decay, start = 0.8, 2
    model = make(one_device, gan_kwargs={"ema_decay": decay, "ema_start": start})
    expected = values(model.generator.weights)
    assert len(expected) == len(model.ema_generator.weights)
    iterator = iter(one_device.experimental_distribute_dataset(digits()))
    train = model.make_train_function()
    for t in range(1, 6):
        train(iterator)
        d = 0.0 if t <= start else decay
        expected = [d * e + (1 - d) * w for e, w in zip(expected,
                                                         values(model.generator.weights))]
        for e, got in zip(expected, values(model.ema_generator.weights)):
            np.testing.assert_allclose(got, e, rtol=1e-5, atol=1e-6)
    moving = [i for i, w in enumerate(model.generator.weights) if "moving" in w.path]
    assert moving, "the test must cover batch-norm statistics"
    gap = max(np.abs(a - b).max() for a, b in zip(values(model.generator.weights),
                                                  values(model.ema_generator.weights)))
    assert gap > 1e-4  # The EMA is not a copy.
    # Samples, predict and gan(z) use the EMA generator.
    z = latents.fixed(0, 4, LATENT)
    np.testing.assert_allclose(model.generate(z), model.ema_generator(z, training=False),
                               atol=1e-6)
    np.testing.assert_allclose(model(z), model.ema_generator(z, training=False), atol=1e-6)
    assert np.abs(model.generate(z) - model.generator(z, training=False)).max() > 1e-5


def max_gap(a, b):
    return max(float(np.abs(x - y).max()) for x, y in zip(a, b, strict=True))


def test_ema_is_checkpointed(one_device, tmp_path):
    model = make(one_device, gan_kwargs={"ema_decay": 0.5})
    fit(model, one_device, 2)
    trained = values(model.ema_generator.weights)
    path = tf.train.Checkpoint(**model.checkpoint_items()).write(str(tmp_path / "ckpt"))
    fresh = make(one_device, gan_kwargs={"ema_decay": 0.5})
    untrained = values(fresh.ema_generator.weights)  # The same seed: G's initial weights.
    tf.train.Checkpoint(**fresh.checkpoint_items()).read(path).assert_consumed()
    restored = values(fresh.ema_generator.weights)
    for a, b in zip(restored, trained, strict=True):
        np.testing.assert_array_equal(a, b)
    # What was restored is the moved EMA: neither the initial weights (an EMA that never
    # updated, or was not saved, would equal them) nor the generator's (decay 0.5: after
    # 2 steps the EMA is 1/4 w0 + 1/4 w1 + 1/2 w2, G is w2).
    assert max_gap(restored, untrained) > 1e-3
    assert max_gap(restored, values(model.generator.weights)) > 1e-3


@pytest.mark.parametrize("kwargs,match", [
    ({"decay": -0.1}, "decay must be in"), ({"decay": 1.0}, "decay must be in"),
    ({"start": -1}, "start must be an integer"), ({"warmup": 1.5}, "warmup must be"),
    ({"start": 10, "num_steps": 10}, "not before the end")])
def test_ema_bad_settings(kwargs, match):
    args = dict({"decay": 0.9, "start": 0, "warmup": 0, "num_steps": None}, **kwargs)
    with pytest.raises(errors.ConfigError, match=match):
        ema.check(**args)


# ---- schedules ---------------------------------------------------------------------------

def test_warmup_then_decay():
    lin = schedules.WarmupDecay(1.0, "linear", warmup_steps=4, total_steps=14)
    np.testing.assert_allclose([float(lin(t)) for t in (0, 1, 3, 4, 9, 14, 20)],
                               [0.25, 0.5, 1.0, 1.0, 0.5, 0.0, 0.0], atol=1e-6)
    cos = schedules.WarmupDecay(2.0, "cosine", total_steps=10)
    np.testing.assert_allclose([float(cos(t)) for t in (0, 5, 10)], [2.0, 1.0, 0.0],
                               atol=1e-6)
    restored = schedules.WarmupDecay.from_config(lin.get_config())
    assert float(restored(9)) == pytest.approx(0.5)
    with pytest.raises(errors.ConfigError, match="lr_decay"):
        schedules.check("exponential", 0, 10)
    with pytest.raises(errors.ConfigError, match="lr_warmup_steps"):
        schedules.check("none", 10, 10)


def test_schedule_counts_each_optimizers_own_updates(one_device):
    """D makes d_steps updates per G step: its schedule is stretched by d_steps, so both
    reach the end of their decay at num_steps."""
    c = configs.base()
    c.model.g_channels, c.model.d_channels, c.model.latent_dim = (8, 4, 2), (4, 4), 4
    c.train.num_steps, c.train.d_steps = 10, 2
    c.train.lr_decay, c.train.lr_warmup_steps = "linear", 2
    with one_device.scope():
        model = training.build_gan(c, (8, 8, 1))
    g, d = model.g_optimizer, model.d_optimizer
    g.iterations.assign(6)
    d.iterations.assign(12)
    lr = c.train.g_optimizer.learning_rate
    assert float(g.learning_rate) == pytest.approx(lr * 0.5)
    assert float(d.learning_rate) == pytest.approx(lr * 0.5)


# ---- losses and D-input noise --------------------------------------------------------------

def test_one_sided_label_smoothing_is_cross_entropy_with_target_1_minus_s():
    r = tf.constant([-2.0, 0.3, 4.0])
    f = tf.constant([1.0, -1.0, 0.0])
    out = losses.smooth_real_labels(losses.non_saturating, 0.1)(real_logits=r, fake_logits=f)
    bce = keras.losses.binary_crossentropy
    want = (bce(tf.fill([3, 1], 0.9), r[:, None], from_logits=True)
            + bce(tf.zeros([3, 1]), f[:, None], from_logits=True))
    np.testing.assert_allclose(out.d, want, rtol=1e-5)
    np.testing.assert_allclose(out.g, losses.non_saturating(real_logits=r, fake_logits=f).g)
    with pytest.raises(errors.ConfigError, match="label_smoothing needs a cross-entropy"):
        make(tf.distribute.get_strategy(), loss="hinge", label_smoothing=0.1)


def test_instance_noise_is_per_example_and_annealed(one_device):
    model = make(one_device, instance_noise=0.5, instance_noise_steps=10)
    x = tf.zeros([6, 8, 8, 1])
    rows = tf.range(6)
    at0 = model.gan_step.d_inputs(x, rows, 0, 0).numpy()
    assert abs(at0.std() - 0.5) < 0.05
    # Half-way the std has halved (same draws if the key were the same: check scale).
    assert abs(model.gan_step.d_inputs(x, rows, 5, 0).numpy().std() - 0.25) < 0.03
    np.testing.assert_array_equal(model.gan_step.d_inputs(x, rows, 10, 0).numpy(), 0.0)
    # Row r's noise depends on (step, phase, r) only: a replica holding rows 3..5 agrees.
    np.testing.assert_array_equal(model.gan_step.d_inputs(x[3:], rows[3:], 0, 0).numpy(), at0[3:])
    assert np.abs(model.gan_step.d_inputs(x, rows, 0, 1).numpy() - at0).max() > 0.1  # Other phase.


# ---- LeCam -------------------------------------------------------------------------------

def test_lecam_anchors_track_global_mean_logits(one_device):
    decay = 0.9
    model = make(one_device, d_norm="none", lecam_weight=0.3, lecam_decay=decay)
    d0 = make(one_device, d_norm="none").discriminator
    g0 = make(one_device, d_norm="none").generator
    fit(model, one_device, 1)
    real = next(iter(digits()))["x"]
    fake = g0(latents.global_normal(5, 0, 0, GB, [LATENT]), training=True)
    want = [(1 - decay) * float(tf.reduce_mean(d0(v, training=True))) for v in (real, fake)]
    np.testing.assert_allclose(model.lecam_anchors.numpy(), want, rtol=1e-5, atol=1e-7)
    assert "lecam_anchors" in model.checkpoint_items()


# ---- lazy penalty --------------------------------------------------------------------------

def test_lazy_penalty_every_k_with_weight_times_k(one_device):
    def weights_after_one_step(start_step, **kwargs):
        model = make(one_device, d_norm="none", **kwargs)
        model.g_optimizer.iterations.assign(start_step)
        fit(model, one_device, 1)
        return values(model.discriminator.weights)

    def close(a, b):
        return all(np.allclose(x, y, rtol=1e-5, atol=1e-6) for x, y in zip(a, b))

    lazy = dict(penalty="r1", penalty_weight=0.5, penalty_every=2)
    # Update 0: the penalty with weight 2 x 0.5.
    assert close(weights_after_one_step(0, **lazy),
                 weights_after_one_step(0, penalty="r1", penalty_weight=1.0))
    # Update 1: none.
    assert close(weights_after_one_step(1, **lazy), weights_after_one_step(1))
    assert not close(weights_after_one_step(1, penalty="r1", penalty_weight=1.0),
                     weights_after_one_step(1))  # The penalty does move D.
    with pytest.raises(errors.ConfigError, match="without batch norm"):
        make(one_device, d_norm="batch", **lazy)


# ---- orthogonal regularization ---------------------------------------------------------------

def test_orthogonal_regularization_adds_its_gradient_to_g(one_device):
    lr, beta = 0.05, 0.01
    plain, ortho = make(one_device, lr=lr), make(one_device, lr=lr, ortho_weight=beta)
    kernels = [i for i, w in enumerate(plain.generator.trainable_weights)
               if len(w.shape) >= 2]
    before = [tf.Variable(plain.generator.trainable_weights[i]) for i in kernels]
    with tf.GradientTape() as tape:
        reg = regularizers.orthogonal(before)
    reg_grads = tape.gradient(reg, before)
    fit(plain, one_device, 1)
    fit(ortho, one_device, 1)
    for i, grad in zip(kernels, reg_grads):
        diff = (ortho.generator.trainable_weights[i].numpy()
                - plain.generator.trainable_weights[i].numpy())
        want = -lr * beta * grad.numpy()
        # The difference of two float32 updates of weights ~0.1 carries ~1e-8 of rounding;
        # a 2x wrong scale would be off by |want| (1e-5 here).
        assert np.abs(diff - want).max() <= 0.01 * np.abs(want).max()


# ---- truncation ----------------------------------------------------------------------------

def test_truncation_bounds_latents_and_keeps_their_identity():
    z = latents.fixed(3, 500, 16).numpy()
    t = latents.fixed(3, 500, 16, truncation=0.5).numpy()
    assert np.abs(t).max() <= 0.5
    assert np.all(np.sign(t) == np.sign(z))
    assert np.all(np.abs(t) <= np.abs(z) + 1e-6)
    # The mapping is monotone, so the ordering of values is the untruncated one.
    order = np.argsort(z.ravel())
    assert np.all(np.diff(t.ravel()[order]) >= 0)


# ---- class conditioning in the GAN step ----------------------------------------------------

CLASSES = 10


def conditional_networks():
    """A tiny conditional pair: [z, labels] -> 8x8x1 images; [x, labels] -> logits."""
    z, y = keras.Input((LATENT,)), keras.Input((), dtype="int32")
    h = keras.layers.Concatenate()([z, keras.layers.Embedding(CLASSES, 4)(y)])
    x = keras.layers.Reshape((8, 8, 1))(keras.layers.Dense(64, activation="tanh")(h))
    g = keras.Model([z, y], x)
    xi, yi = keras.Input((8, 8, 1)), keras.Input((), dtype="int32")
    f = keras.layers.Dense(8, activation="relu")(keras.layers.Flatten()(xi))
    proj = keras.layers.Dot(axes=1)([f, keras.layers.Embedding(CLASSES, 8)(yi)])
    d = keras.Model([xi, yi], keras.layers.Add()([keras.layers.Dense(1)(f), proj]))
    return g, d


def make_conditional(strategy):
    keras.utils.set_random_seed(0)
    with strategy.scope():
        g, d = conditional_networks()
        model = gan.GAN(g, d, LATENT, seed=5, num_classes=CLASSES)
        model.compile(g_optimizer=keras.optimizers.SGD(0.05),
                      d_optimizer=keras.optimizers.SGD(0.05), loss="non_saturating")
    return model


def test_conditional_d_loss_uses_real_labels_and_drawn_fake_labels(one_device):
    model = make_conditional(one_device)
    g0, d0 = [keras.models.clone_model(m) for m in (model.generator, model.discriminator)]
    g0.set_weights(model.generator.get_weights())
    d0.set_weights(model.discriminator.get_weights())
    history = fit(model, one_device, 1)
    batch = next(iter(digits()))
    rows = tf.range(GB)
    fake_labels = latents.rows_labels(latents.key(5, 0, latents.LABEL_PHASE), rows, CLASSES)
    assert len(set(fake_labels.numpy())) > 3
    fake = g0([latents.global_normal(5, 0, 0, GB, [LATENT]), fake_labels])
    want = np.mean(tf.nn.softplus(-d0([batch["x"], batch["label"]]))
                   + tf.nn.softplus(d0([fake, fake_labels])))
    np.testing.assert_allclose(history["d_loss"][0], want, rtol=1e-5)
    # G's update draws its own labels (phase LABEL_PHASE + G_PHASE) and is scored by the
    # updated D.
    g_labels = latents.rows_labels(
        latents.key(5, 0, latents.LABEL_PHASE + latents.G_PHASE), rows, CLASSES)
    assert np.any(g_labels.numpy() != fake_labels.numpy())
    g_fake = g0([latents.global_normal(5, 0, latents.G_PHASE, GB, [LATENT]), g_labels])
    g_want = np.mean(tf.nn.softplus(-model.discriminator([g_fake, g_labels])))
    np.testing.assert_allclose(history["g_loss"][0], g_want, rtol=1e-5)
    # With the labels shuffled the loss would differ (the test can fail).
    wrong = np.mean(tf.nn.softplus(-d0([batch["x"], (batch["label"] + 1) % CLASSES]))
                    + tf.nn.softplus(d0([fake, fake_labels])))
    assert abs(wrong - want) > 1e-4
    # generate / predict take labels.
    z = latents.fixed(0, 4, LATENT)
    labels = tf.constant([0, 1, 2, 3])
    np.testing.assert_allclose(model.generate(z, labels=labels),
                               model.generator([z, labels], training=False), atol=1e-6)
    np.testing.assert_allclose(model.predict((z.numpy(), labels.numpy()), verbose=0),
                               model.generator([z, labels], training=False), atol=1e-6)


def test_conditioning_mismatch_is_one_error(one_device):
    g, d = conditional_networks()
    with pytest.raises(ValueError, match="num_classes=0 but the generator is conditional"):
        gan.GAN(g, d, LATENT)
    g, d = networks()
    with pytest.raises(ValueError, match="num_classes=10 but the generator is uncond"):
        gan.GAN(g, d, LATENT, num_classes=10)


def test_conditional_config_needs_labels_and_a_conditional_architecture():
    c = configs.base()
    c.model.conditional = True
    with pytest.raises(errors.ConfigError, match="architecture 'dcgan' is unconditional"):
        training.validate(c, 1)
    with pytest.raises(errors.ConfigError, match="needs labelled data"):
        training.num_classes(c, 1)
    assert training.num_classes(c, 10) == 10
    c.model.conditional = False
    assert training.num_classes(c, 10) == 0


# ---- the techniques inside the step (not only their functions) ---------------------------

def test_label_smoothing_reaches_the_d_loss_of_a_step(one_device):
    s = 0.1
    plain, smooth = make(one_device, d_norm="none"), make(one_device, d_norm="none",
                                                          label_smoothing=s)
    d0 = make(one_device, d_norm="none").discriminator
    base, smoothed = fit(plain, one_device, 1), fit(smooth, one_device, 1)
    real = next(iter(digits()))["x"]
    # The smoothed real term adds s * real logit per example (losses.smooth_real_labels).
    np.testing.assert_allclose(smoothed["d_loss"][0] - base["d_loss"][0],
                               s * float(tf.reduce_mean(d0(real, training=True))), rtol=1e-4)


def test_d_inputs_are_augmented_in_both_updates(one_device, monkeypatch):
    model = make(one_device, augment="translation", instance_noise=0.1)
    phases = []
    original = model.gan_step.d_inputs
    monkeypatch.setattr(model.gan_step, "d_inputs",
                        lambda x, rows, step, phase: phases.append(phase) or original(
                            x, rows, step, phase))
    fit(model, one_device, 1)
    assert sorted(set(phases)) == [0, latents.G_PHASE]


def test_lecam_term_uses_the_anchors_in_the_d_loss(one_device):
    w, anchors = 0.5, [0.3, -0.2]
    model = make(one_device, d_norm="none", lecam_weight=w)
    model.lecam_anchors.assign(anchors)
    d0 = make(one_device, d_norm="none").discriminator
    g0 = make(one_device, d_norm="none").generator
    history = fit(model, one_device, 1)
    plain = fit(make(one_device, d_norm="none"), one_device, 1)
    real = next(iter(digits()))["x"]
    fake = g0(latents.global_normal(5, 0, 0, GB, [LATENT]), training=True)
    reg = regularizers.lecam(d0(real, training=True), d0(fake, training=True), *anchors)
    np.testing.assert_allclose(history["d_loss"][0] - plain["d_loss"][0],
                               w * float(tf.reduce_mean(reg)), rtol=1e-4, atol=1e-7)
    assert float(tf.reduce_mean(reg)) > 1e-3  # Non-zero: the order of the anchors matters.


def test_truncation_uses_the_whole_interval():
    t = latents.fixed(3, 2000, 16, truncation=0.5).numpy()
    assert 0.49 < np.abs(t).max() <= 0.5


def test_orthogonal_regularization_skips_the_class_embedding():
    g, _ = architectures.build("biggan", data_shape=(8, 8, 1), latent_dim=8, num_classes=10,
                               ch=2, g_channels=(1,), shared_dim=4)
    chosen = ortho_weights(g)
    assert chosen and all("embedding" not in w.path.lower() for w in chosen)
    assert any("embedding" in w.path.lower() for w in g.trainable_weights)


def test_a_conditional_gan_refuses_unlabelled_batches(one_device):
    model = make_conditional(one_device)
    images = data.make_dataset(data.load("embedded:digits"), global_batch_size=GB,
                               seed=0).map(lambda b: b["x"])
    with pytest.raises(ValueError, match="needs labelled batches"):
        model.fit(images, epochs=1, steps_per_epoch=1, verbose=0)


def test_keras_file_round_trip_keeps_ema_classes_and_anchors(one_device, tmp_path):
    """A conditional BigGAN with EMA and LeCam: .keras save/load and .keras -> workdir keep
    the EMA weights, the anchors and the class count (run.json)."""
    from tf_gan_scale.artifacts import keras_io
    from tf_gan_scale.artifacts import sampling
    c = configs.base()
    c.data.source = "embedded:digits"
    c.model = configs.ml_collections.ConfigDict({
        "name": "biggan", "latent_dim": 8, "conditional": True, "ch": 2, "g_channels": (1,),
        "d_channels": (1, 1), "shared_dim": 4})
    c.train.ema.decay, c.train.lecam_weight = 0.5, 0.1
    c.train.global_batch_size, c.train.num_steps = GB, 10
    with one_device.scope():
        model = training.build_gan(c, (8, 8, 1), 10)
    fit(model, one_device, 2)
    path = str(tmp_path / "gan.keras")
    keras_io.save_new(model, path)
    loaded = keras.models.load_model(path)
    assert loaded.num_classes == 10 and loaded.ema is not None
    for a, b in ((model.ema.model, loaded.ema.model), (model.generator, loaded.generator)):
        for x, y in zip(values(a.weights), values(b.weights)):
            np.testing.assert_array_equal(x, y)
    np.testing.assert_array_equal(loaded.lecam_anchors.numpy(), model.lecam_anchors.numpy())
    assert np.abs(model.lecam_anchors.numpy()).max() > 0
    workdir = str(tmp_path / "run")
    with one_device.scope():
        keras_io.keras_to_workdir(path, c, workdir)
    ema_g, _, step, _ = sampling.load_generator(workdir)
    assert step == 2 and ema_g.num_classes == 10
    for x, y in zip(values(ema_g.weights), values(model.ema.model.weights)):
        np.testing.assert_array_equal(x, y)
