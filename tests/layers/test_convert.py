"""convert.sync_batch_norm and GAN(sync_batch_norm=...): the user's own plain-Keras BN."""

import json
import logging
import sys

import keras
import numpy as np
import pytest
import tensorflow as tf

from tf_gan_scale import architectures, data, distribute, gan
from tf_gan_scale.layers import convert

L = keras.layers
LATENT = 8
GB = 16


def user_generator():
    """keras.io DCGAN style, small: Dense -> BN -> LeakyReLU -> Reshape -> ConvT -> BN ..."""
    return keras.Sequential([
        keras.Input((LATENT,)),
        L.Dense(2 * 2 * 16, use_bias=False), L.BatchNormalization(), L.LeakyReLU(0.2),
        L.Reshape((2, 2, 16)),
        L.Conv2DTranspose(8, 4, strides=2, padding="same", use_bias=False),
        L.BatchNormalization(), L.LeakyReLU(0.2),
        L.Conv2DTranspose(1, 4, strides=2, padding="same", activation="tanh"),
    ], name="generator")


def user_discriminator():
    return keras.Sequential([
        keras.Input((8, 8, 1)),
        L.Conv2D(8, 4, strides=2, padding="same"), L.LeakyReLU(0.2),
        L.Conv2D(16, 4, strides=2, padding="same"), L.BatchNormalization(), L.LeakyReLU(0.2),
        L.Flatten(), L.Dropout(0.0), L.Dense(1),
    ], name="discriminator")


def names(model):
    return [type(layer).__name__ for layer in model.layers]


def assert_same_weights(a, b):
    wa, wb = a.get_weights(), b.get_weights()
    assert len(wa) == len(wb)
    for x, y in zip(wa, wb):
        np.testing.assert_array_equal(x, y)


@pytest.mark.parametrize("make,inputs,count", [
    (user_generator, lambda: tf.random.normal([16, LATENT], seed=1), 2),
    (user_discriminator, lambda: tf.random.uniform([16, 8, 8, 1], -1, 1, seed=2), 1),
])
def test_converts_keras_io_style_networks(make, inputs, count):
    keras.utils.set_random_seed(0)
    model = make()
    x = inputs()
    # Non-trivial moving statistics, so copying them is checked.
    model(x * 2.0 + 0.5, training=True)
    new, converted, unconvertible = convert.sync_batch_norm(model)
    assert (converted, unconvertible) == (count, [])
    assert new is not model and new.name == model.name
    assert names(new) == [n.replace("BatchNormalization", "SyncBatchNormalization")
                          for n in names(model)]
    assert all(n != "BatchNormalization" for n in names(new))
    assert_same_weights(model, new)  # Before any training call: moving stats included.
    np.testing.assert_array_equal(model(x, training=False), new(x, training=False))
    # Batch statistics: our one formula vs Keras' moments, on one device.
    np.testing.assert_allclose(model(x, training=True), new(x, training=True), atol=1e-6)
    # And the moving statistics they updated.
    for a, b in zip(model.get_weights(), new.get_weights()):
        np.testing.assert_allclose(a, b, atol=1e-6)


def test_nested_sequential_in_functional_is_converted():
    keras.utils.set_random_seed(0)
    inner = keras.Sequential([L.Dense(6), L.BatchNormalization()], name="inner")
    inner.build((None, 5))
    x = keras.Input((5,))
    y = L.BatchNormalization()(L.Dense(3)(inner(x)))
    model = keras.Model(x, y)
    new, converted, unconvertible = convert.sync_batch_norm(model)
    assert (converted, unconvertible) == (2, [])
    assert names(new) == ["InputLayer", "Sequential", "Dense", "SyncBatchNormalization"]
    assert names(new.layers[1]) == ["Dense", "SyncBatchNormalization"]
    assert new.layers[1] is not inner
    assert_same_weights(model, new)
    z = tf.random.normal([8, 5], seed=3)
    np.testing.assert_array_equal(model(z), new(z))


def test_nothing_to_convert_returns_the_same_model():
    g, _ = architectures.build("dcgan", data_shape=(8, 8, 1), latent_dim=LATENT,
                               g_channels=(16, 8, 4), d_channels=(4, 8))
    assert convert.sync_batch_norm(g) == (g, 0, [])


def test_unconvertible_layers_are_listed():
    class MyBN(L.BatchNormalization):
        pass

    class Block(L.Layer):  # A custom layer with batch norm inside (no get_config).
        def __init__(self):
            super().__init__(name="block")
            self.bn = L.BatchNormalization(name="inner_bn")

        def call(self, x, training=False):
            return self.bn(x, training=training)

    model = keras.Sequential([
        keras.Input((4, 4, 3)),
        L.BatchNormalization(axis=1), L.BatchNormalization(renorm=True), MyBN(),
        L.BatchNormalization(), Block(),
    ])
    new, converted, unconvertible = convert.sync_batch_norm(model)
    assert converted == 1
    assert names(new) == ["BatchNormalization", "BatchNormalization", "MyBN",
                          "SyncBatchNormalization", "Block"]
    assert new.layers[-1] is model.layers[-1]  # Not clonable from config: shared.
    assert len(unconvertible) == 4
    assert "axis=1" in unconvertible[0] and "renorm" in unconvertible[1]
    assert "MyBN subclasses BatchNormalization" in unconvertible[2]
    assert unconvertible[3] == ("block/inner_bn (BatchNormalization): inside custom layer "
                                "Block")
    assert_same_weights(model, new)


class Subclassed(keras.Model):
    def __init__(self):
        super().__init__(name="sub_d")
        self.conv = L.Conv2D(4, 3, padding="same")
        self.bn = L.BatchNormalization(name="sub_bn")
        self.head = L.Dense(1)

    def call(self, x, training=False):
        return self.head(tf.reshape(self.bn(self.conv(x), training=training), [-1, 256]))


def test_subclassed_model_is_reported_with_a_warning(caplog):
    model = Subclassed()
    model(tf.zeros([2, 8, 8, 1]))
    new, converted, unconvertible = convert.sync_batch_norm(model)
    assert new is model and converted == 0
    assert len(unconvertible) == 1 and unconvertible[0].startswith("sub_bn (BatchNormalization)")
    caplog.set_level(logging.INFO)
    g = user_generator()
    g_new, d_new = convert.for_gan(g, model, True)
    assert d_new is model and g_new is not g
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1 and "discriminator layer sub_bn" in warnings[0]
    infos = [r.getMessage() for r in caplog.records if r.levelno == logging.INFO]
    assert infos == ["converted 2/0 BatchNormalization layers of generator/discriminator to "
                     "SyncBatchNormalization (cross-replica statistics); pass "
                     "sync_batch_norm=False to keep them per replica"]


def test_gan_modes(one_device, mirrored2, caplog):
    caplog.set_level(logging.INFO)
    with pytest.raises(ValueError, match="Received: sync_batch_norm='yes'"):
        convert.for_gan(user_generator(), user_discriminator(), "yes")
    with one_device.scope():  # One replica: "auto" leaves the networks alone.
        g, d = user_generator(), user_discriminator()
        model = gan.GAN(g, d, LATENT, sync_batch_norm="auto")
        assert model.generator is g and model.discriminator is d
        assert "SyncBatchNormalization" in names(gan.GAN(g, d, LATENT,
                                                         sync_batch_norm=True).generator)
    with mirrored2.scope():
        g, d = user_generator(), user_discriminator()
        assert gan.GAN(g, d, LATENT, sync_batch_norm=False).generator is g
        caplog.clear()
        model = gan.GAN(g, d, LATENT, sync_batch_norm="auto")
        assert "BatchNormalization" not in names(model.generator) + names(model.discriminator)
        assert [r.getMessage()[:39] for r in caplog.records] == [
            "converted 2/1 BatchNormalization layers"]
        # The built-in architectures already use SyncBatchNormalization: no log line.
        caplog.clear()
        g, d = architectures.build("dcgan", data_shape=(8, 8, 1), latent_dim=LATENT,
                                   d_norm="batch", g_channels=(16, 8, 4), d_channels=(4, 8))
        model = gan.GAN(g, d, LATENT, sync_batch_norm="auto")
        assert model.generator is g and model.discriminator is d and not caplog.records


def train(strategy, steps=4, sync_batch_norm="auto"):
    keras.utils.set_random_seed(0)
    with strategy.scope():
        model = gan.GAN(user_generator(), user_discriminator(), LATENT, seed=5,
                        sync_batch_norm=sync_batch_norm)
        model.compile(g_optimizer=keras.optimizers.SGD(0.05),
                      d_optimizer=keras.optimizers.SGD(0.05), loss="non_saturating")
    dataset = data.make_dataset(data.load("embedded:digits"), global_batch_size=GB, seed=0)
    model.fit(strategy.experimental_distribute_dataset(dataset), epochs=1,
              steps_per_epoch=steps, verbose=0)
    return [w.numpy() for w in model.generator.weights + model.discriminator.weights]


def max_diff(a, b):
    """The equivalence metric: max |a - b| / (1 + max |a|) over all variables."""
    return max(np.abs(x - y).max() / (1 + np.abs(x).max()) for x, y in zip(a, b))


@pytest.mark.slow
def test_user_gan_on_two_replicas_matches_one_device(one_device, mirrored2):
    one = train(one_device)
    assert max_diff(one, train(mirrored2)) <= 1e-5  # Converted by "auto" (measured 6e-8).
    # Per-replica BN (the opt-out) measurably differs: the check above can fail.
    assert max_diff(one, train(mirrored2, sync_batch_norm=False)) > 1e-3  # Measured 1e-2.


@pytest.mark.slow
def test_user_gan_on_four_replicas_matches_one_device():
    # Another replica count: its own process (one MirroredStrategy per process).
    from conftest import run_cmd

    proc = run_cmd(["tests/layers/test_convert.py", "4"], timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    diffs = json.loads(proc.stdout.strip().splitlines()[-1])
    assert diffs["sync"] <= 1e-5 and diffs["local"] > 1e-3, diffs


def main(replicas):
    """Prints {"sync": diff, "local": diff}: the user GAN on `replicas` logical CPUs, with
    "auto" and with per-replica BN, against one device (same metric as above)."""
    distribute.configure_cpu_devices(replicas)  # Before TensorFlow initializes devices.
    one = train(tf.distribute.OneDeviceStrategy("/cpu:0"))
    many = tf.distribute.MirroredStrategy([f"/cpu:{i}" for i in range(replicas)])
    print(json.dumps({"sync": float(max_diff(one, train(many))),
                      "local": float(max_diff(one, train(many, sync_batch_norm=False)))}))


if __name__ == "__main__":
    main(int(sys.argv[1]))
