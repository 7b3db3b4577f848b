"""GAN as a Keras model for notebook users: `save` / `load_model`, `evaluate` and
validation, `predict`, and batches that do not split over the replicas; on one device and
on 2 replicas. Numbers are checked against direct computations, not only that calls run."""

import textwrap

import keras
import numpy as np
import pytest
import tensorflow as tf

from conftest import run_cmd, shared
from helpers.tiny_gan import LATENT, digits, samples
from tf_gan_scale import architectures, data, errors, gan, latents
from tf_gan_scale.gan import losses

N_HELD_OUT = 37  # 16 + 16 + 5: a last batch that splits 3 / 2 over 2 replicas.


@pytest.fixture(params=["one_device", "mirrored2"])
def strategy(request):
    return request.getfixturevalue(request.param)


def test_shared_resets_everything_a_step_reads(strategy):
    """The check behind conftest.shared: its state is the model as built, so training
    from it twice gives the same weights; state it missed (a counter a step reads) would move
    between the two and change the second."""
    model = shared(make, strategy)
    train(model, strategy, 2)
    first = weights(model) + optimizer_state(model)
    model = shared(make, strategy)
    assert int(model.step.numpy()) == 0
    train(model, strategy, 2)
    for a, b in zip(weights(model) + optimizer_state(model), first, strict=True):
        np.testing.assert_array_equal(a, b)


def make(strategy, *, dropout=0.3, d_steps=2):
    """A GAN with settings unlike every default: Adam with its own betas, hinge loss,
    R1, d_steps=2, seed 7, dropout and batch norm in D."""
    keras.utils.set_random_seed(0)
    with strategy.scope():
        g, d = architectures.build("dcgan", data_shape=(8, 8, 1), latent_dim=LATENT,
                                   d_dropout=dropout, d_norm="batch", seed=3,
                                   g_channels=(16, 8, 4), d_channels=(4, 8))
        model = gan.GAN(g, d, LATENT, seed=7)
        model.compile(g_optimizer=keras.optimizers.Adam(2e-3, beta_1=0.3),
                      d_optimizer=keras.optimizers.Adam(1e-3, beta_1=0.4, beta_2=0.9),
                      loss="hinge", d_steps=d_steps, penalty="r1", penalty_weight=0.5)
    return model


def train(model, strategy, steps, skip=0):
    """`steps` generator steps on the digits, starting `skip` steps into the data."""
    dataset = digits().skip(skip * model.d_steps)
    model.fit(strategy.experimental_distribute_dataset(dataset), epochs=1,
              steps_per_epoch=steps, verbose=0)


def held_out():
    return data.load("embedded:digits").arrays["x"][-N_HELD_OUT:]


def weights(model):
    return [v.numpy() for v in model.weights]


def optimizer_state(model):
    return [v.numpy() for opt in (model.g_optimizer, model.d_optimizer)
            for v in opt.variables]


def test_save_load_model_restores_everything_and_training_continues(strategy, tmp_path):
    path = str(tmp_path / "gan.keras")
    model = shared(make, strategy)
    train(model, strategy, 2)
    model.save(path)
    with strategy.scope():
        loaded = keras.models.load_model(path)
    assert type(loaded) is gan.GAN and loaded.distribute_strategy is strategy
    # Settings: the compile config names both optimizers, not Keras' default RMSprop.
    assert (loaded.seed, loaded.latent_dim, loaded.d_steps) == (7, LATENT, 2)
    assert loaded.loss_fn is losses.hinge and loaded.penalty_weight == 0.5
    assert loaded.penalty_fn.__name__ == "r1"
    for name in ("g_optimizer", "d_optimizer"):
        assert (getattr(loaded, name).get_config()
                == getattr(model, name).get_config())
    # State: weights (dropout call counters included) and both optimizers' slots.
    for a, b in zip(weights(loaded), weights(model), strict=True):
        np.testing.assert_array_equal(a, b)
    for a, b in zip(optimizer_state(loaded), optimizer_state(model), strict=True):
        np.testing.assert_array_equal(a, b)
    assert int(loaded.step.numpy()) == 2
    np.testing.assert_array_equal(samples(loaded), samples(model))
    # fit continues: 2 more steps of each equal each other (same data, same state).
    train(model, strategy, 2, skip=2)
    train(loaded, strategy, 2, skip=2)
    for a, b in zip(weights(loaded), weights(model), strict=True):
        np.testing.assert_allclose(a, b, rtol=0, atol=1e-6)
    assert not np.allclose(samples(loaded), samples(make(strategy)))


def test_model_checkpoint_full_model_loads(strategy, tmp_path):
    path = str(tmp_path / "epoch{epoch}.keras")
    model = shared(make, strategy)
    model.fit(strategy.experimental_distribute_dataset(digits()), epochs=2,
              steps_per_epoch=1, verbose=0,
              callbacks=[keras.callbacks.ModelCheckpoint(path)])
    with strategy.scope():
        loaded = keras.models.load_model(str(tmp_path / "epoch2.keras"))
    assert int(loaded.step.numpy()) == 2
    np.testing.assert_array_equal(samples(loaded), samples(model))


@pytest.mark.slow
def test_load_model_in_a_fresh_process_with_only_tf_gan_scale_imported(one_device,
                                                                         tmp_path):
    model = make(one_device)
    train(model, one_device, 1)
    model.save(str(tmp_path / "gan.keras"))
    z = latents.fixed(9, 8, LATENT).numpy()
    np.save(tmp_path / "z.npy", z)
    script = textwrap.dedent(f"""
        import tf_gan_scale  # Registers GAN and the layers with Keras: nothing else.
        import keras, numpy as np
        m = keras.models.load_model({str(tmp_path / "gan.keras")!r})
        assert (m.d_steps, m.seed, int(m.step.numpy())) == (2, 7, 1)
        np.save({str(tmp_path / "out.npy")!r}, m.predict(np.load({str(tmp_path / "z.npy")!r}),
                                                        verbose=0))
    """)
    expected = model.generator(z, training=False).numpy()
    # Cold: in a warm process (tests/helpers/warm_start.py) keras would be imported first.
    proc = run_cmd(["-c", script], env={"TF_GAN_SCALE_COLD_START": "1"})
    assert proc.returncode == 0, proc.stderr[-3000:]
    np.testing.assert_array_equal(np.load(tmp_path / "out.npy"), expected)
    # Keras imported first (registered at import) as well as after (registered by the
    # import hook): both orders load.
    proc = run_cmd(["-c", "import keras\n" + script])
    assert proc.returncode == 0, proc.stderr[-3000:]
    np.testing.assert_array_equal(np.load(tmp_path / "out.npy"), expected)


def expected_losses(model, x):
    """The evaluation losses written out: fake i from latents (seed, i), inference mode,
    per-example losses averaged over the whole set."""
    z = latents.rows_normal(latents.key(model.seed, latents.SAMPLE_STEP, latents.EVAL_PHASE),
                            tf.range(len(x)), [LATENT])
    fake = model.generator(z, training=False)
    out = model.loss_fn(real_logits=model.discriminator(x, training=False),
                        fake_logits=model.discriminator(fake, training=False))
    return float(np.mean(out.d)), float(np.mean(out.g))


def test_evaluate_gives_the_global_mean_losses(one_device, mirrored2):
    x = held_out()
    expected = expected_losses(make(one_device), x)
    for strategy in (one_device, mirrored2):
        model = shared(make, strategy)
        before = weights(model)
        for batch_size in (16, 8):  # 37 = 16 + 16 + 5 (3 + 2 on 2 replicas) = 4 x 8 + 5.
            logs = model.evaluate(x, batch_size=batch_size, verbose=0, return_dict=True)
            np.testing.assert_allclose([logs["d_loss"], logs["g_loss"]], expected,
                                       rtol=1e-6)
        # Inference mode: no moving statistic, dropout counter or step changed.
        for a, b in zip(weights(model), before, strict=True):
            np.testing.assert_array_equal(a, b)
    # The check can fail: the mean of the three batch means is not the answer.
    assert abs(expected[0] - np.mean([expected_losses(make(one_device), x[i:i + 16])[0]
                                      for i in (0, 16, 32)])) > 1e-4


def test_validation_reports_val_entries_every_validation_freq_epochs(strategy):
    model = shared(make, strategy)
    x = held_out()
    history = model.fit(strategy.experimental_distribute_dataset(digits()), epochs=4,
                        steps_per_epoch=1, verbose=0, validation_data=(x,),
                        validation_freq=2, validation_batch_size=16).history
    assert len(history["d_loss"]) == 4
    assert len(history["val_d_loss"]) == len(history["val_g_loss"]) == 2
    # The last validation ran on the final weights: it equals evaluate now.
    np.testing.assert_allclose([history["val_d_loss"][-1], history["val_g_loss"][-1]],
                               expected_losses(model, x), rtol=1e-6)


def test_predict_returns_the_generator_outputs_in_order(strategy):
    model = shared(make, strategy)
    z = latents.fixed(3, N_HELD_OUT, LATENT).numpy()
    out = model.predict(z, batch_size=16, verbose=0)
    np.testing.assert_allclose(out, model.generator(z, training=False).numpy(), atol=1e-6)
    # Labels (a conditional model's second input) are ignored by an unconditional G.
    labels = np.arange(N_HELD_OUT) % 10
    np.testing.assert_allclose(model.predict((z, labels), batch_size=16, verbose=0), out,
                               atol=1e-6)


def test_batches_that_do_not_split_over_replicas_fail_before_the_step(mirrored2):
    model = shared(make, mirrored2)
    before = weights(model)
    dataset = data.make_dataset(data.load("embedded:digits"), global_batch_size=15, seed=0)
    with pytest.raises(errors.UnevenBatchError,
                       match=r"over the 2 replicas before generator step 1 \(nothing was "
                             r"updated\).*divisible by 2 and drop_remainder=True"):
        model.fit(mirrored2.experimental_distribute_dataset(dataset), epochs=1,
                  steps_per_epoch=2, verbose=0)
    assert int(model.step.numpy()) == 0
    for a, b in zip(weights(model), before, strict=True):
        np.testing.assert_array_equal(a, b)


def test_a_partial_last_numpy_batch_fails_on_replicas_only(one_device, mirrored2):
    x = held_out()  # 37 examples, batch 16: the last batch has 5 (3 + 2 on 2 replicas).
    model = shared(make, mirrored2)
    with pytest.raises(errors.UnevenBatchError, match="before generator step 2"):
        model.fit(x, batch_size=16, epochs=1, verbose=0)  # d_steps=2: 2 batches a step.
    assert int(model.step.numpy()) == 1
    model = shared(make, one_device)
    model.fit(x, batch_size=16, epochs=1, verbose=0)  # One device: any batch is whole.
    # 3 batches (16, 16, 5) at d_steps=2: 2 steps, the second with the 5-row batch
    # (measured; replicas stop before it, above).
    assert int(model.step.numpy()) == 2


def test_the_second_batch_of_a_step_is_checked_too(mirrored2):
    # 53 = 16 + 16 + 16 + 5 with d_steps=2: step 2 gets 16 rows, then 5 (3 + 2).
    x = data.load("embedded:digits").arrays["x"][:53]
    model = shared(make, mirrored2)
    with pytest.raises(errors.UnevenBatchError, match="before generator step 2"):
        model.fit(x, batch_size=16, epochs=1, verbose=0)
    assert int(model.step.numpy()) == 1


def test_without_the_pre_step_check_the_global_verdict_still_stops_fit(mirrored2,
                                                                      monkeypatch):
    # As across workers, where the per-worker check is off: the row counts summed in the
    # step's all-reduces give every replica the verdict, raised before any callback.
    from tf_gan_scale.gan import checks
    monkeypatch.setattr(checks, "assert_even_split", lambda strategy, batches: [])
    model = make(mirrored2)
    dataset = data.make_dataset(data.load("embedded:digits"), global_batch_size=15, seed=0)
    with pytest.raises(errors.UnevenBatchError, match="in generator step 1 .its update used"):
        model.fit(mirrored2.experimental_distribute_dataset(dataset), epochs=1,
                  steps_per_epoch=2, verbose=0)


def test_uneven_rows_across_workers_are_caught_after_the_step(mirrored2):
    # Within one worker the pre-step check sees every replica; across workers only the
    # row count summed in the gradient all-reduce does. Feed train_step 8 and 7 rows
    # directly, past the pre-step check, as two workers would.
    model = make(mirrored2, dropout=0.0, d_steps=1)
    x = tf.constant(held_out()[:16])
    batch = mirrored2.experimental_distribute_values_from_function(
        lambda ctx: x[:8] if ctx.replica_id_in_sync_group == 0 else x[8:15])
    out = tf.function(lambda b: mirrored2.run(model.train_step, args=(b,)))(batch)
    codes = [int(v) for v in mirrored2.experimental_local_results(out[gan.NONFINITE])]
    assert codes == [gan.UNEVEN, gan.UNEVEN]


def test_evaluate_reports_fid_across_replicas_with_a_keras_extractor(one_device, mirrored2,
                                                                    tmp_path):
    from tf_gan_scale import metrics
    keras.utils.set_random_seed(2)
    classifier = keras.Sequential([
        keras.Input((8, 8, 1)), keras.layers.Conv2D(4, 3, activation="relu"),
        keras.layers.Flatten(), keras.layers.Dense(6, activation="tanh"),
        keras.layers.Dense(10, activation="softmax")])
    path = str(tmp_path / "classifier.keras")
    classifier.save(path)
    x = held_out()
    fids = []
    for strategy in (one_device, mirrored2):
        model = make(strategy, dropout=0.0)
        with strategy.scope():
            model.compile(g_optimizer="sgd", d_optimizer="sgd", fid_extractor=path)
        logs = model.evaluate(x, batch_size=16, verbose=0, return_dict=True)
        fids.append(logs["fid"])
    np.testing.assert_allclose(fids[1], fids[0], rtol=1e-6)
    # The direct computation: features (the layer before the softmax) of the same reals
    # and of fakes i from latents (seed, EVAL_PHASE, i), quantized to uint8 levels.
    features = keras.Model(classifier.inputs, classifier.layers[-2].output)
    z = latents.rows_normal(latents.key(model.seed, latents.SAMPLE_STEP, latents.EVAL_PHASE),
                            tf.range(len(x)), [LATENT])
    fake = model.generator(z, training=False)
    from tf_gan_scale.evaluation import quantize  # Both sides at uint8 levels.
    expected = metrics.fid_from_features(features(quantize(x)).numpy(),
                                         features(quantize(fake)).numpy())
    np.testing.assert_allclose(fids[0], expected, rtol=1e-5)
    # The extractor is part of the saved compile config.
    model.save(str(tmp_path / "gan.keras"))
    with mirrored2.scope():
        loaded = keras.models.load_model(str(tmp_path / "gan.keras"))
    logs = loaded.evaluate(x, batch_size=16, verbose=0, return_dict=True)
    np.testing.assert_allclose(logs["fid"], fids[1], rtol=1e-6)


def test_a_replica_with_no_rows_of_the_last_batch(one_device, mirrored2):
    # 33 = 16 + 16 + 1: the last batch is 1 + 0 rows on 2 replicas (convolutions fail on
    # empty batches on CPU, so that replica must sit the forward pass out).
    x = held_out()[:33]
    z = latents.fixed(3, 33, LATENT).numpy()
    expected = expected_losses(make(one_device), x)
    model = shared(make, mirrored2)
    logs = model.evaluate(x, batch_size=16, verbose=0, return_dict=True)
    np.testing.assert_allclose([logs["d_loss"], logs["g_loss"]], expected, rtol=1e-6)
    np.testing.assert_allclose(model.predict(z, batch_size=16, verbose=0),
                               model.generator(z, training=False).numpy(), atol=1e-6)


def test_predict_feeds_labels_to_a_two_input_generator(one_device):
    z_in, y_in = keras.Input((LATENT,)), keras.Input((), dtype="int32")
    h = keras.layers.Concatenate()([z_in, keras.layers.Embedding(10, 4)(y_in)])
    g = keras.Model([z_in, y_in], keras.layers.Reshape((8, 8, 1))(
        keras.layers.Dense(64, activation="tanh")(h)))
    x_in, dy_in = keras.Input((8, 8, 1)), keras.Input((), dtype="int32")
    d = keras.Model([x_in, dy_in], keras.layers.Dense(1)(keras.layers.Concatenate()(
        [keras.layers.Flatten()(x_in), keras.layers.Embedding(10, 4)(dy_in)])))
    model = gan.GAN(g, d, LATENT, num_classes=10)  # A conditional pair: both take labels.
    z = latents.fixed(3, 20, LATENT).numpy()
    labels = np.arange(20) % 10
    out = model.predict((z, labels), batch_size=8, verbose=0)
    np.testing.assert_allclose(out, g([z, labels]).numpy(), atol=1e-6)
    assert not np.allclose(out, g([z, (labels + 1) % 10]).numpy(), atol=1e-3)


def test_settings_that_are_not_weights_survive_the_config_round_trip(one_device, tmp_path):
    model = make(one_device)
    with one_device.scope():
        plain = gan.GAN(model.generator, model.discriminator, LATENT, seed=3,
                        sync_batch_norm=False)
        # A penalty given as a function (registered, like a loss callable) reloads too.
        plain.compile(g_optimizer="sgd", d_optimizer="sgd", loss=losses.hinge,
                      penalty=zero_penalty)
    plain.save(str(tmp_path / "plain.keras"))
    with one_device.scope():
        loaded = keras.models.load_model(str(tmp_path / "plain.keras"))
    assert loaded.get_config()["sync_batch_norm"] is False
    assert loaded.loss_fn is losses.hinge and loaded.penalty_fn is zero_penalty


@keras.saving.register_keras_serializable("test_keras_model")
def zero_penalty(discriminator, *, real, fake, noise):
    return tf.zeros_like(noise)


def test_fit_without_any_strategy_scope():
    """The notebook case with no strategy at all (Keras' default strategy): it trains."""
    g, d = architectures.build("dcgan", data_shape=(8, 8, 1), latent_dim=LATENT,
                               g_channels=(8, 4, 2), d_channels=(2, 4))
    model = gan.GAN(g, d, LATENT)
    model.compile(g_optimizer="sgd", d_optimizer="sgd")
    ds = data.make_dataset(data.load("embedded:digits"), global_batch_size=16, seed=0)
    history = model.fit(ds, epochs=1, steps_per_epoch=2, verbose=0).history
    assert int(model.step.numpy()) == 2 and np.isfinite(history["d_loss"][0])
