"""StyleGAN2 building blocks (Karras et al. 2020, stylegan2-ada-pytorch), NHWC, pure TF ops.

Formulas and the official file:function of each part: docs/stylegan2.md; official names in brackets.

  * FIR resampling with the [1,3,3,1] filter [upfirdn2d.py:_upfirdn2d_ref, setup_filter]
    and the conv2d_resample orderings [conv2d_resample.py]: `upfirdn2d`, `upsample2d`,
    `downsample2d`, `conv2d_resample`.
  * Equalized learning rate: raw N(0, 1/lr_mul^2) weights scaled at RUN time
    [FullyConnectedLayer, Conv2dLayer]: `EqualizedDense`, `EqualizedConv2D`, and `bias_act`
    (bias -> activation -> x gain -> clamp) [bias_act.py:_bias_act_ref].
  * Modulated convolution (non-fused, as the official training path) with per-example
    noise [SynthesisLayer], `ToRGB` [ToRGBLayer], `MinibatchStd` [MinibatchStdLayer].

Everything is tf.nn.conv2d / depthwise_conv2d / conv2d_transpose, pads and reshapes, so
it is differentiable to any order (R1 and path length take gradients of gradients) and
runs under XLA; no custom ops (the official CUDA kernels are speed-only).
"""

import contextlib

import keras
import numpy as np
import tensorflow as tf

from tf_gan_scale import latents

_SQRT2 = float(np.sqrt(2.0))
_K = np.array([1.0, 3.0, 3.0, 1.0])
# setup_filter: 4 taps < 8, so the official code uses the 2-D outer product, normalized.
FIR = (np.outer(_K, _K) / np.sum(np.outer(_K, _K))).astype(np.float32)  # [4, 4]


# ---- resampling ---------------------------------------------------------------------

def upfirdn2d(x, *, up=1, down=1, pad=(0, 0), gain=1.0):
    """upfirdn2d with the [1,3,3,1] filter, same padding on both axes (official semantics).

    1. zero insertion (sample i goes to i*up), 2. zero pad (pad[0] before, pad[1] after,
    both >= 0), 3. correlation with the FLIPPED filter times `gain`, VALID, per channel,
    4. keep every `down`-th output (done by the conv's stride: the same outputs).

    Args:
        x: [B, H, W, C] float, C static.
    Returns:
        [B, (H*up + pad[0] + pad[1] - 3) // down (ceil), same for W, C].
    """
    c = x.shape[-1]
    if up > 1:
        b, h, w = tf.shape(x)[0], tf.shape(x)[1], tf.shape(x)[2]
        x = tf.reshape(x, [b, h, 1, w, 1, c])
        x = tf.pad(x, [[0, 0], [0, 0], [0, up - 1], [0, 0], [0, up - 1], [0, 0]])
        x = tf.reshape(x, [b, h * up, w * up, c])
    if pad[0] or pad[1]:
        x = tf.pad(x, [[0, 0], list(pad), list(pad), [0, 0]])
    if SLICE_RESAMPLING:
        return _fir_slices(x, down, gain)
    # The filter is symmetric, so the flip is a no-op; kept to state the semantics.
    f = (FIR[::-1, ::-1] * gain).astype(np.float32)
    kernel = tf.tile(tf.constant(f, x.dtype)[:, :, None, None], [1, 1, c, 1])
    return tf.nn.depthwise_conv2d(x, kernel, [1, down, down, 1], "VALID")


# The FIR correlation as strided slices times taps (separable: rows, then columns)
# instead of a depthwise convolution: DTensor has no layout propagation for
# DepthwiseConv2dNativeBackpropInput, and StridedSliceGrad it has. On while a DTensor
# step is traced (`slice_resampling`); off elsewhere, so one device keeps the depthwise
# convolution's exact numbers (the two differ by float32 summation order, ~5e-7).
SLICE_RESAMPLING = False


@contextlib.contextmanager
def slice_resampling():
    """Within: functions traced resample by strided slices (`_fir_slices`)."""
    global SLICE_RESAMPLING
    before, SLICE_RESAMPLING = SLICE_RESAMPLING, True
    try:
        yield
    finally:
        SLICE_RESAMPLING = before


_TAPS = (_K / np.sum(_K)).astype(np.float32)  # FIR = outer(_TAPS, _TAPS); symmetric.


def _fir_slices(x, down, gain):
    """VALID correlation of x [B, H, W, C] (static H, W) with FIR * gain, stride `down`:
    sum_i taps[i] * x[:, i::down] along H, then the same along W."""
    for axis in (1, 2):
        n = int(x.shape[axis])
        out = (n - len(_TAPS)) // down + 1
        acc = None
        for i, t in enumerate(_TAPS):
            begin = [0, 0, 0, 0]
            end = [0, 0, 0, 0]
            strides = [1, 1, 1, 1]
            begin[axis], end[axis], strides[axis] = i, i + (out - 1) * down + 1, down
            mask = 0b1111 & ~(1 << axis)
            part = tf.strided_slice(x, begin, end, strides, begin_mask=mask, end_mask=mask)
            part = part * tf.cast(t, x.dtype)
            acc = part if acc is None else acc + part
        x = acc
    return x * tf.cast(gain, x.dtype) if gain != 1 else x


def upsample2d(x):
    """[B, H, W, C] -> [B, 2H, 2W, C]: upfirdn2d.upsample2d (gain up^2 = 4, pad [2, 1])."""
    return upfirdn2d(x, up=2, pad=(2, 1), gain=4.0)


def downsample2d(x):
    """[B, H, W, C] -> [B, H/2, W/2, C]: upfirdn2d.downsample2d (pad [1, 1])."""
    return upfirdn2d(x, down=2, pad=(1, 1))


def conv2d_resample(x, w, *, up=1, down=1, taps=None):
    """conv2d_resample with padding k//2: x [B, H, W, I], w [k, k, I, O] (already scaled)
    -> [B, H*up/down, W*up/down, O]. Supports up in {1, 2} with odd k, down in {1, 2}.

    up=2, k>1: conv_transpose stride 2 VALID (2H + k - 2), then FIR pad [p0, p1] gain 4
      ([1, 1] for k = 3) -> 2H. The transposed kernel [k, k, O, I] equals the official
      w.transpose(0, 1) layout (flip_weight=False).
    up=2, k=1: 1x1 conv, then upsample2d.
    down=2, k>1: FIR pad [k//2 + 1, k//2 + 1] (no decimation), then conv stride 2 VALID.
    down=2, k=1: downsample2d, then the 1x1 conv.
    Plain convs are correlations (flip_weight=True) with zero padding k//2.

    taps: None (TensorFlow's convolutions), or (conv2d, conv2d_transpose) computing the
    same convolutions as sums over kernel taps (`parallel.conv`: what a DTensor mesh
    needs when w is split over its output channels), with Keras' argument order:
    conv2d(x, w, strides, padding), conv2d_transpose(x, w_transposed, strides, padding).
    """
    k = w.shape[0]
    if taps is not None:
        return _conv2d_resample_taps(x, w, up, down, *taps)
    if up == 2 and down == 1:
        if k == 1:
            return upsample2d(tf.nn.conv2d(x, w, 1, "VALID"))
        b, h, wd = tf.shape(x)[0], tf.shape(x)[1], tf.shape(x)[2]
        out = tf.stack([b, 2 * h + k - 2, 2 * wd + k - 2, w.shape[-1]])
        x = tf.nn.conv2d_transpose(x, tf.transpose(w, [0, 1, 3, 2]), out, 2, "VALID")
        # Official px0 = k//2 + (fw + up - 1)//2 - (k - 1), px1 = k//2 + (fw - up)//2 - (k - up).
        return upfirdn2d(x, pad=(k // 2 + 2 - (k - 1), k // 2 + 1 - (k - 2)), gain=4.0)
    if down == 2 and up == 1:
        if k == 1:
            return tf.nn.conv2d(downsample2d(x), w, 1, "VALID")
        x = upfirdn2d(x, pad=(k // 2 + 1, k // 2 + 1))
        return tf.nn.conv2d(x, w, 2, "VALID")
    if up != 1 or down != 1:
        raise ValueError(f"conv2d_resample supports up=2 or down=2; Received: up={up}, "
                         f"down={down}")
    p = k // 2
    return tf.nn.conv2d(x, w, 1, [[0, 0], [p, p], [p, p], [0, 0]])


def _conv2d_resample_taps(x, w, up, down, conv2d, conv2d_transpose):
    """conv2d_resample's cases, each convolution by `conv2d` / `conv2d_transpose`."""
    k = w.shape[0]
    if up == 2 and down == 1:
        if k == 1:
            return upsample2d(conv2d(x, w, (1, 1), "valid"))
        x = conv2d_transpose(x, tf.transpose(w, [0, 1, 3, 2]), (2, 2), "valid")
        return upfirdn2d(x, pad=(k // 2 + 2 - (k - 1), k // 2 + 1 - (k - 2)), gain=4.0)
    if down == 2 and up == 1:
        if k == 1:
            return conv2d(downsample2d(x), w, (1, 1), "valid")
        return conv2d(upfirdn2d(x, pad=(k // 2 + 1, k // 2 + 1)), w, (2, 2), "valid")
    if up != 1 or down != 1:
        raise ValueError(f"conv2d_resample supports up=2 or down=2; Received: up={up}, "
                         f"down={down}")
    return conv2d(x, w, (1, 1), "same")  # Odd k, stride 1: zero padding k//2.


# ---- bias_act, normalization -------------------------------------------------------

ACTIVATIONS = ("linear", "lrelu")


def bias_act(x, b=None, act="linear", gain=1.0, clamp=None):
    """bias_act reference order: x + b (b broadcast on the last axis) -> activation
    (lrelu: slope 0.2, default gain sqrt 2; linear: gain 1) -> x (default gain * gain)
    -> clip to [-clamp, clamp] (clamp already includes the caller's gain)."""
    if b is not None:
        x = x + tf.cast(b, x.dtype)
    if act == "lrelu":
        x = tf.nn.leaky_relu(x, 0.2)
        gain = gain * _SQRT2
    elif act != "linear":
        raise ValueError(f"activation must be one of {ACTIVATIONS}; Received: {act!r}")
    if gain != 1:
        x = x * tf.cast(gain, x.dtype)
    if clamp is not None:
        x = tf.clip_by_value(x, -tf.cast(clamp, x.dtype), tf.cast(clamp, x.dtype))
    return x


def normalize_2nd_moment(x, eps=1e-8):
    """x [B, D] -> x / sqrt(mean(x^2 over D) + eps), in float32 (normalize_2nd_moment)."""
    x = tf.cast(x, tf.float32)
    return x * tf.math.rsqrt(tf.reduce_mean(tf.square(x), axis=-1, keepdims=True) + eps)


def conv_clamp_value(conv_clamp):
    """None or 0 -> None (no clamp; 0 is how a command line says none), else a float."""
    return float(conv_clamp) if conv_clamp else None


def _check_act(activation):
    if activation not in ACTIVATIONS:
        raise ValueError(f"activation must be one of {ACTIVATIONS}; "
                         f"Received: activation={activation!r}")
    return activation


# ---- equalized learning rate ---------------------------------------------------------

@keras.saving.register_keras_serializable(package="tf_gan_scale")
class EqualizedDense(keras.layers.Layer):
    """FullyConnectedLayer: y = bias_act(x @ (W * lr_mul/sqrt(fan_in)) + b * lr_mul).

    W is stored raw ~ N(0, 1/lr_mul^2) and scaled at run time, so Adam's per-parameter step
    is the same relative size in every layer (equalized learning rate); lr_mul < 1 (the
    mapping network's 0.01) slows a layer down by that factor.

    Args:
        units: output features.
        activation: "linear" or "lrelu".
        lr_mul: learning-rate multiplier.
        bias_init: initial value of the EFFECTIVE bias (stored as bias_init / lr_mul).
        use_bias: bool.
    Inputs [B, fan_in] -> [B, units].
    """

    def __init__(self, units, activation="linear", lr_mul=1.0, bias_init=0.0, use_bias=True,
                 **kwargs):
        super().__init__(**kwargs)
        self.units, self.activation = int(units), _check_act(activation)
        self.lr_mul, self.bias_init, self.use_bias = float(lr_mul), float(bias_init), use_bias

    def build(self, input_shape):
        fan_in = int(input_shape[-1])
        self.kernel = self.add_weight(
            name="kernel", shape=(fan_in, self.units),
            initializer=keras.initializers.RandomNormal(stddev=1.0 / self.lr_mul))
        self.bias = None
        if self.use_bias:
            self.bias = self.add_weight(
                name="bias", shape=(self.units,),
                initializer=keras.initializers.Constant(self.bias_init / self.lr_mul))
        self.weight_gain = self.lr_mul / float(np.sqrt(fan_in))

    def call(self, x):
        x = tf.cast(x, self.compute_dtype)
        y = tf.matmul(x, self.kernel * self.weight_gain)
        b = None if self.bias is None else self.bias * self.lr_mul
        return bias_act(y, b, self.activation)

    def compute_output_shape(self, input_shape):
        return tuple(input_shape[:-1]) + (self.units,)

    def get_config(self):
        return {**super().get_config(), "units": self.units, "activation": self.activation,
                "lr_mul": self.lr_mul, "bias_init": self.bias_init, "use_bias": self.use_bias}


@keras.saving.register_keras_serializable(package="tf_gan_scale")
class EqualizedConv2D(keras.layers.Layer):
    """Conv2dLayer: bias_act(conv2d_resample(x, W / sqrt(I*k*k)), b, act, gain, clamp).

    Args:
        filters: output channels O.
        kernel_size: odd int k (padding k//2).
        activation: "linear" or "lrelu".
        down: 1 or 2 (FIR-filtered downsampling, `conv2d_resample`).
        use_bias: bool (D's resnet skip has none).
        gain: extra gain (sqrt(1/2) on the resnet branches); also scales the clamp.
        conv_clamp: None or float; outputs clipped to +-conv_clamp*gain.
    Inputs [B, H, W, I] -> [B, H/down, W/down, O].
    """

    def __init__(self, filters, kernel_size, activation="linear", down=1, use_bias=True,
                 gain=1.0, conv_clamp=None, **kwargs):
        super().__init__(**kwargs)
        self.filters, self.kernel_size = int(filters), int(kernel_size)
        self.activation, self.down = _check_act(activation), int(down)
        self.use_bias, self.gain = use_bias, float(gain)
        self.conv_clamp = conv_clamp_value(conv_clamp)
        self.taps = None  # conv2d_resample's: set on a mesh that splits the kernel.

    def build(self, input_shape):
        fan_in = int(input_shape[-1]) * self.kernel_size ** 2
        k = self.kernel_size
        self.kernel = self.add_weight(name="kernel", shape=(k, k, int(input_shape[-1]),
                                                            self.filters),
                                      initializer=keras.initializers.RandomNormal(stddev=1.0),
                                      autocast=False)
        self.bias = (self.add_weight(name="bias", shape=(self.filters,), initializer="zeros")
                     if self.use_bias else None)
        self.weight_gain = 1.0 / float(np.sqrt(fan_in))

    def call(self, x):
        x = tf.cast(x, self.compute_dtype)
        # Official Conv2dLayer: (W * gain) in float32, then cast to x's dtype (a float16
        # block): the kernel is read raw (autocast off) so the gain is not applied in half.
        y = conv2d_resample(x, tf.cast(self.kernel * self.weight_gain, x.dtype),
                            down=self.down, taps=self.taps)
        clamp = None if self.conv_clamp is None else self.conv_clamp * self.gain
        return bias_act(y, self.bias, self.activation, self.gain, clamp)

    def compute_output_shape(self, input_shape):
        h, w = input_shape[1], input_shape[2]
        h = None if h is None else h // self.down
        w = None if w is None else w // self.down
        return (input_shape[0], h, w, self.filters)

    def get_config(self):
        return {**super().get_config(), "filters": self.filters,
                "kernel_size": self.kernel_size, "activation": self.activation,
                "down": self.down, "use_bias": self.use_bias, "gain": self.gain,
                "conv_clamp": self.conv_clamp}


# ---- modulated convolution -----------------------------------------------------------

def modulated_conv2d(x, weight, styles, *, demodulate=True, up=1, noise=None, taps=None):
    """Non-fused modulated conv (modulated_conv2d with fused_modconv=False, the official
    training path; it needs no grouped conv, which TF lacks on CPU).

    x [B, H, W, I] * styles[:, None, None, :] -> conv2d_resample with the SHARED raw
    weight [k, k, I, O] -> * d [B, O] where d = rsqrt(sum_{i,kh,kw} (W * s)^2 + 1e-8)
    (if demodulate), then + noise [B, H', W', 1] (broadcast over channels).
    Equal to convolving each sample with its own demodulated kernel W*s*d.

    weight and styles arrive in float32 (the variable, not its autocast copy). When x is
    float16 and demodulate, both are first pre-normalized as the official code does (W by
    sqrt(I*k*k) and its per-output-channel max |W|, s by its per-sample max |s|): exact in
    real arithmetic (demodulation removes any scale), it keeps x * s and the convolution
    inside float16's range.
    """
    weight = tf.cast(weight, tf.float32)
    styles = tf.cast(styles, tf.float32)
    if demodulate and x.dtype == tf.float16:
        k, i = weight.shape[0], weight.shape[2]
        weight = weight * (1.0 / float(np.sqrt(i * k * k))) / tf.reduce_max(
            tf.abs(weight), axis=[0, 1, 2], keepdims=True)
        styles = styles / tf.reduce_max(tf.abs(styles), axis=1, keepdims=True)
    x = x * tf.cast(styles[:, None, None, :], x.dtype)
    x = conv2d_resample(x, tf.cast(weight, x.dtype), up=up, taps=taps)
    if demodulate:
        # sum_{i,kh,kw} (W[kh,kw,i,o] s_i)^2 = (s^2) @ sum_{kh,kw} W^2 : [B, O].
        w2 = tf.reduce_sum(tf.square(weight), axis=[0, 1])  # [I, O], float32
        s2 = tf.square(styles)
        d = tf.math.rsqrt(tf.matmul(s2, w2) + 1e-8)
        x = x * tf.cast(d[:, None, None, :], x.dtype)
    if noise is not None:
        x = x + tf.cast(noise, x.dtype)
    return x


@keras.saving.register_keras_serializable(package="tf_gan_scale")
class SynthesisLayer(keras.layers.Layer):
    """One StyleGAN2 generator conv [SynthesisLayer]: styles = affine(w) (EqualizedDense
    w_dim -> I, bias init 1), modulated + demodulated k x k conv (up 1 or 2), noise x
    noise_strength (scalar, init 0), bias, lrelu x sqrt 2, clamp +-conv_clamp.

    Call: layer(x [B, H, W, I], w [B, w_dim], noise=None) -> [B, res, res, O], where
    res = H*up must equal `resolution`. noise: [B, res, res, 1] standard normal (drawn by
    the synthesis network per example, see architectures/stylegan2.py) or None, which
    uses this layer's constant noise buffer `noise_const` [res, res, 1] (non-trainable,
    drawn once from NumPy with (noise_seed, layer_index): the official 'const' mode).

    Args:
        filters: O. kernel_size: odd k. up: 1 or 2. w_dim: style vector size.
        resolution: output resolution (size of the noise image).
        conv_clamp: None or float. layer_index: int >= 0, this conv's index in the
        synthesis network (its noise sub-stream). noise_seed: int, the generator's seed.
    """

    def __init__(self, filters, *, w_dim, resolution, kernel_size=3, up=1, conv_clamp=None,
                 layer_index=0, noise_seed=0, **kwargs):
        super().__init__(**kwargs)
        self.filters, self.w_dim, self.resolution = int(filters), int(w_dim), int(resolution)
        self.kernel_size, self.up = int(kernel_size), int(up)
        self.conv_clamp = conv_clamp_value(conv_clamp)
        self.layer_index, self.noise_seed = int(layer_index), int(noise_seed)
        self.affine = None  # EqualizedDense(I), made in build once I is known.
        self.taps = None  # conv2d_resample's: set on a mesh that splits the kernel.
        # Keras 3 casts every float argument of __call__ to the compute dtype: in a
        # float16 block w (and noise) would reach the float32 affine already rounded to
        # half. call() casts x itself, so the conversion is off.
        self._convert_input_args = False

    def build(self, input_shape):
        in_ch, k, r = int(input_shape[-1]), self.kernel_size, self.resolution
        # The styles stay float32 in a float16 block (official), as the mapping does.
        self.affine = EqualizedDense(in_ch, bias_init=1.0, name="affine", dtype="float32")
        self.affine.build((None, self.w_dim))
        # Raw N(0, 1) with no runtime gain: demodulation removes any scale of W. Read in
        # float32 (autocast off): modulated_conv2d pre-normalizes before any half cast.
        self.kernel = self.add_weight(name="kernel", shape=(k, k, in_ch, self.filters),
                                      initializer=keras.initializers.RandomNormal(stddev=1.0),
                                      autocast=False)
        self.noise_strength = self.add_weight(name="noise_strength", shape=(),
                                              initializer="zeros", autocast=False)
        self.bias = self.add_weight(name="bias", shape=(self.filters,), initializer="zeros")
        rng = np.random.default_rng([self.noise_seed % 2 ** 32, self.layer_index])
        const = rng.standard_normal((r, r, 1)).astype(np.float32)
        self.noise_const = self.add_weight(name="noise_const", shape=(r, r, 1),
                                           initializer=lambda shape, dtype=None: const,
                                           trainable=False, autocast=False)

    def call(self, x, w, noise=None):
        x = tf.cast(x, self.compute_dtype)
        styles = self.affine(w)
        if noise is None:
            # Not [None]: a DTensor mesh segfaults on it (architectures/stylegan2.py).
            noise = tf.expand_dims(tf.cast(self.noise_const, tf.float32), 0)
        noise = tf.cast(noise, tf.float32) * tf.cast(self.noise_strength, tf.float32)
        x = modulated_conv2d(x, self.kernel, styles, demodulate=True, up=self.up,
                             noise=noise, taps=self.taps)
        return bias_act(x, self.bias, "lrelu", 1.0, self.conv_clamp)

    def compute_output_shape(self, input_shape, w_shape=None, noise_shape=None):
        return (input_shape[0], self.resolution, self.resolution, self.filters)

    def get_config(self):
        return {**super().get_config(), "filters": self.filters, "w_dim": self.w_dim,
                "resolution": self.resolution, "kernel_size": self.kernel_size,
                "up": self.up, "conv_clamp": self.conv_clamp,
                "layer_index": self.layer_index, "noise_seed": self.noise_seed}


@keras.saving.register_keras_serializable(package="tf_gan_scale")
class ToRGB(keras.layers.Layer):
    """ToRGBLayer: styles = affine(w) / sqrt(I); 1x1 modulated conv WITHOUT demodulation;
    bias; linear; clamp +-conv_clamp. Call: layer(x [B, H, W, I], w [B, w_dim]) ->
    [B, H, W, channels] float32 (the image accumulates in float32)."""

    def __init__(self, channels, *, w_dim, conv_clamp=None, **kwargs):
        super().__init__(**kwargs)
        self.channels, self.w_dim = int(channels), int(w_dim)
        self.conv_clamp = conv_clamp_value(conv_clamp)
        self.affine = None
        self._convert_input_args = False  # w stays float32 (see SynthesisLayer)

    def build(self, input_shape):
        in_ch = int(input_shape[-1])
        self.affine = EqualizedDense(in_ch, bias_init=1.0, name="affine", dtype="float32")
        self.affine.build((None, self.w_dim))
        self.kernel = self.add_weight(name="kernel", shape=(1, 1, in_ch, self.channels),
                                      initializer=keras.initializers.RandomNormal(stddev=1.0),
                                      autocast=False)
        self.bias = self.add_weight(name="bias", shape=(self.channels,), initializer="zeros")
        self.weight_gain = 1.0 / float(np.sqrt(in_ch))

    def call(self, x, w):
        x = tf.cast(x, self.compute_dtype)
        styles = self.affine(w) * self.weight_gain
        x = modulated_conv2d(x, self.kernel, styles, demodulate=False)
        return tf.cast(bias_act(x, self.bias, "linear", 1.0, self.conv_clamp), tf.float32)

    def compute_output_shape(self, input_shape, w_shape=None):
        return tuple(input_shape[:-1]) + (self.channels,)

    def get_config(self):
        return {**super().get_config(), "channels": self.channels, "w_dim": self.w_dim,
                "conv_clamp": self.conv_clamp}


# ---- minibatch standard deviation ----------------------------------------------------

def check_mbstd(batch, group_size, chunk):
    """ValueError unless chunk % group_size == 0 and (static) batch % chunk == 0."""
    if chunk % group_size:
        raise ValueError(f"minibatch stddev chunk must be a multiple of the group size; "
                         f"Received: chunk={chunk}, group_size={group_size}")
    if batch is not None and batch % chunk:
        raise ValueError(f"minibatch stddev needs a batch divisible by its chunk of {chunk} "
                         f"rows (group size {group_size}); Received: batch={batch}")


@keras.saving.register_keras_serializable(package="tf_gan_scale")
class MinibatchStd(keras.layers.Layer):
    """MinibatchStdLayer with virtual chunks: [B, H, W, C] -> [B, H, W, C + 1].

    Rows are cut into consecutive chunks of `chunk` rows (global row order). Inside a
    chunk of n = chunk rows the groups are STRIDED as the official reshape(G, n/G, ...):
    row i = g*(n/G) + j belongs to group j = {j, j + n/G, ..., j + (G-1) n/G}. Per group:
    biased variance over its G members, + 1e-8, sqrt, mean over (H, W, C) -> one scalar,
    appended to each member as a constant channel.

    Why chunks: the official code forms groups inside one GPU's micro-batch (batch_gpu
    rows). Fixing the chunk in GLOBAL rows makes a group a function of global rows only:
    N replicas holding consecutive chunk-multiples of rows give what one device gives.

    Args:
        group_size: G >= 1.
        chunk: rows per chunk, a multiple of G (0 means G).
    """

    def __init__(self, group_size=4, chunk=0, **kwargs):
        super().__init__(**kwargs)
        self.group_size = int(group_size)
        self.chunk = int(chunk) or self.group_size
        check_mbstd(None, self.group_size, self.chunk)

    def call(self, x):
        g, n = self.group_size, self.chunk
        check_mbstd(x.shape[0], g, n)
        dtype = x.dtype
        shape = tf.shape(x)
        h, w, c = x.shape[1], x.shape[2], x.shape[3]
        y = tf.reshape(tf.cast(x, tf.float32), [-1, g, n // g, h, w, c])  # [B/n, G, n/G, ...]
        y = y - tf.reduce_mean(y, axis=1, keepdims=True)
        y = tf.sqrt(tf.reduce_mean(tf.square(y), axis=1) + 1e-8)  # [B/n, n/G, H, W, C]
        y = tf.reduce_mean(y, axis=[2, 3, 4])  # [B/n, n/G]: one value per group.
        y = tf.tile(y[:, None, :], [1, g, 1])  # Row g*(n/G) + j gets group j's value.
        y = tf.reshape(y, [shape[0], 1, 1, 1])
        y = tf.tile(y, [1, shape[1], shape[2], 1])
        return tf.concat([x, tf.cast(y, dtype)], axis=-1)

    def compute_output_shape(self, input_shape):
        return tuple(input_shape[:-1]) + (input_shape[-1] + 1,)

    def get_config(self):
        return {**super().get_config(), "group_size": self.group_size, "chunk": self.chunk}


# Used by the synthesis network to draw noise; exported for tests and the step code.
def noise_key(seed, calls):
    """Key (int64 scalar) of the noise of call `calls` of a synthesis network with seed
    `seed`: latents.key(seed, calls, STYLE_NOISE_PHASE). One per call, shared by its
    layers (a key costs ~150 graph ops: not one per layer)."""
    return latents.key(seed, calls, latents.STYLE_NOISE_PHASE)


def layer_noise(call_key, layer_index, rows, resolution):
    """Training-mode noise of conv `layer_index` for the global `rows` (int [B]) in the
    synthesis call of `call_key` (`noise_key`): [B, res, res, 1] standard normal, row r of
    key subkey(call_key, layer_index). Depends only on (seed, calls, layer, global row):
    the same on one device and on N replicas."""
    k = latents.subkey(call_key, layer_index)
    return latents.rows_normal(k, rows, [resolution, resolution, 1])
