"""parallel.mesh / parallel.layouts: mesh specs, the layout policy, sharded Keras weights.

In-process on the suite's 2 logical CPUs (a 1x2 and a 2x1 mesh); 4-device meshes run in
subprocesses (the pytest process has 2 devices).
"""

import re

import numpy as np
import pytest
import tensorflow as tf

from tf_gan_scale import architectures, errors
from tf_gan_scale.cluster import mesh_spec
from tf_gan_scale.parallel import layouts, mesh as mesh_lib
from tf_gan_scale.parallel import tensors

MODEL2 = {"batch": 1, "model": 2}


@pytest.fixture(scope="module")
def model_mesh():
    return mesh_lib.make(MODEL2, "CPU")


def dcgan():
    return architectures.build("dcgan", data_shape=(8, 8, 1), latent_dim=6,
                               g_channels=(8, 6, 4), d_channels=(4, 6))


def biggan_conditional():
    return architectures.build("biggan", data_shape=(32, 32, 3), latent_dim=8, ch=4,
                               attention=0, num_classes=3)


@pytest.mark.parametrize("spec, dims", [
    ("batch:2,model:2", {"batch": 2, "model": 2}),
    ("model:4", {"batch": 1, "model": 4}),
    (" batch:8 ", {"batch": 8, "model": 1}),
    ("model:2,batch:3", {"batch": 3, "model": 2}),
])
def test_parse(spec, dims):
    assert mesh_spec.parse(spec) == dims


@pytest.mark.parametrize("spec, message", [
    ("batch:2,modle:2", "unknown axis 'modle'"),
    ("batch:2,batch:2", "repeated axis"),
    ("batch:two", "size 'two' of axis 'batch' is not an integer"),
    ("model:0", "axis 'model' has size 0"),
    ("batch", "no size in 'batch'"),
])
def test_parse_errors_name_the_part_and_the_form(spec, message):
    with pytest.raises(errors.ConfigError, match=message) as info:
        mesh_spec.parse(spec)
    assert "valid: batch:B,model:M" in str(info.value) and "\n" not in str(info.value)


def test_a_mesh_must_use_every_device():
    with pytest.raises(errors.ConfigError,
                       match=r"batch:2,model:2 needs 4 devices, the run has 2 CPU; meshes "
                             r"that fit: batch:2,model:1, batch:1,model:2$"):
        mesh_lib.make({"batch": 2, "model": 2}, "CPU")
    assert mesh_spec.fitting(6) == ["batch:6,model:1", "batch:3,model:2", "batch:2,model:3",
                                   "batch:1,model:6"]


def one(plan, pattern):
    """The one planned path matching `pattern` (Keras numbers layer names per process)."""
    hits = [p for p in plan if re.fullmatch(pattern, p)]
    assert len(hits) == 1, (pattern, hits)
    return hits[0]


G_DENSE, D_DENSE = r"generator/dense(_\d+)?/kernel", r"discriminator/dense(_\d+)?/kernel"
CONVT = r"generator/conv2d_transpose(_\d+)?/kernel"


def test_default_policy_splits_dense_and_embedding_weights_only():
    g, d = dcgan()
    plan = layouts.plan((g, d), {"batch": 2, "model": 2})
    # G's first Dense [6, 2*2*8]: column-parallel; D's head Dense [2*2*6, 1]: out 1 is not
    # divisible, so row-parallel; convolutions, biases, BN and counters replicated.
    assert plan[one(plan, G_DENSE)] == (None, "model")
    assert plan[one(plan, D_DENSE)] == ("model", None)
    sharded = {p for p, s in plan.items() if any(s)}
    assert sharded == {one(plan, G_DENSE), one(plan, D_DENSE)}
    assert all(plan[p] == (None,) * 4 for p in plan if "conv" in p and p.endswith("kernel"))
    # Without a model axis nothing is split.
    assert not any(any(s) for s in layouts.plan((g, d), {"batch": 4, "model": 1}).values())
    # A Dense the axis divides neither way stays replicated: model:5 vs [6, 32] and [24, 1].
    plan5 = layouts.plan((g, d), {"batch": 1, "model": 5})
    assert not any(any(s) for s in plan5.values())


def test_embeddings_split_on_their_last_axis():
    g, d = biggan_conditional()
    plan = layouts.plan((g, d), MODEL2)
    # D's projection embedding (one-hot -> spectrally normalized Dense [classes, C],
    # BigGAN-PyTorch's SNEmbedding) splits; G's shared embedding and the conditional
    # batch norm's gain / bias stay whole by default (layouts.KEEP_WHOLE: DTensor fails
    # on the split), and an override still splits them.
    projection = [layouts.weight_path(d, w) for w in d.weights
                  if w.path.endswith("kernel") and len(w.shape) == 2 and w.shape[0] == 3]
    assert len(projection) == 1 and plan[projection[0]] == (None, "model")
    assert plan["generator/shared/embeddings"] == (None, None)
    cbn = [p for p in plan if "conditional_batch_normalization" in p and "kernel" in p]
    assert cbn and not any(any(plan[p]) for p in cbn)
    forced = layouts.plan((g, d), MODEL2, overrides=[("shared/embeddings", "-,model")])
    assert forced["generator/shared/embeddings"] == (None, "model")
    # Spectral-norm wrappers: the inner Dense's kernel follows the Dense rule; plan paths
    # carry the model's name also where Keras' nested paths do not.
    sn_dense = [p for p in plan
                if re.fullmatch(r"generator/spectral_normalization(_\d+)?/dense(_\d+)?/kernel", p)]
    assert sn_dense and all(plan[p] == (None, "model") for p in sn_dense)
    assert all(p.startswith(("generator/", "discriminator/")) for p in plan)


def test_overrides_win_and_are_checked():
    g, d = dcgan()
    dims = {"batch": 2, "model": 2}
    paths = layouts.plan((g, d), dims)
    g_dense = one(paths, G_DENSE)
    convts = sorted((p for p in paths if re.fullmatch(CONVT, p)),
                    key=lambda p: [w.path for w in g.weights].index(p))
    plan = layouts.plan((g, d), dims, overrides=[
        (g_dense, "model,-"),                 # row- instead of column-parallel
        (convts[0] + "$", "-,-,model,-")])    # [5, 5, out 6, in 8]
    assert plan[g_dense] == ("model", None)
    assert plan[convts[0]] == (None, None, "model", None)
    # The last override matching a weight wins.
    both = [(g_dense, "model,-"), (r"generator/dense", "-,-")]
    assert layouts.plan((g, d), dims, overrides=both)[g_dense] == (None, None)
    assert layouts.plan((g, d), dims, overrides=both[::-1])[g_dense] == ("model", None)
    bad = [
        ((r"no_such_layer", "-"), r"override 'no_such_layer' matches no weight; weight paths:"),
        ((g_dense, "-,modle"), r"unknown axis 'modle'; valid per dimension"),
        ((g_dense, "model"), r"has 1 dimensions; the weight has shape "
                             r"\(6, 32\) \(2: e.g. '-,-'\)"),
        ((g_dense, "model,model"), "same axis"),
        # G's last conv [5, 5, 1, 4]: out channel 1 cannot be split over model=2, and a
        # convolution splits on nothing else (its input channels, 4, would divide).
        ((convts[2] + "$", "-,-,model,-"),
         r"dimension 2 of size 1 is not divisible by model=2; layouts that fit: "
         r"replicated$"),
        ((convts[0] + "$", "-,-,-,model"),
         r"a Conv2DTranspose kernel can be split on its output channels \(dimension 2\) "
         r"only; layouts that fit: -,-,model,-, replicated$"),
        ((convts[0] + "$", "model,-,-,-"), r"output channels \(dimension 2\) only"),
    ]
    for override, message in bad:
        with pytest.raises(errors.ConfigError, match=message):
            layouts.plan((g, d), dims, overrides=[override])


def test_large_convolutions_split_on_their_output_channels(monkeypatch):
    g, d = dcgan()
    # The tiny DCGAN's kernels hold 100 .. 1,200 values; from 101 values on (instead of
    # 2^20) every one the axis divides is split: G's transposed convolutions [5, 5, out,
    # in] on dimension 2, D's [5, 5, in, out] on dimension 3.
    monkeypatch.setattr(layouts, "CONV_SPLIT_MIN_PARAMS", 101)
    plan = layouts.plan((g, d), MODEL2)
    kernels = {w.path: tuple(w.shape) for w in g.weights + d.weights
               if "conv" in w.path and w.path.endswith("kernel")}
    by_shape = {}
    for p, shape in kernels.items():
        by_shape.setdefault((p.split("/")[0], shape), set()).add(plan[p])
    assert by_shape == {
        ("generator", (5, 5, 6, 8)): {(None, None, "model", None)},
        ("generator", (5, 5, 4, 6)): {(None, None, "model", None)},
        ("generator", (5, 5, 1, 4)): {(None,) * 4},  # 1 output channel.
        ("discriminator", (5, 5, 1, 4)): {(None,) * 4},  # 100 values < 101.
        ("discriminator", (5, 5, 4, 6)): {(None, None, None, "model")}}
    # Not divisible by the axis: replicated whatever the size.
    assert not any(any(s) for p, s in layouts.plan((g, d), {"batch": 1, "model": 5}).items()
                   if p in kernels)


def test_split_convolutions_compute_what_keras_does(model_mesh, monkeypatch):
    from tensorflow.experimental import dtensor
    plain_g, plain_d = dcgan()
    g, d = dcgan()
    g.set_weights(plain_g.get_weights())
    d.set_weights(plain_d.get_weights())
    monkeypatch.setattr(layouts, "CONV_SPLIT_MIN_PARAMS", 0)
    plan = layouts.plan((g, d), MODEL2)
    layouts.shard((g, d), model_mesh, plan)
    convt = next(w for w in g.weights if w.shape == (5, 5, 6, 8))
    assert tensors.local_shapes(convt) == [(5, 5, 3, 8)] * 2  # Half the output channels.
    z = np.random.default_rng(0).standard_normal((4, 6)).astype(np.float32)
    rep = dtensor.Layout.replicated(model_mesh, 2)
    out = tf.function(lambda x: g(x, training=False))(dtensor.copy_to_mesh(tf.constant(z), rep))
    want = plain_g(z, training=False).numpy()
    np.testing.assert_allclose(tensors.gather(out), want, atol=1e-6)
    x = tensors.to_mesh(want, model_mesh, ("batch", None, None, None))
    logits = tf.function(lambda x: d(x, training=False))(x)
    np.testing.assert_allclose(tensors.gather(logits), plain_d(want, training=False).numpy(),
                               atol=1e-6)


def test_each_device_holds_its_share_of_a_sharded_weight(model_mesh):
    g, d = dcgan()
    before = {w.path: w.numpy() for w in g.weights + d.weights}
    plan = layouts.plan((g, d), MODEL2)
    layouts.shard((g, d), model_mesh, plan)
    for net in (g, d):
        for w in net.weights:
            np.testing.assert_array_equal(tensors.gather(w), before[w.path])
            pieces = tensors.local_shapes(w)
            assert len(pieces) == 2
            spec = plan[layouts.weight_path(net, w)]
            expected = tuple(n // 2 if axis else n for n, axis in zip(w.shape, spec))
            assert all(p == expected for p in pieces), (w.path, pieces)
    assert tensors.local_shapes(g.weights[0]) == [(6, 16), (6, 16)]  # Half of [6, 32] each.


def test_sharded_generator_computes_what_the_plain_one_does(model_mesh):
    from tensorflow.experimental import dtensor
    plain, _ = dcgan()
    g, _ = dcgan()
    g.set_weights(plain.get_weights())
    layouts.shard((g,), model_mesh, layouts.plan((g,), MODEL2))
    z = np.random.default_rng(0).standard_normal((4, 6)).astype(np.float32)
    z_mesh = dtensor.copy_to_mesh(tf.constant(z), dtensor.Layout.replicated(model_mesh, 2))
    out = tf.function(lambda x: g(x, training=False))(z_mesh)
    np.testing.assert_allclose(tensors.gather(out), plain(z, training=False).numpy(),
                               atol=1e-6)


@pytest.mark.parametrize("direction", ["sharded_to_plain", "plain_to_sharded"])
def test_checkpoints_move_between_sharded_and_plain_weights(tmp_path, model_mesh, direction):
    source, _ = dcgan()
    target, _ = dcgan()  # Other random initial weights: the restore must replace them.
    expected = [w.numpy() for w in source.weights]
    sharded = source if direction == "sharded_to_plain" else target
    layouts.shard((sharded,), model_mesh, layouts.plan((sharded,), MODEL2))
    path = tf.train.Checkpoint(g=source).write(str(tmp_path / "ckpt"))
    tf.train.Checkpoint(g=target).read(path).assert_consumed()
    for w, want in zip(target.weights, expected):
        np.testing.assert_array_equal(tensors.gather(w), want)
    if direction == "plain_to_sharded":
        assert tensors.local_shapes(target.weights[0]) == [(6, 16), (6, 16)]  # Still split.


@pytest.mark.parametrize("transposed", [False, True])
def test_tap_sum_convolutions_equal_keras(transposed):
    # parallel/conv.py on one device, without a mesh: every padding it takes ("same"
    # and "valid", both kinds), odd and even kernels, strides 1-3,
    # non-square inputs. Values and output shapes as Keras' (float32 summation order).
    import itertools

    import keras

    from tf_gan_scale.parallel import conv
    rng = np.random.default_rng(0)
    paddings = ("same", "valid")
    for (h, w), k, s, padding in itertools.product(
            ((7, 7), (8, 6), (5, 9)), ((1, 1), (3, 3), (4, 4), (5, 3), (2, 4)),
            ((1, 1), (2, 2), (3, 1)), paddings):
        if padding == "valid" and (h < k[0] or w < k[1]):
            continue
        kind = keras.layers.Conv2DTranspose if transposed else keras.layers.Conv2D
        layer = kind(3, k, strides=s, padding=padding, use_bias=False)
        x = rng.standard_normal((2, h, w, 2)).astype(np.float32)
        want = layer(x).numpy()
        got = (conv.conv2d_transpose(tf.constant(x), layer.kernel, s, padding) if transposed else
               conv.conv2d(tf.constant(x), layer.kernel, s, padding)).numpy()
        assert got.shape == want.shape, (h, w, k, s, padding)
        np.testing.assert_allclose(got, want, atol=2e-6, err_msg=str((h, w, k, s, padding)))


@pytest.mark.parametrize("up, down, k", [(1, 1, 3), (2, 1, 3), (2, 1, 1), (1, 2, 3),
                                         (1, 2, 1)])
def test_stylegan_resampling_convolutions_by_taps_equal_tensorflows(up, down, k):
    # StyleGAN2's conv2d_resample (every case G's modulated and D's equalized
    # convolutions use) with the tap-sum convolutions a split kernel needs on a mesh.
    from tf_gan_scale.layers import stylegan
    from tf_gan_scale.parallel import conv
    rng = np.random.default_rng(0)
    x = tf.constant(rng.standard_normal((2, 8, 8, 3)), tf.float32)
    w = tf.constant(rng.standard_normal((k, k, 3, 4)), tf.float32)
    want = stylegan.conv2d_resample(x, w, up=up, down=down).numpy()
    got = stylegan.conv2d_resample(x, w, up=up, down=down,
                                   taps=(conv.conv2d, conv.conv2d_transpose)).numpy()
    assert got.shape == want.shape == (2, 8 * up // down, 8 * up // down, 4)
    np.testing.assert_allclose(got, want, atol=2e-5)


@pytest.mark.parametrize("groups, cin, cout, k", [(2, 4, 6, 3), (4, 8, 8, 3), (3, 6, 9, 1),
                                                  (1, 3, 4, 5)])
def test_grouped_convolution_by_taps_equals_the_layer(groups, cin, cout, k):
    # conv.grouped_conv2d (what a split GroupedConv2D computes on a mesh) against the
    # layer's own convolution on one device: values, and the input's and the kernel's
    # gradients (R1 + R2 differentiate the input gradient again, through this).
    from tf_gan_scale.layers.grouped_conv import GroupedConv2D
    from tf_gan_scale.parallel import conv
    layer = GroupedConv2D(cout, groups=groups, kernel_size=k, implementation="einsum")
    rng = np.random.default_rng(0)
    x = tf.constant(rng.standard_normal((2, 5, 6, cin)).astype(np.float32))
    w = tf.constant(rng.standard_normal((2, 5, 6, cout)).astype(np.float32))
    layer(x)
    with tf.GradientTape(persistent=True) as tape:
        tape.watch(x)
        want = tf.reduce_sum(layer(x) * w)
        got = tf.reduce_sum(conv.grouped_conv2d(x, layer.kernel, groups) * w)
    np.testing.assert_allclose(got.numpy(), want.numpy(), rtol=1e-5)
    for a, b in zip(tape.gradient(got, [x, layer.kernel]), tape.gradient(want, [x, layer.kernel])):
        np.testing.assert_allclose(a.numpy(), b.numpy(), atol=2e-5)


def test_grouped_convolutions_split_in_whole_groups_only(monkeypatch):
    from tf_gan_scale.layers.grouped_conv import GroupedConv2D
    monkeypatch.setattr(layouts, "CONV_SPLIT_MIN_PARAMS", 0)
    g, d = architectures.build("r3gan", data_shape=(8, 8, 1), latent_dim=8, widths=(8, 8),
                               blocks=1, cardinality=2)
    grouped = {layouts.weight_path(g, layer.kernel) for layer in g._flatten_layers()
               if isinstance(layer, GroupedConv2D)}
    assert len(grouped) == 2
    on_two = layouts.plan((g, d), MODEL2)  # 2 groups over 2 devices: one each.
    assert all(on_two[p] == (None, None, None, "model") for p in grouped), on_two
    # 4 devices divide the 16 output channels but not the 2 groups: kept whole (a
    # device would need a part of a group's kernel and all of its input channels).
    on_four = layouts.plan((g, d), {"batch": 1, "model": 4})
    assert not any(any(on_four[p]) for p in grouped), on_four
    # Overrides are held to the same rules: output channels only, whole groups only; a
    # depthwise kernel (D's basis) not at all.
    path = sorted(grouped)[0]
    for spec, dims, words in [("-,-,model,-", MODEL2, "output channels"),
                              ("-,-,-,model", {"batch": 1, "model": 4}, "whole groups"),
                              ("-,-,-,model", MODEL2, None)]:
        plan = lambda: layouts.plan((g, d), dims, overrides=((re.escape(path), spec),))  # noqa
        if words is None:
            assert plan()[path] == (None, None, None, "model")
        else:
            with pytest.raises(errors.ConfigError, match=words):
                plan()
    with pytest.raises(errors.ConfigError, match="DepthwiseConv2D kernel cannot be split"):
        layouts.plan((g, d), MODEL2, overrides=(("d4_basis", "-,-,model,-"),))


@pytest.mark.parametrize("k, strides, padding, multiplier", [
    (4, 1, "valid", 1), (3, 1, "same", 2), (3, 2, "same", 1), (2, (2, 1), "valid", 3)])
def test_depthwise_convolution_by_taps_equals_keras(k, strides, padding, multiplier):
    # conv.depthwise_conv2d (how a mesh runs DepthwiseConv2D: DTensor has no layout
    # propagation for its filter gradient): R3GAN's D basis (k 4 over a 4x4 map, valid)
    # and other shapes; values and both gradients.
    import keras

    from tf_gan_scale.parallel import conv
    layer = keras.layers.DepthwiseConv2D(k, strides=strides, padding=padding,
                                         depth_multiplier=multiplier, use_bias=False)
    rng = np.random.default_rng(1)
    x = tf.constant(rng.standard_normal((2, 4, 5, 3)).astype(np.float32))
    want_shape = layer(x).shape
    w = tf.constant(rng.standard_normal(want_shape).astype(np.float32))
    with tf.GradientTape(persistent=True) as tape:
        tape.watch(x)
        want = tf.reduce_sum(layer(x) * w)
        y = conv.depthwise_conv2d(x, layer.kernel, layer.strides, padding)
        got = tf.reduce_sum(y * w)
    assert y.shape == want_shape
    np.testing.assert_allclose(got.numpy(), want.numpy(), rtol=1e-5)
    for a, b in zip(tape.gradient(got, [x, layer.kernel]), tape.gradient(want, [x, layer.kernel])):
        np.testing.assert_allclose(a.numpy(), b.numpy(), atol=2e-5)


def test_layers_switched_to_taps_keep_their_bias_and_activation():
    # conv.use_depthwise_taps / use_taps on a layer instance (what layouts.shard does on a
    # mesh), against an identical twin left alone.
    import keras

    from tf_gan_scale.layers.grouped_conv import GroupedConv2D
    from tf_gan_scale.parallel import conv
    x = tf.constant(np.random.default_rng(2).standard_normal((2, 5, 5, 4)), tf.float32)
    for make, install in (
            (lambda: keras.layers.DepthwiseConv2D(3, padding="same", activation="relu",
                                                  bias_initializer="random_normal"),
             conv.use_depthwise_taps),
            (lambda: GroupedConv2D(6, groups=2, implementation="einsum"), conv.use_taps)):
        plain, tapped = make(), make()
        plain(x), tapped(x)
        tapped.set_weights(plain.get_weights())
        install(tapped)
        np.testing.assert_allclose(tapped(x).numpy(), plain(x).numpy(), atol=1e-5)
