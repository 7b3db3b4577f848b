"""The BigGAN family: layout, conditioning, spectral norm, init, one device = 2 replicas."""

import textwrap

import keras
import numpy as np
import pytest
import tensorflow as tf

from conftest import run_cmd
from tf_gan_scale import architectures, errors
from tf_gan_scale.layers import convert
from tf_gan_scale.architectures import biggan
from tf_gan_scale.layers import (ConditionalBatchNormalization, SelfAttention,
                                 SyncBatchNormalization)

LATENT = 9
CLASSES = 5
# 16x16: G 4 -> 8 -> 16 (2 blocks), D 16 -> 8 -> 4; attention at 8x8 in both.
TINY = {"ch": 4, "g_channels": (2, 1), "attention": 8}


def make(num_classes=CLASSES, shape=(16, 16, 3), latent_dim=LATENT, **options):
    return architectures.build("biggan", data_shape=shape, latent_dim=latent_dim,
                               num_classes=num_classes, **{**TINY, **options})


def latents(n=6, latent_dim=LATENT, seed=0):
    return tf.constant(np.random.default_rng(seed).standard_normal((n, latent_dim)),
                       tf.float32)


def labels(*values):
    return tf.constant(values, tf.int32)


def of_type(model, cls):
    return [layer for layer in model.layers if isinstance(layer, cls)]


def spectral(layer):
    """Every SpectralNormalization wrapper in `layer`, nested ones included."""
    found = [layer] if isinstance(layer, keras.layers.SpectralNormalization) else []
    for sub in layer._flatten_layers(include_self=False, recursive=False):
        found += spectral(sub)
    return found


def sigma(sn):
    kernel = sn.kernel.numpy()
    return np.linalg.svd(kernel.reshape(-1, kernel.shape[-1]), compute_uv=False)[0]


def pytorch_parameter_count(ch, g_mults, d_mults, d_down, attention, res, num_classes,
                            latent_dim, shared_dim=128, channels=3):
    """Trainable parameters of BigGAN-PyTorch's G and D (hier, shared embedding, wide D),
    counted module by module from its BigGAN.py / layers.py, independently of our code."""
    slots = len(g_mults) + 1
    chunk = [latent_dim // slots + (i < latent_dim % slots) for i in range(slots)]

    def attn(c):  # theta, phi C -> C/8; g C -> C/2; o C/2 -> C; no biases; gamma.
        return 2 * c * max(1, c // 8) + 2 * c * max(1, c // 2) + 1

    c_in = ch * g_mults[0]
    g = num_classes * shared_dim + chunk[0] * 16 * c_in + 16 * c_in  # shared, linear.
    for i, m in enumerate(g_mults):
        out, cond = ch * m, shared_dim + chunk[i + 1]
        # conv1, conv2, conv_sc (with biases); ccbn gain and bias (no bias) per BN.
        g += 9 * c_in * out + out + 9 * out * out + out + c_in * out + out
        g += 2 * cond * (c_in + out)
        g += attn(out) if 8 * 2 ** i == attention else 0
        c_in = out
    g += 2 * c_in + 9 * c_in * channels + channels  # Output bn, conv.
    d, c_in, res_now, placed = 0, channels, res, False
    for j, m in enumerate(d_mults):
        out, down = ch * m, j < d_down
        d += 9 * c_in * out + out + 9 * out * out + out
        d += c_in * out + out if (c_in != out or down) else 0
        res_now //= 2 if down else 1
        if res_now == attention and not placed:
            d, placed = d + attn(out), True
        c_in = out
    d += c_in + 1 + num_classes * c_in  # linear, SN embedding (projection).
    return g, d


# ---- Layout.

@pytest.mark.parametrize("res", [32, 64, 128])
@pytest.mark.parametrize("num_classes", [0, CLASSES])
def test_preset_shapes_and_biggan_pytorch_parameter_counts(res, num_classes):
    g, d = architectures.build("biggan", data_shape=(res, res, 3), latent_dim=LATENT,
                               num_classes=num_classes, ch=4)
    z, y = latents(4), labels(0, 1, 4, 2)
    x = g([z, y] if num_classes else z, training=True)
    assert x.shape == (4, res, res, 3)
    assert np.all(np.abs(x.numpy()) <= 1.0)
    assert d([x, y] if num_classes else x, training=True).shape == (4, 1)
    assert len(g.inputs) == len(d.inputs) == (2 if num_classes else 1)
    preset = biggan.PRESETS[res]
    assert len(of_type(g, SelfAttention)) == len(of_type(d, SelfAttention)) == (res == 128)
    if num_classes:  # Same trainable parameters as BigGAN-PyTorch's modules.
        expected = pytorch_parameter_count(
            4, preset["g_channels"], preset["d_channels"], preset["d_downsample"],
            preset["attention"], res, num_classes, LATENT)
        trainable = [sum(int(np.prod(w.shape)) for w in m.trainable_weights) for m in (g, d)]
        assert tuple(trainable) == expected


def test_full_size_128_parameter_count_formula():
    # BigGAN at 128x128 (ch 96, dim_z 120, shared 128, 1000 classes), by the formula our
    # models match above (not built here: 158M weights), 158.4M parameters in all.
    p = biggan.PRESETS[128]
    g, d = pytorch_parameter_count(96, p["g_channels"], p["d_channels"], p["d_downsample"],
                                   p["attention"], 128, 1000, 120)
    assert (g, d) == (70_433_988, 87_982_370)


def test_layout_of_a_tiny_conditional_pair():
    g, d = make()
    # 2 G blocks x 2 cBN, all cross-replica inside; output BN plain and cross-replica.
    cbn = of_type(g, ConditionalBatchNormalization)
    assert len(cbn) == 4 and all(isinstance(c.norm, SyncBatchNormalization) for c in cbn)
    assert all(not c.norm.center and not c.norm.scale for c in cbn)
    assert [type(n).__name__ for n in g.layers if isinstance(n, keras.layers.BatchNormalization)] \
        == ["SyncBatchNormalization"]
    # Hierarchical z: 3 chunks (one per block + one); c = [shared(y), chunk] = 128 + 3.
    assert [tuple(c.gain.layer.kernel.shape) for c in cbn] == [
        (131, 8), (131, 8), (131, 8), (131, 4)]
    assert not of_type(d, keras.layers.BatchNormalization)
    # Attention where asked: G after its 8x8 block (8 channels), D after its 8x8 block.
    (ga,), (da,) = of_type(g, SelfAttention), of_type(d, SelfAttention)
    assert ga.input.shape[1:] == (8, 8, 8) and da.input.shape[1:] == (8, 8, 4)
    assert float(ga.gamma.numpy()) == float(da.gamma.numpy()) == 0.0
    assert ga.gamma.trainable
    # gamma = 0: the attention block is the identity at first.
    x = tf.random.stateless_normal([2, 8, 8, 8], seed=[1, 2])
    np.testing.assert_array_equal(ga(x), x)
    # Unconditional without hier: plain BN with learned scale/offset, no cBN.
    g2, _ = make(num_classes=0, hier=False)
    assert not of_type(g2, ConditionalBatchNormalization)
    assert len(of_type(g2, SyncBatchNormalization)) == 5
    # Unconditional with hier: cBN of the z chunk alone.
    g3, _ = make(num_classes=0)
    assert [c.gain.layer.kernel.shape[0] for c in of_type(g3, ConditionalBatchNormalization)] \
        == [3, 3, 3, 3]
    # No attention with attention=0.
    g4, d4 = make(attention=0)
    assert not of_type(g4, SelfAttention) and not of_type(d4, SelfAttention)


# ---- Conditioning.

def test_labels_change_images_and_logits():
    g, d = make()
    z = latents(4)
    z = tf.concat([z[:1]] * 4, 0)  # One z, four classes.
    x = g([z, labels(0, 1, 2, 3)], training=False).numpy()
    for i in range(1, 4):
        assert np.abs(x[i] - x[0]).max() > 1e-3
    # D: the same images under other labels get other logits (the projection term).
    images = tf.constant(x)
    a = d([images, labels(0, 1, 2, 3)], training=False).numpy()
    b = d([images, labels(4, 4, 4, 4)], training=False).numpy()
    assert np.abs(a - b).min() > 1e-4
    # Unconditional: one input; the images depend on z.
    g0, d0 = make(num_classes=0)
    assert len(g0.inputs) == len(d0.inputs) == 1
    x0 = g0(latents(2), training=False).numpy()
    assert np.abs(x0[0] - x0[1]).max() > 1e-3


@pytest.mark.parametrize("num_classes", [0, CLASSES])
def test_every_z_chunk_reaches_the_images(num_classes):
    g, _ = make(num_classes=num_classes)
    z = latents(2)

    def inputs(z):
        return [z, labels(1, 2)] if num_classes else z

    base = g(inputs(z), training=False).numpy()
    sizes = biggan._chunk_sizes(LATENT, 3)
    assert sizes == [3, 3, 3]
    start = 0
    for size in sizes:  # Chunk 0 -> first Dense; chunk i -> block i's batch norms.
        mask = np.zeros((1, LATENT), np.float32)
        mask[0, start:start + size] = 1.0
        changed = g(inputs(z + 0.5 * mask), training=False).numpy()
        assert np.abs(changed - base).max() > 1e-4
        start += size
    # Uneven splits give the first chunks one more (nothing of z is dropped).
    assert biggan._chunk_sizes(11, 3) == [4, 4, 3]


# ---- Spectral norm and initialization.

def test_spectral_norm_u_is_state_and_sigma_converges_to_one(tmp_path):
    keras.utils.set_random_seed(0)
    # N(0, 0.02) kernels start far from sigma = 1 (orthogonal ones start AT 1).
    g, d = make(init="normal")
    g_sn, d_sn = spectral(g), spectral(d)
    # G: Dense, 2 x (3 convs + 2 cBN x 2 Dense), attention 4, output conv = 20;
    # D: 2 x 3 convs, attention 4, linear, projection embedding = 12.
    assert (len(g_sn), len(d_sn)) == (20, 12)
    for model, sns in ((g, g_sn), (d, d_sn)):
        for sn in sns:
            assert not sn.vector_u.trainable
            assert any(w is sn.vector_u for w in model.non_trainable_weights)
            assert not any(w is sn.vector_u for w in model.trainable_weights)
    assert max(abs(sigma(sn) - 1) for sn in g_sn + d_sn) > 0.5
    z, y = latents(4), labels(0, 1, 2, 3)

    @tf.function
    def train_call():
        x = g([z, y], training=True)
        return d([x, y], training=True)

    # One power iteration per training call; u converges slowly where sigma_2 / sigma_1
    # is near 1 (measured max |sigma - 1| over the 32 kernels: 0.16 after 10 calls,
    # 2e-3 after 40, 9e-5 after 60, 9e-6 after 80).
    for _ in range(60):
        train_call()
    for sn in g_sn + d_sn:
        np.testing.assert_allclose(sigma(sn), 1.0, rtol=1e-3)
    # u is saved with the weights: a fresh pair restores it.
    g.save_weights(tmp_path / "g.weights.h5")
    fresh, _ = make(init="normal")
    fresh.load_weights(tmp_path / "g.weights.h5")
    for a, b in zip(g_sn, spectral(fresh)):
        np.testing.assert_array_equal(a.vector_u.numpy(), b.vector_u.numpy())


def test_orthogonal_init_by_default():
    g, d = make(g_channels=(4, 2), ch=2)
    dense = g.get_layer(index=[i for i, layer in enumerate(g.layers)
                               if isinstance(layer, keras.layers.SpectralNormalization)][0])
    kernel = dense.kernel.numpy()  # [3, 4 * 4 * 8]: orthonormal rows.
    assert kernel.shape == (3, 128)
    np.testing.assert_allclose(kernel @ kernel.T, np.eye(3), atol=1e-5)
    checked = 0
    for sn in spectral(g) + spectral(d):
        k = sn.kernel.numpy().reshape(-1, sn.kernel.shape[-1])
        gram = k.T @ k if k.shape[0] >= k.shape[1] else k @ k.T
        np.testing.assert_allclose(gram, np.eye(len(gram)), atol=1e-5)
        checked += 1
    assert checked == len(spectral(g)) + len(spectral(d))
    shared = g.get_layer("shared").embeddings.numpy()  # [5, 128]
    np.testing.assert_allclose(shared @ shared.T, np.eye(CLASSES), atol=1e-5)
    # "normal": N(0, 0.02).
    g2, _ = make(init="normal", ch=8)
    kernels = np.concatenate([sn.kernel.numpy().ravel() for sn in spectral(g2)])
    assert abs(kernels.std() - 0.02) < 2e-3
    # Same seed, same weights.
    keras.utils.set_random_seed(3)
    a, _ = make()
    keras.utils.set_random_seed(3)
    b, _ = make()
    for wa, wb in zip(a.get_weights(), b.get_weights()):
        np.testing.assert_array_equal(wa, wb)


# ---- One device = 2 replicas.

def split(strategy, array):
    """A per-replica value: replica r gets rows [r * n, (r + 1) * n) of `array`."""
    n = array.shape[0] // strategy.num_replicas_in_sync

    def part(ctx):
        r = ctx.replica_id_in_sync_group
        return tf.constant(array[r * n:(r + 1) * n])
    return strategy.experimental_distribute_values_from_function(part)


def training_call(strategy, sync_bn, with_d=True):
    """(outputs on 2 replicas, on one device, max state differences) for a tiny
    conditional pair called in training mode, G then D (unless not with_d), on 8 examples."""
    keras.utils.set_random_seed(0)
    with strategy.scope():
        g, d = make(sync_bn=sync_bn)
    one_g, one_d = make(sync_bn=sync_bn)
    one_g.set_weights(g.get_weights())
    one_d.set_weights(d.get_weights())
    z = latents(8).numpy()
    y = np.arange(8, dtype=np.int32) % CLASSES

    @tf.function
    def replicated(z, y):
        def fn(z, y):
            x = g([z, y], training=True)
            return x, (d([x, y], training=True) if with_d else x)
        return strategy.run(fn, args=(z, y))

    @tf.function
    def single(z, y):
        x = one_g([z, y], training=True)
        return x, (one_d([x, y], training=True) if with_d else x)

    for _ in range(3):  # Several calls: moving statistics, u and kernels evolve.
        outs = replicated(split(strategy, z), split(strategy, y))
        ones = single(tf.constant(z), tf.constant(y))

    def cat(v):
        return np.concatenate([t.numpy() for t in strategy.experimental_local_results(v)])

    outs = [cat(v) for v in outs]
    ones = [v.numpy() for v in ones]
    between, to_one = {}, {}
    for w, w1 in zip(g.weights + d.weights, one_g.weights + one_d.weights):
        per_replica = [t.numpy() for t in strategy.experimental_local_results(w.value)]
        kind = ("u" if w.path.endswith("vector_u") else
                "moving" if "moving_" in w.path else "trainable" if w.trainable else "other")
        between[kind] = max(between.get(kind, 0.0), np.abs(per_replica[0] - per_replica[1]).max())
        to_one[kind] = max(to_one.get(kind, 0.0), np.abs(per_replica[0] - w1.numpy()).max())
    return outs, ones, between, to_one


@pytest.mark.slow
def test_two_replicas_match_one_device_including_statistics_and_u(mirrored2):
    (x, logits), (x1, logits1), between, to_one = training_call(mirrored2, sync_bn=True)
    # Measured: images 1.8e-6, logits 1.1e-6 (|logits| up to 6.6), moving statistics
    # 2.4e-7, u and the spectrally normalized kernels exactly 0.
    np.testing.assert_allclose(x, x1, atol=1e-5)
    np.testing.assert_allclose(logits, logits1, atol=1e-5, rtol=1e-5)
    assert set(between) == {"u", "moving", "trainable"}
    assert max(between.values()) == 0.0  # The replicas hold identical state.
    assert to_one["moving"] <= 1e-5 and to_one["u"] <= 1e-5 and to_one["trainable"] <= 1e-5


@pytest.mark.slow
def test_per_replica_batch_norm_breaks_equivalence(mirrored2):
    (x, _), (x1, _), between, _ = training_call(mirrored2, sync_bn=False, with_d=False)
    assert np.abs(x - x1).max() > 1e-2  # Measured: 0.99.
    # Each replica's statistics of its own 4 examples (measured: 0.058 apart).
    assert between["moving"] > 1e-3


def test_cross_replica_norms_need_no_conversion_and_per_replica_ones_are_reported():
    # GAN(sync_batch_norm="auto") runs convert.sync_batch_norm under several replicas: it
    # must find nothing to convert (and be able to clone the graph at all).
    g, d = make()
    for model in (g, d):
        assert convert.sync_batch_norm(model) == (model, 0, [])
    g2, _ = make(sync_bn=False)
    _, converted, bad = convert.sync_batch_norm(g2)
    assert converted == 1  # The output BN; the 4 cBN layers keep per-replica statistics.
    assert sum("has synchronized=False" in b for b in bad) == 4


# ---- Bad input.

@pytest.mark.parametrize("kwargs,message", [
    ({"data_shape": (28, 28, 1)},
     "biggan supports 32x32, 64x64, 128x128, 256x256 (and any bottom_width*2**k with "
     "g_channels of length k); Received: 28x28x1"),
    ({"data_shape": (28, 28, 1), "g_channels": (2, 1), "bottom_width": 6},
     "biggan with g_channels of length 2 and bottom_width 6 makes 24x24 images"),
    ({"data_shape": (32, 16, 3)}, "biggan supports 32x32, "),
    ({"data_shape": (32, 32, 3), "g_channels": (2, 1)},
     "biggan with g_channels of length 2 and bottom_width 4 makes 16x16 images "
     "(bottom_width*2**len(g_channels)); Received: 32x32x3"),
    ({"data_shape": (32, 32, 3), "attention": 32},
     "biggan attention must be 0 (none) or a resolution that a G block and a D block both "
     "output: 8, 16; Received: attention=32"),
    ({"data_shape": (32, 32, 3), "latent_dim": 3},
     "biggan with hier=True splits z into 4 chunks (one per G block plus one); latent_dim "
     "must be >= 4; Received: latent_dim=3"),
    ({"data_shape": (32, 32, 3), "init": "xavier"},
     "unknown biggan init 'xavier'; valid: glorot, normal, ortho"),
    ({"data_shape": (32, 32, 3), "d_downsample": 5}, "biggan d_downsample must be in [0, 4]"),
    ({"data_shape": (32, 32, 3), "g_channels": ()}, "biggan g_channels must be a non-empty"),
    ({"data_shape": (32, 32, 3), "ch": 0}, "biggan ch must be an int >= 1; Received: ch=0"),
    ({"data_shape": (32, 32, 3), "dropout": 0.1},
     "unknown option 'dropout' for architecture 'biggan'; valid: ch, g_channels"),
])
def test_bad_settings_fail_in_one_line(kwargs, message):
    kwargs = {"latent_dim": 8, **kwargs}
    with pytest.raises(errors.ConfigError) as info:
        architectures.build("biggan", **kwargs)
    assert message in str(info.value) and "\n" not in str(info.value)


def test_options_are_config_friendly():
    assert architectures.options("biggan") == [
        "ch", "g_channels", "d_channels", "d_downsample", "attention", "shared_dim", "hier",
        "sync_bn", "g_spectral_norm", "d_spectral_norm", "power_iterations", "init",
        "bottom_width"]
    assert architectures.conditional("biggan")
    # Lists (as a config might hold them) work like tuples; no spectral norm is an option.
    g, d = make(g_channels=[2, 1], d_channels=[1, 2], g_spectral_norm=False,
                d_spectral_norm=False, init="glorot")
    assert not spectral(g) and not spectral(d)


# ---- Saving.

@pytest.mark.slow
def test_saved_generator_loads_in_a_fresh_process_with_only_tf_gan_scale_imported(tmp_path):
    g, _ = make()
    z, y = latents(3), labels(0, 3, 4)
    g([z, y], training=True)  # Move the moving statistics and u off their initial values.
    path = str(tmp_path / "g.keras")
    g.save(path)
    np.save(tmp_path / "z.npy", z.numpy())
    np.save(tmp_path / "y.npy", y.numpy())
    script = textwrap.dedent(f"""
        import tf_gan_scale  # Registers the framework's layers with Keras: nothing else.
        import keras, numpy as np
        m = keras.models.load_model({path!r})
        names = {{type(layer).__name__ for layer in m.layers}}
        assert {{"ConditionalBatchNormalization", "SelfAttention", "Split"}} <= names, names
        out = m([keras.ops.convert_to_tensor(np.load({str(tmp_path / "z.npy")!r})),
                 keras.ops.convert_to_tensor(np.load({str(tmp_path / "y.npy")!r}))],
                training=False)
        np.save({str(tmp_path / "out.npy")!r}, keras.ops.convert_to_numpy(out))
    """)
    proc = run_cmd(["-c", script])
    assert proc.returncode == 0, proc.stderr[-3000:]
    np.testing.assert_array_equal(np.load(tmp_path / "out.npy"), g([z, y], training=False))


def test_bottom_width_7_makes_mnist_sized_images():
    """28x28 (MNIST) from a 7x7 start: G's blocks output 14 and 28, D halves to 7x7, and
    self-attention can sit at 14x14 in both."""
    g, d = architectures.build("biggan", data_shape=(28, 28, 1), latent_dim=9, num_classes=10,
                               ch=2, g_channels=(2, 1), bottom_width=7, attention=14)
    z = tf.random.stateless_normal([3, 9], seed=[0, 1])
    labels = tf.constant([0, 5, 9])
    x = g([z, labels], training=True)
    assert x.shape == (3, 28, 28, 1)
    assert d([x, labels], training=True).shape == (3, 1)
    assert g.layers[[type(layer).__name__ for layer in g.layers].index("Reshape")
                    ].output.shape[1:3] == (7, 7)
