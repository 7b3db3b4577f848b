"""A run's directory: what it holds, and reading and writing its pieces.

Workdir layout:
    run.json                     the config, data shape and classes (for tools/sample.py)
    checkpoints/ckpt-STEP.*      G, D, both optimizers (and so the step)
    samples/step_XXXXXXX.png     sample grids from fixed latents
    logs/                        TensorBoard event files (eval/<metric> with config.eval)
    logs/<task>.log              in a cluster: each task's log lines (cluster/rank_log.py)
    metrics.jsonl                one line of scores per evaluation (config.eval.every > 0)
    checkpoints/best/ckpt-STEP.* the best checkpoint by config.eval.best (outside rotation)

Only the chief (worker 0, DTensor client 0) writes it, but for each task's own log file;
every worker reads it on resume, so it is one directory they all share.
"""

import json
import os

import ml_collections
import tensorflow as tf

from tf_gan_scale import errors
from tf_gan_scale.training import build

RUN_FILE = "run.json"


def restore(ckpt_dir, checkpoint, path=None):
    """Restores the latest checkpoint in ckpt_dir if any (or the checkpoint `path`);
    returns its path (or None). A checkpoint of another model, or a `path` that is none,
    raises ConfigError."""
    if path is not None:
        if not tf.io.gfile.exists(f"{path}.index"):
            raise errors.ConfigError(f"no checkpoint {path!r} (expected {path}.index)")
    else:
        path = tf.train.latest_checkpoint(ckpt_dir)
    if path is None:
        return None
    try:
        # assert_existing_objects_matched: every variable of the model must be in the file.
        checkpoint.read(path).expect_partial().assert_existing_objects_matched()
    except (ValueError, AssertionError, tf.errors.OpError) as e:
        first = (str(e).strip().splitlines() or [type(e).__name__])[0]
        raise errors.ConfigError(
            f"checkpoint {path} does not match this config's model ({first[:300]}); "
            f"use a new --workdir or the config it was trained with") from None
    return path


def load_run(workdir):
    """(config, data_shape, num_classes of the model) saved by `run` in `workdir`;
    ConfigError if there is none."""
    path = os.path.join(workdir, RUN_FILE)
    if not os.path.isfile(path):
        raise errors.ConfigError(f"no training run in {workdir!r} (missing {RUN_FILE})")
    with open(path) as f:
        run = json.load(f)
    config = ml_collections.ConfigDict(run["config"])
    return config, tuple(run["data_shape"]), build.num_classes(config, run.get("num_classes"))


def write_run(workdir, config, data_shape, source=None, num_classes=None):
    """Records the run's config, data shape and the data's classes (`source`'s, else
    `num_classes`) in workdir (what `load_run` reads)."""
    path = os.path.join(workdir, RUN_FILE)
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        json.dump({"config": json.loads(config.to_json()), "data_shape": list(data_shape),
                   "num_classes": source.num_classes if source else num_classes,
                   "source": source.name if source else config.data.source}, f, indent=2)
    os.replace(tmp, path)


def cache_dir(path=""):
    """Where reference statistics are cached: `path`, else $XDG_CACHE_HOME or ~/.cache."""
    if path:
        return path
    root = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(root, "tf_gan_scale", "reference")
