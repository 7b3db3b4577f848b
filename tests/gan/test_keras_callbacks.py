"""The Keras callbacks notebook users already use, with a GAN in `fit` on 1 device and on
2 replicas: what each records is checked, not only that it ran."""

import csv
import glob

import keras
import numpy as np
import pytest
import tensorflow as tf

from conftest import shared
from helpers.tiny_gan import digits, make, samples
from tf_gan_scale import errors, latents

STEPS_PER_EPOCH = 2


@pytest.fixture(params=["one_device", "mirrored2"])
def strategy(request):
    return request.getfixturevalue(request.param)


def fit(model, strategy, epochs, callbacks, initial_epoch=0):
    return model.fit(strategy.experimental_distribute_dataset(digits()), epochs=epochs,
                     initial_epoch=initial_epoch, steps_per_epoch=STEPS_PER_EPOCH, verbose=0,
                     callbacks=callbacks).history


def test_csv_logger_and_tensorboard_record_the_global_losses(strategy, tmp_path):
    model = shared(make, strategy, sgd=True)
    history = fit(model, strategy, 3, [keras.callbacks.CSVLogger(str(tmp_path / "log.csv")),
                                       keras.callbacks.TensorBoard(str(tmp_path / "tb"))])
    with open(tmp_path / "log.csv") as f:
        rows = list(csv.DictReader(f))
    assert [int(r["epoch"]) for r in rows] == [0, 1, 2]
    for tag in ("d_loss", "g_loss"):
        np.testing.assert_allclose([float(r[tag]) for r in rows], history[tag], rtol=1e-6)
    logged = {}
    for path in glob.glob(str(tmp_path / "tb" / "train" / "events.*")):
        for event in tf.compat.v1.train.summary_iterator(path):
            for v in event.summary.value:
                logged.setdefault(v.tag, {})[event.step] = float(tf.make_ndarray(v.tensor))
    np.testing.assert_allclose([logged["epoch_d_loss"][e] for e in range(3)],
                               history["d_loss"], rtol=1e-6)


def test_early_stopping_on_a_loss(strategy):
    model = shared(make, strategy, sgd=True)
    # D's loss falls from its first epoch on: "stop when it stops rising" ends after one
    # epoch of patience.
    history = fit(model, strategy, 5, [keras.callbacks.EarlyStopping(
        monitor="d_loss", mode="max", patience=0)])
    epochs = len(history["d_loss"])
    assert 2 <= epochs < 5
    assert int(model.step.numpy()) == epochs * STEPS_PER_EPOCH


def test_model_checkpoint_weights_round_trip(strategy, tmp_path):
    path = str(tmp_path / "gan.weights.h5")
    model = shared(make, strategy, sgd=True)
    fit(model, strategy, 2, [keras.callbacks.ModelCheckpoint(path, save_weights_only=True)])
    fresh = make(strategy, sgd=True)
    assert not np.allclose(samples(fresh), samples(model))
    fresh.load_weights(path)
    np.testing.assert_array_equal(samples(fresh), samples(model))
    # Both optimizers' state comes back too: the step counter is g_optimizer.iterations.
    assert int(fresh.step.numpy()) == int(model.step.numpy()) == 2 * STEPS_PER_EPOCH


def test_backup_and_restore_resumes_at_the_interrupted_epoch(strategy, tmp_path):
    backup = str(tmp_path / "backup")

    class Interrupt(keras.callbacks.Callback):
        def on_epoch_begin(self, epoch, logs=None):
            if epoch == 2:
                raise KeyboardInterrupt

    model = shared(make, strategy, sgd=True)
    with pytest.raises(KeyboardInterrupt):
        fit(model, strategy, 4, [keras.callbacks.BackupAndRestore(backup), Interrupt()])
    after_two = samples(model)
    resumed = make(strategy, sgd=True)
    history = fit(resumed, strategy, 4, [keras.callbacks.BackupAndRestore(backup)])
    # Epochs 0-1 were restored from the backup, not trained again: 2 more epochs ran.
    assert len(history["d_loss"]) == 2
    assert int(resumed.step.numpy()) == 4 * STEPS_PER_EPOCH
    assert not np.allclose(samples(resumed), after_two)


def test_non_finite_training_raises_before_terminate_on_nan_sees_it(one_device):
    # The GAN checks global losses, gradients and weights itself and raises before any
    # callback runs, so TerminateOnNaN (which only stops after a NaN logged loss, with the
    # NaN weights in memory) never gets to act.
    model = make(one_device)
    model.d_optimizer.learning_rate.assign(1e8)
    seen = []

    class Logs(keras.callbacks.Callback):
        def on_train_batch_end(self, batch, logs=None):
            seen.append({k: float(v) for k, v in logs.items()})

    with pytest.raises(errors.NonFiniteError, match="non-finite discriminator"):
        fit(model, one_device, 10, [keras.callbacks.TerminateOnNaN(), Logs()])
    assert all(np.isfinite(list(s.values())).all() for s in seen)
    # The generator can still sample: its weights were never touched by the bad step.
    assert np.isfinite(model.generator(latents.fixed(0, 4, model.latent_dim))).all()
