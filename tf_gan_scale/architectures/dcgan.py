"""DCGAN (Radford et al. 2015), at its 28x28x1 default exactly the TensorFlow DCGAN tutorial.

Tutorial model (tensorflow.org/tutorials/generative/dcgan), reproduced layer for layer:
  G: Dense 7*7*256 (no bias) -> BN -> LeakyReLU -> Reshape -> ConvT 128 5x5 s1 -> BN ->
     LeakyReLU -> ConvT 64 5x5 s2 -> BN -> LeakyReLU -> ConvT C 5x5 s2 tanh
  D: Conv 64 5x5 s2 -> LeakyReLU -> Dropout 0.3 -> Conv 128 5x5 s2 -> LeakyReLU ->
     Dropout 0.3 -> Flatten -> Dense 1
Other sizes keep the structure: G starts at (H/4, W/4), so H and W must be multiples of 4.
The BN layers are cross-replica by default (sync_bn=True) and the dropout layers draw
different masks on each replica (ReplicaDropout); both are no-ops for one device.
"""

import keras

from tf_gan_scale import errors
from tf_gan_scale.layers import ReplicaDropout, make_norm
from tf_gan_scale.precision import OUTPUT


def _add(layers, layer):
    if layer is not None:
        layers.append(layer)


def build(*, data_shape, latent_dim, d_dropout=0.3, sync_bn=True, g_norm="batch",
          d_norm="none", g_channels=(256, 128, 64), d_channels=(64, 128), seed=0):
    """Builds the DCGAN pair.

    Args:
        data_shape: (H, W, C) with H, W multiples of 4.
        latent_dim: int, size of z.
        d_dropout: float, dropout after each D conv (0.3 in the tutorial).
        sync_bn: bool, cross-replica batch norm (see layers.make_norm).
        g_norm / d_norm: "batch" or "none". The tutorial has BN in G only; d_norm="batch"
            adds BN after every D conv but the first (as in the DCGAN paper).
        g_channels: (dense, convT1, convT2) channel counts of G.
        d_channels: (conv1, conv2) channel counts of D.
        seed: int, base seed of D's dropout streams.

    Returns:
        (generator [B, latent_dim] -> [B, H, W, C], discriminator [B, H, W, C] -> [B, 1]).
    """
    if len(data_shape) != 3 or data_shape[0] % 4 or data_shape[1] % 4:
        raise errors.ConfigError(
            f"dcgan needs image data of shape (H, W, C) with H and W multiples of 4; "
            f"Received: data_shape={tuple(data_shape)}")
    h, w, c = data_shape
    c0, c1, c2 = g_channels
    g = [keras.Input((latent_dim,)),
         keras.layers.Dense((h // 4) * (w // 4) * c0, use_bias=False)]
    _add(g, make_norm(g_norm, sync_bn=sync_bn))
    g += [keras.layers.LeakyReLU(), keras.layers.Reshape((h // 4, w // 4, c0)),
          keras.layers.Conv2DTranspose(c1, 5, strides=1, padding="same", use_bias=False)]
    _add(g, make_norm(g_norm, sync_bn=sync_bn))
    g += [keras.layers.LeakyReLU(),
          keras.layers.Conv2DTranspose(c2, 5, strides=2, padding="same", use_bias=False)]
    _add(g, make_norm(g_norm, sync_bn=sync_bn))
    g += [keras.layers.LeakyReLU(),
          keras.layers.Conv2DTranspose(c, 5, strides=2, padding="same", use_bias=False,
                                       activation="tanh", dtype=OUTPUT)]

    d = [keras.Input((h, w, c))]
    for i, ch in enumerate(d_channels):
        d.append(keras.layers.Conv2D(ch, 5, strides=2, padding="same"))
        if i > 0:
            _add(d, make_norm(d_norm, sync_bn=sync_bn))
        d += [keras.layers.LeakyReLU(), ReplicaDropout(d_dropout, seed=seed + i)]
    d += [keras.layers.Flatten(), keras.layers.Dense(1, dtype=OUTPUT)]
    return (keras.Sequential(g, name="generator"), keras.Sequential(d, name="discriminator"))
