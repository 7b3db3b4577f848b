"""tf_gan_scale: train GANs at scale with TensorFlow 2 / Keras 3 and tf.distribute.

Public API:
    GAN                      keras.Model with a distributed GAN train step (gan.py)
    architectures.build      generator/discriminator families by name
    data.load / make_dataset data sources and the input pipeline
    distribute               strategies by name, logical CPU devices
    losses, penalties        per-example GAN losses and regularizers by name
    latents                  the one place that owns training randomness
    keras_io                 training-run checkpoints <-> .keras files
    metrics                  FID, KID, Inception Score, precision/recall, feature statistics

`import tf_gan_scale` registers `GAN` and the framework's layers with Keras, so
`keras.models.load_model("gan.keras")` needs nothing else.
"""

import importlib.abc
import importlib.util
import sys

__version__ = "0.1.0"


def __getattr__(name):
    # Lazy, so `from tf_gan_scale import distribute` can configure devices before
    # TensorFlow/Keras models are imported.
    if name == "GAN":
        from tf_gan_scale.gan import GAN
        return GAN
    raise AttributeError(f"module 'tf_gan_scale' has no attribute {name!r}")


# Keras-serializable classes: registered name -> module that defines (and registers) it.
_SERIALIZABLE = {
    "tf_gan_scale>GAN": "tf_gan_scale.gan",
    "tf_gan_scale>SyncBatchNormalization": "tf_gan_scale.layers.sync_batch_norm",
    "tf_gan_scale>ReplicaDropout": "tf_gan_scale.layers.replica_dropout",
    "tf_gan_scale>WarmupDecay": "tf_gan_scale.schedules",
    "tf_gan_scale>ConditionalBatchNormalization": "tf_gan_scale.layers.conditional_batch_norm",
    "tf_gan_scale>SelfAttention": "tf_gan_scale.layers.self_attention",
    "tf_gan_scale>Split": "tf_gan_scale.layers.split",
}


def _lazy_class(registered_name, module):
    """A stand-in that Keras' deserializer finds under `registered_name` and whose
    `from_config` imports the real class (its decorator then replaces the stand-in)."""
    class_name = registered_name.split(">")[1]

    class Lazy:
        @classmethod
        def from_config(cls, config):
            return getattr(importlib.import_module(module), class_name).from_config(config)

    Lazy.__name__ = Lazy.__qualname__ = class_name
    return Lazy


def _register_with_keras(keras):
    # Only the registry dict is touched: TensorFlow imports Keras while it initializes,
    # and importing our modules (which import TensorFlow) at that moment would fail.
    objects = keras.saving.get_custom_objects()
    for registered_name, module in _SERIALIZABLE.items():
        objects.setdefault(registered_name, _lazy_class(registered_name, module))


class _AfterKerasImport(importlib.abc.MetaPathFinder):
    """Registers with Keras as soon as Keras is imported.

    Importing Keras here would import TensorFlow (3.6 s, 0.6 GB) into processes that never
    use it: the launcher, `tools/launch_local.py`, Slurm and Kubernetes entry points. So
    the registration waits for the first `import keras`, wherever it happens.
    """

    _busy = False

    def find_spec(self, fullname, path=None, target=None):
        if fullname != "keras" or self._busy:
            return None
        self._busy = True  # find_spec below asks the finders again, this one included.
        try:
            spec = importlib.util.find_spec(fullname)
        finally:
            self._busy = False
        if spec is None or spec.loader is None:
            return spec
        loader = spec.loader
        exec_module = loader.exec_module

        def exec_then_register(module):
            exec_module(module)
            loader.exec_module = exec_module
            if self in sys.meta_path:  # Asking for a spec (TensorFlow does) is no import.
                sys.meta_path.remove(self)
            _register_with_keras(module)

        loader.exec_module = exec_then_register
        return spec


if "keras" in sys.modules:
    _register_with_keras(sys.modules["keras"])
elif not any(isinstance(f, _AfterKerasImport) for f in sys.meta_path):
    sys.meta_path.insert(0, _AfterKerasImport())
