"""A `.keras` file written by release 0.1.0 before the package was reorganized
(tests/fixtures/make_v0_1_keras.py) loads with today's code: the registered names, the
compile config and every weight, with the samples it gave when it was written."""

import os

import keras
import numpy as np
import tensorflow as tf

import tf_gan_scale

DATA = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "fixtures")


def test_a_keras_file_of_release_0_1_loads_with_its_settings_and_samples():
    expected = np.load(os.path.join(DATA, "gan_v0_1_expected.npz"))
    model = keras.models.load_model(os.path.join(DATA, "gan_v0_1.keras"))
    assert type(model) is tf_gan_scale.GAN
    assert (model.seed, model.latent_dim, model.num_classes, model.d_steps) == (11, 8, 10, 2)
    assert int(model.step.numpy()) == int(expected["step"]) == 2
    assert model.ema is not None and model.penalty_weight == 0.5
    assert model.loss_fn.__name__ == "hinge" and model.penalty_fn.__name__ == "r1"
    config = model.get_compile_config()
    for key, value in {"augment": "translation", "lecam_weight": 0.3, "lecam_decay": 0.9,
                       "ortho_weight": 1e-3, "instance_noise": 0.05,
                       "instance_noise_steps": 10}.items():
        assert config[key] == value, key
    assert model.g_optimizer.get_config()["beta_1"] == 0.3
    assert model.d_optimizer.get_config()["beta_2"] == 0.9
    np.testing.assert_array_equal(model.lecam_anchors.numpy(), expected["lecam_anchors"])
    z, labels = tf.constant(expected["z"]), tf.constant(expected["labels"])
    # The EMA generator samples (gan(z)); G itself is restored too.
    np.testing.assert_allclose(model([z, labels]).numpy(), expected["samples"], atol=1e-6)
    np.testing.assert_allclose(model.generator([z, labels], training=False).numpy(),
                               expected["generator"], atol=1e-6)
    assert np.abs(expected["samples"] - expected["generator"]).max() > 1e-4  # Two networks.
