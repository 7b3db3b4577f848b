"""Training-binary checkpoints <-> `.keras` files (tools/keras_file.py).

    info = keras_io.workdir_to_keras("runs/digits", "digits.keras")
    info = keras_io.keras_to_workdir("digits.keras", config, "runs/digits_more")

A run's checkpoint holds both networks and both optimizers (their slots and the step, which
is `g_optimizer.iterations`); a `GAN.save` file holds the same plus the settings. The first
call loads the latest checkpoint into the GAN that the run's config builds and saves it; the
second copies a `.keras` GAN's weights and optimizer state into the GAN that `config` builds
and writes them as checkpoint `ckpt-STEP` of a new workdir, from which
`python -m tf_gan_scale.main --config=... --workdir=...` resumes (and `tools/sample.py`
samples). Both refuse to overwrite anything, check that the two models match weight by
weight, and write to a temporary name renamed at the end.
"""

import os
import re
import zipfile

import keras
import tensorflow as tf

from tf_gan_scale import errors, training
from tf_gan_scale import gan as gan_lib
from tf_gan_scale.keras_files import check_new, save_new
from tf_gan_scale.training import checkpoints


def workdir_to_keras(workdir, output):
    """Saves the latest checkpoint of the run in `workdir` as a `.keras` file.

    Returns {"step", "checkpoint", "output"}. Bad input (no run, no checkpoint, an
    existing output) raises ConfigError before anything is written.
    """
    check_new(output)
    training.load_run(workdir)  # No run here: that line first, not "no checkpoint".
    ckpt_dir = os.path.join(workdir, "checkpoints")
    found = checkpoints.choose(ckpt_dir)
    if found.path is None:
        raise errors.ConfigError(f"no checkpoint in {ckpt_dir!r}")
    # The config of the segment that trained this checkpoint (run.json, record.py).
    config, data_shape, classes = training.load_run(workdir, checkpoints.step_of(found.path))
    model = training.build_gan(config, data_shape, classes)
    path = checkpoints.restore(ckpt_dir, tf.train.Checkpoint(**model.checkpoint_items()),
                               found=found).path
    save_new(model, output)
    return {"step": int(model.step.numpy()), "checkpoint": path, "output": os.fspath(output)}


def _copy(what, targets, sources):
    """Assigns source variables to target variables, in order; ConfigError on a mismatch."""
    targets, sources = list(targets), list(sources)
    shapes = lambda vs: [tuple(v.shape) for v in vs]  # noqa: E731
    if shapes(targets) != shapes(sources):
        raise errors.ConfigError(
            f"the .keras {what} does not match the config's: {len(sources)} variables of "
            f"shapes {shapes(sources)[:6]}... vs {len(targets)} of {shapes(targets)[:6]}...; "
            f"pass the config the model was built with")
    for t, s in zip(targets, sources):
        t.assign(s.numpy())


def keras_to_workdir(keras_path, config, workdir):
    """Writes the GAN saved in `keras_path` as checkpoint ckpt-STEP of a new run in
    `workdir` (absent or without checkpoints), for the model `config` builds.

    Returns {"step", "checkpoint", "workdir"}. The config must build the same networks and
    optimizers (same architecture and sizes, same optimizer types); its data source must
    have the .keras generator's output shape, checked when the binary resumes.
    """
    if not str(keras_path).endswith(".keras") or not os.path.isfile(keras_path):
        raise errors.ConfigError(f"--from_keras must be an existing .keras file; "
                                 f"Received: {keras_path!r}")
    training.validate(config, 1)
    ckpt_dir = os.path.join(workdir, "checkpoints")
    if tf.train.latest_checkpoint(ckpt_dir) is not None:
        raise errors.ConfigError(f"{workdir!r} already holds checkpoints; choose a new "
                                 f"--workdir (nothing is overwritten)")
    if not zipfile.is_zipfile(keras_path):
        raise errors.ConfigError(f"{keras_path!r} is not a .keras file (not a zip archive)")
    try:
        source = keras.models.load_model(keras_path)
    except (ValueError, TypeError, OSError) as e:
        first = (str(e).strip().splitlines() or [type(e).__name__])[0]
        raise errors.ConfigError(f"cannot load {keras_path!r} as a GAN: {first[:300]}") from None
    if not isinstance(source, gan_lib.GAN):
        raise errors.ConfigError(f"{keras_path!r} holds a {type(source).__name__}, not a "
                                 f"tf_gan_scale GAN (saved with GAN.save)")
    data_shape = tuple(source.generator.output_shape[1:])
    model = training.build_gan(config, data_shape, source.num_classes)
    _copy("generator", model.generator.variables, source.generator.variables)
    _copy("discriminator", model.discriminator.variables, source.discriminator.variables)
    _copy("g_optimizer", model.g_optimizer.variables, source.g_optimizer.variables)
    _copy("d_optimizer", model.d_optimizer.variables, source.d_optimizer.variables)
    if model.ema is not None:
        # The saved EMA if there is one; else the EMA restarts from the saved generator
        # (never from the config's random initialization).
        saved = source.ema.model if source.ema is not None else source.generator
        _copy("ema_generator", model.ema.model.variables, saved.variables)
    if getattr(model, "lecam_anchors", None) is not None and \
            getattr(source, "lecam_anchors", None) is not None:
        model.lecam_anchors.assign(source.lecam_anchors.numpy())
    step = int(model.step.numpy())
    checkpoint = tf.train.Checkpoint(**model.checkpoint_items())
    os.makedirs(workdir, exist_ok=True)
    training.write_run(workdir, config, data_shape, num_classes=source.num_classes or None)
    path = tf.train.CheckpointManager(checkpoint, ckpt_dir, max_to_keep=None).save(
        checkpoint_number=step)
    assert re.search(r"ckpt-\d+$", path), path
    return {"step": step, "checkpoint": path, "workdir": os.fspath(workdir)}
