"""DiffAugment (Zhao et al. 2020, "Differentiable Augmentation for Data-Efficient GAN
Training", arXiv:2006.10738): random, differentiable transforms applied to every image D
sees (real and fake, in the D and the G updates), with its own draws for each example.

The formulas are those of the official TensorFlow code (github.com/mit-han-lab/
data-efficient-gans, DiffAugment_tf.py), on NHWC images in [-1, 1]:
  color       = brightness, then saturation, then contrast, each with its own draw u:
                brightness  x + (u - 0.5)
                saturation  (x - mean_C(x)) * 2u + mean_C(x)
                contrast    (x - mean_HWC(x)) * (u + 0.5) + mean_HWC(x)
  translation  integer shifts (dh, dw) uniform in [-s, s] with s = int(size / 8 + 0.5) per
               axis: out[h, w] = x[h + dh, w + dw], 0 outside the image.
  cutout       a square of int(size / 2 + 0.5) per axis, centred at an offset uniform in
               [0, size + (1 - cut % 2)) per axis, clipped at the borders, set to 0.

What differs is where the randomness comes from: every draw is per example, from
`latents.rows_uniform(latents.subkey(k, stream), rows, [n])` with one stream per
transform (`STREAMS`; a policy's streams are drawn at once, `uniforms`). The augmentation
of example r is a function of (k, r) only, so one device and N replicas holding the same
global rows compute the same images, and a resumed run repeats them (no stateful
generator). The official code draws real and fake batches independently: give them
different keys, or distinct rows (fake rows offset by the global batch), else real i and
fake i get the same transform. Integer draws are floor(u * n) of such a uniform (u has 24
bits, so u * n stays below n in float32; clamped to n - 1 anyway).
"""

import tensorflow as tf

from tf_gan_scale import errors, latents

VALID = ("color", "translation", "cutout")
TRANSLATION_RATIO = 0.125
CUTOUT_RATIO = 0.5

# Sub-stream of the key for each transform: occurrence j of a transform in the policy
# (policies may repeat one, as the official code allows) uses stream
# STREAMS[name] + STREAM_STRIDE * j, so each application gets its own draws and a
# transform's draws do not depend on the others in the policy.
STREAMS = {"brightness": 0, "saturation": 1, "contrast": 2, "translation": 3, "cutout": 4}
STREAM_STRIDE = 8


def check_policy(policy):
    """Parses a DiffAugment policy: "" (or None) -> (); "color,translation" ->
    ("color", "translation"). Spaces around names are ignored. Unknown or empty names
    raise ConfigError (one line, naming the value and the valid choices)."""
    if policy is None:
        return ()
    if not isinstance(policy, str):
        raise errors.ConfigError(
            f"augmentation policy must be a string, got {policy!r}; "
            f"valid: comma-separated {', '.join(VALID)}")
    if not policy.strip():
        return ()
    names = tuple(p.strip() for p in policy.split(","))
    for name in names:
        if name not in VALID:
            raise errors.ConfigError(
                f"unknown augmentation {name!r} in policy {policy!r}; valid: {', '.join(VALID)}")
    return names


# The streams each transform draws from (occurrence j adds STREAM_STRIDE * j).
TRANSFORM_STREAMS = {"color": ("brightness", "saturation", "contrast"),
                     "translation": ("translation",), "cutout": ("cutout",)}


def uniforms(k, rows, streams):
    """{stream: float32 [B, 2]}: the uniforms in [0, 1) of sub-streams `streams` (ints) of
    key k, each equal to latents.rows_uniform(latents.subkey(k, stream), rows, [2]) (a
    draw of 1 is column 0), all from one vectorized computation: one key at a time cost
    ~80 graph ops each (latents.stream_bits)."""
    ids = sorted(set(streams))
    keys = latents.subkey(k, tf.constant(ids, tf.int64))  # [S]
    # Rows leading, as a per-key draw lays them out.
    u = latents.uniform_of_bits(tf.transpose(latents.stream_bits(keys, rows, 2), [1, 0, 2]))
    return {stream: u[:, i] for i, stream in enumerate(ids)}


def _randint(u, n):
    """Integers in [0, n) from uniforms in [0, 1) (float32 [B]) -> int32 [B]."""
    return tf.minimum(tf.cast(tf.floor(u * n), tf.int32), n - 1)


def _static_size(x):
    h, w = x.shape[1], x.shape[2]
    if h is None or w is None:
        raise ValueError(f"augment needs static image height and width, got shape {x.shape}")
    return int(h), int(w)


def translation_shifts(u, height, width):
    """Per-example integer shifts (dh, dw), each int32 [B] in [-s, s] with
    s = int(size * TRANSLATION_RATIO + 0.5) (the official rounding), from the uniforms
    u [B, 2] of a translation stream."""
    out = []
    for j, size in enumerate((height, width)):
        s = int(size * TRANSLATION_RATIO + 0.5)
        out.append(_randint(u[:, j], 2 * s + 1) - s)
    return tuple(out)


def cutout_offsets(u, height, width):
    """Per-example cutout centres (oh, ow), each int32 [B] in [0, size + (1 - cut % 2)),
    and the cutout size (ch, cw) (Python ints, int(size * CUTOUT_RATIO + 0.5)), from the
    uniforms u [B, 2] of a cutout stream."""
    offsets, sizes = [], []
    for j, size in enumerate((height, width)):
        cut = int(size * CUTOUT_RATIO + 0.5)
        offsets.append(_randint(u[:, j], size + (1 - cut % 2)))
        sizes.append(cut)
    return tuple(offsets), tuple(sizes)


# Transforms: (images, u) -> images; u(name) is the uniforms [B, 2] of the transform's
# stream `name` (of TRANSFORM_STREAMS) for this occurrence.

def _color(x, u):
    def draw(name):
        return tf.reshape(tf.cast(u(name)[:, 0], x.dtype), [-1, 1, 1, 1])

    x = x + (draw("brightness") - 0.5)
    mean = tf.reduce_mean(x, axis=3, keepdims=True)
    x = (x - mean) * (draw("saturation") * 2.0) + mean
    mean = tf.reduce_mean(x, axis=[1, 2, 3], keepdims=True)
    return (x - mean) * (draw("contrast") + 0.5) + mean


def _shift_axis(x, shift, axis, size):
    """out[..., i, ...] = x[..., i + shift, ...] along `axis` (1 or 2), 0 outside."""
    src = tf.range(size)[None, :] + shift[:, None]  # [B, size]
    inside = (src >= 0) & (src < size)
    out = tf.gather(x, tf.clip_by_value(src, 0, size - 1), axis=axis, batch_dims=1)
    mask = tf.cast(inside, x.dtype)
    mask = mask[:, :, None, None] if axis == 1 else mask[:, None, :, None]
    return out * mask


def _translation(x, u):
    h, w = _static_size(x)
    dh, dw = translation_shifts(u("translation"), h, w)
    return _shift_axis(_shift_axis(x, dh, 1, h), dw, 2, w)


def _cutout(x, u):
    h, w = _static_size(x)
    (oh, ow), (ch, cw) = cutout_offsets(u("cutout"), h, w)

    def inside(offset, cut, size):  # [B, size]: the square's rows (or columns).
        start = offset[:, None] - cut // 2
        i = tf.range(size)[None, :]
        return (i >= start) & (i < start + cut)

    cut = inside(oh, ch, h)[:, :, None] & inside(ow, cw, w)[:, None, :]  # [B, H, W]
    return x * tf.cast(~cut, x.dtype)[..., None]


_TRANSFORMS = {"color": _color, "translation": _translation, "cutout": _cutout}


def augment(x, policy, k, rows):
    """DiffAugment of a batch.

    Args:
        x: float [B, H, W, C] images (NHWC, in [-1, 1]); H and W static.
        policy: comma-separated names from "color", "translation", "cutout", applied in
            that order of the string ("" or None: identity).
        k: int64 scalar key, `latents.key(seed, step, phase)` (a phase of its own, so the
            draws are independent of the latents').
        rows: int [B], the global row index of each example (`replica.global_rows`, or
            `latents.current_rows`); give real and fake examples distinct rows (e.g. fake
            rows offset by the global batch) when they must be augmented independently.
    Returns:
        [B, H, W, C], same dtype. Differentiable in x (the random parameters are
        constants): the gradient flows through the means, gathers and masks.
    """
    names = check_policy(policy)
    x = tf.convert_to_tensor(x)
    if not names:
        return x
    k = tf.cast(k, tf.int64)
    rows = tf.cast(tf.convert_to_tensor(rows), tf.int64)
    occurrences, seen = [], {}
    for name in names:  # Occurrence j of a transform: its streams + STREAM_STRIDE * j.
        occurrences.append((name, STREAM_STRIDE * seen.get(name, 0)))
        seen[name] = seen.get(name, 0) + 1
    u = uniforms(k, rows, [STREAMS[s] + offset for name, offset in occurrences
                           for s in TRANSFORM_STREAMS[name]])
    for name, offset in occurrences:
        x = _TRANSFORMS[name](x, lambda s, offset=offset: u[STREAMS[s] + offset])
    return x
