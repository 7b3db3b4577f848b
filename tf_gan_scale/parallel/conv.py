"""Convolutions whose filters are split over output channels on a DTensor mesh, and
average pooling DTensor can differentiate.

DTensor runs Keras' Conv2D / Conv2DTranspose only with REPLICATED filters (its SPMD
expansion of Conv2D and its backprop ops supports batch-split inputs only;
docs/notes/dtensor.md). The same convolution written as a sum over the kernel's taps of
pad + strided slice + einsum uses only ops DTensor can split, so the kernel may be split
on its output-channel axis: each device computes out / M channels of every tap, for the
examples it holds. Kernels keep Keras' shapes and values (a checkpoint is the same), and
the numbers equal Keras' convolution up to float32 summation order (kh x kw partial sums
instead of one; tests/parallel/test_parallel_layouts.py).

    y[b, o, p, d] = sum_{i, j, c} x_pad[b, o*s + i, p*s + j, c] * K[i, j, c, d]   (Conv2D)

and the transposed convolution scatters each input pixel: tap (i, j) adds x @ K[i, j]^T
at output position (h*s + i - pad, w*s + j - pad).

Costs: kh x kw einsums instead of one convolution kernel (slower per FLOP than cuDNN /
oneDNN), and the whole input is needed by every device of a model row. It pays where the
filters are large enough for their memory to matter (layouts.CONV_SPLIT_MIN_PARAMS).

Depthwise convolution: DTensor has no layout propagation for its filter gradient,
DepthwiseConv2dNativeBackpropFilter (R3GAN's D basis, a depthwise conv over the whole
4x4 map, fails its first D update). The same convolution as a sum over taps of strided
slices times the tap's [C, M] filter (`depthwise_conv2d`), installed on every
DepthwiseConv2D of a model on a mesh (`use_depthwise_taps`; the filter replicated), equal
to Keras' up to float32 summation order.

Average pooling: DTensor expands AvgPool but has no layout propagation for its gradient,
AvgPoolGrad (SNGAN's and BigGAN's residual D blocks fail in their first D update). The
same pooling as the mean of its window's strided slices needs only StridedSliceGrad,
which DTensor has: `avg_pool`, installed on every AveragePooling2D of a model on a mesh
(`use_slice_pool`), equal to Keras' up to float32 summation order.
"""

import keras
import numpy as np
import tensorflow as tf

from tf_gan_scale.layers import stylegan
from tf_gan_scale.layers.grouped_conv import GroupedConv2D

# Layer type -> the kernel axis of its output channels ([kh, kw, in, out] for Conv2D,
# [kh, kw, out, in] for Conv2DTranspose). StyleGAN2's convolutions (the equalized one of
# D, the modulated one of G) take tap functions for their conv2d_resample
# (`layer.taps`); their kernels are [k, k, in, out]. A grouped convolution's kernel is
# [k, k, in / groups, out], split in whole groups (`grouped_conv2d`).
OUT_AXIS = {keras.layers.Conv2D: 3, keras.layers.Conv2DTranspose: 2, GroupedConv2D: 3}
STYLE_CONVS = (stylegan.EqualizedConv2D, stylegan.SynthesisLayer)
OUT_AXIS.update({kind: 3 for kind in STYLE_CONVS})


def out_axis(layer):
    """The kernel axis of `layer`'s output channels, or None for another layer type."""
    return next((axis for kind, axis in OUT_AXIS.items() if isinstance(layer, kind)), None)


def unsupported(layer):
    """Why `layer`'s convolution cannot be computed by taps here ("" when it can)."""
    if out_axis(layer) is None:
        return f"{type(layer).__name__} (only Conv2D and Conv2DTranspose)"
    if isinstance(layer, STYLE_CONVS + (GroupedConv2D,)):  # Channels last, no dilation:
        return ""  # every one.
    bad = []
    if layer.data_format != "channels_last":
        bad.append(f"data_format={layer.data_format!r}")
    if tuple(layer.dilation_rate) != (1, 1):
        bad.append(f"dilation_rate={tuple(layer.dilation_rate)}")
    if getattr(layer, "groups", 1) != 1:
        bad.append(f"groups={layer.groups}")
    transposed = isinstance(layer, keras.layers.Conv2DTranspose)
    if layer.padding not in (("same",) if transposed else ("same", "valid")):
        bad.append(f"padding={layer.padding!r}")
    if transposed and layer.output_padding is not None:
        bad.append(f"output_padding={layer.output_padding}")
    return ", ".join(bad)


def _same_pads(n, k, s):
    """TensorFlow's "same" padding of one spatial axis: (output size, before, after)."""
    out = -(-n // s)
    total = max((out - 1) * s + k - n, 0)
    return out, total // 2, total - total // 2


def conv2d(x, kernel, strides, padding):
    """Keras' Conv2D (channels_last, dilation 1) as a sum over taps.

    Args:
        x: [B, H, W, C_in] (static H, W).
        kernel: [kh, kw, C_in, C_out].
        strides: (sh, sw). padding: "same" or "valid".
    Returns:
        [B, H_out, W_out, C_out].
    """
    y = None
    for i, j, patch in _windows(x, int(kernel.shape[0]), int(kernel.shape[1]), strides,
                                padding):
        tap = tf.einsum("bhwc,cd->bhwd", patch, kernel[i, j])
        y = tap if y is None else y + tap
    return y


def _windows(x, kh, kw, strides, padding):
    """[(i, j, patch)] of a kh x kw window over x [B, H, W, C] (static H, W): patch
    [B, H_out, W_out, C] is the input each output position sees at tap (i, j), with
    TensorFlow's "same" or "valid" padding (zeros)."""
    (sh, sw), (h, w) = strides, (int(x.shape[1]), int(x.shape[2]))
    if padding == "same":
        (ho, top, bottom), (wo, left, right) = _same_pads(h, kh, sh), _same_pads(w, kw, sw)
        x = tf.pad(x, [[0, 0], [top, bottom], [left, right], [0, 0]])
    else:
        ho, wo = (h - kh) // sh + 1, (w - kw) // sw + 1
    return [(i, j, x[:, i:i + (ho - 1) * sh + 1:sh, j:j + (wo - 1) * sw + 1:sw, :])
            for i in range(kh) for j in range(kw)]


def _spread(t, s, axis):
    """Zero-insertion upsampling of axis `axis` of t by s: element n lands at n * s (a
    stack with zeros and a reshape: no scatter, which DTensor cannot split)."""
    if s == 1:
        return t
    parts = tf.stack([t] + [tf.zeros_like(t)] * (s - 1), axis=axis + 1)
    shape = [-1 if a == 0 else int(t.shape[a]) * (s if a == axis else 1)
             for a in range(t.shape.rank)]
    return tf.reshape(parts, shape)


def conv2d_transpose(x, kernel, strides, padding="same"):
    """Keras' Conv2DTranspose (channels_last, dilation 1, no output_padding) as a sum
    over taps.

    Args:
        x: [B, H, W, C_in] (static H, W).
        kernel: [kh, kw, C_out, C_in].
        strides: (sh, sw).
        padding: "same", or "valid" (tf.nn.conv2d_transpose's: every tap kept).
    Returns:
        [B, H * sh, W * sw, C_out] ("same"), [B, H * sh + max(kh - sh, 0), ...,
        C_out] ("valid": (H - 1) * sh + kh when kh >= sh).
    """
    kh, kw = int(kernel.shape[0]), int(kernel.shape[1])
    (sh, sw), (h, w) = strides, (int(x.shape[1]), int(x.shape[2]))
    if padding == "same":
        ho, wo = h * sh, w * sw
        top, left = max(kh - sh, 0) // 2, max(kw - sw, 0) // 2
    else:  # Input pixel (h, w)'s tap (i, j) lands at (h*sh + i, w*sw + j).
        ho, wo = h * sh + max(kh - sh, 0), w * sw + max(kw - sw, 0)
        top, left = 0, 0
    margin = max(kh, kw)  # Room to shift by any tap offset, then cut [0, ho) x [0, wo).
    y = None
    for i in range(kh):
        for j in range(kw):
            tap = tf.einsum("bhwc,dc->bhwd", x, kernel[i, j])  # [B, H, W, C_out]
            tap = _spread(_spread(tap, sh, 1), sw, 2)  # Pixel (h, w) at (h*sh, w*sw).
            tap = tf.pad(tap, [[0, 0], [margin, margin], [margin, margin], [0, 0]])
            di, dj = i - top, j - left  # This tap lands di, dj further on.
            tap = tap[:, margin - di:margin - di + ho, margin - dj:margin - dj + wo, :]
            y = tap if y is None else y + tap
    return y


def grouped_conv2d(x, kernel, groups):
    """GroupedConv2D's convolution (stride 1, "same") as a sum over taps, each an einsum
    over the groups: a kernel split on its output channels in whole groups (the model
    axis divides `groups`) makes each device compute its own groups from its slice of
    the input's channels, with no communication.

    Args:
        x: [B, H, W, C_in] (static H, W, C_in).
        kernel: [k, k, C_in / groups, C_out].
    Returns:
        [B, H, W, C_out]; output channel o sees input group o // (C_out / groups).
    """
    k, cin_g, cout = int(kernel.shape[0]), int(kernel.shape[2]), int(kernel.shape[3])
    h, w = int(x.shape[1]), int(x.shape[2])
    y = None
    for i, j, patch in _windows(x, k, k, (1, 1), "same"):
        tap = tf.einsum("bhwgc,cgo->bhwgo", tf.reshape(patch, [-1, h, w, groups, cin_g]),
                        tf.reshape(kernel[i, j], [cin_g, groups, cout // groups]))
        y = tap if y is None else y + tap
    return tf.reshape(y, [-1, h, w, cout])


def use_taps(layer, constrain_input=lambda x: x):
    """Makes this instance of a Conv2D / Conv2DTranspose compute by taps (bias and
    activation as Keras does), its input passed through `constrain_input` first; a
    StyleGAN2 convolution its conv2d_resample (`layer.taps`), the same way."""
    if isinstance(layer, STYLE_CONVS):
        layer.taps = (conv2d, conv2d_transpose)
        own = layer.call
        layer.call = lambda inputs, *args, **kwargs: own(constrain_input(inputs), *args,
                                                         **kwargs)
        return
    if isinstance(layer, GroupedConv2D):
        layer.call = lambda inputs: grouped_conv2d(
            inputs, tf.cast(layer.kernel, inputs.dtype), layer.groups)
        return
    transposed = isinstance(layer, keras.layers.Conv2DTranspose)

    def call(inputs):
        x = constrain_input(inputs)
        if transposed:
            y = conv2d_transpose(x, layer.kernel, tuple(layer.strides))
        else:
            y = conv2d(x, layer.kernel, tuple(layer.strides), layer.padding)
        if layer.use_bias:
            y = y + layer.bias
        return layer.activation(y) if layer.activation is not None else y

    layer.call = call  # This instance only.


def depthwise_unsupported(layer):
    """Why `layer` (a DepthwiseConv2D) cannot run by taps ("" when it can)."""
    bad = []
    if layer.data_format != "channels_last":
        bad.append(f"data_format={layer.data_format!r}")
    if tuple(layer.dilation_rate) != (1, 1):
        bad.append(f"dilation_rate={tuple(layer.dilation_rate)}")
    return ", ".join(bad)


def depthwise_conv2d(x, kernel, strides, padding):
    """Keras' DepthwiseConv2D (channels_last, dilation 1) as a sum over taps.

    Args:
        x: [B, H, W, C] (static H, W).
        kernel: [kh, kw, C, M] (M: the depth multiplier).
        strides: (sh, sw). padding: "same" or "valid".
    Returns:
        [B, H_out, W_out, C * M], channel c * M + m from input channel c (Keras' order).
    """
    kh, kw, c, m = (int(n) for n in kernel.shape)
    y = None
    for i, j, patch in _windows(x, kh, kw, strides, padding):
        tap = patch[..., None] * kernel[i, j]  # [B, ho, wo, C, M]
        y = tap if y is None else y + tap
    return tf.reshape(y, [-1, int(y.shape[1]), int(y.shape[2]), c * m])


def use_depthwise_taps(layer):
    """Makes this instance of a DepthwiseConv2D compute by taps (`depthwise_conv2d`),
    bias and activation as Keras does."""
    def call(inputs):
        y = depthwise_conv2d(inputs, tf.cast(layer.kernel, inputs.dtype),
                             tuple(layer.strides), layer.padding)
        if layer.use_bias:
            y = y + tf.cast(layer.bias, y.dtype)
        return layer.activation(y) if layer.activation is not None else y

    layer.call = call  # This instance only.


def pool_unsupported(layer):
    """Why `layer` (an AveragePooling2D) cannot pool by slices ("" when it can)."""
    bad = []
    if layer.data_format != "channels_last":
        bad.append(f"data_format={layer.data_format!r}")
    return ", ".join(bad)


def avg_pool(x, pool_size, strides, padding="valid"):
    """Keras' AveragePooling2D (channels_last) as the mean of the pool's ph x pw strided
    slices. "same" pads with zeros as TensorFlow does and divides each window by the
    number of its values inside the image (TensorFlow's AvgPool: padding is not counted).

    Args:
        x: [B, H, W, C] (static H, W). pool_size: (ph, pw). strides: (sh, sw).
        padding: "valid" or "same".
    Returns:
        [B, (H - ph) // sh + 1, (W - pw) // sw + 1, C] ("valid"), [B, ceil(H / sh),
        ceil(W / sw), C] ("same").
    """
    (ph, pw), (sh, sw) = pool_size, strides
    h, w = int(x.shape[1]), int(x.shape[2])
    if padding == "same":
        (ho, top, bottom), (wo, left, right) = _same_pads(h, ph, sh), _same_pads(w, pw, sw)
        x = tf.pad(x, [[0, 0], [top, bottom], [left, right], [0, 0]])
        inside = np.pad(np.ones((h, w)), ((top, bottom), (left, right)))
        count = sum(inside[i:i + (ho - 1) * sh + 1:sh, j:j + (wo - 1) * sw + 1:sw]
                    for i in range(ph) for j in range(pw))  # [ho, wo], a constant.
        scale = tf.constant((1.0 / count)[None, :, :, None], x.dtype)
    else:
        ho, wo = (h - ph) // sh + 1, (w - pw) // sw + 1
        scale = 1.0 / (ph * pw)
    y = None
    for i in range(ph):
        for j in range(pw):
            part = x[:, i:i + (ho - 1) * sh + 1:sh, j:j + (wo - 1) * sw + 1:sw, :]
            y = part if y is None else y + part
    return y * scale


def use_slice_pool(layer):
    """Makes this instance of an AveragePooling2D pool by slices (`avg_pool`)."""
    def call(inputs):
        return avg_pool(inputs, tuple(layer.pool_size), tuple(layer.strides), layer.padding)

    layer.call = call  # This instance only.
