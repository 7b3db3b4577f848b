"""Generator samples from a training run's latest checkpoint (used by tools/sample.py)."""

import os

import numpy as np
import tensorflow as tf

from tf_gan_scale import errors, images, latents, training
from tf_gan_scale.architectures import stylegan2
from tf_gan_scale.architectures.calls import generate
from tf_gan_scale.training import checkpoints


def load_generator(workdir, checkpoint=None, ema=True):
    """(generator, latent_dim, step, checkpoint path) from the latest checkpoint in workdir
    (or from `checkpoint`, a path such as WORKDIR/checkpoints/best/ckpt-500).

    With ema=True (the default) a run trained with an EMA (config.train.ema.decay > 0, or
    StyleGAN's config.train.ema.kimg > 0) gives its EMA generator, the one to sample and score; ema=False the raw one.
    The generator's `num_classes` attribute is the number of classes it is conditioned
    on (0: unconditional)."""
    training.load_run(workdir)  # No run here: that line first, not "no checkpoint".
    ckpt_dir = os.path.join(workdir, "checkpoints")
    found = checkpoints.choose(ckpt_dir, checkpoint)
    if found.path is None:
        raise errors.ConfigError(f"no checkpoint in {ckpt_dir!r}")
    step = checkpoints.step_of(found.path)
    # The config of the segment that trained this checkpoint (run.json, record.py).
    config, data_shape, classes = training.load_run(workdir, step)
    generator, _ = training.build_networks(config, data_shape, classes)
    generator.num_classes = classes
    settings = config.train.get("ema") or {}
    use_ema = ema and (settings.get("decay", 0.0) > 0 or settings.get("kimg", 0.0) > 0)
    ckpt = (tf.train.Checkpoint(ema_generator=generator) if use_ema
            else tf.train.Checkpoint(generator=generator))
    path = checkpoints.restore(ckpt_dir, ckpt, found=found).path
    return generator, config.model.latent_dim, step, path


def labels_for(generator, num_samples, class_id=None):
    """(labels int32 [N] or None, grid columns or None) for sampling `generator`:
    None for an unconditional one; all `class_id` if given; else a class per row.
    A class id outside [0, num_classes) raises ConfigError."""
    classes = getattr(generator, "num_classes", 0)
    if not classes:
        if class_id is not None:
            raise errors.ConfigError(f"--class_id={class_id} but the model is unconditional "
                                     f"(trained with config.model.conditional=False)")
        return None, None
    if class_id is None:
        return images.class_rows(num_samples, classes)
    if not 0 <= class_id < classes:
        raise errors.ConfigError(f"--class_id={class_id} is out of range; valid: 0 to "
                                 f"{classes - 1} ({classes} classes)")
    return np.full([num_samples], class_id, np.int32), None


def from_workdir(workdir, num_samples, seed, batch_size=256, *, class_id=None,
                 truncation=None, ema=True):
    """(samples [N, *data_shape] float32, step, checkpoint path, grid columns or None).

    Sample i comes from latents (seed, i) and, conditional, class `class_id` or a class
    per grid row. `truncation` = t: z truncated to [-t, t] (BigGAN's trick); for a style
    generator (stylegan2) the truncation psi in w space instead, w_avg + psi (w - w_avg)
    on every layer (StyleGAN's trick; 1 = none), with t in (0, 1]."""
    if truncation is not None and not truncation > 0:
        raise errors.ConfigError(f"--truncation must be > 0; Received: {truncation}")
    generator, latent_dim, step, path = load_generator(workdir, ema=ema)
    labels, cols = labels_for(generator, num_samples, class_id)
    if stylegan2.is_style_generator(generator):
        if truncation is not None and truncation > 1:
            raise errors.ConfigError(f"--truncation={truncation} is StyleGAN's psi for this "
                                     f"model; valid: 0 < psi <= 1 (1: no truncation)")
        z = latents.fixed(seed, num_samples, latent_dim)
        samples = np.concatenate([
            stylegan2.sample(generator, z[i:i + batch_size],
                             None if labels is None else labels[i:i + batch_size],
                             psi=1.0 if truncation is None else truncation).numpy()
            for i in range(0, num_samples, batch_size)])
        return samples, step, path, cols
    z = latents.fixed(seed, num_samples, latent_dim, truncation)
    samples = generate(generator, z, batch_size, labels).numpy()
    return samples, step, path, cols


def write(path, samples, cols=None):
    """Writes samples as .npy (raw) or .png (grid/scatter, `cols` columns), atomically."""
    directory = os.path.dirname(os.path.abspath(path))
    os.makedirs(directory, exist_ok=True)
    if path.lower().endswith(".npy"):
        tmp = path + ".tmp.npy"
        np.save(tmp, samples)
        os.replace(tmp, path)
    else:
        try:
            picture = images.render(samples, cols=cols)
        except ValueError as e:
            raise errors.ConfigError(str(e)) from None
        images.write_png(path, picture)
