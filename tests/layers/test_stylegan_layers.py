"""StyleGAN2 layers (layers/stylegan.py) against direct NumPy references: upfirdn2d and the
conv2d_resample orderings, equalized LR, modulated conv (fused form), mbstd grouping."""

import keras
import numpy as np
import pytest
import tensorflow as tf

from tf_gan_scale.layers import stylegan as sg

RNG = np.random.default_rng(0)
F = np.outer([1, 3, 3, 1], [1, 3, 3, 1]) / 64.0


def np_upfirdn2d(x, f, up=1, down=1, pad=(0, 0), gain=1.0):
    """Direct reference of upfirdn2d on NHWC: zero insertion, zero pad, correlation with
    the FLIPPED filter (i.e. a true convolution), VALID, then decimation."""
    b, h, w, c = x.shape
    z = np.zeros((b, h * up, w * up, c))
    z[:, ::up, ::up, :] = x
    z = np.pad(z, [(0, 0), pad, pad, (0, 0)])
    ff = f[::-1, ::-1] * gain
    kh, kw = ff.shape
    oh, ow = z.shape[1] - kh + 1, z.shape[2] - kw + 1
    out = np.zeros((b, oh, ow, c))
    for a in range(kh):
        for e in range(kw):
            out += z[:, a:a + oh, e:e + ow, :] * ff[a, e]
    return out[:, ::down, ::down, :]


def np_conv(x, w, stride=1, pad=0):
    """Correlation NHWC x [k, k, I, O] weights, zero pad, stride."""
    x = np.pad(x, [(0, 0), (pad, pad), (pad, pad), (0, 0)])
    k = w.shape[0]
    oh, ow = x.shape[1] - k + 1, x.shape[2] - k + 1
    out = np.zeros((x.shape[0], oh, ow, w.shape[3]))
    for a in range(k):
        for e in range(k):
            out += np.einsum("bhwi,io->bhwo", x[:, a:a + oh, e:e + ow, :], w[a, e])
    return out[:, ::stride, ::stride]


def np_conv_transpose2(x, w):
    """Transposed conv stride 2, VALID: out[2i + a, 2j + e] += x[i, j] @ w[a, e]."""
    b, h, wd, _ = x.shape
    k = w.shape[0]
    out = np.zeros((b, 2 * h + k - 2, 2 * wd + k - 2, w.shape[3]))
    for a in range(k):
        for e in range(k):
            out[:, a:a + 2 * h:2, e:e + 2 * wd:2] += np.einsum("bhwi,io->bhwo", x, w[a, e])
    return out


def test_filter():
    np.testing.assert_allclose(sg.FIR, F, rtol=0)
    assert sg.FIR[1, 1] * 64 == 9


@pytest.mark.parametrize("h,w", [(4, 4), (5, 7)])
def test_up_and_down_sample_match_numpy_upfirdn2d(h, w):
    x = RNG.standard_normal((2, h, w, 3)).astype(np.float32)
    up = sg.upsample2d(tf.constant(x)).numpy()
    assert up.shape == (2, 2 * h, 2 * w, 3)
    np.testing.assert_allclose(up, np_upfirdn2d(x, F, up=2, pad=(2, 1), gain=4), atol=1e-5)
    x2 = RNG.standard_normal((2, 2 * h, 2 * w, 3)).astype(np.float32)
    down = sg.downsample2d(tf.constant(x2)).numpy()
    assert down.shape == (2, h, w, 3)
    np.testing.assert_allclose(down, np_upfirdn2d(x2, F, down=2, pad=(1, 1)), atol=1e-5)
    # Gain 4 keeps a constant image constant away from the borders (DC gain 1 per axis).
    ones = sg.upsample2d(tf.ones([1, 6, 6, 1])).numpy()[0, 2:-2, 2:-2, 0]
    np.testing.assert_allclose(ones, 1.0, atol=1e-6)


def test_general_upfirdn2d_matches_numpy():
    x = RNG.standard_normal((1, 5, 5, 2)).astype(np.float32)
    for up, down, pad in [(1, 1, (2, 2)), (2, 2, (1, 2)), (1, 2, (0, 3))]:
        got = sg.upfirdn2d(tf.constant(x), up=up, down=down, pad=pad).numpy()
        np.testing.assert_allclose(got, np_upfirdn2d(x, F, up, down, pad), atol=1e-5)


def test_conv2d_resample_orderings():
    x = RNG.standard_normal((2, 6, 6, 3)).astype(np.float32)
    w3 = RNG.standard_normal((3, 3, 3, 4)).astype(np.float32)
    w1 = RNG.standard_normal((1, 1, 3, 4)).astype(np.float32)
    # 3x3 up: conv_transpose stride 2 VALID (13x13), then FIR pad [1, 1] gain 4 -> 12x12.
    up = sg.conv2d_resample(tf.constant(x), tf.constant(w3), up=2).numpy()
    ref = np_upfirdn2d(np_conv_transpose2(x, w3), F, pad=(1, 1), gain=4)
    assert up.shape == ref.shape == (2, 12, 12, 4)
    np.testing.assert_allclose(up, ref, atol=1e-4)
    # 3x3 down: FIR pad [2, 2] (7 + ... -> 9x9), then conv stride 2 VALID -> 3x3.
    down = sg.conv2d_resample(tf.constant(x), tf.constant(w3), down=2).numpy()
    ref = np_conv(np_upfirdn2d(x, F, pad=(2, 2)), w3, stride=2)
    assert down.shape == ref.shape == (2, 3, 3, 4)
    np.testing.assert_allclose(down, ref, atol=1e-4)
    # 1x1 down: FIR downsample, then the 1x1 conv.
    skip = sg.conv2d_resample(tf.constant(x), tf.constant(w1), down=2).numpy()
    np.testing.assert_allclose(skip, np_conv(np_upfirdn2d(x, F, down=2, pad=(1, 1)), w1),
                               atol=1e-4)
    # Plain 3x3: zero padding 1.
    same = sg.conv2d_resample(tf.constant(x), tf.constant(w3)).numpy()
    np.testing.assert_allclose(same, np_conv(x, w3, pad=1), atol=1e-4)


def test_bias_act_order():
    x = tf.constant([-300.0, -1.0, 2.0, 300.0])
    got = sg.bias_act(x, tf.constant(1.0), "lrelu", gain=0.5, clamp=10.0).numpy()
    pre = np.array([-299.0, 0.0, 3.0, 301.0])
    ref = np.clip(np.where(pre < 0, 0.2 * pre, pre) * np.sqrt(2) * 0.5, -10, 10)
    np.testing.assert_allclose(got, ref, rtol=1e-6)


def test_equalized_dense_and_conv_runtime_gains():
    x = RNG.standard_normal((3, 16)).astype(np.float32)
    fc = sg.EqualizedDense(5, "lrelu", lr_mul=0.01, bias_init=0.5)
    y = fc(x).numpy()
    kernel, bias = fc.kernel.numpy(), fc.bias.numpy()
    # Stored raw weights ~ N(0, 1/lr_mul^2); effective bias = stored * lr_mul = bias_init.
    assert 50 < kernel.std() < 200
    np.testing.assert_allclose(bias * 0.01, 0.5, rtol=1e-6)
    pre = x @ (kernel * 0.01 / 4.0) + bias * 0.01
    np.testing.assert_allclose(y, np.where(pre < 0, 0.2 * pre, pre) * np.sqrt(2), atol=1e-4)

    xi = RNG.standard_normal((2, 8, 8, 3)).astype(np.float32)
    conv = sg.EqualizedConv2D(4, 3, "lrelu", down=2, gain=np.sqrt(0.5), conv_clamp=0.3)
    y = conv(xi).numpy()
    assert y.shape == (2, 4, 4, 4)
    pre = np_conv(np_upfirdn2d(xi, F, pad=(2, 2)), conv.kernel.numpy() / np.sqrt(27), 2)
    ref = np.clip(np.where(pre < 0, 0.2 * pre, pre) * np.sqrt(2) * np.sqrt(0.5),
                  -0.3 * np.sqrt(0.5), 0.3 * np.sqrt(0.5))
    np.testing.assert_allclose(y, ref, atol=1e-4)
    assert np.abs(y).max() == pytest.approx(0.3 * np.sqrt(0.5), rel=1e-5)  # Clamp binds.


def fused_reference(x, weight, styles, demodulate, up=1):
    """Official fused form: each sample convolved with its own W*s (*d) kernel."""
    out = []
    for n in range(x.shape[0]):
        wn = weight * styles[n][None, None, :, None]
        if demodulate:
            wn = wn / np.sqrt(np.sum(wn ** 2, axis=(0, 1, 2), keepdims=True) + 1e-8)
        out.append(sg.conv2d_resample(tf.constant(x[n:n + 1]), tf.constant(wn, tf.float32),
                                      up=up).numpy())
    return np.concatenate(out)


@pytest.mark.parametrize("up", [1, 2])
def test_modulated_conv_equals_fused_form(up):
    x = RNG.standard_normal((3, 4, 4, 5)).astype(np.float32)
    weight = RNG.standard_normal((3, 3, 5, 6)).astype(np.float32)
    styles = RNG.standard_normal((3, 5)).astype(np.float32)
    got = sg.modulated_conv2d(tf.constant(x), tf.constant(weight), tf.constant(styles),
                              up=up).numpy()
    np.testing.assert_allclose(got, fused_reference(x, weight, styles, True, up), atol=1e-4)


def test_demodulation_makes_the_weight_scale_irrelevant():
    layer = sg.SynthesisLayer(6, w_dim=8, resolution=8, up=2, layer_index=3, noise_seed=1)
    x = tf.constant(RNG.standard_normal((2, 4, 4, 5)), tf.float32)
    w = tf.constant(RNG.standard_normal((2, 8)), tf.float32)
    layer.build(x.shape)
    layer.noise_strength.assign(0.7)  # Exercise the const noise too (init is 0).
    before = layer(x, w).numpy()
    assert before.shape == (2, 8, 8, 6)
    layer.kernel.assign(layer.kernel * 37.0)
    np.testing.assert_allclose(layer(x, w).numpy(), before, rtol=1e-4, atol=1e-5)
    # Scaling the styles does not matter either; scaling the input does (linearly).
    layer.affine.kernel.assign(layer.affine.kernel * 3.0)
    layer.affine.bias.assign(layer.affine.bias * 3.0)
    np.testing.assert_allclose(layer(x, w).numpy(), before, rtol=1e-4, atol=1e-5)
    assert not np.allclose(layer(2 * x, w).numpy(), before, atol=1e-3)
    # ToRGB does NOT demodulate: a weight scale passes straight through (bias is 0).
    rgb = sg.ToRGB(3, w_dim=8)
    y = rgb(x, w).numpy()
    rgb.kernel.assign(rgb.kernel * 2.0)
    np.testing.assert_allclose(rgb(x, w).numpy(), 2 * y, rtol=1e-5, atol=1e-6)
    s = (w.numpy() @ (rgb.affine.kernel.numpy() / np.sqrt(8)) + 1.0) / np.sqrt(5)
    np.testing.assert_allclose(y, fused_reference(x.numpy(), rgb.kernel.numpy() / 2, s,
                                                  False), atol=1e-4)


def test_noise_is_added_after_demodulation_and_const_buffer_is_seeded():
    x = tf.constant(RNG.standard_normal((2, 4, 4, 5)), tf.float32)
    w = tf.constant(RNG.standard_normal((2, 8)), tf.float32)
    a = sg.SynthesisLayer(6, w_dim=8, resolution=4, layer_index=2, noise_seed=9)
    b = sg.SynthesisLayer(6, w_dim=8, resolution=4, layer_index=2, noise_seed=9)
    a.build(x.shape)
    b.build(x.shape)
    np.testing.assert_array_equal(a.noise_const.numpy(), b.noise_const.numpy())
    assert a.noise_const in a.non_trainable_weights
    noise = RNG.standard_normal((2, 4, 4, 1)).astype(np.float32)
    a.noise_strength.assign(0.5)
    with_noise = a(x, w, noise=noise).numpy()
    a.noise_strength.assign(0.0)
    base = a(x, w).numpy()
    pre_base = base / np.sqrt(2)  # bias 0: lrelu output / sqrt 2 ...
    pre_base = np.where(pre_base < 0, pre_base / 0.2, pre_base)  # ... inverted.
    pre = pre_base + 0.5 * noise  # One noise image for every channel.
    np.testing.assert_allclose(with_noise, np.where(pre < 0, 0.2 * pre, pre) * np.sqrt(2),
                               atol=1e-4)


def np_mbstd(x, group):
    """The official MinibatchStdLayer on one call of N rows (NHWC, F = 1)."""
    n = x.shape[0]
    y = x.reshape(group, n // group, *x.shape[1:])
    y = np.sqrt(((y - y.mean(0)) ** 2).mean(0) + 1e-8).mean(axis=(1, 2, 3))  # [n/G]
    y = np.tile(y, group)  # row g*(n/G) + j -> group j
    return np.concatenate([x, np.broadcast_to(y[:, None, None, None], x.shape[:3] + (1,))],
                          -1)


def test_mbstd_groups_are_strided():
    # Rows 0, 2, 4, 6 equal; odd rows differ: strided groups give ~0 std to the even group.
    vals = np.array([5.0, 1.0, 5.0, -2.0, 5.0, 4.0, 5.0, 0.5], np.float32)
    x = np.broadcast_to(vals[:, None, None, None], (8, 2, 2, 3)).copy()
    y = sg.MinibatchStd(4, 8)(tf.constant(x)).numpy()
    assert y.shape == (8, 2, 2, 4)
    std = y[:, 0, 0, 3]
    np.testing.assert_allclose(std[0::2], 1e-4, rtol=1e-3)  # sqrt(0 + 1e-8).
    np.testing.assert_allclose(std[1::2], np.sqrt(np.var(vals[1::2]) + 1e-8), rtol=1e-5)
    np.testing.assert_allclose(y, np_mbstd(x, 4), rtol=1e-5)
    # Chunks of 4: groups never cross rows 3|4 (rows 0-3 constant, 4-7 varying).
    vals = np.array([2.0, 2.0, 2.0, 2.0, 1.0, 3.0, 0.0, 7.0], np.float32)
    x = np.broadcast_to(vals[:, None, None, None], (8, 2, 2, 3)).copy()
    std = sg.MinibatchStd(4, 4)(tf.constant(x)).numpy()[:, 0, 0, 3]
    np.testing.assert_allclose(std[:4], 1e-4, rtol=1e-3)
    np.testing.assert_allclose(std[4:], np.sqrt(np.var(vals[4:]) + 1e-8), rtol=1e-5)


def test_mbstd_chunks_equal_separate_official_calls():
    x = RNG.standard_normal((12, 3, 3, 2)).astype(np.float32)
    got = sg.MinibatchStd(2, 6)(tf.constant(x)).numpy()
    ref = np.concatenate([np_mbstd(x[:6], 2), np_mbstd(x[6:], 2)])
    np.testing.assert_allclose(got, ref, rtol=1e-5)
    # Default chunk = group size: every group is G consecutive rows.
    got = sg.MinibatchStd(3)(tf.constant(x)).numpy()
    np.testing.assert_allclose(got, np.concatenate([np_mbstd(x[i:i + 3], 3)
                                                    for i in range(0, 12, 3)]), rtol=1e-5)


def test_mbstd_bad_sizes_raise():
    with pytest.raises(ValueError, match="batch divisible by its chunk of 4 rows .*batch=6"):
        sg.MinibatchStd(4, 4)(tf.zeros([6, 2, 2, 1]))
    with pytest.raises(ValueError, match="chunk=6, group_size=4"):
        sg.MinibatchStd(4, 6)


def test_layers_serialize():
    for layer in [sg.EqualizedDense(3, "lrelu", lr_mul=0.01, bias_init=1.0),
                  sg.EqualizedConv2D(4, 3, down=2, use_bias=False, gain=0.5, conv_clamp=256),
                  sg.SynthesisLayer(4, w_dim=8, resolution=8, up=2, layer_index=1),
                  sg.ToRGB(3, w_dim=8, conv_clamp=256), sg.MinibatchStd(4, 8)]:
        config = keras.saving.serialize_keras_object(layer)
        clone = keras.saving.deserialize_keras_object(config)
        assert type(clone) is type(layer) and clone.get_config() == layer.get_config()


def test_float16_modulated_conv_pre_normalizes():
    """x in float16 with a weight and styles large enough that x * s and the convolution
    overflow float16 (max 65504): the official pre-normalization keeps the demodulated
    output finite and equal to the float32 result (up to float16 rounding). Without it
    the output is inf/NaN, so this fails if the pre-normalization goes."""
    x = RNG.standard_normal((2, 4, 4, 8)).astype(np.float32)
    weight = (RNG.standard_normal((3, 3, 8, 6)) * 3e3).astype(np.float32)
    styles = (RNG.standard_normal((2, 8)) * 3e3).astype(np.float32)
    want = sg.modulated_conv2d(tf.constant(x), tf.constant(weight), tf.constant(styles)).numpy()
    got = sg.modulated_conv2d(tf.constant(x, tf.float16), tf.constant(weight),
                              tf.constant(styles))
    assert got.dtype == tf.float16
    assert np.all(np.isfinite(got.numpy()))
    np.testing.assert_allclose(got.numpy().astype(np.float32), want, atol=2e-2 * np.abs(
        want).max())
    # The same magnitudes without demodulation (ToRGB's path, no pre-normalization)
    # overflow: the inputs really are out of float16's range.
    plain = sg.modulated_conv2d(tf.constant(x, tf.float16), tf.constant(weight),
                                tf.constant(styles), demodulate=False).numpy()
    assert not np.all(np.isfinite(plain))


def test_float16_layer_reads_float32_variables_and_styles():
    layer = sg.SynthesisLayer(6, w_dim=8, resolution=8, up=2, conv_clamp=256.0,
                              dtype="mixed_float16")
    x = tf.constant(RNG.standard_normal((2, 4, 4, 5)), tf.float32)
    w = tf.constant(RNG.standard_normal((2, 8)), tf.float32)
    y = layer(x, w)
    assert y.dtype == tf.float16 and layer.kernel.dtype == "float32"
    assert layer.affine.compute_dtype == "float32"  # Styles stay float32 (official).
    ref = sg.SynthesisLayer(6, w_dim=8, resolution=8, up=2, conv_clamp=256.0)
    ref.build(x.shape)
    ref.set_weights(layer.get_weights())
    np.testing.assert_allclose(y.numpy().astype(np.float32), ref(x, w).numpy(), atol=2e-2)
    # w reaches the float32 affine unrounded (Keras would cast a float16 layer's float
    # arguments to half), and the float32 variables are not read through half copies.
    seen = []
    call = layer.call
    layer.call = lambda x, w, noise=None: (seen.append(w.dtype), call(x, w, noise))[1]
    layer(x, w)
    assert seen == [tf.float32]
    assert not any(v._autocast for v in (layer.kernel, layer.noise_strength,
                                          layer.noise_const))
    for cls in (sg.SynthesisLayer, sg.ToRGB, sg.EqualizedConv2D):
        kwargs = {"w_dim": 8, "resolution": 8} if cls is sg.SynthesisLayer else (
            {"w_dim": 8} if cls is sg.ToRGB else {"kernel_size": 3})
        assert cls(3, conv_clamp=0, **kwargs).conv_clamp is None  # 0: no clamp.


@pytest.mark.parametrize("kwargs", [dict(up=2, pad=(2, 1), gain=4.0), dict(down=2, pad=(1, 1)),
                                    dict(pad=(1, 1), gain=4.0), dict(pad=(2, 2))])
def test_slice_resampling_equals_the_depthwise_convolution(kwargs):
    # The mesh's resampling (strided slices times the separable taps) against the
    # depthwise convolution one device runs: float32 summation order apart.
    x = tf.constant(np.random.default_rng(0).standard_normal((3, 9, 9, 5)), tf.float32)
    ref = sg.upfirdn2d(x, **kwargs).numpy()
    with sg.slice_resampling():
        got = sg.upfirdn2d(x, **kwargs).numpy()
    assert not sg.SLICE_RESAMPLING
    assert got.shape == ref.shape
    np.testing.assert_allclose(got, ref, atol=1e-6)
