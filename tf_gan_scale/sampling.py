"""Generator samples from a training run's latest checkpoint (used by tools/sample.py)."""

import os
import re

import numpy as np
import tensorflow as tf

from tf_gan_scale import architectures, errors, gan, images, latents, train_lib


def load_generator(workdir, checkpoint=None):
    """(generator, latent_dim, step, checkpoint path) from the latest checkpoint in workdir
    (or from `checkpoint`, a path such as WORKDIR/checkpoints/best/ckpt-500)."""
    config, data_shape = train_lib.load_run(workdir)
    generator, _ = architectures.build(config.model.name, data_shape=data_shape,
                                       latent_dim=config.model.latent_dim,
                                       **train_lib.model_options(config))
    ckpt_dir = os.path.join(workdir, "checkpoints")
    path = train_lib.restore(ckpt_dir, tf.train.Checkpoint(generator=generator),
                             path=checkpoint)
    if path is None:
        raise errors.ConfigError(f"no checkpoint in {ckpt_dir!r}")
    step = int(re.search(r"ckpt-(\d+)$", path).group(1))
    return generator, config.model.latent_dim, step, path


def from_workdir(workdir, num_samples, seed, batch_size=256):
    """(samples [N, *data_shape] float32, step, checkpoint path)."""
    generator, latent_dim, step, path = load_generator(workdir)
    z = latents.fixed(seed, num_samples, latent_dim)
    return gan.generate(generator, z, batch_size).numpy(), step, path


def write(path, samples):
    """Writes samples as .npy (raw) or .png (grid/scatter), atomically."""
    directory = os.path.dirname(os.path.abspath(path))
    os.makedirs(directory, exist_ok=True)
    if path.lower().endswith(".npy"):
        tmp = path + ".tmp.npy"
        np.save(tmp, samples)
        os.replace(tmp, path)
    else:
        try:
            picture = images.render(samples)
        except ValueError as e:
            raise errors.ConfigError(str(e)) from None
        images.write_png(path, picture)
