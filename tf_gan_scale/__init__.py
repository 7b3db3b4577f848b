"""tf_gan_scale: train GANs at scale with TensorFlow 2 / Keras 3 and tf.distribute.

Public API:
    GAN                      keras.Model with a distributed GAN train step (gan/)
    gan                      the step math (GanStep), its settings (StepConfig), losses,
                             penalties, regularizers, augmentation, EMA
    architectures.build      generator/discriminator families by name
    data.load / make_dataset data sources and the input pipeline
    distribute               strategies by name, logical CPU devices
    latents                  the one place that owns training randomness
    training                 runs: prepare, run, the workdir, callbacks
    metrics                  FID, KID, Inception Score, precision/recall, scoring
    artifacts                samples, export, .keras files, plots

`import tf_gan_scale` registers `GAN` and the framework's layers with Keras, so
`keras.models.load_model("gan.keras")` needs nothing else. Modules that moved in release
0.2 (issue 23) still import from their old paths, with a DeprecationWarning (`_MOVED`).
"""

import importlib
import importlib.abc
import importlib.util
import sys
import types
import warnings

__version__ = "0.1.0"


def __getattr__(name):
    # Lazy, so `from tf_gan_scale import distribute` can configure devices before
    # TensorFlow/Keras models are imported.
    if name == "GAN":
        # Lazy: `import tf_gan_scale` alone (launchers, Kubernetes tools) loads no TensorFlow.
        from tf_gan_scale.gan.model import GAN
        return GAN
    raise AttributeError(f"module 'tf_gan_scale' has no attribute {name!r}")


# Keras-serializable classes: registered name -> module that defines (and registers) it.
_SERIALIZABLE = {
    "tf_gan_scale>GAN": "tf_gan_scale.gan.model",
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


# Old module path -> where its names live now (release 0.2 moved them; they resolve until
# 0.3). One new module: the old name IS it. Several: a module that looks names up in them.
_MOVED = {
    "tf_gan_scale.augment": ("tf_gan_scale.gan.augment",),
    "tf_gan_scale.callbacks": ("tf_gan_scale.training.callbacks",),
    "tf_gan_scale.classifier": ("tf_gan_scale.metrics.classifier",),
    "tf_gan_scale.clusters": ("tf_gan_scale.cluster.env", "tf_gan_scale.cluster.kubernetes",
                              "tf_gan_scale.distribute.strategies"),
    "tf_gan_scale.convert": ("tf_gan_scale.layers.convert",),
    "tf_gan_scale.cost_model": ("tf_gan_scale.distribute.cost_model",),
    "tf_gan_scale.ema": ("tf_gan_scale.gan.ema",),
    "tf_gan_scale.evaluation": ("tf_gan_scale.metrics.scoring",),
    "tf_gan_scale.export": ("tf_gan_scale.artifacts.export",),
    "tf_gan_scale.gan_checks": ("tf_gan_scale.gan.checks",),
    "tf_gan_scale.keras_io": ("tf_gan_scale.artifacts.keras_io",),
    "tf_gan_scale.launch": ("tf_gan_scale.cluster.launch",),
    "tf_gan_scale.losses": ("tf_gan_scale.gan.losses",),
    "tf_gan_scale.parallel.training": ("tf_gan_scale.training.mesh_runner",),
    "tf_gan_scale.penalties": ("tf_gan_scale.gan.penalties",),
    "tf_gan_scale.plot": ("tf_gan_scale.artifacts.plot",),
    "tf_gan_scale.regularizers": ("tf_gan_scale.gan.regularizers",),
    "tf_gan_scale.sampling": ("tf_gan_scale.artifacts.sampling",),
    "tf_gan_scale.toy_metrics": ("tf_gan_scale.metrics.toy",),
    "tf_gan_scale.train_lib": ("tf_gan_scale.training",),
}


class _MovedLoader(importlib.abc.Loader):
    """Imports an old module path as the module(s) its names moved to, with a warning."""

    def create_module(self, spec):
        targets = _MOVED[spec.name]
        warnings.warn(f"{spec.name} moved to {' and '.join(targets)}; the old path "
                      f"works until tf_gan_scale 0.3", DeprecationWarning, stacklevel=2)
        modules = [importlib.import_module(t) for t in targets]
        if len(modules) == 1:
            # The import system sets the returned module's __spec__ to the old name's:
            # exec_module puts its own back.
            self._spec = modules[0].__spec__
            return modules[0]
        alias = types.ModuleType(spec.name, f"Names moved to {', '.join(targets)}.")

        def lookup(name):
            for module in modules:
                if hasattr(module, name):
                    return getattr(module, name)
            raise AttributeError(f"module {spec.name!r} has no attribute {name!r}")

        alias.__getattr__ = lookup
        return alias

    def exec_module(self, module):
        if getattr(self, "_spec", None) is not None:
            module.__spec__ = self._spec


class _MovedFinder(importlib.abc.MetaPathFinder):
    def find_spec(self, fullname, path=None, target=None):
        if fullname in _MOVED:
            return importlib.util.spec_from_loader(fullname, _MovedLoader())
        return None


if not any(isinstance(f, _MovedFinder) for f in sys.meta_path):
    sys.meta_path.append(_MovedFinder())
