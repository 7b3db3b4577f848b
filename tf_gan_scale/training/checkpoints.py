"""A run's checkpoints on disk: resuming from the newest one that can be read, setting
damaged ones aside, and reading each one back as it is written.

A checkpoint `ckpt-STEP` is an index file and data shards (`ckpt-STEP.index`,
`ckpt-STEP.data-00000-of-00001`); `checkpoints/checkpoint` (the state file) lists the
ones tf.train.CheckpointManager keeps. A truncated or missing file (a full disk, a
partial copy between clusters) or flipped bytes make a checkpoint unreadable: that is
told apart from an intact checkpoint of another model (a ConfigError) by reading every
tensor of the files back, independently of the model (`damage`).

    found = checkpoints.restore(ckpt_dir, checkpoint)   # every worker; writes nothing
    checkpoints.set_aside(ckpt_dir, found.damaged, found.path)   # the chief, then writes
    manager = checkpoints.Manager(checkpoint, ckpt_dir, max_to_keep=3)   # checked saves

Nothing is ever deleted: damaged files move to `checkpoints/damaged/` for inspection.
"""

import copy
import dataclasses
import os
import re
import time

import tensorflow as tf
from absl import logging
from tensorflow.python.eager import context

from tf_gan_scale import errors

DAMAGED_DIR = "damaged"
STATE_FILE = "checkpoint"
_NAME = re.compile(r"^(ckpt-(\d+))\.(index|data-\d+-of-(\d+))$")

# Errors that say nothing about the files (a storage or network hiccup, a lost peer):
# raised as they are, never taken for damage, so a retry reads the files again.
PASS_THROUGH = (tf.errors.UnavailableError, tf.errors.DeadlineExceededError,
                tf.errors.AbortedError, tf.errors.CancelledError)
# What reading a damaged file raises: IndexError "Read less bytes than requested" (a
# truncated data shard), DataLossError (a CRC mismatch), NotFoundError (a missing
# shard), OpError "not an sstable" (a damaged index), OutOfRangeError, ValueError.
_READ_ERRORS = (tf.errors.OpError, IndexError, ValueError, AssertionError, EOFError)


def _first_line(error):
    return ((str(error).strip().splitlines() or [type(error).__name__])[0])[:300]


def step_of(path):
    """The step of checkpoint `path` (".../ckpt-STEP"), or None for another name."""
    match = re.search(r"ckpt-(\d+)$", str(path))
    return int(match.group(1)) if match else None


def _state(ckpt_dir):
    """The state file's CheckpointState, or None if it is missing or unreadable."""
    try:
        return tf.train.get_checkpoint_state(ckpt_dir)
    except ValueError:  # Parsed, but names no checkpoint.
        return None


def candidates(ckpt_dir):
    """The checkpoints of ckpt_dir to try, newest first: those the state file lists (a
    checkpoint is recorded there once its save completed: files on disk that it does
    not list are an interrupted save, which the next save of that step overwrites);
    without a readable state file (a partial copy, a lost file), the `ckpt-STEP` files
    on disk, so that the resume does not start afresh and overwrite them."""
    state = _state(ckpt_dir)
    if state is not None:
        paths = [state.model_checkpoint_path, *state.all_model_checkpoint_paths]
        steps = {step_of(p) for p in paths} - {None}
    elif tf.io.gfile.isdir(ckpt_dir):
        steps = {int(m.group(2)) for m in map(_NAME.match, tf.io.gfile.listdir(ckpt_dir))
                 if m}
    else:
        steps = set()
    return [os.path.join(ckpt_dir, f"ckpt-{s}") for s in sorted(steps, reverse=True)]


def damage(path):
    """None if every file of checkpoint `path` is present and every tensor reads back
    (CRC-checked), else "FILE: what is wrong" naming the file at fault. Independent of
    any model; reads the whole checkpoint once."""
    base = os.path.basename(path)
    if not tf.io.gfile.exists(f"{path}.index"):
        return f"{base}.index: missing"
    try:
        reader = tf.train.load_checkpoint(path)
    except PASS_THROUGH:
        raise
    except _READ_ERRORS as e:
        return f"{base}.index: {_first_line(e)}"
    shards = sorted(s for s in tf.io.gfile.glob(f"{path}.data-*")
                    if _NAME.match(os.path.basename(s)))
    # Each shard's name says how many there are ("-of-00003"); none found: at least one.
    counts = {int(_NAME.match(os.path.basename(s)).group(4)) for s in shards} or {1}
    expected = {f"{base}.data-{i:05d}-of-{n:05d}" for n in counts for i in range(n)}
    missing = sorted(expected - {os.path.basename(s) for s in shards})
    if missing:
        return f"{', '.join(missing)}: missing"
    try:
        for name in reader.get_variable_to_dtype_map():
            reader.get_tensor(name)
    except PASS_THROUGH:
        raise
    except _READ_ERRORS as e:
        # Several shards: the one the error names (a CRC error does), else all of them.
        shard = re.search(r"shard (\d+)", str(e))
        where = (os.path.basename(shards[0]) if len(shards) == 1 else
                 f"{base}.data-{int(shard.group(1)):05d}-of-{len(shards):05d}" if shard else
                 f"{base}.data-*")
        return f"{where}: {_first_line(e)}"
    return None


@dataclasses.dataclass(frozen=True)
class Found:
    """The checkpoint a resume restored (None: none, a new run) and the newer ones it
    passed over as unreadable: ((path, "FILE: what is wrong"), ...), newest first."""

    path: str = None
    damaged: tuple = ()

    @property
    def lost_steps(self):
        """Steps that will be trained again: newest damaged step - restored step."""
        if not self.damaged:
            return 0
        return step_of(self.damaged[0][0]) - (step_of(self.path) or 0)

    def warning(self):
        """One line: the unreadable checkpoints, why, and where training resumes."""
        paths = [p for p, _ in self.damaged]
        names = ", ".join([paths[0], *map(os.path.basename, paths[1:])])
        why = "; ".join(reason for _, reason in self.damaged)
        folder = os.path.join(os.path.dirname(paths[0]), DAMAGED_DIR)
        return (f"checkpoint{'s' if len(paths) > 1 else ''} {names} cannot be read ({why}); "
                f"resuming from {os.path.basename(self.path)}: {self.lost_steps} steps will "
                f"be trained again (the damaged files are kept, in {folder})")


def _read(checkpoint, path):
    """Restores `checkpoint` from `path`, whose files are intact (`damage`): an error now
    means another model's checkpoint (ConfigError)."""
    try:
        # assert_existing_objects_matched: every variable of the model must be in the file.
        checkpoint.read(path).expect_partial().assert_existing_objects_matched()
    except PASS_THROUGH:
        raise
    except (*_READ_ERRORS, tf.errors.OpError) as e:
        raise errors.ConfigError(
            f"checkpoint {path} does not match this config's model ({_first_line(e)}); "
            f"use a new --workdir or the config it was trained with") from None


def choose(ckpt_dir, path=None):
    """The checkpoint a resume (or a tool) is to restore, without any model: the newest
    readable one of ckpt_dir, or the one at `path`; a Found. Writes nothing: every
    worker calls it on the shared directory, and the same files give every worker the
    same choice. Known before the model is built, so the record can be checked against
    the config that trained it (record.check).

    Each checkpoint's files are read back whole (`damage`) before a model reads them
    (`restore`): a failed read would leave restorations pending on the model's objects
    (of variables created later, such as the checkpoint's save counter) that still point
    at the damaged files. Newer unreadable checkpoints are passed over with one warning
    line (Found.warning). ConfigError (one line): a `path` that is none or cannot be
    read, or checkpoints none of which can be read."""
    if path is not None:
        if not tf.io.gfile.exists(f"{path}.index"):
            raise errors.ConfigError(f"no checkpoint {path!r} (expected {path}.index)")
        reason = damage(path)
        if reason is not None:
            raise errors.ConfigError(f"checkpoint {path} cannot be read ({reason}); valid: "
                                     f"another checkpoint, or none for the run's latest")
        return Found(path)
    damaged = []
    for candidate in candidates(ckpt_dir):
        reason = damage(candidate)
        if reason is not None:
            damaged.append((candidate, reason))
            continue
        found = Found(candidate, tuple(damaged))
        if damaged:
            logging.warning("%s", found.warning())
        return found
    if damaged:
        raise errors.ConfigError(
            f"no checkpoint in {ckpt_dir} can be read: "
            f"{'; '.join(f'{os.path.basename(p)} ({r})' for p, r in damaged)}; nothing was "
            f"changed; valid: another --workdir, or move these files away to start fresh")
    return Found()


def restore(ckpt_dir, checkpoint, path=None, found=None):
    """Restores into `checkpoint` the checkpoint `choose` picks (or `found`, a Found it
    gave); returns the Found. ConfigError also for a checkpoint of another model."""
    found = found or choose(ckpt_dir, path)
    if found.path is not None:
        _read(checkpoint, found.path)
    return found


def set_aside(ckpt_dir, damaged, restored):
    """Moves the files of the `damaged` checkpoints (Found.damaged) into
    ckpt_dir/damaged/ and makes the state file list only checkpoints up to `restored`.

    The chief alone, once the run is validated and before its CheckpointManager exists:
    the manager would save over ckpt-STEP.* when training passes STEP again and, from
    the state file, delete old checkpoints in its rotation. Other workers may still be
    reading: they find the damaged files either in place or gone, and pass over them
    either way. The files first: killed before the state file is written, a resume finds
    the listed checkpoint's files missing and passes over it again."""
    if not damaged:
        return None
    folder = os.path.join(ckpt_dir, DAMAGED_DIR)
    if any(tf.io.gfile.exists(os.path.join(folder, os.path.basename(f)))
           for p, _ in damaged for f in tf.io.gfile.glob(f"{p}.*")):
        folder = os.path.join(folder, time.strftime("%Y%m%d-%H%M%S"))  # Keep the older.
    tf.io.gfile.makedirs(folder)
    for path, _ in damaged:
        for name in tf.io.gfile.glob(f"{path}.*"):
            tf.io.gfile.rename(name, os.path.join(folder, os.path.basename(name)))
    state = _state(ckpt_dir)
    limit = step_of(restored)
    paths = list(state.all_model_checkpoint_paths) if state else []
    stamps = list(state.all_model_checkpoint_timestamps) if state else []
    # A state file written without timestamps (older tools): now, for each.
    listed = zip(paths, stamps + [time.time()] * (len(paths) - len(stamps)))
    keep = [(os.path.basename(p), t) for p, t in listed if (step_of(p) or 0) <= limit]
    if os.path.basename(restored) not in [name for name, _ in keep]:
        keep.append((os.path.basename(restored), time.time()))
        keep.sort(key=lambda kept: step_of(kept[0]))
    proto = tf.compat.v1.train.generate_checkpoint_state_proto(
        ckpt_dir, os.path.basename(restored), [name for name, _ in keep],
        all_model_checkpoint_timestamps=[t for _, t in keep],
        last_preserved_timestamp=state.last_preserved_timestamp if state else time.time())
    _write_atomically(os.path.join(ckpt_dir, STATE_FILE), str(proto))
    logging.info("moved the files of %s to %s",
                 ", ".join(os.path.basename(p) for p, _ in damaged), folder)
    return folder


def _write_atomically(path, text):
    """Writes `text` to `path` through a temporary file: a reader sees old or new."""
    tmp = f"{path}.tmp"
    with tf.io.gfile.GFile(tmp, "w") as f:
        f.write(text)
    tf.io.gfile.rename(tmp, path, overwrite=True)


def check_written(path):
    """Raises errors.CheckpointError (one line) if checkpoint `path`, just written,
    cannot be read back (`damage`)."""
    # A DTensor save runs asynchronously: its files are complete once pending ops are.
    context.async_wait()
    reason = damage(path)
    if reason is not None:
        raise errors.CheckpointError(
            f"checkpoint {path} was written but cannot be read back ({reason}); it is not "
            f"recorded as the latest and no older checkpoint was removed; check the "
            f"storage (space, quota), then rerun the command to resume")


class Manager(tf.train.CheckpointManager):
    """A tf.train.CheckpointManager that reads back every checkpoint it writes
    (`check_written`) before recording it in the state file and removing old ones:
    a save that cannot be read raises errors.CheckpointError, and the previous
    checkpoints stay as they were (the manager's own bookkeeping is a write callback
    that runs after this one)."""

    def save(self, checkpoint_number=None, check_interval=True, options=None):
        options = copy.copy(options) if options is not None else tf.train.CheckpointOptions()
        # A lambda: check_written looked up at each save (tests wrap it).
        options.experimental_write_callbacks = [
            *(options.experimental_write_callbacks or []), lambda path: check_written(path)]
        return super().save(checkpoint_number, check_interval=check_interval, options=options)


def agree(strategy, start, workdir):
    """Raises ConfigError (one line, on every worker) if the workers of a
    MultiWorkerMirroredStrategy restored different steps from `workdir`, e.g. one saw a
    damaged checkpoint its peers read (not a shared directory, or one that changed
    during the resume). A collective: every worker calls it at the same point."""
    if not isinstance(strategy, tf.distribute.MultiWorkerMirroredStrategy):
        return  # One process reads the workdir (DTensor clients: mesh.spread).
    steps = strategy.gather(strategy.experimental_distribute_values_from_function(
        lambda _: tf.constant([start], tf.int64)), axis=0).numpy()
    low, high = int(steps.min()), int(steps.max())
    if low != high:
        raise errors.ConfigError(
            f"the workers restored different steps ({low} to {high}; this worker: {start}) "
            f"from --workdir={workdir}; valid: one directory that every worker shares "
            f"(NFS, a volume claim, gs://), unchanged while they start")
