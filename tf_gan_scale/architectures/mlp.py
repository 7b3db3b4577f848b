"""Multi-layer perceptrons for vector data (e.g. the 2D Gaussian mixtures of PacGAN)."""

import keras

from tf_gan_scale import errors
from tf_gan_scale.layers import make_norm
from tf_gan_scale.precision import OUTPUT


def build(*, data_shape, latent_dim, hidden=(256, 256), g_norm="batch", d_norm="none",
          sync_bn=True):
    """Builds an MLP pair.

    Args:
        data_shape: (D,), the vector size.
        latent_dim: int, size of z.
        hidden: widths of the hidden layers (same for G and D).
        g_norm / d_norm: "batch" or "none", after every hidden Dense.
        sync_bn: bool, cross-replica batch norm.

    Returns:
        (generator [B, latent_dim] -> [B, D] (linear output: data is not bounded),
         discriminator [B, D] -> [B, 1]).
    """
    if len(data_shape) != 1:
        raise errors.ConfigError(
            f"mlp needs vector data of shape (D,); Received: data_shape={tuple(data_shape)}")

    def stack(inputs, norm, out, activation, name):
        layers = [keras.Input(inputs)]
        for width in hidden:
            layers.append(keras.layers.Dense(width))
            n = make_norm(norm, sync_bn=sync_bn)
            if n is not None:
                layers.append(n)
            layers.append(keras.layers.LeakyReLU(0.2))
        layers.append(keras.layers.Dense(out, activation=activation, dtype=OUTPUT))
        return keras.Sequential(layers, name=name)

    return (stack((latent_dim,), g_norm, data_shape[0], None, "generator"),
            stack(tuple(data_shape), d_norm, 1, None, "discriminator"))
