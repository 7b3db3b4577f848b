"""ada: StyleGAN2-ADA's 'bgc' augmentation pipe and p controller, checked against a NumPy
(float64) transcription of the official AugmentPipe.forward (stylegan2-ada-pytorch,
training/augment.py and torch_utils/ops/upfirdn2d.py:_upfirdn2d_ref), exact effects of
single transforms, gate statistics, per-row determinism, adjointness and second order."""

import numpy as np
import pytest
import tensorflow as tf

from tf_gan_scale import latents
from tf_gan_scale.gan import ada

K = latents.key(11, 5, latents.AUGMENT_PHASE)


def smooth(shape, seed=0):
    """Smooth-ish images [B, H, W, C] in [-1, 1]: bicubic upsampling of 4x coarser noise."""
    b, h, w, c = shape
    lo = np.random.default_rng(seed).uniform(-1, 1, (b, h // 4 + 2, w // 4 + 2, c))
    return tf.image.resize(lo.astype(np.float32), [h, w], "bicubic").numpy().clip(-1, 1)


def noise(shape, seed=0):
    return np.random.default_rng(seed).uniform(-1, 1, shape).astype(np.float32)


def run(x, p, rows=None, k=K):
    rows = np.arange(len(x)) if rows is None else np.asarray(rows)
    return ada.augment(tf.constant(x), tf.constant(p, tf.float32), k, tf.constant(rows)).numpy()


def row_max(a):
    return np.abs(a).reshape(len(a), -1).max(axis=1)


# ---- NumPy transcription of the official code (float64, NCHW, per-batch margin) -------

def np_upfirdn2d(x, f, up=1, down=1, padding=(0, 0, 0, 0), flip_filter=False, gain=1):
    """upfirdn2d.py:_upfirdn2d_ref with a separable (1-D) filter."""
    n, c, h, w = x.shape
    px0, px1, py0, py1 = padding
    z = np.zeros((n, c, h, up, w, up), x.dtype)
    z[:, :, :, 0, :, 0] = x
    x = z.reshape(n, c, h * up, w * up)
    x = np.pad(x, [(0, 0), (0, 0), (max(py0, 0), max(py1, 0)), (max(px0, 0), max(px1, 0))])
    x = x[:, :, max(-py0, 0):x.shape[2] - max(-py1, 0), max(-px0, 0):x.shape[3] - max(-px1, 0)]
    f = np.asarray(f) * gain ** 0.5
    if not flip_filter:
        f = f[::-1]
    fw = len(f)
    size = x.shape[3] - fw + 1  # conv2d = correlation, along W then H.
    x = sum(f[t] * x[:, :, :, t:t + size] for t in range(fw))
    size = x.shape[2] - fw + 1
    x = sum(f[t] * x[:, :, t:t + size, :] for t in range(fw))
    return x[:, :, ::down, ::down]


def np_grid_sample(img, grid):
    """torch grid_sample(bilinear, zeros, align_corners=False): img [N, C, Hi, Wi], grid
    [N, Ho, Wo, 2] -> [N, C, Ho, Wo]."""
    n, c, hi, wi = img.shape
    ix = ((grid[..., 0] + 1) * wi - 1) / 2
    iy = ((grid[..., 1] + 1) * hi - 1) / 2
    x0, y0 = np.floor(ix).astype(int), np.floor(iy).astype(int)
    out = 0
    b = np.arange(n)[:, None, None]
    for xx in (x0, x0 + 1):
        for yy in (y0, y0 + 1):
            w = (1 - np.abs(ix - xx)) * (1 - np.abs(iy - yy))
            ok = (xx >= 0) & (xx < wi) & (yy >= 0) & (yy < hi)
            v = img[b, :, np.clip(yy, 0, hi - 1), np.clip(xx, 0, wi - 1)]  # [N, Ho, Wo, C]
            out = out + v * (w * ok)[..., None]
    return out.transpose(0, 3, 1, 2)


def T(tx, ty):
    return np.array([[1, 0, tx], [0, 1, ty], [0, 0, 1]], np.float64)


def S(sx, sy):
    return np.array([[sx, 0, 0], [0, sy, 0], [0, 0, 1]], np.float64)


def R(theta):
    return np.array([[np.cos(theta), -np.sin(theta), 0], [np.sin(theta), np.cos(theta), 0],
                     [0, 0, 1]])


def np_geometric(images, g_inv):
    """AugmentPipe.forward, "Execute geometric transformations", line by line."""
    n, c, height, width = images.shape
    f = np.asarray(ada.SYM6) / np.sum(ada.SYM6)  # setup_filter
    cx, cy = (width - 1) / 2, (height - 1) / 2
    cp = g_inv @ np.array([[-cx, -cy, 1], [cx, -cy, 1], [cx, cy, 1], [-cx, cy, 1]]).T
    hz_pad = len(ada.SYM6) // 4
    margin = cp[:, :2, :].transpose(1, 0, 2).reshape(2, -1)
    margin = np.concatenate([-margin, margin]).max(axis=1)
    margin = margin + np.array([hz_pad * 2 - cx, hz_pad * 2 - cy] * 2)
    margin = np.minimum(np.maximum(margin, 0), [width - 1, height - 1] * 2)
    mx0, my0, mx1, my1 = np.ceil(margin).astype(int)
    images = np.pad(images, [(0, 0), (0, 0), (my0, my1), (mx0, mx1)], mode="reflect")
    g_inv = T((mx0 - mx1) / 2, (my0 - my1) / 2) @ g_inv
    fw = len(f)
    up_pad = ((fw + 1) // 2, (fw - 2) // 2) * 2  # upsample2d: (fw + up - 1)//2, (fw - up)//2
    images = np_upfirdn2d(images, f, up=2, padding=up_pad[0:2] + up_pad[0:2], gain=4)
    g_inv = S(2, 2) @ g_inv @ S(0.5, 0.5)
    g_inv = T(-0.5, -0.5) @ g_inv @ T(0.5, 0.5)
    ho, wo = (height + hz_pad * 2) * 2, (width + hz_pad * 2) * 2
    g_inv = S(2 / images.shape[3], 2 / images.shape[2]) @ g_inv @ S(wo / 2, ho / 2)
    xs, ys = (2 * np.arange(wo) + 1) / wo - 1, (2 * np.arange(ho) + 1) / ho - 1  # affine_grid
    base = np.stack(list(np.meshgrid(xs, ys)) + [np.ones((ho, wo))], -1)
    images = np_grid_sample(images, np.einsum("nij,hwj->nhwi", g_inv[:, :2, :], base))
    p0, p1 = -hz_pad * 2 + (fw - 1) // 2, -hz_pad * 2 + (fw - 2) // 2  # downsample2d
    return np_upfirdn2d(images, f, down=2, padding=(p0, p1, p0, p1), flip_filter=True)


def np_matrices(params, height, width):
    """G_inv [B, 3, 3] and C [B, 4, 4] from the (gated) parameters, as AugmentPipe builds
    them (float64)."""
    prm = {k: v.numpy().astype(np.float64) for k, v in params.items()}
    v = np.array([1, 1, 1, 0]) / np.sqrt(3)
    vv = np.outer(v, v)
    gs, cs = [], []
    for b in range(len(prm["xflip"])):
        g = S(1 / (1 - 2 * prm["xflip"][b]), 1)  # scale2d_inv(1 - 2i, 1)
        g = g @ R(np.pi / 2 * prm["rotate90"][b])  # rotate2d_inv(-pi/2 i)
        tx, ty = prm["xint"][b]
        g = g @ T(-np.round(tx * width), -np.round(ty * height))
        s = prm["scale"][b]
        g = g @ S(1 / s, 1 / s)
        g = g @ R(prm["rotate_pre"][b])  # rotate2d_inv(-theta)
        s = prm["aniso"][b]
        g = g @ S(1 / s, s)
        g = g @ R(prm["rotate_post"][b])
        tx, ty = prm["xfrac"][b]
        gs.append(g @ T(-tx * width, -ty * height))
        c = np.eye(4)
        bb = prm["brightness"][b]
        c = np.array([[1, 0, 0, bb], [0, 1, 0, bb], [0, 0, 1, bb], [0, 0, 0, 1]]) @ c
        k = prm["contrast"][b]
        c = np.diag([k, k, k, 1]) @ c
        c = (np.eye(4) - 2 * vv * prm["lumaflip"][b]) @ c
        th = prm["hue"][b]
        vx, vy, vz = v[:3]
        s_, co = np.sin(th), np.cos(th)
        cc = 1 - co
        rot = np.array([[vx * vx * cc + co, vx * vy * cc - vz * s_, vx * vz * cc + vy * s_, 0],
                        [vy * vx * cc + vz * s_, vy * vy * cc + co, vy * vz * cc - vx * s_, 0],
                        [vz * vx * cc - vy * s_, vz * vy * cc + vx * s_, vz * vz * cc + co, 0],
                        [0, 0, 0, 1]])
        c = rot @ c
        c = (vv + (np.eye(4) - vv) * prm["saturation"][b]) @ c
        cs.append(c)
    return np.stack(gs), np.stack(cs)


def identity_params(batch):
    return ada.draw(K, tf.range(batch), 0.0)


# ---- the filter ---------------------------------------------------------------------

def test_sym6_is_an_orthogonal_lowpass_filter():
    f = np.asarray(ada.SYM6, np.float64)
    assert len(f) == 12 and ada.HZ_PAD == 3
    assert f.sum() == pytest.approx(np.sqrt(2.0), abs=1e-12)
    assert (f ** 2).sum() == pytest.approx(1.0, abs=1e-12)
    # Orthogonal to its even shifts (what perfect reconstruction needs).
    for shift in range(2, 12, 2):
        assert abs(np.dot(f[:-shift], f[shift:])) < 1e-12, shift


# ---- p = 0: the identity, through the geometric path ----------------------------------

@pytest.mark.parametrize("shape", [(4, 32, 32, 3), (4, 28, 28, 1)])
def test_p0_is_the_identity_everywhere(shape):
    # Reflect padding by the full fixed margin + an orthogonal filter: reconstruction is
    # exact up to float rounding everywhere, borders included, even for white noise.
    for x in (smooth(shape), noise(shape, 1)):
        y = run(x, 0.0)
        assert y.shape == x.shape and y.dtype == np.float32
        np.testing.assert_allclose(y, x, atol=1e-5, rtol=0)


# ---- the geometric path against the official's ---------------------------------------

@pytest.mark.parametrize("shape,p", [((6, 32, 32, 3), 1.0), ((6, 24, 40, 1), 0.6)])
def test_geometric_path_equals_the_official_transcription(shape, p):
    """Same G_inv through ours (fixed margin, float32, gathers) and the official's line by
    line (per-batch margin, float64): the fixed margin does not change the result."""
    b, h, w, _ = shape
    x = noise(shape, 2)
    params = ada.draw(K, tf.range(b), p)
    g = ada.geometric_matrix(params, h, w)
    ours = ada.apply_geometric(tf.constant(x), g).numpy()
    g64 = np_matrices(params, h, w)[0]
    np.testing.assert_allclose(g.numpy(), g64, atol=2e-5)  # The parameters -> matrix.
    official = np_geometric(x.transpose(0, 3, 1, 2).astype(np.float64), g64)
    official = official.transpose(0, 2, 3, 1)
    assert row_max(ours - x).min() > 0.05  # The warps did something to every row.
    np.testing.assert_allclose(ours, official, atol=1e-5, rtol=0)


def test_blits():
    """xflip, rotate90, integer translation on a 32x32 RGB image: translations are exact
    (an even shift of the upsampled grid commutes with the filter); flips and quarter
    turns are what the official gives, which is close to but not exactly the pixel flip
    (sym6 is not linear-phase: mirroring in the upsampled domain changes the filter's
    phase), so they are checked against the transcription and for direction."""
    x = smooth((4, 32, 32, 3), 3)
    params = identity_params(4)
    params["xflip"] = tf.constant([1.0, 0.0, 0.0, 0.0])
    params["rotate90"] = tf.constant([0.0, 1.0, 0.0, 0.0])
    params["xint"] = tf.constant([[0, 0], [0, 0], [3 / 32, -2 / 32], [-0.5 / 32, 1.49 / 32]])
    y = ada.apply_geometric(tf.constant(x), ada.geometric_matrix(params, 32, 32)).numpy()
    flip, quarter = x[0, :, ::-1], np.rot90(x[1], 1, axes=(0, 1))
    assert np.abs(y[0] - flip).max() < 0.1 < np.abs(y[0] - x[0]).max()
    assert np.abs(y[1] - quarter).max() < 0.1 < np.abs(y[1] - np.rot90(x[1], -1, axes=(0, 1))).max()
    # out[y, x] = in[y - ty, x - tx], with the reflect padding visible at the border;
    # -0.5 rounds to 0 (half to even), 1.49 to 1.
    m = 31
    xp = np.pad(x, [(0, 0), (m, m), (m, m), (0, 0)], mode="reflect")
    np.testing.assert_allclose(y[2], xp[2, m + 2:m + 34, m - 3:m + 29], atol=1e-5)
    np.testing.assert_allclose(y[3], xp[3, m - 1:m + 31, m:m + 32], atol=1e-5)
    g64 = np_matrices(params, 32, 32)[0]
    official = np_geometric(x.transpose(0, 3, 1, 2).astype(np.float64), g64)
    np.testing.assert_allclose(y, official.transpose(0, 2, 3, 1), atol=1e-5)


# ---- colour --------------------------------------------------------------------------

def test_color_matrix_equals_the_official_composition():
    params = ada.draw(K, tf.range(16), 1.0)
    np.testing.assert_allclose(ada.color_matrix(params, 3).numpy(),
                               np_matrices(params, 32, 32)[1], atol=1e-5)


def test_single_color_transforms():
    x = noise((5, 4, 4, 3), 4)
    params = identity_params(5)
    params["brightness"] = tf.constant([0.3, 0, 0, 0, 0])
    params["contrast"] = tf.constant([1, 2.0, 1, 1, 1])
    params["lumaflip"] = tf.constant([0, 0, 1.0, 0, 0])
    params["hue"] = tf.constant([0, 0, 0, 2 * np.pi / 3, 0])
    params["saturation"] = tf.constant([1, 1, 1, 1, 0.0])
    y = ada.apply_color(tf.constant(x), ada.color_matrix(params, 3)).numpy()
    mean = x.mean(axis=3, keepdims=True)
    np.testing.assert_allclose(y[0], x[0] + 0.3, atol=1e-6)
    np.testing.assert_allclose(y[1], 2 * x[1], atol=1e-6)
    # Householder reflection through the luma plane: x - 2 (v.x) v = x - 2 mean.
    np.testing.assert_allclose(y[2], x[2] - 2 * mean[2], atol=1e-6)
    # A third of a turn about the grey axis permutes the channels: r' = b, g' = r, b' = g.
    np.testing.assert_allclose(y[3], np.roll(x[3], 1, axis=-1), atol=1e-6)
    np.testing.assert_allclose(y[4], np.broadcast_to(mean[4], x[4].shape), atol=1e-6)
    # Grayscale: the mean of C's colour rows (lumaflip is then x -> -x); hue and
    # saturation are skipped.
    g = x[..., :1]
    y = ada.apply_color(tf.constant(g), ada.color_matrix(params, 1)).numpy()
    expected = [g[0] + 0.3, 2 * g[1], -g[2], g[3], g[4]]
    np.testing.assert_allclose(y, np.stack(expected), atol=1e-6)


# ---- draws ---------------------------------------------------------------------------

def _fired(params):
    """Bool [B] per transform: the row's parameter is not the identity."""
    return {name: np.abs(v.numpy() - (1.0 if name in ("scale", "aniso", "contrast",
                                                        "saturation") else 0.0))
            .reshape(len(v), -1).max(axis=1) > 0 for name, v in params.items()}


def test_gate_rates_and_independence():
    """4096 rows at p = 0.5: each transform's rate of non-identity parameters is p times
    the probability that the drawn value is not the identity; the two rotations fire with
    p_rot each and p together; gates of different streams are independent. Tolerances
    are 4.5 binomial standard deviations (at most 0.035)."""
    n, p = 4096, 0.5
    fired = _fired(ada.draw(K, tf.range(n), p))
    p_rot = 1 - np.sqrt(1 - p)
    expected = {name: p for name in fired}
    expected.update(xflip=p / 2, rotate90=p * 3 / 4, lumaflip=p / 2,
                    rotate_pre=p_rot, rotate_post=p_rot)
    for name, rate in expected.items():
        tol = 4.5 * np.sqrt(rate * (1 - rate) / n)
        assert abs(fired[name].mean() - rate) < tol, (name, fired[name].mean(), rate)
    either = fired["rotate_pre"] | fired["rotate_post"]
    assert abs(either.mean() - p) < 4.5 * np.sqrt(p * (1 - p) / n)
    for a, b in [("scale", "aniso"), ("brightness", "contrast"), ("xfrac", "saturation"),
                 ("rotate_pre", "rotate_post")]:
        both = (fired[a] & fired[b]).mean()
        rate = expected[a] * expected[b]
        assert abs(both - rate) < 4.5 * np.sqrt(rate * (1 - rate) / n), (a, b)
    # p = 0: nothing; p > 1: every gate fires (p_rot saturates at 1).
    assert not any(v.any() for v in _fired(ada.draw(K, tf.range(64), 0.0)).values())
    full = _fired(ada.draw(K, tf.range(n), 1.5))
    for name in ("scale", "rotate_pre", "aniso", "rotate_post", "xfrac", "brightness",
                 "contrast", "hue", "saturation", "xint"):
        assert full[name].all(), name


def test_parameter_distributions():
    """With every gate on (p = 1), the parameters follow the official distributions
    (4096 rows; means within 4.5 standard errors, spreads within 6%)."""
    n = 4096
    prm = {k: v.numpy() for k, v in ada.draw(K, tf.range(n), 1.0).items()}
    se = 4.5 / np.sqrt(n)
    for name, std in [("scale", 0.2), ("aniso", 0.2), ("contrast", 0.5), ("saturation", 1.0)]:
        z = np.log2(prm[name])
        assert abs(z.mean()) < se * std and abs(z.std() / std - 1) < 0.06, name
    for name, std in [("brightness", 0.2), ("xfrac", 0.125)]:
        z = prm[name]
        assert abs(z.mean()) < se * std and abs(z.std() / std - 1) < 0.06, name
    for name, high in [("rotate_pre", np.pi), ("rotate_post", np.pi), ("hue", np.pi),
                       ("xint", 0.125)]:
        z = prm[name]
        assert z.min() >= -high and z.max() <= high, name
        assert abs(z.std() / (high / np.sqrt(3)) - 1) < 0.06, name  # U(-a, a): a / sqrt 3
    for name, k in [("xflip", 2), ("rotate90", 4), ("lumaflip", 2)]:
        counts = np.bincount(prm[name].astype(int), minlength=k)
        tol = 4.5 * np.sqrt(1 / k / n)
        assert len(counts) == k and np.all(np.abs(counts / n - 1 / k) < tol), name


def test_draws_are_each_streams_own_key_bit_for_bit():
    """draw() takes its 26 keys' draws in one vectorized computation; each value must be
    the module docstring's per-key draw: rows_uniform / rows_normal of
    subkey(subkey(key, STREAMS[name]), GATE or PARAM), element j of the row."""
    rows = tf.constant([0, 7, 3, 1_000_003, 2 ** 33, 12], tf.int64)
    draws = ada._Draws(K, rows)
    for name, s in ada.STREAMS.items():
        stream = latents.subkey(K, s)
        gate, param = latents.subkey(stream, ada.GATE), latents.subkey(stream, ada.PARAM)
        np.testing.assert_array_equal(draws.gate_uniform(name),
                                      latents.rows_uniform(gate, rows, []), err_msg=name)
        np.testing.assert_array_equal(draws.uniform(name, 2),
                                      latents.rows_uniform(param, rows, [2]), err_msg=name)
        np.testing.assert_array_equal(draws.uniform(name),
                                      latents.rows_uniform(param, rows, []), err_msg=name)
        np.testing.assert_array_equal(draws.normal(name, 2),
                                      latents.rows_normal(param, rows, [2]), err_msg=name)
        np.testing.assert_array_equal(draws.normal(name),
                                      latents.rows_normal(param, rows, []), err_msg=name)


def test_unchanged_rows_are_exactly_the_identity_draws():
    """At p = 0.15 a row comes out unchanged iff every drawn parameter is the identity
    (xint counting as identity when both shifts round to 0 pixels): the gates reach the
    pixels, and nothing else changes them. 128 rows: about a fifth unchanged."""
    n, p = 128, 0.15
    x = smooth((n, 32, 32, 3), 5)
    y = run(x, p)
    params = ada.draw(K, tf.range(n), p)
    fired = _fired(params)
    fired["xint"] = np.abs(np.round(params["xint"].numpy() * 32)).max(axis=1) > 0
    identity = ~np.any(np.stack(list(fired.values())), axis=0)
    change = row_max(y - x)
    assert 10 <= identity.sum() <= 60, identity.sum()
    assert change[identity].max() < 1e-5
    assert change[~identity].min() > 1e-3


def test_p1_changes_every_image_and_p_saturates():
    x = smooth((16, 32, 32, 3), 6)
    y = run(x, 1.0)
    assert row_max(y - x).min() > 0.05
    np.testing.assert_array_equal(run(x, 3.0), y)  # Every gate already fires at p = 1.


# ---- N replicas = one device ---------------------------------------------------------

def test_each_row_depends_only_on_its_own_global_row():
    x = smooth((8, 32, 32, 3), 7)
    rows = np.arange(100, 108)
    whole = run(x, 0.7, rows)
    halves = np.concatenate([run(x[:4], 0.7, rows[:4]), run(x[4:], 0.7, rows[4:])])
    np.testing.assert_array_equal(halves, whole)  # Bit for bit.
    perm = np.random.default_rng(0).permutation(8)
    np.testing.assert_array_equal(run(x[perm], 0.7, rows[perm]), whole[perm])
    np.testing.assert_array_equal(run(x[5:6], 0.7, rows[5:6]), whole[5:6])
    # Other rows (or another key) are other draws.
    assert row_max(run(x, 0.7, rows - 100) - whole).min() > 1e-3
    other_key = latents.key(11, 6, latents.AUGMENT_PHASE)
    assert row_max(run(x, 0.7, rows, other_key) - whole).min() > 1e-3


# ---- gradients -----------------------------------------------------------------------

def test_sampler_is_torch_grid_sample_and_its_gradient_is_the_adjoint():
    rng = np.random.default_rng(8)
    img = rng.normal(size=(2, 9, 11, 3)).astype(np.float32)
    # A random affine warp (rotation, anisotropic scale, shift) plus jitter: many samples
    # land outside the image (zeros), none on the pixel grid.
    theta = np.stack([np.array([[np.cos(a) * s, -np.sin(a), 0.2], [np.sin(a), np.cos(a) / s, -0.1]])
                      for a, s in [(0.7, 1.3), (-2.0, 0.6)]])
    xs, ys = np.meshgrid((2 * np.arange(13) + 1) / 13 - 1, (2 * np.arange(10) + 1) / 10 - 1)
    base = np.stack([xs, ys, np.ones_like(xs)], -1)
    grid = np.einsum("nij,hwj->nhwi", theta, base) * 1.2 + rng.normal(size=(2, 10, 13, 2)) * 0.05
    grid = grid.astype(np.float32)
    out = ada.grid_sample(tf.constant(img), tf.constant(grid)).numpy()
    official = np_grid_sample(img.transpose(0, 3, 1, 2).astype(np.float64), grid.astype(np.float64))
    np.testing.assert_allclose(out, official.transpose(0, 2, 3, 1), atol=1e-5)
    assert (out == 0).any()  # Some samples fully outside.
    # <A x, y> == <x, A^T y>, A^T y from autodiff.
    x = tf.constant(rng.normal(size=img.shape).astype(np.float32))
    y = tf.constant(rng.normal(size=out.shape).astype(np.float32))
    with tf.GradientTape() as tape:
        tape.watch(x)
        ax = ada.grid_sample(x, tf.constant(grid))
    aty = tape.gradient(ax, x, output_gradients=y)
    lhs, rhs = float(tf.reduce_sum(ax * y)), float(tf.reduce_sum(x * aty))
    assert abs(lhs - rhs) < 1e-5 * (1 + abs(lhs))
    # And A^T itself equals the explicit transpose (scatter of the bilinear weights).
    a = np.zeros((out[0].size // 3, img[0].size // 3))
    for i in range(a.shape[1]):
        e = np.zeros((1, 9, 11, 1), np.float32)
        e.reshape(-1)[i] = 1
        a[:, i] = ada.grid_sample(tf.constant(e), tf.constant(grid[:1])).numpy().reshape(-1)
    explicit = (a.T @ y.numpy()[0].reshape(-1, 3)).reshape(9, 11, 3)
    np.testing.assert_allclose(aty.numpy()[0], explicit, atol=1e-5)


def test_whole_pipe_gradient_is_its_adjoint():
    rng = np.random.default_rng(9)
    x = tf.constant(noise((4, 16, 16, 3), 9))
    y = tf.constant(rng.normal(size=(4, 16, 16, 3)).astype(np.float32))
    p, rows = tf.constant(0.8), tf.range(4)
    params = ada.draw(K, rows, p)
    colour = ada.color_matrix(params, 3)
    no_offset = tf.tile(tf.constant([[[0.0], [0], [0], [1]]], tf.float64), [4, 1, 1])
    colour = tf.concat([colour[:, :, :3], no_offset], 2)
    linear = lambda v: ada.apply_color(  # The pipe without its colour offset: linear in x.
        ada.apply_geometric(v, ada.geometric_matrix(params, 16, 16)), colour)
    with tf.GradientTape() as tape:
        tape.watch(x)
        ax = linear(x)
    aty = tape.gradient(ax, x, output_gradients=y)
    lhs, rhs = float(tf.reduce_sum(ax * y)), float(tf.reduce_sum(x * aty))
    assert abs(lhs - rhs) < 1e-4 * (1 + abs(lhs)), (lhs, rhs)


def test_second_order_through_the_pipe():
    """R1 through the pipe: the D-weight gradient of sum((dD(aug(x))/dx)^2) is finite,
    non-zero, and matches central finite differences."""
    rng = np.random.default_rng(10)
    x = tf.constant(smooth((3, 16, 16, 3), 10))
    w = tf.Variable(rng.normal(size=(3, 3, 3, 4)).astype(np.float32) * 0.3)
    v = tf.constant(rng.normal(size=(4,)).astype(np.float32))
    p, rows = tf.constant(0.9), tf.range(3)

    def r1(weights):
        with tf.GradientTape() as inner:
            inner.watch(x)
            h = tf.nn.conv2d(ada.augment(x, p, K, rows), weights, 1, "SAME")
            logits = tf.reduce_sum(tf.nn.softplus(h) * v, axis=[1, 2, 3])
            total = tf.reduce_sum(logits)
        g = inner.gradient(total, x)
        return tf.reduce_sum(tf.square(g))

    with tf.GradientTape() as outer:
        penalty = r1(w)
    grad = outer.gradient(penalty, w)
    assert grad is not None and np.all(np.isfinite(grad.numpy()))
    assert np.abs(grad.numpy()).max() > 0
    eps = 1e-2
    for idx in [(1, 1, 0, 2), (0, 2, 2, 1)]:
        delta = np.zeros(w.shape, np.float32)
        delta[idx] = eps
        fd = (float(r1(w + delta)) - float(r1(w - delta))) / (2 * eps)
        assert fd == pytest.approx(float(grad.numpy()[idx]), rel=2e-2, abs=1e-3), idx


# ---- graph / XLA ---------------------------------------------------------------------

def test_xla_matches_eager():
    x = smooth((4, 16, 16, 1), 11)

    @tf.function(jit_compile=True)
    def f(x, p, rows):
        return ada.augment(x, p, K, rows)

    got = f(tf.constant(x), tf.constant(0.7), tf.range(4)).numpy()
    np.testing.assert_allclose(got, run(x, 0.7), atol=1e-5)


def test_rejects_other_channel_counts():
    with pytest.raises(ValueError, match="1 or 3 channels"):
        ada.augment(tf.zeros([1, 8, 8, 4]), tf.constant(0.5), K, tf.range(1))


# ---- the p controller ----------------------------------------------------------------

def test_adjust_p_paper256():
    step = np.float32(64 * 4 / 500_000)  # 5.12e-4
    assert step == np.float32(5.12e-4)
    adjust = lambda p, s, n: float(ada.adjust_p(tf.constant(p, tf.float32), s, n, 64, 4, 0.6, 500))
    p = np.float32(0.25)
    assert adjust(p, 163, 256) == np.float32(p + step)  # r_t = 0.637 > 0.6: up
    assert adjust(p, 153, 256) == np.float32(p - step)  # r_t = 0.598: down
    assert adjust(p, -256, 256) == np.float32(p - step)  # The size of the miss is ignored.
    assert adjust(p, 3, 5) == p  # r_t == target exactly: sign 0 (np.sign), unchanged.
    assert adjust(0.0, 0, 256) == 0.0  # Never below 0.
    assert adjust(3e-4, 0, 256) == 0.0
    assert adjust(1.0, 256, 256) == np.float32(np.float32(1.0) + step)  # No upper clamp.
    assert adjust(p, 0, 0) == p  # No statistic: unchanged.
    new_p = ada.adjust_p(tf.constant(0.5), tf.constant(200), tf.constant(256), 64)
    assert new_p.dtype == tf.float32
    # 0 -> 1 takes ceil(1 / 5.12e-4) = 1954 adjustments, i.e. 7816 iterations (500 kimg).
    p, n = tf.constant(0.0), 0
    while float(p) < 1.0:
        p = ada.adjust_p(p, 200, 256, 64, 4, 0.6, 500)
        n += 1
    assert n == 1954
