"""Generator/discriminator families, looked up by name.

    generator, discriminator = architectures.build("dcgan", data_shape=(28, 28, 1),
                                                   latent_dim=100, d_dropout=0.3)

Every family is a module with `build(*, data_shape, latent_dim, **options)` returning two
Keras models: G maps [B, latent_dim] -> [B, *data_shape] (image families end in tanh,
so images lie in [-1, 1]), D maps [B, *data_shape] -> [B, 1] logits. Unknown family names and unknown options raise
ConfigError naming the valid ones; nothing is silently dropped.
"""

import inspect

from tf_gan_scale import errors
from tf_gan_scale.architectures import dcgan, mlp, resnet

ARCHITECTURES = {"mlp": mlp.build, "dcgan": dcgan.build, "resnet": resnet.build}


def options(name):
    """The options (keyword arguments besides data_shape/latent_dim) family `name` accepts."""
    fn = errors.choose("architecture", name, ARCHITECTURES)
    return [p for p in inspect.signature(fn).parameters if p not in ("data_shape", "latent_dim")]


def build(name, *, data_shape, latent_dim, **kwargs):
    """Builds (generator, discriminator) for family `name`; see module docstring."""
    fn = errors.choose("architecture", name, ARCHITECTURES)
    valid = options(name)
    for key in kwargs:
        if key not in valid:
            raise errors.ConfigError(
                f"unknown option {key!r} for architecture {name!r}; valid: {', '.join(valid)}")
    return fn(data_shape=tuple(data_shape), latent_dim=latent_dim, **kwargs)
