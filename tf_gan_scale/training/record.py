"""The workdir's record, `run.json`: the config its checkpoints were trained with.

    {"config": {...},              the latest segment's config (what tools/sample.py reads)
     "data_shape": [H, W, C], "num_classes": N, "source": "embedded:digits",
     "segments": [{"step": 0, "config": {...}},
                  {"step": 500, "changed": {"train.num_steps": [1000, 3000]}, "config": {...}}]}

A segment is a stretch of training under one config; a resume under another config
starts a new one at the step it resumed from. So the record stays true: whatever trained
the checkpoints beside it is written in it, step by step.

A resume is checked, before anything is restored (`check`), against the segment that
trained the checkpoint it resumes from (`covering`: after a damaged newer checkpoint is
passed over, that may be an earlier segment than the last):
- keys that do not change the math (`FREE`: run length, logging, checkpoint, sample and
  evaluation cadence, the topology) change freely, with one line;
- any other change (model, seed, loss, optimizers, batch, data, precision, augmentation,
  ...) is refused in one line listing each key and its two values, unless the user
  names it in `allowed` (the binary's --allow_changes): then it is recorded.
Only a workdir that holds checkpoints is checked: without one nothing was trained yet,
and the new config simply replaces the record. A key that only one of the two configs
has is a change (an experiment file that adds `beta_1` changes the math), unless the side
that has it holds `configs.base()`'s default: a key a newer version of the project added.
"""

import json
import os

import ml_collections
import tensorflow as tf
from absl import logging

from tf_gan_scale import configs, errors
from tf_gan_scale.training import build

RUN_FILE = "run.json"

# Keys (or key prefixes, ending in ".") whose value does not enter the training math:
# a resume may change them. The topology is among them because N replicas, N workers,
# a mesh or a placement train the same weights as one device (docs/distributed_math.md);
# so is XLA (the same math, rounded differently) and the gradient packs of the all-reduce.
FREE = ("train.num_steps", "train.log_every", "train.checkpoint_every",
        "train.sample_every", "train.keep_checkpoints", "train.steps_per_execution",
        "train.jit_compile", "train.grad_pack_bytes", "eval.", "parallel.")
# num_steps is free only when no schedule ends at it (schedules.py: a linear or cosine
# learning-rate decay reaches 0 at num_steps, so a longer run has other rates).
_SCHEDULED = ("linear", "cosine")
ALL = "all"  # allowed=("all",): every change is intended.
ABSENT = "(absent)"  # A key one of two configs does not have.


def _flat(tree, prefix=""):
    """{"train.g_optimizer.learning_rate": 1e-4, ...} of a JSON config dict."""
    out = {}
    for key, value in tree.items():
        if isinstance(value, dict):
            out.update(_flat(value, f"{prefix}{key}."))
        else:
            out[f"{prefix}{key}"] = value
    return out


def as_json(config):
    """A ConfigDict as the record holds it (tuples become lists, as JSON has them)."""
    return json.loads(config.to_json())


def is_free(key, old_config):
    """Whether a change of `key` leaves the math alone (see FREE) for a run recorded with
    `old_config` (a flat dict)."""
    if key == "train.num_steps":
        return old_config.get("train.lr_decay", "none") not in _SCHEDULED
    return any(key == f or (f.endswith(".") and key.startswith(f)) for f in FREE)


def changes(old, new):
    """{key: (old value, new value)} of two JSON config dicts; a key only one has is
    (value, ABSENT) or (ABSENT, value), unless its value is configs.base()'s default
    (a key a newer version of the project added or removed: the run had its default)."""
    a, b = _flat(old), _flat(new)
    default = _flat(as_json(configs.base()))
    out = {}
    for k in sorted(a.keys() | b.keys()):
        x, y = a.get(k, ABSENT), b.get(k, ABSENT)
        one_sided = ABSENT in (x, y)
        if x != y and not (one_sided and k in default and default[k] in (x, y)):
            out[k] = (x, y)
    return out


def covering(segments, step):
    """The segment that trained checkpoint `step`: the last one that started before it
    (a segment starting at `step` trained nothing that checkpoint holds)."""
    before = [s for s in segments if s["step"] < step]
    return before[-1] if before else segments[0]


def read(workdir):
    """The record in `workdir` as a dict (a record written before segments existed gets
    one segment from step 0), or None if there is none."""
    path = os.path.join(workdir, RUN_FILE)
    if not tf.io.gfile.exists(path):
        return None
    with tf.io.gfile.GFile(path) as f:
        run = json.load(f)
    run.setdefault("segments", [{"step": 0, "config": run["config"]}])
    return run


def _show(value):
    if value == ABSENT:
        return ABSENT
    return json.dumps(value) if not isinstance(value, str) else repr(value)


def check(config, workdir, step, allowed=()):
    """Compares `config` with the record of the checkpoint a resume restores, before
    restoring it.

    Args:
        config: the run's ConfigDict.
        workdir: the run directory.
        step: the step of the checkpoint to be restored (checkpoints.choose), None when
            there is none (a new run: nothing to compare).
        allowed: keys whose change the user intends (the binary's --allow_changes), or
            ("all",).
    Returns:
        The segments to record so far (a list; [] for a new run) and the changes
        ({key: (old, new)}) that start a new segment ({} if none).
    Raises:
        ConfigError: a key that changes the math differs and is not allowed; or `allowed`
            names a key the config does not have.
    """
    new = as_json(config)
    run = read(workdir)
    old = None if run is None or step is None else covering(run["segments"], step)["config"]
    keys = _flat(new).keys() | (_flat(old).keys() if old else set())  # Removed ones too.
    unknown = [k for k in allowed if k != ALL and k not in keys]
    if unknown:
        raise errors.ConfigError(
            f"--allow_changes names {', '.join(unknown)}, not keys of this config; valid: "
            f"dotted config keys such as seed,train.d_optimizer.learning_rate, or {ALL}")
    if old is None:
        return [], {}
    diff = changes(old, new)
    flat_old = _flat(old)
    math = {k: v for k, v in diff.items() if not is_free(k, flat_old)}
    refused = {k: v for k, v in math.items() if ALL not in allowed and k not in allowed}
    if refused:
        listed = "; ".join(f"{k}: {_show(a)} -> {_show(b)}" for k, (a, b) in refused.items())
        raise errors.ConfigError(
            f"--workdir={workdir} holds checkpoints trained with another config ({listed}); "
            f"valid: the recorded values (run.json), another --workdir, or "
            f"--allow_changes={','.join(refused)} to continue under the new values and "
            f"record the change")
    if diff:
        logging.info("config changed since the checkpoints were written (%s); recorded "
                     "in %s as a new segment", "; ".join(
                         f"{k}: {_show(a)} -> {_show(b)}"
                         + ("" if k not in math else " (allowed)")
                         for k, (a, b) in diff.items()), RUN_FILE)
    return run["segments"], diff


def segments_after(segments, config, start, diff):
    """The segments to record for a run that starts (or resumes) at step `start` with
    `config`: the recorded ones (`check`'s) that trained the restored checkpoint, plus a
    new one when there is none yet or the config changed (`diff`, `check`'s). Segments
    from `start` on go: their steps are trained again (a segment that started there
    trained nothing a checkpoint holds, or only a damaged one passed over)."""
    kept = [s for s in segments if s["step"] < int(start)]
    if kept and not diff:
        return kept
    segment = {"step": int(start), "config": as_json(config)}
    if kept:
        segment["changed"] = {k: list(v) for k, v in diff.items()}
    return kept + [segment]


def write(workdir, config, data_shape, source=None, num_classes=None, segments=None):
    """Records the run's config, data shape, the data's classes (`source`'s, else
    `num_classes`) and its segments (default: one from step 0) in workdir: what `load`
    and `check` read. Atomic: written aside, then renamed over the old record."""
    segments = segments or [{"step": 0, "config": as_json(config)}]
    path = os.path.join(workdir, RUN_FILE)
    tmp = path + ".tmp"
    with tf.io.gfile.GFile(tmp, "w") as f:
        json.dump({"config": as_json(config), "data_shape": list(data_shape),
                   "num_classes": source.num_classes if source else num_classes,
                   "source": source.name if source else config.data.source,
                   "segments": segments}, f, indent=2)
    tf.io.gfile.rename(tmp, path, overwrite=True)


def load(workdir, step=None):
    """(config, data_shape, num_classes of the model) recorded in `workdir`: the config
    of the segment that trained checkpoint `step` (default: the latest segment's, which
    a run records before its first checkpoint under it), for tools that read that
    checkpoint; ConfigError if there is none."""
    run = read(workdir)
    if run is None:
        raise errors.ConfigError(f"no training run in {workdir!r} (missing {RUN_FILE})")
    config = ml_collections.ConfigDict(
        run["config"] if step is None else covering(run["segments"], step)["config"])
    return config, tuple(run["data_shape"]), build.num_classes(config, run.get("num_classes"))
