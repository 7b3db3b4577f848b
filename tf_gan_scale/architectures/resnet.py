"""SNGAN-style residual generator and discriminator (Miyato et al. 2018, arXiv:1802.05957).

At 32x32 with the defaults this is the paper's CIFAR-10 ResNet:
  G: Dense 4*4*256 -> Reshape -> 3 x GBlock(256, up) -> BN -> ReLU -> Conv 3x3 C -> tanh
     GBlock: BN -> ReLU -> Upsample -> Conv 3x3 -> BN -> ReLU -> Conv 3x3,
             shortcut Upsample -> Conv 1x1; summed.
  D: DBlock(128, down, first) -> DBlock(128, down) -> 2 x DBlock(128) -> ReLU ->
     global SUM pool -> Dense 1; every conv and the dense spectrally normalized.
     DBlock: [ReLU] -> Conv 3x3 -> ReLU -> Conv 3x3 -> [AvgPool 2],
             shortcut ([AvgPool 2 ->] Conv 1x1 in the first block, Conv 1x1 -> [AvgPool 2]
             otherwise) when the block downsamples or changes channels, else identity.
Other sizes: G has one upsampling block per entry of `g_channels` and D downsamples in
its first `d_downsample` blocks, so H and W must be divisible by 2**len(g_channels) and by
2**d_downsample (8x8 test models: e.g. g_channels=(8, 8), d_downsample=2). Both networks
are plain Functional models of Keras layers (get_config round trips; nothing custom).

Distributed behaviour (one device = N replicas):
  * every batch norm is cross-replica (`layers.make_norm`, i.e. SyncBatchNormalization)
    unless sync_bn=False;
  * spectral norm is Keras' `keras.layers.SpectralNormalization` (as
    `layers.SpectralNormalization`: the same arithmetic with its zero-kernel guard as a
    select, which a DTensor mesh can run), kept because it is right under replicas: its power-iteration vector `vector_u` is a non-trainable
    variable (in `non_trainable_weights`, so checkpoints and `.weights.h5` hold it), and
    the training-mode update reads only the kernel and `u`, never the batch, so every
    replica computes bit-identical `u` and kernel; a GAN trained with it matches one
    device to float32 rounding (tests/architectures/test_resnet.py).
  * Keras' layer is a weight PROJECTION, not the paper's reparametrization: each
    training-mode call does one power iteration and assigns kernel <- kernel / sigma in
    place, and gradients flow to that normalized kernel without the d(sigma)/dW term
    (the paper differentiates through W / sigma(W)). Inference uses the stored kernel
    as is. The kernel's largest singular value stays ~1 either way.
"""

import keras

from tf_gan_scale import errors
from tf_gan_scale.layers import make_norm
from tf_gan_scale.layers.spectral_norm import SpectralNormalization
from tf_gan_scale.precision import OUTPUT


def _sn(layer, enabled, power_iterations):
    if not enabled:
        return layer
    # The wrapper computes in its layer's policy (a float32 logit layer stays float32).
    return SpectralNormalization(layer, power_iterations=power_iterations,
                                              dtype=layer.dtype_policy)


def _conv(ch, k, sn, power_iterations):
    return _sn(keras.layers.Conv2D(ch, k, padding="same"), sn, power_iterations)


def _norm_act(x, norm, sync_bn):
    n = make_norm(norm, sync_bn=sync_bn)
    if n is not None:
        x = n(x)
    return keras.layers.ReLU()(x)


def _g_block(x, ch, *, norm, sync_bn, sn, power_iterations):
    h = _norm_act(x, norm, sync_bn)
    h = keras.layers.UpSampling2D(2)(h)
    h = _conv(ch, 3, sn, power_iterations)(h)
    h = _norm_act(h, norm, sync_bn)
    h = _conv(ch, 3, sn, power_iterations)(h)
    s = keras.layers.UpSampling2D(2)(x)
    s = _conv(ch, 1, sn, power_iterations)(s)
    return keras.layers.Add()([h, s])


def d_block(x, ch, conv, *, down, first):
    """SNGAN's discriminator block (also BigGAN's): x [B, H, W, C] -> [B, H/2 or H, ., ch].
    conv(ch, kernel) makes each convolution (spectrally normalized or not)."""
    h = x if first else keras.layers.ReLU()(x)
    h = conv(ch, 3)(h)
    h = keras.layers.ReLU()(h)
    h = conv(ch, 3)(h)
    if down:
        h = keras.layers.AveragePooling2D(2)(h)
    s = x
    if first:  # SNGAN's optimized first block: pool, then the 1x1 conv (cheaper).
        if down:
            s = keras.layers.AveragePooling2D(2)(s)
        s = conv(ch, 1)(s)
    elif down or x.shape[-1] != ch:
        s = conv(ch, 1)(s)
        if down:
            s = keras.layers.AveragePooling2D(2)(s)
    return keras.layers.Add()([h, s])


def build(*, data_shape, latent_dim, g_channels=(256, 256, 256),
          d_channels=(128, 128, 128, 128), d_downsample=2, g_norm="batch", sync_bn=True,
          d_spectral_norm=True, g_spectral_norm=False, power_iterations=1):
    """Builds the SNGAN ResNet pair.

    Args:
        data_shape: (H, W, C), H and W divisible by 2**len(g_channels) and 2**d_downsample.
        latent_dim: int, size of z.
        g_channels: output channels of G's upsampling blocks (one per doubling); the
            initial Dense produces g_channels[0] channels at (H, W) / 2**len(g_channels).
        d_channels: output channels of D's residual blocks.
        d_downsample: int, how many of D's first blocks halve the resolution.
        g_norm: "batch" or "none", the norm before each ReLU in G.
        sync_bn: bool, cross-replica batch norm (see layers.make_norm).
        d_spectral_norm / g_spectral_norm: bool, spectral norm on every conv and dense
            of D / G (SNGAN: D only; BigGAN: both).
        power_iterations: int >= 1, power iterations per training-mode call.

    Returns:
        (generator [B, latent_dim] -> [B, H, W, C] in [-1, 1] (tanh),
         discriminator [B, H, W, C] -> [B, 1] logits).

    Example:
        >>> g, d = build(data_shape=(8, 8, 1), latent_dim=4, g_channels=(8, 8),
        ...              d_channels=(8, 8), d_downsample=2)
    """
    data_shape = tuple(data_shape)
    g_channels, d_channels = tuple(g_channels), tuple(d_channels)
    if not g_channels or not d_channels or min(g_channels + d_channels) < 1:
        raise errors.ConfigError(
            f"resnet needs at least one block in G and D, each with >= 1 channel; "
            f"Received: g_channels={g_channels}, d_channels={d_channels}")
    if not 0 <= d_downsample <= len(d_channels):
        raise errors.ConfigError(
            f"resnet d_downsample must be in [0, {len(d_channels)}] (the number of D "
            f"blocks); Received: d_downsample={d_downsample}")
    if power_iterations < 1:
        raise errors.ConfigError(f"resnet power_iterations must be >= 1; "
                                 f"Received: power_iterations={power_iterations}")
    factor = 2 ** max(len(g_channels), d_downsample)
    if len(data_shape) != 3 or data_shape[0] % factor or data_shape[1] % factor:
        raise errors.ConfigError(
            f"resnet with {len(g_channels)} G blocks and d_downsample={d_downsample} needs "
            f"image data of shape (H, W, C) with H and W multiples of {factor}; "
            f"Received: data_shape={data_shape}")
    h, w, c = data_shape
    bh, bw = h // 2 ** len(g_channels), w // 2 ** len(g_channels)

    z = keras.Input((latent_dim,))
    x = _sn(keras.layers.Dense(bh * bw * g_channels[0]), g_spectral_norm, power_iterations)(z)
    x = keras.layers.Reshape((bh, bw, g_channels[0]))(x)
    for ch in g_channels:
        x = _g_block(x, ch, norm=g_norm, sync_bn=sync_bn, sn=g_spectral_norm,
                     power_iterations=power_iterations)
    x = _norm_act(x, g_norm, sync_bn)
    x = _conv(c, 3, g_spectral_norm, power_iterations)(x)
    x = keras.layers.Activation("tanh", dtype=OUTPUT)(x)
    generator = keras.Model(z, x, name="generator")

    inp = keras.Input(data_shape)
    y = inp
    for i, ch in enumerate(d_channels):
        y = d_block(y, ch, lambda c, k: _conv(c, k, d_spectral_norm, power_iterations),
                    down=i < d_downsample, first=i == 0)
    y = keras.layers.ReLU()(y)
    # Global SUM pooling (SNGAN): the mean times the number of positions.
    y = keras.layers.GlobalAveragePooling2D()(y)
    y = keras.layers.Rescaling(float((h >> d_downsample) * (w >> d_downsample)))(y)
    y = _sn(keras.layers.Dense(1, dtype=OUTPUT), d_spectral_norm, power_iterations)(y)
    discriminator = keras.Model(inp, y, name="discriminator")
    return generator, discriminator
