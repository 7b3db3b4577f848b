"""R3GAN (architectures/r3gan.py) against the official brownvc/R3GAN Networks.py: exact
parameter counts per preset, the fix-up init, stage order, precision, conditioning and
second-order gradients through D."""

import math
import os

import keras
import numpy as np
import pytest
import tensorflow as tf

from tf_gan_scale import architectures, configs, errors, precision, training
from tf_gan_scale.architectures import r3gan
from tf_gan_scale.layers.grouped_conv import GroupedConv2D

# Counted by building the official networks (brownvc/R3GAN 19a7ddf, R3GAN/Networks.py with
# train.py's preset arguments) in PyTorch on the CPU: sum(p.numel() for p in parameters()).
OFFICIAL = {  # preset, classes: (G, D)
    ("cifar10", 10): (20_781_952, 21_280_512),
    ("cifar10", 0): (20_732_160, 20_683_776),
    ("ffhq64", 0): (22_429_824, 22_381_440),
    ("ffhq256", 0): (23_057_952, 23_009_568),
    ("imagenet32", 1000): (82_914_304, 86_548_992),
    ("imagenet64", 1000): (103_570_432, 107_205_120),
}
TINY = dict(data_shape=(16, 16, 3), latent_dim=8, widths=(16, 16, 8), blocks=(1, 2, 1),
            cardinality=(4, 4, 2))


def build_preset(preset, classes):
    c = configs.r3gan(preset)
    res = configs.R3GAN_PRESETS[preset][0]
    keras.utils.set_random_seed(0)
    return architectures.build("r3gan", data_shape=(res, res, 3), latent_dim=c.model.latent_dim,
                               num_classes=classes, **training.model_options(c))


def count(model):
    return sum(int(np.prod(w.shape)) for w in model.trainable_weights), model.count_params()


@pytest.fixture(scope="module")
def cifar10():
    return build_preset("cifar10", 10)


@pytest.fixture(scope="module")
def tiny():
    keras.utils.set_random_seed(1)
    return r3gan.build(num_classes=3, **TINY)


def test_cifar10_conditional_has_the_official_parameter_counts(cifar10):
    g, d = cifar10
    official_g, official_d = OFFICIAL[("cifar10", 10)]
    # Every weight trainable (the resampling filters are constants, buffers officially).
    assert count(g) == (official_g, official_g) and count(d) == (official_d, official_d)


def test_ffhq64_has_the_official_parameter_counts():
    g, d = build_preset("ffhq64", 0)
    assert (g.count_params(), d.count_params()) == OFFICIAL[("ffhq64", 0)]


@pytest.mark.slow
@pytest.mark.parametrize("preset,classes", [("cifar10", 0), ("ffhq256", 0),
                                            ("imagenet32", 1000), ("imagenet64", 1000)])
def test_large_presets_have_the_official_parameter_counts(preset, classes):
    g, d = build_preset(preset, classes)
    assert (g.count_params(), d.count_params()) == OFFICIAL[(preset, classes)]


def layers_of(model, cls):
    return [layer for layer in model.layers if isinstance(layer, cls)]


def test_init_blocks_are_identity_and_stds_follow_the_fixup_formula(cifar10):
    g, d = cifar10
    gain = math.sqrt(2 / 1.04) * 8 ** -0.25  # L = 8 blocks in each network.
    for net in (g, d):
        convs = {layer.name: layer.kernel.numpy() for layer in net.layers
                 if "_block" in layer.name and hasattr(layer, "kernel")}
        assert len(convs) == 3 * 8, net.name
        for name, kernel in convs.items():
            if name.endswith("conv3"):
                assert not np.any(kernel), name  # Zero: the block is the identity.
            else:  # conv1 fan_in 768; the grouped conv2 fan_in 1536 / 96 * 9 = 144.
                fan_in = 768 if name.endswith("conv1") else 144
                np.testing.assert_allclose(kernel.std(), gain / math.sqrt(fan_in), rtol=0.02,
                                           err_msg=name)
        biases = [w.numpy() for w in net.weights if w.name == "bias"]
        assert len(biases) == 2 * 8 and not any(np.any(b) for b in biases)
    np.testing.assert_allclose(gain / math.sqrt(768), 0.02975, rtol=1e-3)  # The notes' probe.
    np.testing.assert_allclose(gain / math.sqrt(144), 0.06871, rtol=1e-3)
    np.testing.assert_allclose(g.get_layer("basis").basis.numpy().std(), 1.0, rtol=0.05)
    np.testing.assert_allclose(g.get_layer("basis_linear").kernel.numpy().std(),
                               1 / math.sqrt(128), rtol=0.05)  # z ++ embedding: 128.
    # 10 x 64 draws: a looser bound.
    np.testing.assert_allclose(g.get_layer("embedding").embeddings.numpy().std(),
                               1 / math.sqrt(10), rtol=0.2)
    np.testing.assert_allclose(d.get_layer("embedding").embeddings.numpy().std(),
                               1 / math.sqrt(768) / math.sqrt(10), rtol=0.05)
    np.testing.assert_allclose(d.get_layer("d4_basis").kernel.numpy().std(), 0.25, rtol=0.05)
    np.testing.assert_allclose(d.get_layer("d4_linear").kernel.numpy().std(),
                               1 / math.sqrt(768), rtol=0.1)


def test_stage_order_and_transitions_as_official():
    g, d = r3gan.build(data_shape=(16, 16, 3), latent_dim=8, widths=(16, 16, 8), blocks=1,
                       cardinality=(4, 4, 2))
    names = [layer.name for layer in g.layers]
    # G: basis, blocks at 4x4; width unchanged -> no 1x1 at 8x8; 1x1 BEFORE the x2 up.
    assert names.index("basis") < names.index("g4_block0_add") < names.index("g8_up")
    assert "g8_transition" not in names
    assert names.index("g16_transition") + 1 == names.index("g16_up")
    assert names[-1] == "aggregation"
    names = [layer.name for layer in d.layers]
    # D: extraction, blocks then x2 down FIRST, then the 1x1 (width 8 -> 16).
    assert names[1] == "extraction"
    assert names.index("d16_block0_add") < names.index("d16_down") < names.index(
        "d16_transition")
    assert "d8_transition" not in names and names[-3:] == ["d4_basis", "d4_flatten",
                                                           "d4_linear"]
    assert d.get_layer("d4_basis").kernel.shape == (4, 4, 16, 1)  # Depthwise, no bias.
    assert [type(layer).__name__ for layer in layers_of(g, GroupedConv2D)] == ["GroupedConv2D"] * 3
    assert layers_of(g, GroupedConv2D)[-1].groups == 2


def test_no_normalization_anywhere(cifar10):
    for net in cifar10:
        kinds = {type(layer).__name__ for layer in net.layers}
        assert not [k for k in kinds if "Norm" in k], kinds
        assert not [w.path for w in net.weights if "moving" in w.path or "gamma" in w.path]
        assert all(w.trainable for w in net.weights)


def test_output_shape_dtype_and_conditioning(tiny):
    g, d = tiny
    z = tf.random.stateless_normal([4, 8], [0, 1])
    x0 = g([z, tf.constant([0, 0, 0, 0])])
    x1 = g([z, tf.constant([1, 1, 1, 1])])
    assert x0.shape == (4, 16, 16, 3) and x0.dtype == tf.float32
    assert float(tf.reduce_max(tf.abs(x0 - x1))) > 1e-3  # Labels reach G ...
    logits = d([x0, tf.constant([0, 1, 2, 0])])
    assert logits.shape == (4, 1) and logits.dtype == tf.float32
    other = d([x0, tf.constant([1, 2, 0, 1])])
    assert float(tf.reduce_max(tf.abs(logits - other))) > 1e-6  # ... and D (projection).
    # The projection: sum over E of D's features times the label's embedding.
    features = keras.Model(d.inputs, d.get_layer("d4_linear").output)([x0, tf.zeros(4, tf.int32)])
    e = tf.gather(d.get_layer("embedding").embeddings, [0, 1, 2, 0])
    np.testing.assert_allclose(logits[:, 0], tf.reduce_sum(features * e, 1), rtol=1e-5,
                               atol=1e-6)


@pytest.mark.parametrize("policy", ["float32", "mixed_bfloat16"])
def test_bf16_stages_follow_the_policy(policy):
    with precision.policy(policy):
        g, d = r3gan.build(bf16_stages=2, **TINY)
    half = "bfloat16" if policy == "mixed_bfloat16" else "float32"
    dtype = {layer.name: layer.compute_dtype for net in (g, d) for layer in net.layers}
    assert dtype["g4_block0_conv2"] == dtype["basis"] == dtype["d4_block0_conv2"] == "float32"
    assert dtype["g8_block0_conv2"] == dtype["g16_block0_conv2"] == half
    assert dtype["d16_block0_conv2"] == dtype["d8_block0_conv2"] == dtype["extraction"] == half
    assert dtype["d16_down"] == dtype["d16_transition"] == dtype["d8_down"] == half
    assert dtype["aggregation"] == dtype["d4_linear"] == "float32"
    assert {w.dtype for net in (g, d) for w in net.weights} == {"float32"}
    x = g(tf.zeros([2, 8]))
    assert x.dtype == d(x).dtype == tf.float32


def test_second_order_gradients_through_d(tiny):
    _, d = tiny
    # Non-zero last convs, so gradients reach every block's first two layers too.
    for layer in d.layers:
        if layer.name.endswith("conv3"):
            layer.kernel.assign(tf.random.stateless_normal(layer.kernel.shape, [1, 2]) * 0.1)
    x = tf.random.stateless_normal([3, 16, 16, 3], [3, 4])
    labels = tf.constant([0, 1, 2])
    with tf.GradientTape() as outer:
        with tf.GradientTape() as inner:
            inner.watch(x)
            total = tf.reduce_sum(d([x, labels], training=True))
        gx = inner.gradient(total, x)
        r1 = tf.reduce_sum(tf.square(gx))
    grads = [tf.convert_to_tensor(grad) for grad in outer.gradient(r1, d.trainable_weights)]
    assert float(r1) > 0 and np.isfinite(float(r1))
    for w, grad in zip(d.trainable_weights, grads):
        assert grad is not None and np.all(np.isfinite(grad.numpy())), w.path
        if w.name != "bias":  # Piecewise-linear D: dR1/dbias is 0 almost everywhere.
            assert float(tf.reduce_max(tf.abs(grad))) > 0, w.path


def test_bottom_width_7_gives_28x28_mnist_stages():
    # bottom_width 7: G 7 -> 14 -> 28 and D back, the basis and D's depthwise conv 7x7.
    g, d = r3gan.build(data_shape=(28, 28, 1), latent_dim=8, widths=(16, 16, 8), blocks=1,
                       cardinality=4, bottom_width=7)
    assert g.get_layer("basis").basis.shape == (7, 7, 16)
    assert d.get_layer("d4_basis").kernel.shape == (7, 7, 16, 1)
    assert [int(g.get_layer(f"g{r}_up").output.shape[1]) for r in (14, 28)] == [14, 28]
    image = g(tf.random.stateless_normal([2, 8], [5, 6]))
    assert image.shape == (2, 28, 28, 1)
    assert d(image).shape == (2, 1)
    # The basis conv's fix-up fan-in is the whole 7x7 window: std 1 / sqrt(49).
    np.testing.assert_allclose(float(np.std(d.get_layer("d4_basis").kernel.numpy())),
                               1 / 7, rtol=0.35)
    g4, _ = r3gan.build(data_shape=(16, 16, 3), latent_dim=8, widths=(16, 16, 8), blocks=1,
                        cardinality=4)
    assert g4.get_layer("basis").basis.shape == (4, 4, 16)  # The official default.


def test_bad_configurations_fail_loudly():
    with pytest.raises(errors.ConfigError, match="one width, block count and cardinality per "
                                                 "stage 4x4..16x16"):
        r3gan.build(data_shape=(16, 16, 3), latent_dim=8, widths=(16, 16))
    with pytest.raises(errors.ConfigError, match="cardinality 5 does not divide"):
        r3gan.build(**{**TINY, "cardinality": 5})
    with pytest.raises(errors.ConfigError, match=r"bf16_stages must be in \[0, 2\]"):
        r3gan.build(**{**TINY, "bf16_stages": 3})
    with pytest.raises(errors.ConfigError, match="Received: data_shape=\\(12, 12, 3\\)"):
        r3gan.build(**{**TINY, "data_shape": (12, 12, 3)})
    with pytest.raises(errors.ConfigError, match=r"bottom_width \(7\) times a power of two"):
        r3gan.build(**{**TINY, "data_shape": (21, 21, 3), "bottom_width": 7})
    with pytest.raises(errors.ConfigError, match="bottom_width must be an int >= 2"):
        r3gan.build(**{**TINY, "bottom_width": "4"})
    with pytest.raises(errors.ConfigError, match="unknown r3gan preset 'cifar'"):
        configs.r3gan("cifar")


# ---- against the official networks' numbers ---------------------------------------------
# tests/fixtures/make_r3gan_networks_official.py ran the official G and D (torch, CPU) at
# TINY's configuration with 3 classes, in float32 and float64, and stored their weights.
GOLDEN = os.path.join(os.path.dirname(__file__), "..", "fixtures", "r3gan_networks_official.npz")


def torch_conv(w):
    """[out, in / groups, kh, kw] (torch) -> [kh, kw, in / groups, out] (Keras)."""
    return w.transpose(2, 3, 1, 0)


def official_weights(f):
    """{network: {our layer name: its weights}} from the official parameter names."""
    nets = {"G": {}, "D": {}}

    def block(src, net, dst):
        for k in (1, 2, 3):
            nets[net][f"{dst}_conv{k}"] = [torch_conv(f[f"{src}.LinearLayer{k}.Layer.weight"])]
        for k in (1, 2):
            nets[net][f"{dst}_act{k}"] = [f[f"{src}.NonLinearity{k}.Bias"]]

    g, d, res = nets["G"], nets["D"], [4, 8, 16]
    g["basis"] = [f["G.MainLayers.0.Layers.0.Basis"].transpose(1, 2, 0)]  # (W,4,4) -> (4,4,W)
    g["basis_linear"] = [f["G.MainLayers.0.Layers.0.LinearLayer.weight"].T]
    g["embedding"] = [f["G.EmbeddingLayer.weight"].T]  # Linear(one-hot) = Embedding.
    g["aggregation"] = [torch_conv(f["G.AggregationLayer.Layer.weight"])]
    for i, r in enumerate(res):
        transition = f"G.MainLayers.{i}.Layers.0.LinearLayer.Layer.weight"
        if i and transition in f:
            g[f"g{r}_transition"] = [torch_conv(f[transition])]
        for j in range(TINY["blocks"][i]):
            block(f"G.MainLayers.{i}.Layers.{j + 1}", "G", f"g{r}_block{j}")
    d["extraction"] = [torch_conv(f["D.ExtractionLayer.Layer.weight"])]
    d["embedding"] = [f["D.EmbeddingLayer.weight"].T]
    for i, r in enumerate(res[::-1]):
        n = TINY["blocks"][::-1][i]
        for j in range(n):
            block(f"D.MainLayers.{i}.Layers.{j}", "D", f"d{r}_block{j}")
        transition = f"D.MainLayers.{i}.Layers.{n}.LinearLayer.Layer.weight"
        if transition in f:
            d[f"d{r}_transition"] = [torch_conv(f[transition])]
    last = f"D.MainLayers.2.Layers.{TINY['blocks'][0]}"
    d["d4_basis"] = [f[last + ".Basis.weight"].transpose(2, 3, 0, 1)]  # (W,1,4,4) -> (4,4,W,1)
    d["d4_linear"] = [f[last + ".LinearLayer.weight"].T]
    return nets


def test_equals_the_official_networks_within_their_float32_rounding():
    f = dict(np.load(GOLDEN))
    g, d = r3gan.build(num_classes=3, **TINY)
    nets = official_weights(f)
    for net, weights in ((g, nets["G"]), (d, nets["D"])):
        for name, arrays in weights.items():
            net.get_layer(name).set_weights(arrays)
        loaded = sum(a.size for arrays in weights.values() for a in arrays)
        assert loaded == net.count_params() == sum(
            v.size for k, v in f.items() if k.startswith(net.name[0].upper() + ".")), net.name
    labels = tf.constant(f["labels"], tf.int32)
    x = tf.constant(f["x"].transpose(0, 2, 3, 1))  # NCHW -> NHWC
    with tf.GradientTape() as tape:
        tape.watch(x)
        logits = d([x, labels])
        total = tf.reduce_sum(logits)
    ours = {"g": g([tf.constant(f["z"]), labels]).numpy().transpose(0, 3, 1, 2),
            "d": logits.numpy()[:, 0],
            "r1_grad": tape.gradient(total, x).numpy().transpose(0, 3, 1, 2)}
    for key, value in ours.items():
        exact = f[f"{key}_fp64"]
        official = np.abs(f[f"{key}_fp32"] - exact).max()  # The official's own rounding.
        assert np.abs(exact).max() > 1e3 * official, key  # Non-trivial values.
        assert np.abs(value - exact).max() <= 3 * official, (key, np.abs(value - exact).max(),
                                                             official)
