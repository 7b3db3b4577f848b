"""Every shipped experiment config loads, validates and builds its models."""

import glob
import os
import runpy

import pytest

from conftest import REPO
from tf_gan_scale import architectures, configs
from tf_gan_scale import training

# Every recipe; experiments/recorded.py is not one (it reads a run's run.json:
# tests/interop/test_stylegan2_import.py).
CONFIGS = sorted(p for p in glob.glob(os.path.join(REPO, "experiments", "*.py"))
                 if os.path.basename(p) != "recorded.py")
SHAPES = {"embedded:digits": (8, 8, 1), "tfds:mnist": (28, 28, 1), "toy:grid25": (2,),
          "tfds:cifar10": (32, 32, 3), "tfds:imagenet2012@128": (128, 128, 3),
          "arrayrecord:/data/ffhq256": (256, 256, 3),
          "arrayrecord:/data/ffhq1024": (1024, 1024, 3),
          "npz:/work/data/stacked_train.npz": (28, 28, 3),
          "arrayrecord:/work/data/mnist32": (32, 32, 1),
          "arrayrecord:/data/ffhq64": (64, 64, 3),
          "tfds:imagenet_resized/32x32": (32, 32, 3),
          "tfds:imagenet_resized/64x64": (64, 64, 3)}


@pytest.mark.parametrize("path", CONFIGS, ids=os.path.basename)
def test_config(path):
    module = runpy.run_path(path)
    assert "python -m tf_gan_scale.main --config=experiments/" in module["__doc__"]
    config = module["get_config"]()
    training.validate(config, num_replicas=1)
    if config.model.name == "biggan" and config.data.source.startswith("tfds:imagenet"):
        return  # 158M parameters: built with tiny widths in tests/integration/test_recipes.py.
    if config.model.name == "r3gan" and config.data.source.startswith("tfds:imagenet"):
        return  # 166M / 211M parameters: built (slow tier) in tests/architectures/test_r3gan.py.
    classes = training.num_classes(config, 10)
    g, d = architectures.build(config.model.name, data_shape=SHAPES[config.data.source],
                               latent_dim=config.model.latent_dim, num_classes=classes,
                               **training.model_options(config))
    assert g.output_shape[1:] == SHAPES[config.data.source]
    assert (len(g.inputs) == 2) == bool(config.model.get("conditional", False))


def test_stable_keys():
    config = runpy.run_path(os.path.join(REPO, "experiments", "dcgan_mnist.py"))["get_config"]()
    assert config.seed == 0 and config.data.source == "tfds:mnist"
    assert config.train.num_steps > 0 and config.train.global_batch_size == 256
    assert config.model.d_dropout == 0.3


def test_batch_norm_is_cross_replica_by_default(mirrored2):
    # The default config (every experiment starts from configs.base()) on 2 replicas:
    # every batch norm of G and D computes its statistics over the global batch. With
    # per-replica BN as the default, N replicas would not train what one device trains.
    config = configs.base()
    config.data.source = "embedded:digits"
    config.model.g_channels, config.model.d_channels = (32, 16, 8), (8, 16)
    config.model.d_norm = "batch"  # D's batch norm too (the dcgan default has none).
    with mirrored2.scope():
        model = training.build_gan(config, SHAPES["embedded:digits"])
    bn = [(net.name, layer.name, getattr(layer, "synchronized", False))
          for net in (model.generator, model.discriminator)
          for layer in net._flatten_layers(include_self=False, recursive=True)
          if hasattr(layer, "moving_mean")]
    assert {name for name, _, _ in bn} == {model.generator.name, model.discriminator.name}
    assert all(synced for _, _, synced in bn), bn
