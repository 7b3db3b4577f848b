"""Every shipped experiment config loads, validates and builds its models."""

import glob
import os
import runpy

import pytest

from conftest import REPO
from tf_gan_scale import architectures, train_lib

CONFIGS = sorted(glob.glob(os.path.join(REPO, "experiments", "*.py")))
SHAPES = {"embedded:digits": (8, 8, 1), "tfds:mnist": (28, 28, 1), "toy:grid25": (2,),
          "tfds:cifar10": (32, 32, 3), "tfds:imagenet2012@128": (128, 128, 3)}


@pytest.mark.parametrize("path", CONFIGS, ids=os.path.basename)
def test_config(path):
    module = runpy.run_path(path)
    assert "python -m tf_gan_scale.main --config=experiments/" in module["__doc__"]
    config = module["get_config"]()
    train_lib.validate(config, num_replicas=1)
    if config.model.name == "biggan" and config.data.source.startswith("tfds:imagenet"):
        return  # 158M parameters: built with tiny widths in tests/test_recipes.py.
    classes = train_lib.num_classes(config, 10)
    g, d = architectures.build(config.model.name, data_shape=SHAPES[config.data.source],
                               latent_dim=config.model.latent_dim, num_classes=classes,
                               **train_lib.model_options(config))
    assert g.output_shape[1:] == SHAPES[config.data.source]
    assert (len(g.inputs) == 2) == bool(config.model.get("conditional", False))


def test_stable_keys():
    config = runpy.run_path(os.path.join(REPO, "experiments", "dcgan_mnist.py"))["get_config"]()
    assert config.seed == 0 and config.data.source == "tfds:mnist"
    assert config.train.num_steps > 0 and config.train.global_batch_size == 256
    assert config.model.d_dropout == 0.3
