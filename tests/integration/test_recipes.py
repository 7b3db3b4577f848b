"""Every BigGAN-class, StyleGAN2 and R3GAN recipe on TFDS data trains 2 steps end to end with a tiny size override: the real
TFDS code path on TFDS's mock data (the recipes' datasets cannot be downloaded here)."""

import os
import runpy

import numpy as np
import pytest
import tensorflow_datasets as tfds

from conftest import REPO
from tf_gan_scale import training
from tf_gan_scale.artifacts import sampling
from tf_gan_scale.training import build

# Widths shrunk so a step takes well under a second; everything else is the recipe's.
TINY = {
    "sngan_cifar10.py": {"model.g_channels": (4, 4, 4), "model.d_channels": (4, 4, 4, 4)},
    "biggan_cifar10.py": {"model.ch": 1, "model.shared_dim": 4},
    "biggan_imagenet128.py": {"model.ch": 1, "model.shared_dim": 4},
    # Minibatch-std chunks of 4: the test's batch (the preset's are 32).
    "stylegan2_cifar10.py": {"model.latent_dim": 8, "model.w_dim": 8, "model.fmaps": 1 / 256,
                             "model.channel_max": 4, "model.mbstd_group": 2,
                             "model.mbstd_chunk": 4},
    # R3GAN: 8 channels a stage, groups of 4 (2 per stage), its bfloat16 stages kept.
    **{name: {"model.latent_dim": 8, "model.widths": (8,) * 4, "model.blocks": 1,
              "model.cardinality": (4,) * 4} for name in ("r3gan_cifar10.py", "r3gan_imagenet32.py")},
    # The recommended MNIST recipe (R3GAN at 28x28: three stages from a 7x7 basis).
    "mnist.py": {"model.latent_dim": 8, "model.widths": (8,) * 3, "model.blocks": 1,
                 "model.cardinality": (4,) * 3},
}
SHAPES = {"sngan_cifar10.py": (32, 32, 3), "biggan_cifar10.py": (32, 32, 3),
          "biggan_imagenet128.py": (128, 128, 3), "stylegan2_cifar10.py": (32, 32, 3),
          "r3gan_cifar10.py": (32, 32, 3), "r3gan_imagenet32.py": (32, 32, 3),
          "mnist.py": (28, 28, 1)}


def recipe(name, **overrides):
    config = runpy.run_path(os.path.join(REPO, "experiments", name))["get_config"]()
    for key, value in {**TINY[name], **overrides}.items():
        node = config
        *path, leaf = key.split(".")
        for part in path:
            node = node[part]
        node[leaf] = value
    return config


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(TINY))
def test_recipe_trains_two_steps(name, one_device, tmp_path, monkeypatch):
    config = recipe(name, **{"train.num_steps": 2, "train.global_batch_size": 4,
                             "train.log_every": 1, "train.checkpoint_every": 2,
                             "train.sample_every": 2, "eval.every": 0})
    if config.train.ema.decay:
        config.train.ema.start = 1  # Must be before the (shortened) end.
    workdir = str(tmp_path / "run")
    initial = {}  # Each network's trainable weights as built, before any step.
    build_gan = build.build_gan

    def recording_build_gan(*args, **kwargs):
        gan = build_gan(*args, **kwargs)
        for key, net in (("g", gan.generator), ("d", gan.discriminator)):
            initial[key] = [w.numpy() for w in net.trainable_weights]
        return gan

    monkeypatch.setattr(build, "build_gan", recording_build_gan)
    with tfds.testing.mock_data(num_examples=16):
        model = training.run(config, workdir, one_device, verbose=0)
    assert int(model.step.numpy()) == 2
    # Both networks trained: their weights moved from the initial ones, and are finite.
    for key, net in (("g", model.generator), ("d", model.discriminator)):
        after = [w.numpy() for w in net.trainable_weights]
        assert len(after) == len(initial[key]), key
        assert all(np.all(np.isfinite(w)) for w in after), key
        moved = max(float(np.abs(a - b).max()) for a, b in zip(after, initial[key]))
        # Adam's first updates move a weight with a gradient by ~ the learning rate.
        lr = config.train[f"{key}_optimizer"].learning_rate
        assert moved > 0.5 * lr, (key, moved, lr)
    assert os.path.exists(os.path.join(workdir, "checkpoints", "ckpt-2.index"))
    assert tuple(model.generator.output_shape[1:]) == SHAPES[name]
    # The recipe's knobs reached the model.
    assert model.num_classes == (0 if name == "sngan_cifar10.py" else
                                 1000 if "imagenet" in name else 10)
    assert (model.ema is not None) == bool(config.train.ema.decay or config.train.ema.kimg
                                           or config.train.cosine.ema_kimg)
    assert model.d_steps == config.train.d_steps
    samples, step, _, cols = sampling.from_workdir(workdir, 8, seed=0)
    assert samples.shape == (8,) + SHAPES[name] and step == 2
    assert np.all(np.isfinite(samples))
    if config.model.name not in ("stylegan2", "r3gan"):  # Linear outputs, no tanh.
        assert np.abs(samples).max() <= 1.0
    assert (cols is not None) == bool(model.num_classes)


def test_imagenet_recipe_is_the_papers_setting():
    c = runpy.run_path(os.path.join(REPO, "experiments", "biggan_imagenet128.py"))["get_config"]()
    assert c.data.source == "tfds:imagenet2012@128"
    assert (c.model.ch, c.model.latent_dim, c.model.shared_dim, c.model.attention) == (
        96, 120, 128, 64)
    assert c.train.global_batch_size == 2048 and c.train.d_steps == 2
    assert (c.train.g_optimizer.learning_rate, c.train.d_optimizer.learning_rate) == (1e-4, 4e-4)
    assert c.train.ortho_weight == 1e-4 and c.train.ema.decay == 0.9999
    training.validate(c, num_replicas=8)
