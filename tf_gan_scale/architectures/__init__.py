"""Generator/discriminator families, looked up by name.

    generator, discriminator = architectures.build("dcgan", data_shape=(28, 28, 1),
                                                   latent_dim=100, d_dropout=0.3)
    generator, discriminator = architectures.build("biggan", data_shape=(32, 32, 3),
                                                   latent_dim=120, num_classes=10)

Every family is a module with `build(*, data_shape, latent_dim, **options)` returning two
Keras models: G maps [B, latent_dim] -> [B, *data_shape] (image families end in tanh,
so images lie in [-1, 1]; stylegan2's and r3gan's are linear, as the officials, and trained towards
[-1, 1]), D maps [B, *data_shape] -> [B, 1] logits.

Conditional families (`conditional(name)`: their build() has a `num_classes` parameter:
biggan, r3gan and stylegan2) take `num_classes`; with num_classes > 0 both models have TWO inputs:
G [z float32 [B, latent_dim], labels int32 [B]] -> [B, *data_shape] and
D [x [B, *data_shape], labels int32 [B]] -> [B, 1]; callers detect them by
`len(model.inputs) == 2`. With num_classes == 0 (the default) they are single-input like
every other family. num_classes is not an option (it comes from the data source, not from
config.model), so `options()` does not list it; num_classes > 0 for an unconditional
family is an error.

Unknown family names and unknown options raise ConfigError naming the valid ones; nothing
is silently dropped.
"""

import inspect

from tf_gan_scale import errors
from tf_gan_scale.architectures import biggan, dcgan, mlp, r3gan, resnet, stylegan2

ARCHITECTURES = {"mlp": mlp.build, "dcgan": dcgan.build, "resnet": resnet.build,
                 "biggan": biggan.build, "stylegan2": stylegan2.build,
                 "r3gan": r3gan.build}

_NOT_OPTIONS = ("data_shape", "latent_dim", "num_classes")


def _family(name):
    return errors.choose("architecture", name, ARCHITECTURES)


def conditional(name):
    """Whether family `name` can be class-conditional (its build() takes num_classes)."""
    return "num_classes" in inspect.signature(_family(name)).parameters


def options(name):
    """The options (keyword arguments besides data_shape/latent_dim/num_classes) family
    `name` accepts."""
    return [p for p in inspect.signature(_family(name)).parameters if p not in _NOT_OPTIONS]


def build(name, *, data_shape, latent_dim, num_classes=0, **kwargs):
    """Builds (generator, discriminator) for family `name`; see module docstring.

    num_classes: int >= 0 (None counts as 0); > 0 needs a conditional family.
    """
    fn = _family(name)
    valid = options(name)
    for key in kwargs:
        if key not in valid:
            raise errors.ConfigError(
                f"unknown option {key!r} for architecture {name!r}; valid: {', '.join(valid)}")
    num_classes = 0 if num_classes is None else num_classes
    if not errors.is_int(num_classes) or num_classes < 0:
        raise errors.ConfigError(f"num_classes must be an int >= 0; "
                                 f"Received: num_classes={num_classes!r}")
    num_classes = int(num_classes)
    if conditional(name):
        kwargs["num_classes"] = num_classes
    elif num_classes > 0:
        names = ", ".join(sorted(n for n in ARCHITECTURES if conditional(n)))
        raise errors.ConfigError(
            f"architecture {name!r} is unconditional; conditional architectures: {names} "
            f"(config.model.conditional=True needs one of them)")
    return fn(data_shape=tuple(data_shape), latent_dim=latent_dim, **kwargs)
