"""augment: DiffAugment with per-example draws from latents (official formulas)."""

import numpy as np
import pytest
import tensorflow as tf

from tf_gan_scale import errors, latents, replica
from tf_gan_scale.gan import augment

ALL = "color,translation,cutout"
K = latents.key(7, 3, 0)


def images(shape, seed=0, low=-1.0):
    return np.random.default_rng(seed).uniform(low, 1.0, shape).astype(np.float32)


def run(x, policy, k=K, rows=None):
    rows = np.arange(len(x)) if rows is None else rows
    return augment.augment(tf.constant(x), policy, k, tf.constant(rows)).numpy()


# ---- NumPy transcription of DiffAugment_tf.py (mit-han-lab/data-efficient-gans) --------
# The same code line by line, with its tf.random draws replaced by ours: the uniform of
# each transform's stream, mapped to the official ranges.

def _u(k, rows, name, n, occurrence=0):
    stream = augment.STREAMS[name] + augment.STREAM_STRIDE * occurrence
    return latents.rows_uniform(latents.subkey(k, stream), rows, [n]).numpy()


def _int(u, low, high):  # tf.random.uniform(minval=low, maxval=high, dtype=int32)
    return np.minimum(np.floor(u * (high - low)).astype(np.int32), high - low - 1) + low


def np_brightness(x, u):
    magnitude = u.reshape(-1, 1, 1, 1) - 0.5
    return x + magnitude


def np_saturation(x, u):
    magnitude = u.reshape(-1, 1, 1, 1) * 2
    x_mean = np.mean(x, axis=3, keepdims=True)
    return (x - x_mean) * magnitude + x_mean


def np_contrast(x, u):
    magnitude = u.reshape(-1, 1, 1, 1) + 0.5
    x_mean = np.mean(x, axis=(1, 2, 3), keepdims=True)
    return (x - x_mean) * magnitude + x_mean


def np_translation(x, u, ratio=0.125):
    image_size = np.array(x.shape[1:3])
    shift = (image_size.astype(np.float32) * ratio + 0.5).astype(np.int32)
    translation_x = _int(u[:, :1], -shift[0], shift[0] + 1)
    translation_y = _int(u[:, 1:], -shift[1], shift[1] + 1)
    grid_x = np.clip(np.arange(image_size[0])[None] + translation_x + 1, 0, image_size[0] + 1)
    grid_y = np.clip(np.arange(image_size[1])[None] + translation_y + 1, 0, image_size[1] + 1)
    pad = [[0, 0], [1, 1], [0, 0], [0, 0]]
    x = np.take_along_axis(np.pad(x, pad), grid_x[:, :, None, None], axis=1)
    x = np.take_along_axis(np.pad(x.transpose(0, 2, 1, 3), pad), grid_y[:, :, None, None],
                           axis=1).transpose(0, 2, 1, 3)
    return x


def np_cutout(x, u, ratio=0.5):
    batch_size = x.shape[0]
    image_size = np.array(x.shape[1:3])
    cutout_size = (image_size.astype(np.float32) * ratio + 0.5).astype(np.int32)
    offset_x = _int(u[:, 0], 0, image_size[0] + (1 - cutout_size[0] % 2)).reshape(-1, 1, 1)
    offset_y = _int(u[:, 1], 0, image_size[1] + (1 - cutout_size[1] % 2)).reshape(-1, 1, 1)
    grid_batch, grid_x, grid_y = np.meshgrid(np.arange(batch_size), np.arange(cutout_size[0]),
                                             np.arange(cutout_size[1]), indexing="ij")
    cutout_grid = np.stack([grid_batch, grid_x + offset_x - cutout_size[0] // 2,
                            grid_y + offset_y - cutout_size[1] // 2], axis=-1)
    mask_shape = np.array([batch_size, image_size[0], image_size[1]])
    cutout_grid = np.minimum(np.maximum(cutout_grid, 0), (mask_shape - 1).reshape(1, 1, 1, 3))
    counts = np.zeros(mask_shape, np.float32)
    np.add.at(counts, tuple(np.moveaxis(cutout_grid, -1, 0)), 1.0)  # tf.scatter_nd sums.
    mask = np.maximum(1 - counts, 0)
    return x * mask[..., None]


def np_diffaugment(x, policy, k, rows):
    seen = {}
    for p in policy.split(","):
        j = seen.get(p, 0)
        seen[p] = j + 1
        if p == "color":
            x = np_brightness(x, _u(k, rows, "brightness", 1, j))
            x = np_saturation(x, _u(k, rows, "saturation", 1, j))
            x = np_contrast(x, _u(k, rows, "contrast", 1, j))
        elif p == "translation":
            x = np_translation(x, _u(k, rows, "translation", 2, j))
        else:
            x = np_cutout(x, _u(k, rows, "cutout", 2, j))
    return x


SHAPES = [(8, 16, 24, 3), (6, 10, 14, 2)]  # Even and odd cutout sizes (8x12; 5x7).


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("policy", ["color", "translation", "cutout", ALL,
                                    "cutout,color,translation", "translation,translation"])
def test_matches_the_official_code_given_the_same_draws(shape, policy):
    x = images(shape)
    rows = np.array([3, 11, 0, 7, 100, 5, 9, 2][:shape[0]])
    np.testing.assert_allclose(run(x, policy, rows=rows), np_diffaugment(x, policy, K, rows),
                               atol=1e-6, rtol=0)


def test_empty_policy_is_identity():
    x = images((2, 8, 8, 3))
    for policy in ["", None, " "]:
        np.testing.assert_array_equal(run(x, policy), x)


def test_each_example_depends_only_on_key_and_row():
    x = images((8, 16, 24, 3))
    rows = np.array([5, 17, 2, 40, 1, 33, 8, 0])
    whole = run(x, ALL, rows=rows)
    for i in range(len(x)):
        np.testing.assert_allclose(run(x[i:i + 1], ALL, rows=rows[i:i + 1])[0], whole[i],
                                   atol=1e-6, rtol=0)
    # The same image on two rows: two different augmentations.
    same = run(np.repeat(x[:1], 2, axis=0), ALL, rows=np.array([0, 1]))
    assert np.abs(same[0] - same[1]).max() > 0.1
    other_key = run(x, ALL, k=latents.key(7, 4, 0), rows=rows)
    assert all(np.abs(other_key[i] - whole[i]).max() > 0.1 for i in range(len(x)))


def test_two_replicas_agree_with_one_device(mirrored2):
    x = images((4, 8, 8, 3))
    expected = run(x, ALL)
    ds = tf.data.Dataset.from_tensor_slices(x).batch(4)
    dist = mirrored2.experimental_distribute_dataset(ds)

    @tf.function
    def step(batch):
        def replica_fn(xr):
            rows = replica.global_rows(tf.shape(xr)[0])
            return augment.augment(xr, ALL, K, rows), rows
        return mirrored2.run(replica_fn, args=(batch,))

    out, rows = step(next(iter(dist)))
    got = np.zeros_like(expected)
    for o, r in zip(mirrored2.experimental_local_results(out),
                    mirrored2.experimental_local_results(rows)):
        got[r.numpy()] = o.numpy()
    assert sorted(np.concatenate([r.numpy() for r in
                                  mirrored2.experimental_local_results(rows)])) == [0, 1, 2, 3]
    np.testing.assert_allclose(got, expected, atol=1e-6, rtol=0)


def test_same_in_tf_function_and_xla_as_eager():
    x = tf.constant(images((4, 16, 16, 3)))
    rows = tf.constant([4, 1, 9, 2])
    eager = augment.augment(x, ALL, K, rows).numpy()
    fn = lambda x, k, rows: augment.augment(x, ALL, k, rows)  # noqa: E731
    np.testing.assert_allclose(tf.function(fn)(x, K, rows).numpy(), eager, atol=1e-6, rtol=0)
    np.testing.assert_allclose(tf.function(fn, jit_compile=True)(x, K, rows).numpy(), eager,
                               atol=1e-6, rtol=0)


def _grad(x, policy, weights=None):
    x = tf.constant(x)
    with tf.GradientTape() as tape:
        tape.watch(x)
        y = augment.augment(x, policy, K, tf.range(x.shape[0]))
        total = tf.reduce_sum(y if weights is None else y * weights)
    return tape.gradient(total, x).numpy()


def test_gradient_flows_through_every_transform():
    x = images((4, 16, 16, 3))
    for policy in ["color", "translation", "cutout", ALL]:
        g = _grad(x, policy)
        assert np.all(np.isfinite(g)) and np.abs(g).max() > 0, policy
    # Translation and cutout pass each kept pixel through once: the gradient of the sum
    # is 1 where the pixel lands in the output, 0 where it is shifted out or cut.
    g = _grad(x, "translation,cutout")
    assert set(np.unique(g)) == {0.0, 1.0}
    kept = run(np.ones_like(x), "translation,cutout")  # 1 where a pixel survives.
    assert g.sum() == kept.sum()


def test_color_gradient_is_the_analytic_value():
    x = images((2, 2, 3, 3))
    # The sum is invariant: contrast and saturation keep the means they scale around.
    np.testing.assert_allclose(_grad(x, "color"), np.ones_like(x), atol=1e-6)
    # A weighted sum: back through contrast (scale c about the image mean), saturation
    # (scale s about the pixel's channel mean), brightness (identity).
    w = images(x.shape, seed=1)
    rows = np.arange(2)
    s = (2 * _u(K, rows, "saturation", 1)).reshape(-1, 1, 1, 1)
    c = (_u(K, rows, "contrast", 1) + 0.5).reshape(-1, 1, 1, 1)
    g = c * w + (1 - c) * w.mean(axis=(1, 2, 3), keepdims=True)
    g = s * g + (1 - s) * g.mean(axis=3, keepdims=True)
    np.testing.assert_allclose(_grad(x, "color", tf.constant(w)), g, atol=1e-6)


def _shift(x, dh, dw):
    """x[h + dh, w + dw] with zero fill: [H, W, C]."""
    out = np.zeros_like(x)
    h, w = x.shape[:2]
    out[max(0, -dh):min(h, h - dh), max(0, -dw):min(w, w - dw)] = \
        x[max(0, dh):min(h, h + dh), max(0, dw):min(w, w + dw)]
    return out


def test_translation_is_an_integer_shift_with_zero_fill():
    x = images((64, 16, 24, 3), low=0.5)  # No zeros: the fill is visible.
    out = run(x, "translation")
    s = (2, 3)  # int(16 / 8 + 0.5), int(24 / 8 + 0.5)
    found = []
    for i in range(len(x)):
        matches = [(dh, dw) for dh in range(-8, 9) for dw in range(-12, 13)
                   if np.array_equal(out[i], _shift(x[i], dh, dw))]
        assert len(matches) == 1, (i, matches)
        found.append(matches[0])
    found = np.array(found)
    assert np.abs(found[:, 0]).max() <= s[0] and np.abs(found[:, 1]).max() <= s[1]
    # Every shift in [-s, s] occurs (64 draws of 5 and 7 values).
    assert set(found[:, 0]) == set(range(-2, 3)) and set(found[:, 1]) == set(range(-3, 4))


@pytest.mark.parametrize("shape", [(64, 16, 24, 3), (64, 10, 14, 2)])
def test_cutout_zeroes_one_clipped_square(shape):
    x = images(shape, low=0.5)
    out = run(x, "cutout")
    cut = (int(shape[1] * 0.5 + 0.5), int(shape[2] * 0.5 + 0.5))
    whole = clipped = 0
    for i in range(len(x)):
        zero = out[i] == 0
        assert np.array_equal(zero, np.repeat(zero[..., :1], shape[3], axis=-1))  # All C.
        zero = zero[..., 0]
        np.testing.assert_array_equal(out[i][~zero], x[i][~zero])  # The rest unchanged.
        hs, ws = np.flatnonzero(zero.any(axis=1)), np.flatnonzero(zero.any(axis=0))
        assert np.array_equal(zero, np.outer(zero.any(axis=1), zero.any(axis=0)))  # A box.
        for idx, size, c in [(hs, shape[1], cut[0]), (ws, shape[2], cut[1])]:
            assert len(idx) and np.array_equal(idx, np.arange(idx[0], idx[-1] + 1))
            if idx[0] > 0 and idx[-1] < size - 1:
                assert len(idx) == c
            else:  # Clipped at a border: at least the half on the image.
                assert c - c // 2 <= len(idx) <= c
        full = len(hs) == cut[0] and len(ws) == cut[1]
        whole += full
        clipped += not full
    assert whole and clipped


def test_bad_policy_is_a_config_error():
    for bad in ["colour", "color,flip", "color,", "translation cutout"]:
        with pytest.raises(errors.ConfigError, match="valid: color, translation, cutout"):
            augment.check_policy(bad)
    with pytest.raises(errors.ConfigError, match="unknown augmentation 'flip' in policy"):
        augment.augment(tf.zeros([1, 8, 8, 3]), "color,flip", K, [0])
    assert augment.check_policy(" color, cutout") == ("color", "cutout")
