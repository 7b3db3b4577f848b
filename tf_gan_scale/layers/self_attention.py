"""SAGAN / BigGAN self-attention block (Zhang et al. 2018, arXiv:1805.08318; BigGAN-PyTorch
`layers.Attention`).

For x [B, H, W, C] with N = H * W positions:
    theta = conv1x1(x)                  [B, N,     C/8]
    phi   = maxpool2x2(conv1x1(x))      [B, N / 4, C/8]
    g     = maxpool2x2(conv1x1(x))      [B, N / 4, C/2]
    beta  = softmax(theta phi^T)        [B, N, N / 4]   (over the last axis)
    o     = conv1x1(beta g)             [B, H, W, C]
    y     = x + gamma * o               gamma a trainable scalar, initialized to 0
so the block starts as the identity. The 1x1 convolutions have no bias; C/8 and C/2 are
rounded down but at least 1 (tiny test models have fewer than 8 channels). Every example
attends only over its own positions: nothing crosses the batch, so N replicas compute
exactly what one device does.
"""

import keras
from keras import ops

from tf_gan_scale.layers.spectral_norm import SpectralNormalization


@keras.saving.register_keras_serializable(package="tf_gan_scale")
class SelfAttention(keras.layers.Layer):
    """Self-attention over the spatial positions of a feature map, plus the input.

    Args:
        spectral_norm: bool, wrap the four 1x1 convolutions in
            `layers.SpectralNormalization` (BigGAN: in G and D).
        power_iterations: int >= 1, power iterations per training-mode call.
        kernel_initializer: initializer of the convolution kernels (a name, config dict or
            instance; each kernel gets its own fresh instance).
        **kwargs: base Layer arguments (name, dtype).

    Inputs [B, H, W, C] with static, even H and W; output [B, H, W, C].

    Example:
        >>> attn = SelfAttention()
        >>> y = attn(tf.random.normal([2, 8, 8, 16]))   # == x while gamma is 0
    """

    def __init__(self, spectral_norm=True, power_iterations=1,
                 kernel_initializer="orthogonal", **kwargs):
        super().__init__(**kwargs)
        self.spectral_norm = bool(spectral_norm)
        self.power_iterations = int(power_iterations)
        self.kernel_initializer = keras.initializers.serialize(
            keras.initializers.get(kernel_initializer))

    def _conv(self, filters, name):
        conv = keras.layers.Conv2D(
            filters, 1, use_bias=False, name=name,
            kernel_initializer=keras.initializers.get(self.kernel_initializer))
        if not self.spectral_norm:
            return conv
        return SpectralNormalization(
            conv, power_iterations=self.power_iterations, name=f"{name}_sn")

    def build(self, input_shape):
        if len(input_shape) != 4 or any(s is None or s % 2 for s in input_shape[1:3]):
            raise ValueError(f"SelfAttention needs inputs [B, H, W, C] with static even H and "
                             f"W (phi and g are max-pooled 2x2); Received: {input_shape}")
        channels = input_shape[-1]
        self.key_channels = max(1, channels // 8)
        self.value_channels = max(1, channels // 2)
        self.theta = self._conv(self.key_channels, "theta")
        self.phi = self._conv(self.key_channels, "phi")
        self.g = self._conv(self.value_channels, "g")
        self.o = self._conv(channels, "o")
        for conv in (self.theta, self.phi, self.g):
            conv.build(input_shape)
        self.o.build(tuple(input_shape[:3]) + (self.value_channels,))
        self.gamma = self.add_weight(name="gamma", shape=(), initializer="zeros")
        self.built = True

    def call(self, x, training=None):
        _, h, w, _ = x.shape
        n = h * w
        theta = ops.reshape(self.theta(x, training=training), [-1, n, self.key_channels])
        phi = ops.max_pool(self.phi(x, training=training), 2, strides=2)
        phi = ops.reshape(phi, [-1, n // 4, self.key_channels])
        g = ops.max_pool(self.g(x, training=training), 2, strides=2)
        g = ops.reshape(g, [-1, n // 4, self.value_channels])
        beta = ops.softmax(ops.matmul(theta, ops.transpose(phi, [0, 2, 1])), axis=-1)
        o = ops.reshape(ops.matmul(beta, g), [-1, h, w, self.value_channels])
        o = self.o(o, training=training)
        return x + ops.cast(self.gamma, o.dtype) * o

    def compute_output_shape(self, input_shape):
        return input_shape

    def get_config(self):
        return {**super().get_config(), "spectral_norm": self.spectral_norm,
                "power_iterations": self.power_iterations,
                "kernel_initializer": self.kernel_initializer}
