"""Keras callbacks for GAN training: checkpoints, sample grids, TensorBoard, stopping.

All of them read the step from `model.step` (the generator optimizer's iteration count),
so they agree with the checkpoint numbering after a resume. What they read of the model
is `TrainedModel`: `gan.GAN` offers it, and so does a mesh run's `parallel.step.HostView`.
"""

import json
import os
import shutil
import signal
import sys
import tempfile
import time
import typing
from typing import Any

import keras
import numpy as np
import tensorflow as tf
from absl import logging

from tf_gan_scale import images, latents
from tf_gan_scale.cluster.launch import PREEMPTED_EXIT_CODE
from tf_gan_scale.metrics import scoring


class TrainedModel(typing.Protocol):
    """What the callbacks (and `prepare.make_scorer`) read of the model they watch."""

    latent_dim: int
    num_classes: int        # 0 when unconditional.
    stop_training: bool     # Set by StopAtStep (and Keras' EarlyStopping).
    g_optimizer: Any        # `.learning_rate`: the next update's (Summaries).
    d_optimizer: Any

    @property
    def step(self): ...     # int64 scalar: generator steps taken.

    @property
    def sampler(self): ...  # The generator to sample and score (EMA if any).

    def generate(self, z, batch_size=256, labels=None): ...  # [N, latent_dim] -> images


def _step(model):
    return int(model.step.numpy())


class Every(keras.callbacks.Callback):
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


class Evaluate(Every):
    """Scores the generator every `every` steps and when training ends.

    `score()` returns scoring.evaluate's dict; it runs collectives, so this callback
    runs on EVERY worker. The chief (given `writer` and `path`) writes TensorBoard scalars
    `eval/<metric>` and appends {"step", **scores} as one JSON line to `path`. With
    `best` (a score key) and `best_manager`, a step that beats every earlier one (in this
    run and in the lines of `history`, the run's metrics.jsonl that every worker reads)
    is saved by `best_manager` on every worker, as checkpoints are (the others' managers
    write to their temporary directories): all workers reach the same verdict.
    """

    at_end = True

    def __init__(self, every, score, writer=None, path=None, best="", best_manager=None,
                 history=None):
        super().__init__(every)
        self.score, self.writer, self.path, self.history = score, writer, path, history
        self.best, self.best_manager = best, best_manager
        self._best_value = None

    def on_train_begin(self, logs=None):
        # A resumed run continues the comparison with the scores it logged before.
        if self.best and self.history and os.path.isfile(self.history):
            with open(self.history) as f:
                for line in f:
                    value = json.loads(line).get(self.best)
                    if value is not None and scoring.better(self.best, value,
                                                               self._best_value):
                        self._best_value = value

    def fire(self, step, logs):
        scores = self.score()
        logging.info("step %d: %s", step, scoring.format_scores(scores))
        if self.best and self.best_manager is not None and scoring.better(
                self.best, scores[self.best], self._best_value):
            self._best_value = scores[self.best]
            self.best_manager.save(checkpoint_number=step)
            logging.info("step %d: best %s so far (%.4g); saved %s", step, self.best,
                         self._best_value, self.best_manager.latest_checkpoint)
        if self.writer is not None:
            with self.writer.as_default():
                for name, value in scores.items():
                    if isinstance(value, float):
                        tf.summary.scalar(f"eval/{name}", value, step=step)
            self.writer.flush()
        if self.path is not None:
            with open(self.path, "a") as f:
                f.write(json.dumps({"step": step, **scores}) + "\n")


class StopAtStep(keras.callbacks.Callback):
    """Stops `fit` once the model reaches `num_steps` generator steps (resume-safe)."""

    def __init__(self, num_steps):
        super().__init__()
        self.num_steps = int(num_steps)

    def on_train_batch_end(self, batch, logs=None):
        if _step(self.model) >= self.num_steps:
            self.model.stop_training = True


class Checkpoint(Every):
    """Saves a `tf.train.CheckpointManager` every `every` steps and when training ends.

    Checkpoints are numbered by step (`ckpt-STEP`); the manager updates its index file
    only after a save is complete, so an interrupted save never becomes "latest"; the
    runs' manager (checkpoints.Manager) also reads the files back first, and one that
    does not read back stops the run (errors.CheckpointError) before old ones are removed.
    """

    at_end = True

    def __init__(self, manager, every):
        super().__init__(every)
        self.manager = manager

    def fire(self, step, logs):
        if step > 0:
            self.manager.save(checkpoint_number=step)


class Preemption(keras.callbacks.Callback):
    """On SIGTERM to ANY worker, every worker saves a checkpoint at the same step and the
    process exits with PREEMPTED_EXIT_CODE (143); a restart resumes at exactly that step.

    Built on `tf.distribute.experimental.PreemptionCheckpointHandler`: the signalled worker
    picks "after the next step" and tells the others through the coordination service
    (no collective per step). The handler counts its calls to agree on that step, and
    would restore its count from the checkpoint it is given -- on the chief from the
    shared workdir but on other workers from their private directories, so the counts
    would disagree after a resume. It therefore gets a private, empty checkpoint (count
    0 everywhere) and saves through `save_fn`: the run's own manager, numbered by step.

    Args:
        strategy: the run's strategy (its cluster resolver, if any, defines the cluster).
        manager: the run's tf.train.CheckpointManager.
    """

    def __init__(self, strategy, manager):
        super().__init__()
        self.strategy, self.manager = strategy, manager
        self.handler = self._dir = self._sigterm = None

    def on_train_begin(self, logs=None):
        # The handler takes over SIGTERM; after training it must kill the process again.
        self._sigterm = signal.getsignal(signal.SIGTERM)
        self._dir = tempfile.mkdtemp(prefix="tf_gan_scale_preemption_")
        resolver = getattr(self.strategy, "cluster_resolver", None)
        if resolver is not None and not resolver.cluster_spec().jobs:
            resolver = None
        self.handler = tf.distribute.experimental.PreemptionCheckpointHandler(
            resolver, tf.train.CheckpointManager(tf.train.Checkpoint(), self._dir, 1),
            termination_config=tf.distribute.experimental.TerminationConfig(
                exit_fn=self._exit, save_fn=self._save))

    def _save(self):
        step = _step(self.model)
        latest = self.manager.latest_checkpoint
        if latest is None or not latest.endswith(f"-{step}"):  # Not saved at this step yet.
            self.manager.save(checkpoint_number=step)
        logging.info("preemption: saved checkpoint at step %d", step)

    def _exit(self):
        self._cleanup()
        sys.exit(PREEMPTED_EXIT_CODE)

    def on_train_batch_end(self, batch, logs=None):
        self.handler.save_checkpoint_if_preempted()

    def on_train_end(self, logs=None):
        self._cleanup()

    def _cleanup(self):
        if self._dir:
            shutil.rmtree(self._dir, ignore_errors=True)
            self._dir = None
        if self._sigterm is not None:
            signal.signal(signal.SIGTERM, self._sigterm)
            self._sigterm = None


class Samples(Every):
    """Writes `samples/step_XXXXXXX.png` (grid or 2D scatter) from fixed latents, of the
    EMA generator if any (`GAN.sampler`); a conditional model's grid has a class per row.

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
        labels = cols = None
        if getattr(self.model, "num_classes", 0):  # One class per row.
            labels, cols = images.class_rows(self.num, self.model.num_classes)
        picture = images.render(self.model.generate(z, labels=labels).numpy(),
                                self.reference, cols=cols)
        os.makedirs(self.directory, exist_ok=True)
        images.write_png(os.path.join(self.directory, f"step_{step:07d}.png"), picture)
        if self.writer is not None:
            with self.writer.as_default():
                tf.summary.image("samples", picture[None], step=step)


class Summaries(Every):
    """TensorBoard every `every` steps: the logs (losses, global gradient norms), both
    learning rates, steps/sec, images/sec (global); and at the start a grid of `real`
    images (the same view as the sample grids), if given."""

    def __init__(self, writer, every, global_batch_size, real=None):
        super().__init__(every)
        self.writer, self.global_batch_size, self.real = writer, global_batch_size, real
        self._t0 = self._s0 = None

    def on_train_begin(self, logs=None):
        self._t0, self._s0 = time.perf_counter(), _step(self.model)
        if self.real is not None and np.ndim(self.real) == 4:
            with self.writer.as_default():
                tf.summary.image("real", images.render(self.real)[None], step=self._s0)

    def fire(self, step, logs):
        now = time.perf_counter()
        rate = (step - self._s0) / max(now - self._t0, 1e-9)
        self._t0, self._s0 = now, step
        with self.writer.as_default():
            for name, value in (logs or {}).items():
                tf.summary.scalar(name, float(np.asarray(value)), step=step)
            for name in ("g", "d"):
                lr = getattr(self.model, f"{name}_optimizer").learning_rate
                tf.summary.scalar(f"{name}_learning_rate", float(np.asarray(lr)), step=step)
            tf.summary.scalar("steps_per_sec", rate, step=step)
            tf.summary.scalar("images_per_sec", rate * self.global_batch_size, step=step)
            # StyleGAN2-ADA's state (global, the same on every replica).
            for name in ("ada_p", "pl_mean"):
                if getattr(self.model, name, None) is not None:
                    tf.summary.scalar(name, float(getattr(self.model, name).numpy()), step=step)
        self.writer.flush()
        # Global numbers: losses are means over all replicas and workers, throughput is
        # of the whole job (global batch), the step is the generator step; kimg (real
        # images shown to D, in thousands) as StyleGAN users count progress.
        logging.info("step %d: %s; %.1f kimg, %.2f steps/s, %.1f images/s (global)", step,
                     ", ".join(f"{k}={float(np.asarray(v)):.4f}" for k, v in (logs or {}).items()),
                     step * self.global_batch_size / 1000.0, rate,
                     rate * self.global_batch_size)

    def on_train_end(self, logs=None):
        self.writer.flush()


class Progress(keras.callbacks.Callback):
    """A progress bar per block of `every` steps, sized to the steps the block really has.

    Training from step `start` to `num_steps` is shown in blocks ending at multiples of
    `every` and at `num_steps`, so the first block of a resumed run and the last block may
    be shorter (resume at 150 of 320, every 100: blocks of 50, 100, 20). Keras' own bar
    would show each fit "epoch" as `every` steps. Updated from `model.step`, so it is
    right also when batch-end hooks see only every k-th step (steps_per_execution=k).

    Args:
        start: the step training starts (or resumes) at.
        num_steps: the step training ends at.
        every: block size (config.train.log_every).
        verbose: 1 (a bar) or 2 (one line per block), as Keras' `fit(verbose=...)`.
    """

    def __init__(self, start, num_steps, every, verbose=1):
        super().__init__()
        self.start, self.num_steps, self.every = int(start), int(num_steps), int(every)
        self.verbose = verbose
        self._bar = None
        self._pos = self._begin = self._end = self.start  # Last step shown; open block.

    def _open(self):
        # The block after the last step shown: up to the next multiple of `every`.
        self._begin = self._pos
        self._end = min((self._pos // self.every + 1) * self.every, self.num_steps)
        _print(f"Steps {self._begin + 1}-{self._end} of {self.num_steps}")
        # The logged losses are already running means: show them as they are.
        self._bar = keras.utils.Progbar(self._end - self._begin, verbose=self.verbose,
                                        stateless_metrics=())

    def on_train_batch_end(self, batch, logs=None):
        step = min(_step(self.model), self.num_steps)
        values = [(k, float(np.asarray(v))) for k, v in (logs or {}).items()]
        while self._pos < step:  # Several blocks when one execution crossed a boundary.
            if self._bar is None:
                self._open()
            self._pos = min(step, self._end)
            done = self._pos == self._end
            self._bar.update(self._pos - self._begin, values, finalize=done)
            if done:
                self._bar = None

    def on_train_end(self, logs=None):
        if self._bar is not None:  # Stopped inside a block: end its line where it stood.
            self._bar.update(self._pos - self._begin, finalize=True)
            self._bar = None


def _print(message):
    """A line where Keras prints its progress: stdout, or absl logging when Keras'
    interactive logging is off."""
    if keras.config.is_interactive_logging_enabled():
        sys.stdout.write(message + "\n")
        sys.stdout.flush()
    else:
        logging.info(message)
