"""Keras callbacks for GAN training: checkpoints, sample grids, TensorBoard, stopping.

All of them read the step from `model.step` (the generator optimizer's iteration count),
so they agree with the checkpoint numbering after a resume.
"""

import os
import time

import keras
import numpy as np
import tensorflow as tf

from tf_gan_scale import images, latents


def _step(model):
    return int(model.step.numpy())


class _Every(keras.callbacks.Callback):
    """Calls `self.fire(step, logs)` whenever the step crosses a multiple of `every` (also
    with steps_per_execution > 1, when batch-end hooks see only every k-th step), and at
    the end of training if `at_end`; never twice for the same step."""

    at_end = False

    def __init__(self, every):
        super().__init__()
        self.every = int(every)
        self._prev = None
        self._fired = None

    def _fire(self, step, logs):
        if step != self._fired:
            self._fired = step
            self.fire(step, logs)

    def on_train_batch_end(self, batch, logs=None):
        step = _step(self.model)
        prev = self._prev if self._prev is not None else step - 1
        self._prev = step
        if self.every > 0 and step // self.every > prev // self.every:
            self._fire(step, logs)

    def on_train_end(self, logs=None):
        if self.at_end:
            self._fire(_step(self.model), logs)

    def fire(self, step, logs):
        raise NotImplementedError


class StopAtStep(keras.callbacks.Callback):
    """Stops `fit` once the model reaches `num_steps` generator steps (resume-safe)."""

    def __init__(self, num_steps):
        super().__init__()
        self.num_steps = int(num_steps)

    def on_train_batch_end(self, batch, logs=None):
        if _step(self.model) >= self.num_steps:
            self.model.stop_training = True


class Checkpoint(_Every):
    """Saves a `tf.train.CheckpointManager` every `every` steps and when training ends.

    Checkpoints are numbered by step (`ckpt-STEP`); the manager updates its index file
    only after a save is complete, so an interrupted save never becomes "latest".
    """

    at_end = True

    def __init__(self, manager, every):
        super().__init__(every)
        self.manager = manager

    def fire(self, step, logs):
        if step > 0:
            self.manager.save(checkpoint_number=step)


class Samples(_Every):
    """Writes `samples/step_XXXXXXX.png` (grid or 2D scatter) from fixed latents.

    Args:
        directory: where PNGs go (created on first write).
        every: steps between grids (and one at the end of training).
        seed: seed of the fixed latents (latents.fixed).
        num: number of samples.
        writer: optional tf.summary writer that also gets the picture.
        reference: optional [M, 2] real points drawn under 2D samples.
    """

    at_end = True

    def __init__(self, directory, every, *, seed, num=64, writer=None, reference=None):
        super().__init__(every)
        self.directory, self.seed, self.num = directory, seed, num
        self.writer, self.reference = writer, reference

    def fire(self, step, logs):
        z = latents.fixed(self.seed, self.num, self.model.latent_dim)
        picture = images.render(self.model.generate(z).numpy(), self.reference)
        os.makedirs(self.directory, exist_ok=True)
        images.write_png(os.path.join(self.directory, f"step_{step:07d}.png"), picture)
        if self.writer is not None:
            with self.writer.as_default():
                tf.summary.image("samples", picture[None], step=step)


class Summaries(_Every):
    """TensorBoard scalars every `every` steps: losses, steps/sec, images/sec (global)."""

    def __init__(self, writer, every, global_batch_size):
        super().__init__(every)
        self.writer, self.global_batch_size = writer, global_batch_size
        self._t0 = self._s0 = None

    def on_train_begin(self, logs=None):
        self._t0, self._s0 = time.perf_counter(), _step(self.model)

    def fire(self, step, logs):
        now = time.perf_counter()
        rate = (step - self._s0) / max(now - self._t0, 1e-9)
        self._t0, self._s0 = now, step
        with self.writer.as_default():
            for name, value in (logs or {}).items():
                tf.summary.scalar(name, float(np.asarray(value)), step=step)
            tf.summary.scalar("steps_per_sec", rate, step=step)
            tf.summary.scalar("images_per_sec", rate * self.global_batch_size, step=step)
        self.writer.flush()

    def on_train_end(self, logs=None):
        self.writer.flush()
