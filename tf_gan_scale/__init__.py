"""tf_gan_scale: train GANs at scale with TensorFlow 2 / Keras 3 and tf.distribute.

Public API:
    GAN                      keras.Model with a distributed GAN train step (gan.py)
    architectures.build      generator/discriminator families by name
    data.load / make_dataset data sources and the input pipeline
    distribute               strategies by name, logical CPU devices
    losses, penalties        per-example GAN losses and regularizers by name
    latents                  the one place that owns training randomness
"""

__version__ = "0.1.0"


def __getattr__(name):
    # Lazy, so `from tf_gan_scale import distribute` can configure devices before
    # TensorFlow/Keras models are imported.
    if name == "GAN":
        from tf_gan_scale.gan import GAN
        return GAN
    raise AttributeError(f"module 'tf_gan_scale' has no attribute {name!r}")
