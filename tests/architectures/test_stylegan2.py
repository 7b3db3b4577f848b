"""The StyleGAN2 family: official parameter counts, w indexing, per-row noise (one device =
N replicas), w_avg, clone/save round trips, second-order gradients, config errors."""

import keras
import numpy as np
import pytest
import tensorflow as tf

from tf_gan_scale import errors, latents
from tf_gan_scale.architectures import stylegan2
from tf_gan_scale.layers import stylegan as sg

# 32x32, 4 convs wide at most: seconds to build and run.
SMALL = dict(data_shape=(32, 32, 3), latent_dim=32, w_dim=32, fmaps=1 / 256,
             mapping_layers=2, channel_max=16)


def count(model):
    return sum(int(np.prod(v.shape)) for v in model.trainable_weights)


def layer_count(model, path):
    """Trainable parameters of the layer `path` ("synthesis/b64_conv0" or "b4_fc")."""
    top, _, sub = path.partition("/")
    layer = model.get_layer(top)
    if sub:
        layer = next(x for x in layer._flatten_layers(include_self=False) if x.name == sub)
    return count(layer)


def z_of(n, dim=32, seed=0):
    return tf.constant(np.random.default_rng(seed).standard_normal((n, dim)), tf.float32)


# ---- official parameter counts (notes section 15.1) ----------------------------------

def test_paper256_counts_and_per_layer_anchors():
    g, d = stylegan2.build(data_shape=(256, 256, 3), fmaps=0.5, mbstd_group=8)
    assert (count(g), count(d)) == (24_767_458, 24_001_089)
    mapping, synthesis = stylegan2.parts(g)
    assert (count(mapping), count(synthesis)) == (2_101_248, 22_666_210)
    assert count(mapping.fcs[0]) == 262_656
    assert synthesis.num_ws == stylegan2.num_ws(256) == 14
    g_rows = {"b4_conv1": 2_622_465, "b4_torgb": 264_195, "b8_conv0": 2_622_465,
              "b32_conv1": 2_622_465, "b32_torgb": 264_195, "b64_conv0": 1_442_561,
              "b64_conv1": 721_409, "b64_torgb": 132_099, "b128_conv0": 426_369,
              "b128_conv1": 213_249, "b128_torgb": 66_051, "b256_conv0": 139_457,
              "b256_conv1": 69_761, "b256_torgb": 33_027}
    assert {k: layer_count(g, f"synthesis/{k}") for k in g_rows} == g_rows
    assert int(np.prod(synthesis.const.shape)) == 8_192
    d_rows = {"b256_fromrgb": 256, "b256_skip": 8_192, "b256_conv0": 36_928,
              "b256_conv1": 73_856, "b128_skip": 32_768, "b128_conv0": 147_584,
              "b128_conv1": 295_168, "b64_skip": 131_072, "b64_conv0": 590_080,
              "b64_conv1": 1_180_160, "b8_skip": 262_144, "b8_conv0": 2_359_808,
              "b8_conv1": 2_359_808, "b4_conv": 2_364_416, "b4_fc": 4_194_816, "b4_out": 513}
    assert {k: count(d.get_layer(k)) for k in d_rows} == d_rows
    # Buffers: per conv layer r^2 noise_const (the official r^2 + 16 minus the filter),
    # plus w_avg and our call counter.
    noise = sum(int(np.prod(v.shape)) for v in g.non_trainable_weights
                if "noise_const" in v.path)
    assert noise == 16 + 2 * sum(r * r for r in (8, 16, 32, 64, 128, 256))


def test_cifar_counts():
    cifar = dict(data_shape=(32, 32, 3), mapping_layers=2, d_architecture="orig",
                 mbstd_group=32)
    g, d = stylegan2.build(**cifar)
    assert (count(g), count(d)) == (19_947_539, 20_720_641)
    assert count(stylegan2.parts(g)[1]) == 19_422_227
    g, d = stylegan2.build(**cifar, num_classes=10)
    assert (count(g), count(d)) == (20_215_315, 23_089_664)
    assert count(d.get_layer("mapping")) == 5_632 + 8 * 262_656  # embed + 8 FCs.
    assert [layer.name for layer in d.layers if "skip" in layer.name] == []


def test_stylegan2_1024_counts():
    g, d = stylegan2.build(data_shape=(1024, 1024, 3))
    assert (count(g), count(d)) == (30_370_060, 29_012_513)
    assert count(d.get_layer("b1024_fromrgb")) == 128
    assert stylegan2.parts(g)[1].num_ws == 18
    # auto@1024 (map 2) matches the pasted print_module_summary total.
    assert count(g) - 6 * 262_656 == 28_794_124


def test_channels_and_num_ws():
    assert [stylegan2.channels(r, 0.5) for r in (4, 32, 64, 128, 256)] == [512, 512, 256,
                                                                         128, 64]
    assert [stylegan2.channels(r) for r in (64, 128, 1024)] == [512, 256, 32]
    assert [stylegan2.num_ws(r) for r in (32, 256, 512, 1024)] == [8, 14, 16, 18]


@pytest.mark.parametrize("shape,what", [((48, 48, 3), "data_shape=(48, 48, 3)"),
                                        ((4, 4, 3), "data_shape=(4, 4, 3)"),
                                        ((32, 16, 3), "H == W")])
def test_bad_resolution_is_one_line(shape, what):
    with pytest.raises(errors.ConfigError) as info:
        stylegan2.build(data_shape=shape)
    assert what in str(info.value) and "\n" not in str(info.value)


def test_helpers_for_the_step():
    _, d = stylegan2.build(**SMALL, mbstd_group=2, mbstd_chunk=8)
    assert stylegan2.mbstd_chunk(d) == 8
    assert stylegan2.mbstd_chunk(keras.Sequential([keras.Input((2,)),
                                                   keras.layers.Dense(1)])) == 0
    model = {"mbstd_group": 4, "mbstd_chunk": 8}
    stylegan2.check_batch(model, 16)
    with pytest.raises(errors.ConfigError, match="per-replica batch 12 is not a multiple of 8"):
        stylegan2.check_batch(model, 12)
    with pytest.raises(errors.ConfigError, match="not a multiple of 4; valid: a per-replica "
                                                 "batch that is a multiple of 4$"):
        stylegan2.check_batch({"mbstd_group": 4}, 6)
    with pytest.raises(errors.ConfigError, match=r"valid: mbstd_chunk in 4, 12 \(multiples "
                                                 r"of mbstd_group dividing 12\), or a "):
        stylegan2.check_batch(model, 12)


def test_bad_options():
    with pytest.raises(errors.ConfigError, match="d_architecture"):
        stylegan2.build(**SMALL, d_architecture="skip")
    with pytest.raises(errors.ConfigError, match="chunk=6, group_size=4"):
        stylegan2.build(**SMALL, mbstd_chunk=6)


# ---- the small model: structure and behaviour ---------------------------------------

@pytest.fixture(scope="module")
def small():
    keras.utils.set_random_seed(1)
    g, d = stylegan2.build(**SMALL, seed=3)
    _, synthesis = stylegan2.parts(g)
    for conv in synthesis.convs:  # Noise strengths start at 0: make the noise visible.
        conv.noise_strength.assign(0.5)
    return g, d


def test_parts_and_standalone_calls(small):
    g, d = small
    mapping, synthesis = stylegan2.parts(g)
    assert stylegan2.is_style_generator(g) and not stylegan2.is_style_generator(d)
    assert [layer.name for layer in g.layers] == ["z", "mapping", "broadcast", "synthesis"]
    z = z_of(4)
    w = mapping(z)
    ws = tf.tile(w[:, None], [1, 8, 1])
    np.testing.assert_allclose(synthesis(ws).numpy(), g(z).numpy(), atol=1e-6)
    # z is normalized to unit second moment first: its scale does not matter.
    np.testing.assert_allclose(mapping(3.0 * z).numpy(), w.numpy(), rtol=1e-4, atol=1e-5)
    # No tanh: a float32 image; inference is a deterministic function of z.
    assert g(z).dtype == tf.float32 and g(z).shape == (4, 32, 32, 3)
    np.testing.assert_array_equal(g(z).numpy(), g(z).numpy())


def test_w_indexing_torgb_shares_the_next_conv0s_w(small, monkeypatch):
    g, _ = small
    _, synthesis = stylegan2.parts(g)
    seen = []
    for cls in (sg.SynthesisLayer, sg.ToRGB):
        original = cls.call

        def spy(self, x, w, *args, _original=original, **kwargs):
            seen.append((self.name, int(round(float(w[0, 0])))))
            return _original(self, x, w, *args, **kwargs)
        monkeypatch.setattr(cls, "call", spy)
    ws = tf.tile(tf.range(8, dtype=tf.float32)[None, :, None], [2, 1, 32])  # ws[:, i] = i
    synthesis(ws)
    assert seen == [("b4_conv1", 0), ("b4_torgb", 1), ("b8_conv0", 1), ("b8_conv1", 2),
                    ("b8_torgb", 3), ("b16_conv0", 3), ("b16_conv1", 4), ("b16_torgb", 5),
                    ("b32_conv0", 5), ("b32_conv1", 6), ("b32_torgb", 7)]


def test_training_noise_is_per_global_row(small):
    g, _ = small
    mapping, synthesis = stylegan2.parts(g)
    ws = tf.tile(mapping(z_of(8))[:, None], [1, 8, 1])

    def run(rows, count=5):
        synthesis.calls.assign(count)
        with latents.example_rows(tf.constant(rows)):
            return synthesis(tf.gather(ws, rows), training=True).numpy()

    whole = run(list(range(8)))
    assert int(synthesis.calls.numpy()) == 6  # One increment per training-mode call.
    halves = np.concatenate([run([0, 1, 2, 3]), run([4, 5, 6, 7])])
    # What makes N replicas = 1. Up to float32 rounding of batch-size-dependent conv
    # kernels: outputs reach ~4, where an ulp is 4.8e-7; measured 2.9e-6 on an AMD EPYC
    # without AVX-512 (1e-6 held on the CPU it was written on).
    np.testing.assert_allclose(halves, whole, rtol=1e-5, atol=1e-5)
    # The noise is real: another call count, or the same w at another row, differs (by
    # more than 100x the tolerance).
    assert np.abs(run(list(range(8)), count=6) - whole).max() > 1e-3
    same_w = synthesis(tf.tile(ws[:1], [2, 1, 1]), training=True).numpy()
    assert np.abs(same_w[0] - same_w[1]).max() > 1e-3
    # Inference uses the constant buffers: independent of the call count.
    synthesis.calls.assign(0)
    a = synthesis(ws).numpy()
    synthesis.calls.assign(17)
    np.testing.assert_array_equal(synthesis(ws).numpy(), a)
    assert np.abs(a - whole).max() > 1e-3


def test_w_avg_moves_only_by_update_w_avg(small):
    g, _ = small
    mapping, _ = stylegan2.parts(g)
    mapping.w_avg.assign(tf.zeros([32]))
    z = z_of(6, seed=4)
    w = mapping(z, training=True).numpy()
    g(z, training=True)
    np.testing.assert_array_equal(mapping.w_avg.numpy(), 0.0)  # Calls never move it.
    stylegan2.update_w_avg(mapping, w.mean(0))
    np.testing.assert_allclose(mapping.w_avg.numpy(), 0.005 * w.mean(0), rtol=1e-5, atol=1e-7)
    mapping.w_avg.assign(tf.zeros([32]))
    assert mapping.w_avg in mapping.non_trainable_weights
    # Truncation: w_avg + psi (w - w_avg) on the first `cutoff` ws only.
    ws = tf.tile(tf.constant(w)[:, None], [1, 8, 1])
    avg = tf.ones([32])
    t = stylegan2.truncate(ws, avg, 0.25, cutoff=3).numpy()
    np.testing.assert_allclose(t[:, :3], 1 + 0.25 * (ws[:, :3].numpy() - 1), rtol=1e-6)
    np.testing.assert_array_equal(t[:, 3:], ws[:, 3:].numpy())


def test_clone_and_save_round_trip(small, tmp_path):
    g, d = small
    z = z_of(4, seed=2)
    x = g(z).numpy()
    clone = keras.models.clone_model(g)
    clone.set_weights(g.get_weights())
    assert stylegan2.is_style_generator(clone)
    np.testing.assert_array_equal(clone(z).numpy(), x)
    clone_d = keras.models.clone_model(d)
    clone_d.set_weights(d.get_weights())
    np.testing.assert_array_equal(clone_d(x).numpy(), d(x).numpy())
    path = str(tmp_path / "g.keras")
    g.save(path)
    loaded = keras.models.load_model(path)
    np.testing.assert_array_equal(loaded(z).numpy(), x)
    loaded_syn = stylegan2.parts(loaded)[1]
    np.testing.assert_array_equal(loaded_syn.convs[3].noise_strength.numpy(), 0.5)


def test_forward_and_second_order_gradient_are_finite(small):
    g, d = small
    x = g(z_of(4), training=True)
    assert bool(tf.reduce_all(tf.math.is_finite(x)))
    with tf.GradientTape() as outer:
        with tf.GradientTape() as inner:
            inner.watch(x)
            logits = d(x, training=True)
            total = tf.reduce_sum(logits)
        dx = inner.gradient(total, x)
        r1 = tf.reduce_sum(tf.square(dx))
    assert logits.shape == (4, 1) and logits.dtype == tf.float32
    grads = outer.gradient(r1, d.trainable_weights)
    # Every weight but the final bias (R1 does not depend on it) gets a finite gradient.
    missing = [v.path for v, gr in zip(d.trainable_weights, grads) if gr is None]
    assert missing == ["b4_out/bias"]
    assert all(bool(tf.reduce_all(tf.math.is_finite(gr))) for gr in grads if gr is not None)
    assert float(r1) > 0
    # G's gradient through D reaches every G weight (the noise strengths included).
    with tf.GradientTape() as tape:
        loss = tf.reduce_sum(d(g(z_of(4), training=True), training=True))
    g_grads = tape.gradient(loss, g.trainable_weights)
    assert all(gr is not None and bool(tf.reduce_all(tf.math.is_finite(gr)))
               for gr in g_grads)
    with pytest.raises(ValueError, match="chunk of 4 rows"):
        d(x[:3])


def test_conditional_models():
    keras.utils.set_random_seed(2)
    g, d = stylegan2.build(**SMALL, num_classes=3, mbstd_group=2, mbstd_chunk=4)
    assert len(g.inputs) == len(d.inputs) == 2
    z = tf.tile(z_of(1), [4, 1])
    labels = tf.constant([0, 1, 2, 0], tf.int32)
    x = g([z, labels]).numpy()
    np.testing.assert_allclose(x[0], x[3], atol=1e-6)
    assert np.abs(x[0] - x[1]).max() > 1e-4  # Same z, other label: another image.
    mapping, _ = stylegan2.parts(g)
    assert mapping.fcs[0].kernel.shape == (64, 32)  # [z; embed(labels)].
    logits = d([tf.constant(x), labels])
    assert logits.shape == (4, 1) and logits.dtype == tf.float32
    cmap = d.get_layer("mapping")(labels)
    out = keras.Model(d.inputs, d.get_layer("b4_out").output)([tf.constant(x), labels])
    np.testing.assert_allclose(logits.numpy()[:, 0],
                               np.sum(out.numpy() * cmap.numpy(), 1) / np.sqrt(16), rtol=1e-4)


def test_two_replicas_equal_one_device(mirrored2):
    """The synthesis network's training-mode noise under a 2-replica MirroredStrategy
    equals one device's on the same 8 global rows."""
    with mirrored2.scope():
        g, _ = stylegan2.build(**SMALL, seed=3)
    mapping, synthesis = stylegan2.parts(g)
    for conv in synthesis.convs:
        conv.noise_strength.assign(0.5)
    z = z_of(8, seed=7)

    def step(zr):
        w = mapping(zr, training=True)
        return synthesis(tf.tile(w[:, None], [1, 8, 1]), training=True)

    ds = mirrored2.experimental_distribute_dataset(
        tf.data.Dataset.from_tensors(z))
    per_replica = mirrored2.run(tf.function(step), args=(next(iter(ds)),))
    replicas = np.concatenate([t.numpy() for t in mirrored2.experimental_local_results(
        per_replica)])
    assert int(synthesis.calls.numpy()) == 1  # Replicas in lockstep: counted once.
    synthesis.calls.assign(0)
    one = step(z).numpy()
    np.testing.assert_allclose(replicas, one, atol=1e-5)


# ---- mixed precision the StyleGAN2-ADA way -----------------------------------------------

def test_float16_resolutions_are_the_official_ones():
    # notes section 5: 256 -> blocks 32..256, 1024 -> 128..1024, 32 -> 8..32.
    assert [stylegan2.fp16_resolution(r, 4) for r in (256, 1024, 32)] == [32, 128, 8]
    assert stylegan2.fp16_resolution(256, 0) is None
    keras.utils.set_random_seed(1)
    g, d = stylegan2.build(**SMALL, num_fp16_res=2, conv_clamp=256.0)
    _, synthesis = stylegan2.parts(g)
    half = {layer.name for layer in synthesis.convs + synthesis.torgbs
            if layer.compute_dtype == "float16"}
    assert half == {"b16_conv0", "b16_conv1", "b16_torgb", "b32_conv0", "b32_conv1",
                    "b32_torgb"}
    d_half = {layer.name for layer in d.layers if layer.compute_dtype == "float16"}
    assert d_half == {"b32_fromrgb", "b32_skip", "b32_conv0", "b32_conv1", "b32_add",
                      "b16_skip", "b16_conv0", "b16_conv1", "b16_add"}
    # Variables stay float32 everywhere: checkpoints move between the two forms.
    assert {v.dtype for v in g.weights + d.weights} <= {"float32", "int64"}
    assert g(z_of(2)).dtype == tf.float32 and d(g(z_of(4))).dtype == tf.float32
    with pytest.raises(errors.ConfigError, match="num_fp16_res must be an integer >= 0"):
        stylegan2.build(**SMALL, num_fp16_res=-1)


def test_float16_model_matches_float32_and_its_gradients_are_finite():
    """The same weights in both forms: images and logits agree to float16 rounding, and
    R1's second-order gradient through the float16 blocks is finite."""
    keras.utils.set_random_seed(1)
    g32, d32 = stylegan2.build(**SMALL, conv_clamp=256.0)
    keras.utils.set_random_seed(1)
    g16, d16 = stylegan2.build(**SMALL, conv_clamp=256.0, num_fp16_res=2)
    for a, b in ((g32, g16), (d32, d16)):
        b.set_weights(a.get_weights())
    z = z_of(4)
    x32, x16 = g32(z).numpy(), g16(z).numpy()
    scale = np.abs(x32).max()
    assert 0 < np.abs(x16 - x32).max() < 2e-2 * scale
    np.testing.assert_allclose(d16(x32).numpy(), d32(x32).numpy(),
                               atol=2e-2 * np.abs(d32(x32).numpy()).max())
    x = tf.constant(x32)
    with tf.GradientTape() as outer:
        with tf.GradientTape() as inner:
            inner.watch(x)
            total = tf.reduce_sum(d16(x, training=True))
        r1 = tf.reduce_sum(tf.square(inner.gradient(total, x)))
    grads = outer.gradient(r1, d16.trainable_weights)
    assert all(bool(tf.reduce_all(tf.math.is_finite(gr))) for gr in grads if gr is not None)


def test_freeze_d_trains_all_but_the_first_layers():
    # Freeze-D (the official --freezed=N): D's first N layers in the official order
    # (top block's fromrgb, conv0, conv1, skip, then the next block's) get no gradient
    # and no update; a GAN step moves every other D weight.
    from tf_gan_scale import gan as gan_lib
    assert stylegan2.d_layers(16, "resnet") == ["b16_fromrgb", "b16_conv0", "b16_conv1", "b16_skip",
                                          "b8_conv0", "b8_conv1", "b8_skip"]
    assert stylegan2.d_layers(16, "orig") == ["b16_fromrgb", "b16_conv0", "b16_conv1", "b8_conv0",
                                        "b8_conv1"]
    keras.utils.set_random_seed(0)
    g, d = stylegan2.build(data_shape=(16, 16, 1), latent_dim=8, w_dim=8, mapping_layers=2,
                     fmaps=1 / 1024, channel_max=8, mbstd_group=2, d_freeze_layers=5)
    frozen = {w.path for w in d.weights} - {w.path for w in d.trainable_weights}
    assert frozen == {"b16_fromrgb/kernel", "b16_fromrgb/bias", "b16_conv0/kernel",
                      "b16_conv0/bias", "b16_conv1/kernel", "b16_conv1/bias", "b16_skip/kernel",
                      "b8_conv0/kernel", "b8_conv0/bias"}, frozen
    model = gan_lib.GAN(g, d, latent_dim=8)
    model.compile(d_optimizer=keras.optimizers.SGD(0.1), g_optimizer=keras.optimizers.SGD(0.1),
                  loss="non_saturating")
    before = {w.path: w.numpy() for w in d.weights}
    real = np.random.default_rng(0).uniform(-1, 1, (4, 16, 16, 1)).astype(np.float32)
    model.train_step(tf.constant(real))
    moved = {w.path for w in d.weights if not np.array_equal(w.numpy(), before[w.path])}
    assert not moved & frozen and moved >= {"b8_conv1/kernel", "b4_fc/kernel"}, moved
    with pytest.raises(errors.ConfigError, match=r"d_freeze_layers must be an integer in "
                                                 r"\[0, 7\]"):
        stylegan2.build(data_shape=(16, 16, 1), latent_dim=8, w_dim=8, mapping_layers=2,
                  fmaps=1 / 1024, channel_max=8, mbstd_group=2, d_freeze_layers=8)
