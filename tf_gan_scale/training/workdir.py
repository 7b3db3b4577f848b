"""A run's directory: what it holds, and reading and writing its pieces.

Workdir layout:
    run.json                     the config of its checkpoints, segment by segment (record.py)
    checkpoints/ckpt-STEP.*      G, D, both optimizers (and so the step)
    samples/step_XXXXXXX.png     sample grids from fixed latents
    logs/                        TensorBoard event files (eval/<metric> with config.eval)
    logs/<task>.log              in a cluster: each task's log lines (cluster/rank_log.py)
    metrics.jsonl                one line of scores per evaluation (config.eval.every > 0)
    checkpoints/best/ckpt-STEP.* the best checkpoint by config.eval.best (outside rotation)
    run.lock                     while a run uses it: which run (run_lock.py)
    checkpoints/damaged/         checkpoints a resume could not read, kept for inspection

Only the chief (worker 0, DTensor client 0) writes it, but for each task's own log file;
every worker reads it on resume, so it is one directory they all share.
"""

import os

from tf_gan_scale.training import checkpoints


def restore(ckpt_dir, checkpoint, path=None):
    """Restores the newest readable checkpoint in ckpt_dir if any (or the checkpoint
    `path`); returns its path (or None). Newer checkpoints that cannot be read (damaged
    files) are passed over with one warning line; a checkpoint of another model, a
    `path` that is none or cannot be read, or no readable checkpoint at all raises
    ConfigError (checkpoints.restore, which also returns what was passed over)."""
    return checkpoints.restore(ckpt_dir, checkpoint, path).path


def cache_dir(path=""):
    """Where reference statistics are cached: `path`, else $XDG_CACHE_HOME or ~/.cache."""
    if path:
        return path
    root = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(root, "tf_gan_scale", "reference")
