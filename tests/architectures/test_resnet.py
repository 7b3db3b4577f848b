"""The SNGAN-style `resnet` family: shapes, spectral norm, one device = 2 replicas."""

import keras
import numpy as np
import pytest
import tensorflow as tf

from tf_gan_scale import architectures, data, errors, gan
from tf_gan_scale.layers import SyncBatchNormalization

LATENT = 8
GB = 16
TINY = {"g_channels": (8, 8), "d_channels": (8, 8, 8), "d_downsample": 2}


def spectral_layers(model):
    return [layer for layer in model.layers
            if isinstance(layer, keras.layers.SpectralNormalization)]


@pytest.mark.parametrize("shape,options", [
    ((8, 8, 1), TINY),
    ((16, 16, 3), {"g_channels": (8, 4, 4), "d_channels": (4, 8), "d_downsample": 1}),
    ((8, 12, 3), {"g_channels": (4, 4), "d_channels": (4,), "d_downsample": 1}),
    ((32, 32, 3), {"g_channels": (4, 4, 4), "d_channels": (4, 4, 4, 4)}),  # SNGAN's layout.
])
def test_shapes_and_config_round_trip(shape, options):
    g, d = architectures.build("resnet", data_shape=shape, latent_dim=LATENT, **options)
    z = np.random.default_rng(0).standard_normal((3, LATENT)).astype(np.float32)
    x = g(z, training=True).numpy()
    assert x.shape == (3,) + shape and np.all(np.abs(x) <= 1.0)
    assert d(x, training=True).shape == (3, 1)
    for model, inp in ((g, z), (d, x)):
        clone = model.__class__.from_config(model.get_config())
        clone.set_weights(model.get_weights())
        np.testing.assert_allclose(clone(inp, training=False), model(inp, training=False),
                                   atol=1e-6)


def test_every_batch_norm_is_cross_replica_and_d_is_spectrally_normalized():
    g, d = architectures.build("resnet", data_shape=(8, 8, 1), latent_dim=LATENT, **TINY)
    norms = [layer for layer in g.layers if isinstance(layer, keras.layers.BatchNormalization)]
    assert len(norms) == 5 and all(isinstance(n, SyncBatchNormalization) for n in norms)
    assert not any(isinstance(layer, keras.layers.BatchNormalization) for layer in d.layers)
    weighted = [layer for layer in d.layers if layer.weights]
    assert weighted and all(isinstance(layer, keras.layers.SpectralNormalization)
                            for layer in weighted)
    assert not spectral_layers(g)
    # G's Dense, 2 blocks x 3 convs, output conv; with g_spectral_norm all are wrapped.
    g2, _ = architectures.build("resnet", data_shape=(8, 8, 1), latent_dim=LATENT,
                                g_spectral_norm=True, **TINY)
    assert len(spectral_layers(g2)) == 8


def test_bad_shapes_and_settings_fail_loudly():
    with pytest.raises(errors.ConfigError, match=r"multiples of 8; Received: data_shape=\(12, 12, 1\)"):
        architectures.build("resnet", data_shape=(12, 12, 1), latent_dim=4, g_channels=(4,) * 3)
    with pytest.raises(errors.ConfigError, match="d_downsample must be in"):
        architectures.build("resnet", data_shape=(8, 8, 1), latent_dim=4, d_channels=(4,),
                            d_downsample=2)
    with pytest.raises(errors.ConfigError, match="power_iterations=0"):
        architectures.build("resnet", data_shape=(8, 8, 1), latent_dim=4, power_iterations=0)


def test_spectral_norm_makes_largest_singular_value_one_and_u_is_state(tmp_path):
    keras.utils.set_random_seed(0)
    _, d = architectures.build("resnet", data_shape=(8, 8, 1), latent_dim=LATENT, **TINY)
    x = np.random.default_rng(1).standard_normal((4, 8, 8, 1)).astype(np.float32)
    sn = spectral_layers(d)
    before = [np.linalg.svd(layer.kernel.numpy().reshape(-1, layer.kernel.shape[-1]),
                            compute_uv=False)[0] for layer in sn]
    assert max(abs(s - 1) for s in before) > 0.1  # Not normalized at initialization.
    # One power iteration per training call; random kernels have sigma_2 / sigma_1 up to
    # ~0.97, so u converges slowly (measured max |sigma - 1|: 0.04 after 10 calls, 3e-3
    # after 30, 3e-5 after 60).
    train_call = tf.function(lambda: d(x, training=True))
    for _ in range(50):
        train_call()
    for layer in sn:
        kernel = layer.kernel.numpy().reshape(-1, layer.kernel.shape[-1])
        np.testing.assert_allclose(np.linalg.svd(kernel, compute_uv=False)[0], 1.0, rtol=1e-3)
        u = layer.vector_u
        assert not u.trainable
        assert any(w is u for w in d.non_trainable_weights)
        assert not any(w is u for w in d.trainable_weights)
    # Inference does not touch the state.
    before = [w.numpy() for w in d.weights]
    d(x, training=False)
    for a, b in zip(before, d.weights):
        np.testing.assert_array_equal(a, b.numpy())
    # Saved weights hold u: a fresh D restores it (and so the next training call).
    d.save_weights(tmp_path / "d.weights.h5")
    _, fresh = architectures.build("resnet", data_shape=(8, 8, 1), latent_dim=LATENT, **TINY)
    fresh.load_weights(tmp_path / "d.weights.h5")
    for a, b in zip(spectral_layers(d), spectral_layers(fresh)):
        np.testing.assert_array_equal(a.vector_u.numpy(), b.vector_u.numpy())
    np.testing.assert_allclose(fresh(x, training=True), d(x, training=True), atol=1e-6)


def make(strategy, sync_bn=True):
    keras.utils.set_random_seed(0)
    with strategy.scope():
        g, d = architectures.build("resnet", data_shape=(8, 8, 1), latent_dim=LATENT,
                                   sync_bn=sync_bn, **TINY)
        model = gan.GAN(g, d, LATENT, seed=5, sync_batch_norm="auto" if sync_bn else False)
        model.compile(g_optimizer=keras.optimizers.SGD(0.05),
                      d_optimizer=keras.optimizers.SGD(0.05), loss="hinge")
    return model


def trained_weights(model, strategy, steps=2):
    dataset = data.make_dataset(data.load("embedded:digits"), global_batch_size=GB, seed=0)
    model.fit(strategy.experimental_distribute_dataset(dataset), epochs=1,
              steps_per_epoch=steps, verbose=0)
    return state(model.generator) + state(model.discriminator)


def state(model):
    """(is_u, value) of every weight, trainable or not, in model order (layer names are
    numbered per process, so paths differ between builds)."""
    return [(w.path.endswith("vector_u"), w.numpy()) for w in model.weights]


def max_relative_difference(a, b):
    assert [u for u, _ in a] == [u for u, _ in b]
    return max(np.abs(wa - wb).max() / (1 + np.abs(wa).max()) for (_, wa), (_, wb) in zip(a, b))


@pytest.mark.slow
def test_two_replicas_match_one_device_including_u(one_device, mirrored2):
    a = trained_weights(make(one_device), one_device)
    b = trained_weights(make(mirrored2), mirrored2)
    # Every conv and the dense of D: 3 + 3 + 2 (identity shortcut) + 1.
    assert sum(u for u, _ in a) == 9
    # Spectral norm moved every u (one power iteration per training call of D).
    initial = make(one_device)
    fresh = state(initial.generator) + state(initial.discriminator)
    assert all(not np.allclose(w, w0) for (u, w), (_, w0) in zip(a, fresh) if u)
    assert max_relative_difference(a, b) <= 1e-5  # Measured: 1.3e-7 (float32 rounding).


@pytest.mark.slow
def test_per_replica_batch_norm_breaks_equivalence(one_device, mirrored2):
    a = trained_weights(make(one_device, sync_bn=False), one_device)
    b = trained_weights(make(mirrored2, sync_bn=False), mirrored2)
    assert max_relative_difference(a, b) > 1e-3  # Measured: 6.3e-3.
