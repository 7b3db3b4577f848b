"""AugmentPipe configurations (StyleGAN2-ADA's training/augment.py) that D's inputs can
go through, by config.train.augment value: "ada", the 'bgc' pipeline (ada.py), and
"r3gan", R3GAN's (Huang et al. 2024; brownvc/R3GAN train.py:299-300):

    AugmentPipe(xflip=1, rotate90=1, xint=1, scale=1, rotate=1, aniso=1, xfrac=1,
                brightness=0.5, contrast=0.5, lumaflip=0.5, hue=0.5, saturation=0.5,
                cutout=1)                                   # cutout_size 0.5 (default)

i.e. 'bgc' with the colour probabilities halved, plus cutout. A `Pipe` is the
multipliers (ada.draw: transform n fires when u < m_n p, the rotations with p_rot =
1 - sqrt(clip(1 - m_rotate p, 0, 1)) each) and cutout's multiplier and size. Both use
the p variable of the GAN (`GAN.ada_p`, checkpointed); ADA's controller moves it when
ada_interval > 0, otherwise it stays where config or a schedule puts it.

Cutout (`cutout_mask`, `apply_cutout`), as augment.py's cutout block, after the colour
transforms (imgfilter and noise, which come between officially, are off in both pipes):
per example, gate u_g < cutout p (a float32 product, as officially), centre c = (c_x,
c_y) ~ U[0, 1)^2, size s = cutout_size if the gate fires else 0; pixel (i, j) is kept
iff |(j + 0.5)/W - c_x| >= s/2 or |(i + 0.5)/H - c_y| >= s/2 (a square of side s W x s
H zeroed, clipped at the borders). A gated-off row keeps every pixel (|.| >= 0).

House rules, as ada.py's: the gate and the centre of row r are keyed by (key, r) only,
on sub-stream CUTOUT_STREAM of `key` (after ada.STREAMS' 0..12, which are unchanged, so
"ada" results are the same bits as without this module), its gate from
latents.subkey(k_c, ada.GATE) and its centre from latents.subkey(k_c, ada.PARAM); the
mask is float64 elementwise arithmetic (exact: no transcendental), then one product with
the image, so a row's output does not depend on the other rows, and the pipe stays
differentiable in x to any order (the mask is a constant). Officially the mask is
computed in float32: for power-of-two sizes both are exact (the centres have 24 bits),
so they agree bit for bit; otherwise a pixel whose distance ties s/2 to float32 rounding
may differ.
"""

import dataclasses

import numpy as np
import tensorflow as tf

from tf_gan_scale import latents
from tf_gan_scale.gan import ada

CUTOUT_STREAM = len(ada.STREAMS)  # 13: a sub-stream of `key` that ada.py does not use.
CUTOUT_SIZE = 0.5  # AugmentPipe's default cutout_size.

_F64 = tf.float64


@dataclasses.dataclass(frozen=True)
class Pipe:
    """An AugmentPipe configuration: `multipliers` {name in ada.MULTIPLIERS: float} (a
    missing name: 0), cutout's probability multiplier and size (relative to H and W)."""

    multipliers: dict
    cutout: float = 0.0
    cutout_size: float = CUTOUT_SIZE


R3GAN_MULTIPLIERS = {**ada.BGC, "brightness": 0.5, "contrast": 0.5, "lumaflip": 0.5,
                     "hue": 0.5, "saturation": 0.5}
PIPES = {"ada": Pipe(ada.BGC), "r3gan": Pipe(R3GAN_MULTIPLIERS, cutout=1.0)}


def cutout_draw(key, rows, p, cutout=1.0):
    """(gate bool [B], centre float64 [B, 2] (c_x, c_y) in [0, 1)) of the global rows
    `rows`: gate u < cutout * p (float32 product), u, c uniform (24-bit, exact)."""
    k = latents.subkey(tf.cast(key, tf.int64), CUTOUT_STREAM)
    keys = tf.stack([latents.subkey(k, ada.GATE), latents.subkey(k, ada.PARAM)])
    # [2 (GATE, PARAM), B, 2]: the same values as rows_uniform of each key (element j of
    # a row does not depend on how many are drawn).
    u = tf.cast(latents.uniform_of_bits(latents.stream_bits(keys, rows, 2)), _F64)
    prob = tf.cast(tf.cast(p, tf.float32) * float(cutout), _F64)
    return u[0, :, 0] < prob, u[1]


def cutout_mask(gate, centre, height, width, size=CUTOUT_SIZE):
    """float32 [B, H, W]: 1 where a pixel is kept, 0 in the cutout square (module
    docstring). gate bool [B], centre float [B, 2] (c_x, c_y); float64 arithmetic."""
    half = tf.where(gate, tf.constant(size / 2.0, _F64), tf.constant(0.0, _F64))
    centre = tf.cast(centre, _F64)
    # New axes by expand_dims on explicit axes only (a DTensor mesh crashes on a strided
    # slice inserting an axis before an implicit one: see ada.apply_color).
    col = lambda v: tf.expand_dims(v, 1)  # [B] -> [B, 1]
    cx = tf.constant((np.arange(width) + 0.5) / width, _F64)  # [W]
    cy = tf.constant((np.arange(height) + 0.5) / height, _F64)  # [H]
    keep_x = tf.abs(cx - col(centre[:, 0])) >= col(half)  # [B, W]
    keep_y = tf.abs(cy - col(centre[:, 1])) >= col(half)  # [B, H]
    keep = tf.logical_or(tf.expand_dims(keep_y, 2), tf.expand_dims(keep_x, 1))
    return tf.cast(keep, tf.float32)


def apply_cutout(x, key, rows, p, cutout=1.0, size=CUTOUT_SIZE):
    """x [B, H, W, C] times the cutout mask of its rows (H, W static)."""
    gate, centre = cutout_draw(key, rows, p, cutout)
    mask = cutout_mask(gate, centre, x.shape[1], x.shape[2], size)
    return x * tf.cast(tf.expand_dims(mask, 3), x.dtype)


def augment(x, p, key, rows, pipe="ada"):
    """AugmentPipe `pipe` (a name in PIPES or a `Pipe`) on x [B, H, W, C] in [-1, 1]:
    ada.augment with its multipliers, then cutout if on. Arguments and guarantees as
    ada.augment's (row r depends only on (key, rows[r], p, x[r]), bit for bit;
    differentiable in x to any order). "ada" is ada.augment itself, bit for bit."""
    spec = PIPES[pipe] if isinstance(pipe, str) else pipe
    y = ada.augment(x, p, key, rows, spec.multipliers)
    if spec.cutout:
        y = apply_cutout(y, key, rows, p, spec.cutout, spec.cutout_size)
    return y
