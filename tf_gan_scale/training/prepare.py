"""Preparing a run: everything that can fail on user input, before anything is written.

    prepared = prepare.prepare_run(config, workdir, num_replicas=2, scope=strategy.scope())

Both runners (`training.run` for tf.distribute and placements, `training.mesh_runner` for a
DTensor mesh) call `prepare`: names and numbers (`validate`), the data, the model, the
restored checkpoint and the input pipeline at the restored step. Nothing here writes to
the workdir, so a bad command leaves an existing workdir exactly as it was.
"""

import contextlib
import dataclasses
import math
import os
from typing import Any

import tensorflow as tf

from tf_gan_scale import architectures, data, errors, precision, schedules
from tf_gan_scale.architectures import stylegan2
from tf_gan_scale.gan import StepConfig
from tf_gan_scale.gan import ema as ema_lib
from tf_gan_scale.layers import normalization
from tf_gan_scale.metrics import extractors, scoring
from tf_gan_scale.parallel import placement
from tf_gan_scale.training import build, checkpoints, record, workdir


# Numeric keys and their valid ranges; checked before any data is read or file written.
# (The step's knobs, d_steps and penalty_weight among them, are StepConfig's.)
_AT_LEAST_1 = ("train.num_steps", "train.global_batch_size", "train.log_every",
               "train.keep_checkpoints", "model.latent_dim")
# 0 turns the periodic checkpoints / sample grids off; both are still written at the end.
# steps_per_execution 0 = auto (steps_per_execution below).
_AT_LEAST_0 = ("train.checkpoint_every", "train.sample_every", "train.steps_per_execution")
_WIDTHS = ("model.g_channels", "model.d_channels", "model.hidden")


def _lookup(config, key):
    """(present, value) of a dotted key such as "train.log_every"."""
    node = config
    for part in key.split("."):
        if not hasattr(node, "keys") or part not in node:
            return False, None
        node = node[part]
    return True, node


def _check_numbers(config):
    """Raises ConfigError for the first numeric key outside its valid range."""

    def bad(key, value, valid):
        return errors.ConfigError(f"config.{key} must be {valid}; Received: {value!r}")

    for keys, low in ((_AT_LEAST_1, 1), (_AT_LEAST_0, 0)):
        for key in keys:
            value = _lookup(config, key)[1]
            if not errors.is_int(value) or value < low:
                raise bad(key, value, f"an integer >= {low}")
    present, dropout = _lookup(config, "model.d_dropout")
    if present and not (errors.is_real(dropout) and 0 <= dropout < 1):
        raise bad("model.d_dropout", dropout, "a number in [0, 1)")
    for key in ("train.g_optimizer.learning_rate", "train.d_optimizer.learning_rate"):
        present, rate = _lookup(config, key)
        if present and not (errors.is_real(rate) and math.isfinite(rate) and rate > 0):
            raise bad(key, rate, "a finite number > 0")
    for key in _WIDTHS:
        present, widths = _lookup(config, key)
        if present and not (isinstance(widths, (tuple, list)) and widths
                            and all(errors.is_int(w) and w >= 1 for w in widths)):
            raise bad(key, widths, "a non-empty tuple of integers >= 1")


def _check_eval(e):
    """config.eval: names and numbers (the extractor itself is loaded before training)."""
    if e is None:
        return
    for key, low in (("every", 0), ("num_samples", 2), ("batch_size", 1)):
        if not errors.is_int(e[key]) or e[key] < low:
            raise errors.ConfigError(
                f"config.eval.{key} must be an integer >= {low}; Received: {e[key]!r}")
    if e.every > 0:
        names = scoring.check_metrics(e.metrics)
        if e.best and e.best not in scoring.metric_keys(names):
            raise errors.ConfigError(
                f"config.eval.best={e.best!r} is not among the scores of config.eval.metrics="
                f"{e.metrics!r}; valid: {', '.join(scoring.metric_keys(names))}, or ''")
        if not e.extractor:
            raise errors.ConfigError(
                "config.eval.every > 0 needs config.eval.extractor: inception_v3, "
                "fid_inception:PATH.pb or PATH.keras (e.g. from tools/train_classifier.py)")


def validate(config, num_replicas):
    """Cheap checks of names and numbers, before any data is read or the workdir touched.

    Raises ConfigError naming the key, the value received and the valid choices.
    """
    t = config.train
    tpu = isinstance(tf.distribute.get_strategy(), tf.distribute.TPUStrategy)
    # The step's knobs (loss, penalty, d_steps, weights, XLA...): their one validation.
    StepConfig.from_train(t).validate(num_replicas=num_replicas, tpu=tpu)
    architectures.options(config.model.name)
    _check_numbers(config)
    normalization.check_config(config.model.get("sync_bn_group_size", 0), num_replicas,
                               sync_bn=config.model.get("sync_bn", True))
    if config.model.get("conditional", False) and not architectures.conditional(
            config.model.name):
        raise errors.ConfigError(
            f"config.model.conditional=True but architecture {config.model.name!r} is "
            f"unconditional; conditional architectures: "
            f"{', '.join(n for n in architectures.ARCHITECTURES if architectures.conditional(n))}")
    if t.get("ema") is not None:
        ema_lib.check(t.ema.decay, t.ema.start, t.ema.warmup, t.num_steps,
                      prefix="config.train.ema.")
        ema_lib.check_kimg(t.ema.get("kimg", 0.0), t.ema.get("rampup", 0.0),
                           t.global_batch_size, prefix="config.train.ema.")
    schedules.check(t.get("lr_decay", "none"), t.get("lr_warmup_steps", 0), t.num_steps)
    build.cosine_options(t)  # R3GAN's schedules of the optimizers and the EMA.
    _check_eval(config.get("eval"))
    for key in ("num_steps", "log_every"):
        if int(t[key]) % build.steps_per_execution(config):
            # One call of the step function runs steps_per_execution steps: a run (and a
            # Keras "epoch" of log_every steps) must be a whole number of calls.
            raise errors.ConfigError(
                f"config.train.{key}={t[key]} is not a multiple of config.train."
                f"steps_per_execution={t.steps_per_execution}")
    if t.global_batch_size % num_replicas:
        raise errors.ConfigError(
            f"config.train.global_batch_size={t.global_batch_size} is not divisible by the "
            f"{num_replicas} replicas; use a multiple of {num_replicas}")
    precision.check(t.get("precision", "float32"))
    if t.get("grad_nan_to_num", False) and t.get("precision") == "mixed_float16":
        # Cleaned gradients would hide from the loss scaler the overflows it is steered by.
        raise errors.ConfigError(
            "config.train.grad_nan_to_num=True cannot run with config.train.precision="
            "'mixed_float16' (its loss scaling needs to see overflows); valid: float16 "
            "blocks without loss scaling (config.model.num_fp16_res, precision float32 or "
            "mixed_bfloat16), or grad_nan_to_num=False")
    if config.model.name == "stylegan2":  # Minibatch-std chunks must not straddle replicas.
        stylegan2.check_batch(config.model, t.global_batch_size // num_replicas)
    for key in ("style_mixing", "pl_weight"):  # Before anything is built or written.
        if t.get(key, 0.0) and config.model.name != "stylegan2":
            raise errors.ConfigError(
                f"config.train.{key}={t[key]} needs a style generator; Received: "
                f"config.model.name={config.model.name!r}; valid: 'stylegan2', or {key}=0")
    if build.placement_of(config):
        step_config = StepConfig.from_train(t)
        placement.check(build.placement_of(config), num_replicas, step_config.xla,
                        step_config)
    k = t.get("accumulation_steps", 1)
    per_replica = t.global_batch_size // num_replicas
    if per_replica % k:
        divisors = [d for d in range(1, per_replica + 1) if per_replica % d == 0]
        raise errors.ConfigError(
            f"config.train.accumulation_steps={k} does not divide the per-replica batch "
            f"{per_replica} (global batch {t.global_batch_size} / {num_replicas} replicas); "
            f"valid: {', '.join(map(str, divisors))}")


def make_scorer(config, model, source, strategy, *, chief=True):
    """A function scoring `model.generator` with config.eval (scoring.evaluate); builds
    the extractor now (inside the strategy scope) so a bad one fails before training."""
    e = config.eval
    names = scoring.check_metrics(e.metrics)
    scoring.real_count(e.get("num_real", 0), e.num_samples, source, "config.eval.num_real")
    with strategy.scope():
        extractor = extractors.get(e.extractor, source.shape,
                                   weights=e.extractor_weights or None)
    scoring.check_metrics(names, extractor)
    scoring.check_counts(names, extractor, e.num_samples, e.allow_rank_deficient)

    def score():
        return scoring.evaluate(
            model.sampler, model.latent_dim, source, extractor, strategy,
            num_samples=e.num_samples, seed=e.seed, metrics=names, batch_size=e.batch_size,
            cache_dir=workdir.cache_dir(e.cache_dir), write_cache=chief,
            allow_rank_deficient=e.allow_rank_deficient, num_classes=model.num_classes,
            num_real=e.get("num_real", 0))

    return score


@dataclasses.dataclass
class Prepared:
    """A run ready to train: its data source, compiled GAN (restored), the checkpoint of
    its items, the restored checkpoint's path (None for a new run), the step it starts
    at and its input positioned there (a data.input_fn: `data.distribute(input, strategy)`
    for per-worker batches, `input()` for global ones), and the segments its record
    (run.json) is to hold (record.segments_after)."""

    source: Any
    model: Any
    checkpoint: tf.train.Checkpoint
    restored: str
    start: int
    input: Any
    segments: list
    # Newer checkpoints that could not be read (checkpoints.Found.damaged): the chief
    # sets them aside (checkpoints.set_aside) before it writes.
    damaged: tuple = ()


def prepare_run(config, run_dir, *, num_replicas, scope=None, check=None, placement_spec="",
                tfds_data_dir=None, allowed_changes=(), claim=None):
    """Validates `config` (for `num_replicas` replicas over which the global batch splits,
    then `check(config)`, an engine's own refusals, then against the record of the
    checkpoints in `run_dir`: a change of the math not in `allowed_changes` is refused,
    record.check), loads the data, builds the GAN inside
    `scope` (a strategy's scope, or none), restores the latest checkpoint of `run_dir`
    if any and positions the input pipeline at the restored step. Writes nothing.

    Every worker (and DTensor client) restores from the shared run_dir: all must start
    from the same state. `claim()`, if given, runs once the config is valid and before
    run_dir is read (the runners': run_lock.Claim.acquire, one run per workdir)."""
    t = config.train
    validate(config, num_replicas)
    if check is not None:
        check(config)
    if claim is not None:  # One run per workdir: before it is read (run_lock.Claim).
        claim()
    source = data.load(config.data.source, tfds_data_dir=tfds_data_dir)
    data.check_batch_size(source, t.global_batch_size)  # Here: the dataset is built lazily.
    # After the checks of the input itself (a bad value is named as such), before the
    # restore: a changed model would fail it with a shape error, a changed seed not at
    # all; the record names every differing key instead.
    ckpt_dir = os.path.join(run_dir, "checkpoints")
    found = checkpoints.choose(ckpt_dir)  # Model-free: the record names its trainer.
    segments, changes = record.check(config, run_dir, checkpoints.step_of(found.path),
                                     allowed_changes)
    with scope or contextlib.nullcontext():
        model = build.build_gan(config, source.shape, source.num_classes, placement_spec)
    checkpoint = tf.train.Checkpoint(**model.checkpoint_items())
    found = checkpoints.restore(ckpt_dir, checkpoint, found=found)
    restored = found.path
    start = int(model.step.numpy())
    # Data position: each generator step consumed batches_per_step global batches.
    per_step = StepConfig.from_train(t).batches_per_step
    input_fn = data.input_fn(source, global_batch_size=t.global_batch_size, seed=config.seed,
                             start_batch=start * per_step)
    return Prepared(source, model, checkpoint, restored, start, input_fn,
                    record.segments_after(segments, config, start, changes),
                    damaged=found.damaged)
