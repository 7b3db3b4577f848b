"""Adaptive discriminator augmentation (ADA; Karras et al. 2020, "Training Generative
Adversarial Networks with Limited Data", arXiv:2006.06676): the 'bgc' pipeline and the
p controller, in pure TensorFlow, differentiable to second order in the images.

Official references (NVlabs/stylegan2-ada-pytorch): training/augment.py:AugmentPipe
(__init__ and forward, with train.py augpipe_specs['bgc'] = all 12 multipliers 1),
torch_utils/ops/upfirdn2d.py (upsample2d/downsample2d, _upfirdn2d_ref) and
training/training_loop.py ("Execute ADA heuristic"). Images are NHWC in [-1, 1].

Pipeline (`augment`), per sample, every transform gated by its own Bernoulli(p) draw
(u < p; p > 1 saturates the gates; with AugmentPipe's probability multipliers m, as in
R3GAN's pipe, ada_pipes.py: u < m p). The geometric ones build the inverse homogeneous
3x3 matrix G_inv (output pixel -> input pixel, pixel units, origin at the image centre)
by right-multiplication, in this order:
  1 xflip        i in {0, 1} uniform;           G_inv @= scale2d(1 - 2i, 1)
  2 rotate90     i in {0, 1, 2, 3} uniform;     G_inv @= rotate2d(pi/2 i)
  3 xint         t ~ U(-0.125, 0.125)^2;        G_inv @= translate2d(-round(t_x W), -round(t_y H))
  4 scale        s = 2^N(0, 0.2^2);             G_inv @= scale2d(1/s, 1/s)
  5 rotate pre   theta ~ U(-pi, pi), gate p_rot; G_inv @= rotate2d(theta)
  6 aniso        s = 2^N(0, 0.2^2);             G_inv @= scale2d(1/s, s)
  7 rotate post  theta ~ U(-pi, pi), gate p_rot; G_inv @= rotate2d(theta)
  8 xfrac        t ~ N(0, 0.125^2)^2;           G_inv @= translate2d(-t_x W, -t_y H)
with p_rot = 1 - sqrt(clip(1 - p, 0, 1)), so that P(pre or post) = p, and
rotate2d(a) = [[cos a, -sin a, 0], [sin a, cos a, 0], [0, 0, 1]]. Gated-off transforms
contribute their identity value. The colour ones build a 4x4 matrix C (colour_in ->
colour_out) by LEFT-multiplication, with the luma axis v = (1, 1, 1, 0)/sqrt(3):
  9 brightness   b ~ N(0, 0.2^2);               C = translate3d(b, b, b) @ C
 10 contrast     c = 2^N(0, 0.5^2);             C = scale3d(c, c, c) @ C
 11 lumaflip     i in {0, 1} uniform;           C = (I - 2 v v^T i) @ C
 12 hue          theta ~ U(-pi, pi);            C = rotate3d(v, theta) @ C      (RGB only)
 13 saturation   s = 2^N(0, 1);                 C = (v v^T + (I - v v^T) s) @ C (RGB only)

Geometric execution (`apply_geometric`), as AugmentPipe.forward: reflect-pad the image,
upsample 2x with the orthogonal sym6 wavelet low-pass filter (`SYM6`, 12 taps, normalized
to sum 1 as upfirdn2d.setup_filter does; upsample gain 4), sample the
[(H + 2 HZ_PAD) 2, (W + 2 HZ_PAD) 2] canvas bilinearly through G_inv (conjugated into the
upsampled, padded frame exactly as the official matrices do), then downsample 2x with
the same filter (correlation, i.e. flip_filter=True) while cropping 2 HZ_PAD, giving
[H, W]. The bilinear sampler (`grid_sample`, `sample_bilinear`) is an explicit gather
equivalent to torch grid_sample(mode='bilinear', padding_mode='zeros',
align_corners=False), so autodiff gives its exact adjoint (a segment sum) and second
derivatives; tf.raw_ops.ImageProjectiveTransformV3 (keras.ops.image.affine_transform) is
NOT used: its registered gradient re-samples with the inverse transform, which is not the
adjoint for non-bijective warps (tensorflow#127241). Pads, slices, gathers, multiplies
and adds only, so R1 can differentiate through the pipe (to any order).

Colour execution (`apply_color`): RGB: rgb' = C[:3, :3] rgb + C[:3, 3]. Grayscale (the
official handling): c = mean over the 3 colour rows of C[:3, :], x' = x sum(c[:3]) + c[3]
(hue and saturation are skipped for one channel, as officially).

As officially, both paths always run (the official tests `G_inv is not I_3`, a Python
identity test, so whenever a multiplier is > 0): at p = 0 the geometric path is the
identity up to float rounding (perfect reconstruction of the orthogonal filter).

Controller (`adjust_p`), every `interval` iterations:
  p <- max(p + sign(sign_sum / count - target) * batch_size * interval / (kimg * 1000), 0)
with r_t = sign_sum / count the mean of sign(D(aug(reals))) since the last adjustment,
target 0.6, interval 4, kimg 500 (100 on resume). NO upper clamp (as official; StudioGAN
clamps to 1): p > 1 saturates every gate, and p_rot saturates at 1.

What differs from the official:
  * Randomness: every draw is per example, keyed by the example's GLOBAL row. Transform
    `name` owns sub-stream k_s = latents.subkey(key, STREAMS[name]); its gate uniform is
    latents.rows_uniform(latents.subkey(k_s, GATE), rows, []) and its parameters come from
    latents.subkey(k_s, PARAM) (rows_uniform or rows_normal, one row per example; all 26
    keys' draws are computed at once, `_Draws`, with the same values). The
    augmentation of row r is a function of (key, r, p, x[r]) only, bit for bit (see
    "Batch invariance" below), so one device and N replicas (any split of the rows)
    compute the same images, and a resumed run repeats them. The official draws from one
    global torch generator per process, in batch order. Give real and fake batches, and
    each D call (Gmain, Dmain, Dreg), different keys (or distinct rows).
  * Margin: the official pads by a per-BATCH margin (the max over the batch's transformed
    corners + 2 HZ_PAD, clipped to [0, W - 1] x [0, H - 1]), so one row's result depends
    (slightly: the filter tails reach the padding edge) on the other rows of its replica.
    Here the margin is FIXED at the clip's upper bound, W - 1 and H - 1 on every side. The
    official margin is meant to keep the padding edge out of sight and ours is at least
    as large (equal where the official clips): against a float64 NumPy transcription of
    AugmentPipe.forward on batches of 16 at 32x32 and 24x40, ours agrees within 1e-6,
    while the official's own result for a row moved by up to 2e-5 between its batch of
    16 and a batch of 1 (measured). The cost differs: the padded image is
    (3H - 2) x (3W - 2), upsampled 2x per axis, for every sample whatever p.
  * Precision: parameters, matrices and sample coordinates in float64 (official float32),
    pixels in float32; rotate90 uses exact cos/sin (0, +-1). Like latents.rows_normal,
    this needs float64 support on the device.
  * Execution: the 12-tap FIR as polyphase sums of shifted slices (the same arithmetic as
    upfirdn2d's zero-insertion and convolution, without the zero taps), the colour
    matrices and the 3x3/4x4 products as explicit elementwise sums.
  * adjust_p returns p unchanged when count == 0 (the official never calls it then).

Not a deviation, but worth knowing: because sym6 is not linear-phase, mirroring in the
upsampled domain is not the pixel mirror: the official xflip (and odd quarter turns) of a
smooth 32x32 image differs from x[:, ::-1] by up to ~0.05 (0.3 on white noise); integer
translations are exact. We reproduce the official, not the ideal flip.

Batch invariance: TensorFlow's CPU kernels for transcendental functions (pow, exp, cos,
...) give float32 results that depend on where an element falls in a SIMD packet, i.e. on
the batch size (measured: tf.pow(2., z) differed in the last bit between a batch of 8 and
of 4), and matmul/conv kernels may pick other blockings for other shapes. So the
parameter math runs in float64 (a last-bit float64 difference does not survive rounding
to float32), and every per-pixel operation is elementwise: products with broadcast
scalars and sums in a fixed order, slices, pads, gathers. A row's output is then the same
bits whatever the other rows of its call (tested on CPU; across device types, or eager
vs XLA, results agree to float rounding only).
"""

import numpy as np
import tensorflow as tf

from tf_gan_scale import latents

# Daubechies symlet-6 low-pass decomposition filter: AugmentPipe's wavelets['sym6'], the
# orthogonal filter of the geometric path (sum = sqrt(2), sum of squares = 1, orthogonal
# to its even shifts: that is what makes "upsample, identity, downsample" the identity).
SYM6 = (0.015404109327027373, 0.0034907120842174702, -0.11799011114819057,
        -0.048311742585633, 0.4910559419267466, 0.787641141030194, 0.3379294217276218,
        -0.07263752278646252, -0.021060292512300564, 0.04472490177066578,
        0.0017677118642428036, -0.007800708325034148)
HZ_PAD = len(SYM6) // 4  # 3: the official Hz_pad (canvas border, in input pixels).

# 'bgc' constants (AugmentPipe.__init__ defaults).
XINT_MAX = 0.125
SCALE_STD = 0.2
ROTATE_MAX = 1.0
ANISO_STD = 0.2
XFRAC_STD = 0.125
BRIGHTNESS_STD = 0.2
CONTRAST_STD = 0.5
HUE_MAX = 1.0
SATURATION_STD = 1.0

# Sub-stream of `key` owned by each transform, in the official order. Rotation has two
# applications with independent draws, so 13 streams for the 12 'bgc' multipliers. Within
# stream s (key k_s = latents.subkey(key, s)), the gate uniform uses latents.subkey(k_s,
# GATE) and the parameters latents.subkey(k_s, PARAM): rows_uniform and rows_normal of
# ONE key share their random bits, so the gate and a normal parameter must not share a key.
STREAMS = {"xflip": 0, "rotate90": 1, "xint": 2, "scale": 3, "rotate_pre": 4, "aniso": 5,
           "rotate_post": 6, "xfrac": 7, "brightness": 8, "contrast": 9, "lumaflip": 10,
           "hue": 11, "saturation": 12}
GATE = 0
PARAM = 1
GEOMETRIC = ("xflip", "rotate90", "xint", "scale", "rotate_pre", "aniso", "rotate_post",
             "xfrac")
COLOR = ("brightness", "contrast", "lumaflip", "hue", "saturation")
# AugmentPipe's probability multipliers ("rotate" gates both rotations); 'bgc': all 1.
MULTIPLIERS = ("xflip", "rotate90", "xint", "scale", "rotate", "aniso", "xfrac",
               "brightness", "contrast", "lumaflip", "hue", "saturation")
BGC = dict.fromkeys(MULTIPLIERS, 1.0)

# ADA controller defaults (train.py / training_loop.py).
ADA_TARGET = 0.6
ADA_INTERVAL = 4
ADA_KIMG = 500


# ---- random parameters ----------------------------------------------------------------
#
# float64 for all parameter math: see "Batch invariance" in the module docstring.
_F64 = tf.float64


class _Draws:
    """Every uniform and normal `draw` uses, from ONE vectorized computation of the 26
    keys (13 streams x GATE, PARAM) and their rows' bits. The values are the per-key
    draws the module docstring specifies, bit for bit (rows_uniform and rows_normal of
    latents.subkey(latents.subkey(key, STREAMS[name]), part)): latents' draws are
    elementwise in the keys, and a row's element j does not depend on how many elements
    are drawn. Drawn one key at a time they were ~40% of the ops of a StyleGAN2-ADA step.
    """

    def __init__(self, key, rows):
        streams = latents.subkey(key, tf.range(len(STREAMS), dtype=tf.int64))  # [13]
        keys = tf.stack([latents.subkey(streams, GATE), latents.subkey(streams, PARAM)])
        # Rows leading, [B, 2 (GATE, PARAM), 13, 2]: a row's values then sit at the same
        # places whatever the batch size, as in a per-key draw (see "Batch invariance":
        # the float64 ndtri's kernel may round by where an element falls).
        bits = tf.transpose(latents.stream_bits(keys, rows, 2), [2, 0, 1, 3])
        self._uniform = tf.cast(latents.uniform_of_bits(bits), _F64)
        self._normal = tf.cast(latents.normal_of_bits(bits[:, PARAM]), _F64)  # [B, 13, 2]

    def gate_uniform(self, name):
        """[B] uniform in [0, 1): the gate draws of transform `name`."""
        return self._uniform[:, GATE, STREAMS[name], 0]

    def gate(self, name, prob):
        """Bool [B]: row fires transform `name` (u < prob, u uniform in [0, 1))."""
        return self.gate_uniform(name) < prob

    def uniform(self, name, size=None):
        """[B] (size None) or [B, size] parameters of `name`, uniform in [0, 1)."""
        u = self._uniform[:, PARAM, STREAMS[name]]
        return u[:, 0] if size is None else u[:, :size]

    def normal(self, name, size=None):
        """[B] (size None) or [B, size] parameters of `name`, standard normal."""
        n = self._normal[:, STREAMS[name]]
        return n[:, 0] if size is None else n[:, :size]


def rotation_probability(p):
    """p_rot = 1 - sqrt(clip(1 - p, 0, 1)) (float64 scalar): the gate of EACH of the two
    rotations, so that P(pre or post) = 1 - (1 - p_rot)^2 = min(p, 1)."""
    p = tf.cast(tf.cast(p, tf.float32), _F64)
    return 1.0 - tf.sqrt(tf.clip_by_value(1.0 - p, 0.0, 1.0))


def draw(key, rows, p, multipliers=None):
    """The per-row parameters of the 13 transforms, gated (identity value where the gate
    is off), with the official distributions.

    Args:
        key: int64 scalar (latents.key(seed, step, phase)).
        rows: int [B], the global row of each example.
        p: float scalar, the augmentation probability (may exceed 1).
        multipliers: {name in MULTIPLIERS: float >= 0}, AugmentPipe's per-transform
            probability multipliers (None: 'bgc', all 1; a missing name: 0). Officially
            transform name fires when u < multiplier * p (a float32 product) and each
            rotation when u < 1 - sqrt(clip(1 - rotate * p, 0, 1)); so here.
    Returns:
        dict of float64 tensors: "xflip", "rotate90", "lumaflip" [B] (integers i as
        floats; identity 0), "xint" [B, 2] (t_x, t_y relative to W, H, before rounding;
        identity 0), "xfrac" [B, 2] (relative; 0), "scale", "aniso", "contrast",
        "saturation" [B] (factors; 1), "rotate_pre", "rotate_post", "hue" [B] (radians;
        0), "brightness" [B] (offset; 0).
    """
    key = tf.cast(key, tf.int64)
    rows = tf.cast(tf.convert_to_tensor(rows), tf.int64)
    p = tf.cast(p, tf.float32)
    m = BGC if multipliers is None else multipliers
    if set(m) - set(MULTIPLIERS):
        raise ValueError(f"unknown AugmentPipe multipliers {sorted(set(m) - set(MULTIPLIERS))}")
    # u < multiplier * p compared exactly (the float32 product of the official buffer).
    prob = {name: tf.cast(p * float(m.get(name, 0.0)), _F64) for name in MULTIPLIERS}
    p_rot = rotation_probability(p * float(m.get("rotate", 0.0)))
    draws = _Draws(key, rows)
    out = {}

    def gated(name, value, identity, gate=None):
        on = draws.gate(name, prob[name] if gate is None else gate)
        if value.shape.rank == 2:
            on = on[:, None]
        out[name] = tf.where(on, value, tf.cast(identity, _F64))

    def choice(name, n):  # floor(u n), u < 1 (clamped anyway).
        return tf.minimum(tf.floor(draws.uniform(name) * n), n - 1.0)

    def log2_normal(name, std):
        return tf.pow(tf.constant(2.0, _F64), draws.normal(name) * std)

    def angle(name, fraction):
        return (draws.uniform(name) * 2 - 1) * np.pi * fraction

    gated("xflip", choice("xflip", 2), 0.0)
    gated("rotate90", choice("rotate90", 4), 0.0)
    gated("xint", (draws.uniform("xint", 2) * 2 - 1) * XINT_MAX, 0.0)
    gated("scale", log2_normal("scale", SCALE_STD), 1.0)
    gated("rotate_pre", angle("rotate_pre", ROTATE_MAX), 0.0, p_rot)
    gated("aniso", log2_normal("aniso", ANISO_STD), 1.0)
    gated("rotate_post", angle("rotate_post", ROTATE_MAX), 0.0, p_rot)
    gated("xfrac", draws.normal("xfrac", 2) * XFRAC_STD, 0.0)
    gated("brightness", draws.normal("brightness") * BRIGHTNESS_STD, 0.0)
    gated("contrast", log2_normal("contrast", CONTRAST_STD), 1.0)
    gated("lumaflip", choice("lumaflip", 2), 0.0)
    gated("hue", angle("hue", HUE_MAX), 0.0)
    gated("saturation", log2_normal("saturation", SATURATION_STD), 1.0)
    return out


# ---- matrices (float64, [B, n, n]) -----------------------------------------------------

def _matrix(rows):
    """[[a, b, c], ...] of [B] float64 tensors or Python numbers -> [B, n, m] float64."""
    ref = next(e for row in rows for e in row if isinstance(e, tf.Tensor))
    full = lambda e: e if isinstance(e, tf.Tensor) else tf.fill(tf.shape(ref), tf.constant(e, _F64))
    return tf.stack([tf.stack([full(e) for e in row], -1) for row in rows], -2)


def _mm(a, b):
    """Batched a @ b ([B, n, k] @ [B, k, m], or [n, k] constants broadcast), as a sum of
    broadcast products in a fixed order (no matmul kernel: see "Batch invariance")."""
    out = a[..., :, 0:1] * b[..., 0:1, :]
    for k in range(1, a.shape[-1]):
        out = out + a[..., :, k:k + 1] * b[..., k:k + 1, :]
    return out


def _translate2d(tx, ty):
    return _matrix([[1, 0, tx], [0, 1, ty], [0, 0, 1]])


def _scale2d(sx, sy):
    return _matrix([[sx, 0, 0], [0, sy, 0], [0, 0, 1]])


def _rotate2d(cos, sin):
    return _matrix([[cos, -sin, 0], [sin, cos, 0], [0, 0, 1]])


def _param(params, name):
    return tf.cast(params[name], _F64)


def geometric_matrix(params, height, width):
    """G_inv [B, 3, 3] float64 (output pixel -> input pixel, pixel units centred on the
    image) of the parameters `draw` returns, composed in the official order (module
    docstring). height, width: Python ints (xint rounds t * size to whole pixels)."""
    g = _scale2d(1.0 - 2.0 * _param(params, "xflip"), 1.0)  # Its own inverse.
    # rotate2d_inv(-pi/2 i) = rotate2d(pi/2 i), with the exact cos/sin of quarter turns.
    quarter = tf.cast(_param(params, "rotate90"), tf.int32)
    cos = tf.gather(tf.constant([1.0, 0.0, -1.0, 0.0], _F64), quarter)
    sin = tf.gather(tf.constant([0.0, 1.0, 0.0, -1.0], _F64), quarter)
    g = _mm(g, _rotate2d(cos, sin))
    t = _param(params, "xint")  # round: half to even, in TF as in torch.
    g = _mm(g, _translate2d(-tf.round(t[:, 0] * width), -tf.round(t[:, 1] * height)))
    s = _param(params, "scale")
    g = _mm(g, _scale2d(1.0 / s, 1.0 / s))
    theta = _param(params, "rotate_pre")  # rotate2d_inv(-theta) = rotate2d(theta).
    g = _mm(g, _rotate2d(tf.cos(theta), tf.sin(theta)))
    s = _param(params, "aniso")
    g = _mm(g, _scale2d(1.0 / s, s))  # scale2d_inv(s, 1/s).
    theta = _param(params, "rotate_post")
    g = _mm(g, _rotate2d(tf.cos(theta), tf.sin(theta)))
    t = _param(params, "xfrac")
    return _mm(g, _translate2d(-t[:, 0] * width, -t[:, 1] * height))


_V = np.array([1.0, 1.0, 1.0, 0.0]) / np.sqrt(3.0)  # Luma axis.
_VV = np.outer(_V, _V)


def color_matrix(params, channels):
    """C [B, 4, 4] float64 (colour_in -> colour_out, homogeneous) of the parameters `draw`
    returns, composed in the official order; hue and saturation only when channels > 1."""
    b = _param(params, "brightness")
    c = _matrix([[1, 0, 0, b], [0, 1, 0, b], [0, 0, 1, b], [0, 0, 0, 1]])
    k = _param(params, "contrast")
    c = _mm(_matrix([[k, 0, 0, 0], [0, k, 0, 0], [0, 0, k, 0], [0, 0, 0, 1]]), c)
    i = _param(params, "lumaflip")[:, None, None]
    eye, vv = tf.eye(4, dtype=_F64), tf.constant(_VV)
    c = _mm(eye - 2.0 * vv * i, c)  # Householder reflection through the luma plane.
    if channels > 1:
        theta = _param(params, "hue")
        vx, vy, vz = (float(e) for e in _V[:3])
        s, co = tf.sin(theta), tf.cos(theta)
        cc = 1.0 - co
        c = _mm(_matrix([  # rotate3d(v, theta): Rodrigues' rotation about v.
            [vx * vx * cc + co, vx * vy * cc - vz * s, vx * vz * cc + vy * s, 0],
            [vy * vx * cc + vz * s, vy * vy * cc + co, vy * vz * cc - vx * s, 0],
            [vz * vx * cc - vy * s, vz * vy * cc + vx * s, vz * vz * cc + co, 0],
            [0, 0, 0, 1]]), c)
        sat = _param(params, "saturation")[:, None, None]
        c = _mm(vv + (eye - vv) * sat, c)
    return c


# ---- execution ------------------------------------------------------------------------

def sample_bilinear(images, ix, iy):
    """Bilinear sampling with zeros outside, by explicit gathers: differentiable to any
    order in `images` (the coordinates are constants), and autodiff's gradient is the
    exact adjoint (a scatter-add of the same weights).

    Args:
        images: float [B, Hi, Wi, C].
        ix, iy: float [B, Ho, Wo] (float64 for the pipe), the sample positions in input
            pixels, pixel (i, j) centred at (x, y) = (j, i) (torch's align_corners=False
            convention after unnormalizing).
    Returns:
        [B, Ho, Wo, C] in images' dtype: the sum over the 4 neighbours of weight * pixel,
        neighbours outside the image contributing 0 (torch padding_mode='zeros').
    """
    hi, wi, ch = images.shape[1], images.shape[2], images.shape[3]
    ix, iy = tf.stop_gradient(ix), tf.stop_gradient(iy)
    x0, y0 = tf.floor(ix), tf.floor(iy)
    # The fractions in the images' dtype from here: the weights are elementwise products
    # (exact IEEE operations, so still batch invariant) and the float64 part stays small.
    wx1, wy1 = tf.cast(ix - x0, images.dtype), tf.cast(iy - y0, images.dtype)
    wx0, wy0 = 1.0 - wx1, 1.0 - wy1
    x0, y0 = tf.cast(x0, tf.int32), tf.cast(y0, tf.int32)
    corners = [(x0, y0, wx0 * wy0), (x0 + 1, y0, wx1 * wy0),
               (x0, y0 + 1, wx0 * wy1), (x0 + 1, y0 + 1, wx1 * wy1)]
    index, weight = [], []
    for x, y, w in corners:
        inside = (x >= 0) & (x < wi) & (y >= 0) & (y < hi)
        # Outside corners gather a valid pixel with weight 0: the adjoint then adds
        # nothing there, exactly like grid_sample's zeros padding.
        index.append(tf.clip_by_value(y, 0, hi - 1) * wi + tf.clip_by_value(x, 0, wi - 1))
        weight.append(tf.where(inside, w, tf.zeros_like(w))[..., None])
    b = tf.shape(images)[0]
    shape = tf.shape(ix)
    index = tf.reshape(tf.stack(index, 1), [b, -1])  # [B, 4 Ho Wo]: one gather for all.
    flat = tf.reshape(images, [b, hi * wi, ch])
    taps = tf.reshape(tf.gather(flat, index, batch_dims=1), [b, 4, shape[1], shape[2], ch])
    out = taps[:, 0] * weight[0]
    for k in range(1, 4):  # A fixed summation order (not reduce_sum): batch invariant.
        out = out + taps[:, k] * weight[k]
    return out


def grid_sample(images, grid):
    """torch.nn.functional.grid_sample(mode='bilinear', padding_mode='zeros',
    align_corners=False), NHWC.

    Args:
        images: float [B, Hi, Wi, C].
        grid: float [B, Ho, Wo, 2], normalized (x, y): -1 and 1 are the outer edges of
            the border pixels.
    Returns:
        [B, Ho, Wo, C].
    """
    hi, wi = images.shape[1], images.shape[2]
    ix = ((grid[..., 0] + 1.0) * wi - 1.0) / 2.0
    iy = ((grid[..., 1] + 1.0) * hi - 1.0) / 2.0
    return sample_bilinear(images, ix, iy)


def _filter():
    f = np.asarray(SYM6, np.float64)
    return f / f.sum()  # upfirdn2d.setup_filter(normalize=True): sum 1.


def _slice(x, axis, start, stop, step=1):
    """x[..., start:stop:step, ...] along axis 1 (H) or 2 (W) of NHWC."""
    return x[:, start:stop:step] if axis == 1 else x[:, :, start:stop:step]


def reflect_pad(x, axis, m):
    """tf.pad(mode="REFLECT") of m (<= size - 1) on both sides of axis 1 (H) or 2 (W) of
    NHWC, as slices with stride -1 and a concat: the same values, in ops DTensor can lay
    out (MirrorPad and ReverseV2 have no layout propagation: a mesh could not run ADA)."""
    size = x.shape[axis]
    before = _slice(x, axis, m, 0, -1)  # x[m], ..., x[1]
    stop = size - 2 - m
    after = _slice(x, axis, size - 2, stop if stop >= 0 else None, -1)  # x[L-2], ...
    return tf.concat([before, x, after], axis)


def _weighted_sum(terms):
    """sum_t c_t x_t in the order given (float32 constants c_t)."""
    out = None
    for c, x in terms:
        out = x * np.float32(c) if out is None else out + x * np.float32(c)
    return out


def _upsample_axis(x, axis):
    """upfirdn2d.upsample2d(sym6, up=2) along one axis of NHWC ([.., L, ..] -> [.., 2L, ..]),
    polyphase. Officially: insert a zero after every sample, zero-pad (6, 5) (i.e.
    ((fw + 1)//2, (fw - 2)//2)), CONVOLVE (flip_filter=False) with g = 2 f (gain up^2 = 4,
    sqrt per axis of the separable filter): y[k] = sum_t g[11 - t] z[k + t - 6]. Only the
    taps meeting a non-zero survive:
      y[2q]     = sum_s g[11 - 2s] x[q + s - 3],   y[2q + 1] = sum_s g[10 - 2s] x[q + s - 2],
    s = 0..5, x zero outside [0, L)."""
    g = 2.0 * _filter()
    size = x.shape[axis]
    pad = [[0, 0]] * 4
    pad[axis] = [3, 3]
    xp = tf.pad(x, pad)  # xp[i] = x[i - 3]
    even = _weighted_sum((g[11 - 2 * s], _slice(xp, axis, s, s + size)) for s in range(6))
    odd = _weighted_sum((g[10 - 2 * s], _slice(xp, axis, s + 1, s + 1 + size)) for s in range(6))
    y = tf.stack([even, odd], axis=axis + 1)  # [.., L, 2, ..]
    shape = tf.unstack(tf.shape(x))
    shape[axis] = 2 * size
    return tf.reshape(y, tf.stack(shape))


def _downsample_axis(x, axis, crop):
    """upfirdn2d.downsample2d(sym6, down=2, padding=-crop, flip_filter=True) along one
    axis: pad (-crop + (fw - 1)//2, -crop + (fw - 2)//2), i.e. crop c0 = c1 = crop - 5,
    CORRELATE with f (gain 1), keep even outputs: y[n] = sum_t f[t] x[c0 + 2n + t]."""
    f = _filter()
    fw = len(f)
    c0, c1 = crop - (fw - 1) // 2, crop - (fw - 2) // 2
    if min(c0, c1) < 0:
        raise ValueError(f"crop {crop} too small for a {fw}-tap filter")
    n = (x.shape[axis] - c0 - c1 - fw) // 2 + 1
    return _weighted_sum((f[t], _slice(x, axis, c0 + t, c0 + t + 2 * n - 1, 2))
                         for t in range(fw))


def _pixel_coordinates(g_inv, height, width, margin_y, margin_x):
    """(ix, iy), float64 [B, Ho, Wo]: the upsampled-input pixel that canvas pixel (i, j)
    samples. The official chain: pad translate (0 for symmetric margins), the 2x
    conjugation with its half-pixel shift, then affine_grid's and grid_sample's
    normalizations, which reduce to pixel-centre offsets: affine_grid puts canvas pixel j
    at x_n = (2j + 1)/Wo - 1, the official scale2d_inv(2/Wo) makes that j + 0.5 - Wo/2;
    grid_sample maps the official scale2d(2/Wi) output g to ((g + 1) Wi - 1)/2, i.e. the
    unnormalized v to v + Wi/2 - 0.5."""
    b = tf.shape(g_inv)[0]
    one = tf.ones([b], _F64)

    def t(tx, ty):
        return _translate2d(tx * one, ty * one)

    def s(sx, sy):
        return _scale2d(sx * one, sy * one)

    g = _mm(s(2.0, 2.0), _mm(g_inv, s(0.5, 0.5)))  # scale2d(2) @ G @ scale2d_inv(2)
    g = _mm(t(-0.5, -0.5), _mm(g, t(0.5, 0.5)))  # translate2d(-.5) @ G @ translate2d_inv(-.5)
    hi, wi = 2 * (height + 2 * margin_y), 2 * (width + 2 * margin_x)
    ho, wo = 2 * (height + 2 * HZ_PAD), 2 * (width + 2 * HZ_PAD)
    m = _mm(t(wi / 2 - 0.5, hi / 2 - 0.5), _mm(g, t(0.5 - wo / 2, 0.5 - ho / 2)))
    j = tf.constant(np.arange(wo, dtype=np.float64))[None, None, :]
    i = tf.constant(np.arange(ho, dtype=np.float64))[None, :, None]
    row = lambda r: [m[:, r, k][:, None, None] for k in range(3)]
    (a, bb, c), (d, e, f) = row(0), row(1)
    return a * j + bb * i + c, d * j + e * i + f  # Elementwise, fixed order.


def apply_geometric(x, g_inv):
    """Executes the inverse warps G_inv on the batch.

    Args:
        x: float32 [B, H, W, C] (H, W static, each >= 2).
        g_inv: float [B, 3, 3], `geometric_matrix`.
    Returns:
        float32 [B, H, W, C]. Linear in x; its gradient is the exact adjoint.
    """
    h, w = x.shape[1], x.shape[2]
    # FIXED margin, the official clip's upper bound (module docstring). Reflect padding
    # needs margin <= size - 1.
    my, mx = h - 1, w - 1
    x = reflect_pad(reflect_pad(x, 1, my), 2, mx)
    up = _upsample_axis(_upsample_axis(x, 2), 1)  # [B, 2(H + 2my), 2(W + 2mx), C]
    ix, iy = _pixel_coordinates(tf.cast(g_inv, _F64), h, w, my, mx)
    canvas = sample_bilinear(up, ix, iy)  # [B, 2(H + 2 HZ_PAD), 2(W + 2 HZ_PAD), C]
    return _downsample_axis(_downsample_axis(canvas, 2, 2 * HZ_PAD), 1, 2 * HZ_PAD)


def apply_color(x, c):
    """Executes the colour matrices: x float32 [B, H, W, C] (C = 1 or 3), c float
    [B, 4, 4] (`color_matrix`) -> [B, H, W, C]. Elementwise products and fixed-order sums
    (no matmul kernel: see "Batch invariance")."""
    channels = x.shape[3]
    c = tf.cast(c, x.dtype)
    # Per-row scalars c[:, i, j] are taken from the [B, 4, 4] matrices and then given
    # image axes: the same products and sums as indexing a [B, 1, 1, 4, 4] expansion.
    # DTensor (TF 2.21) crashes the process (a segmentation fault) on a strided slice
    # that inserts axes in front of an axis it leaves implicit (v[:, None, None] of a
    # [B, 1] tensor): every new axis here is explicit, on a [B] tensor.
    at = lambda v: v[:, None, None]  # [B] -> [B, 1, 1]
    if channels == 3:
        out = []
        for i in range(3):
            y = at(c[:, i, 3])
            for j in range(3):
                y = y + at(c[:, i, j]) * x[..., j]
            out.append(y)
        return tf.stack(out, axis=-1)
    if channels == 1:
        g = (c[:, 0, :] + c[:, 1, :] + c[:, 2, :]) / 3.0  # Mean of the colour rows.
        gain = g[:, 0] + g[:, 1] + g[:, 2]
        return x * gain[:, None, None, None] + g[:, 3][:, None, None, None]
    raise ValueError(f"ADA needs RGB (3 channels) or L (1 channel) images, got {channels}")


def augment(x, p, key, rows, multipliers=None):
    """The 'bgc' ADA pipeline (or AugmentPipe's with `multipliers`: `draw`'s; cutout is
    ada_pipes.py's).

    Args:
        x: float [B, H, W, C] images in [-1, 1], C = 1 or 3, H and W static (>= 2).
        p: float32 scalar tensor, the augmentation probability (> 1 saturates the gates).
        key: int64 scalar, latents.key(seed, step, phase); one per D call and per
            real/fake batch (or distinct rows), as for DiffAugment.
        rows: int [B], the global row of each example (replica.global_rows, or
            latents.current_rows).
    Returns:
        [B, H, W, C] in x's dtype (computed in float32). Row r depends only on
        (key, rows[r], p, x[r]), bit for bit. Differentiable in x to any order; the
        random parameters are constants.
    """
    x = tf.convert_to_tensor(x)
    dtype = x.dtype
    h, w, ch = x.shape[1], x.shape[2], x.shape[3]
    if h is None or w is None or ch is None:
        raise ValueError(f"ada.augment needs static height, width and channels, got {x.shape}")
    if ch not in (1, 3):
        raise ValueError(f"ada.augment needs 1 or 3 channels, got {ch}")
    params = draw(key, rows, p, multipliers)
    y = tf.cast(x, tf.float32)
    y = apply_geometric(y, geometric_matrix(params, h, w))
    y = apply_color(y, color_matrix(params, ch))
    return tf.cast(y, dtype)


# ---- controller -----------------------------------------------------------------------

def adjust_p(p, sign_sum, count, batch_size, interval=ADA_INTERVAL, target=ADA_TARGET,
             kimg=ADA_KIMG):
    """One step of the ADA heuristic (training_loop.py, "Execute ADA heuristic").

    p + sign(sign_sum / count - target) * batch_size * interval / (kimg * 1000), clamped
    below at 0 and NOT above (as official; p > 1 saturates the gates). The statistic and
    step are computed in float64 (as the official numpy), the result rounded to float32
    (the official p buffer). count == 0: p unchanged.

    Args:
        p: float scalar, the current probability.
        sign_sum: scalar, the sum of sign(D(aug(reals))) over the global batch since the
            last adjustment (an integer: exactly replica-invariant once all-reduced).
        count: scalar, how many signs were summed.
        batch_size: the global batch size (kimg counts images).
        interval: iterations between adjustments (ada_interval, 4).
        target: ada_target (0.6).
        kimg: ada_kimg (500; 100 on resume officially).
    Returns:
        float32 scalar tensor, the new p.
    """
    p = tf.cast(p, tf.float32)
    sign_sum = tf.cast(sign_sum, tf.float64)
    count = tf.cast(count, tf.float64)
    rate = tf.math.divide_no_nan(sign_sum, count)
    # batch_size may be a tensor (a per-replica batch without a static size).
    step = tf.cast(batch_size, tf.float64) * (float(interval) / (float(kimg) * 1000.0))
    adjust = tf.sign(rate - float(target)) * step
    adjust = tf.where(count > 0, adjust, tf.zeros_like(adjust))
    return tf.maximum(p + tf.cast(adjust, tf.float32), 0.0)
