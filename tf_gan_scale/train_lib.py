"""run(config, workdir, strategy): one training run, resumable.

Only the chief (worker 0) writes the workdir; other workers keep their checkpoints in a
temporary directory that is removed when they finish.

Order matters for bad input: everything that can fail on user input (names, data,
batch/replica mismatch, model build, checkpoint restore) happens BEFORE the first write
to the workdir, so a bad command leaves an existing workdir exactly as it was.

Workdir layout:
    run.json                     the config, data shape and classes (for tools/sample.py)
    checkpoints/ckpt-STEP.*      G, D, both optimizers (and so the step)
    samples/step_XXXXXXX.png     sample grids from fixed latents
    logs/                        TensorBoard event files (eval/<metric> with config.eval)
    metrics.jsonl                one line of scores per evaluation (config.eval.every > 0)
    checkpoints/best/ckpt-STEP.* the best checkpoint by config.eval.best (outside rotation)
"""

import json
import math
import numbers
import os
import shutil
import tempfile

import keras
import ml_collections
import tensorflow as tf
from absl import logging

from tf_gan_scale import (architectures, callbacks, data, distribute, errors, gan as gan_lib,
                          losses, penalties, precision, schedules)
from tf_gan_scale import ema as ema_lib
from tf_gan_scale.layers import normalization

OPTIMIZERS = {"adam": keras.optimizers.Adam, "adamw": keras.optimizers.AdamW,
              "sgd": keras.optimizers.SGD, "rmsprop": keras.optimizers.RMSprop}
RUN_FILE = "run.json"


def make_optimizer(cfg, schedule=None):
    """Optimizer from a config dict {"name": ..., **kwargs}; bad names/keys raise ConfigError.

    schedule: optional (decay, warmup_steps, total_steps) for `schedules.WarmupDecay`
    around the config's learning_rate, in this optimizer's own update count."""
    cfg = dict(cfg)
    cls = errors.choose("optimizer", cfg.pop("name", None), OPTIMIZERS)
    if schedule is not None and "learning_rate" in cfg:
        decay, warmup, total = schedule
        if decay != "none" or warmup:
            cfg["learning_rate"] = schedules.WarmupDecay(cfg["learning_rate"], decay=decay,
                                                         warmup_steps=warmup,
                                                         total_steps=total)
    try:
        return cls(**cfg)
    except (TypeError, ValueError) as e:
        raise errors.ConfigError(f"bad optimizer config {dict(cfg)}: {e}") from None


def model_options(config):
    """Architecture options: everything in config.model besides name, latent_dim and
    conditional (the number of classes comes from the data: `num_classes`)."""
    return {k: (tuple(v) if isinstance(v, list) else v)
            for k, v in config.model.items()
            if k not in ("name", "latent_dim", "conditional", "sync_bn_group_size")}


def num_classes(config, data_classes):
    """Classes the model is conditioned on: 0 unless config.model.conditional, else the
    data source's (ConfigError when the source has no labels)."""
    if not config.model.get("conditional", False):
        return 0
    if not data_classes or int(data_classes) < 2:
        raise errors.ConfigError(
            f"config.model.conditional=True needs labelled data with >= 2 classes; "
            f"config.data.source={config.data.source!r} has {data_classes or 0}; valid: a "
            f"tfds dataset with a label, npz with y/labels, a folder of class sub-folders, "
            f"embedded:digits, toy:*; or conditional=False")
    return int(data_classes)


def build_networks(config, data_shape, classes=0):
    """(generator, discriminator) of config.model (weights seeded by config.seed)."""
    keras.utils.set_random_seed(config.seed)
    options = model_options(config)
    if "seed" in architectures.options(config.model.name):
        options.setdefault("seed", config.seed)  # Layer seeds (dropout) follow config.seed.
    # Layers compute in config.train.precision; variables and outputs stay float32.
    with precision.policy(config.train.get("precision", "float32")):
        return architectures.build(config.model.name, data_shape=data_shape,
                                   latent_dim=config.model.latent_dim, num_classes=classes,
                                   **options)


def placement_of(config):
    """config.parallel.placement ("g:I,d:J", or "" for none)."""
    return (config.get("parallel") or {}).get("placement", "")


def build_gan(config, data_shape, data_classes=0, placement=""):
    """GAN (built and compiled) for `config`; call inside strategy.scope().

    data_classes: the data source's number of classes (used when config.model.conditional).
    placement: "g:I,d:J" to train G on device I and D on device J of this process
    (parallel/placement.py; `run` passes config.parallel.placement), "" for none.
    Weight initialization is seeded by config.seed, so every topology starts from the
    same weights (variables are created on replica 0 and broadcast).
    """
    classes = num_classes(config, data_classes)
    g, d = build_networks(config, data_shape, classes)
    for net in (g, d):  # Batch statistics over groups of replicas (ghost BN); 0: all.
        normalization.set_group_size(net, config.model.get("sync_bn_group_size", 0))
    t = config.train
    ema = t.get("ema") or {}
    # config.model.sync_bn=False asks for per-replica batch norm: keep it so.
    model = gan_lib.GAN(g, d, config.model.latent_dim, seed=config.seed,
                        sync_batch_norm="auto" if config.model.get("sync_bn", True) else False,
                        num_classes=classes, ema_decay=ema.get("decay", 0.0),
                        ema_start=ema.get("start", 0), ema_warmup=ema.get("warmup", 0))
    if placement:  # G and D on two devices of this process, before the optimizers exist.
        from tf_gan_scale.parallel import placement as placement_lib
        placement_lib.place(model, placement_lib.devices(placement_lib.parse(placement)))
    decay, warmup = t.get("lr_decay", "none"), t.get("lr_warmup_steps", 0)
    mode = t.get("precision", "float32")
    # Schedules count each optimizer's own updates: D makes d_steps per G step.
    g_opt = make_optimizer(t.g_optimizer, (decay, warmup, t.num_steps))
    d_opt = make_optimizer(t.d_optimizer, (decay, warmup * t.d_steps, t.num_steps * t.d_steps))
    model.compile(g_optimizer=precision.optimizer(g_opt, mode),
                  d_optimizer=precision.optimizer(d_opt, mode),
                  jit_compile=jit_compile(t.get("jit_compile", "auto")),
                  loss=t.loss, d_steps=t.d_steps, penalty=t.penalty,
                  penalty_weight=t.penalty_weight, steps_per_execution=int(t.steps_per_execution) or 1,
                  **{k: t[k] for k in TECHNIQUES if k in t})
    return model


# config.train keys passed to GAN.compile as they are (see its docstring).
TECHNIQUES = ("penalty_every", "augment", "label_smoothing", "instance_noise",
              "instance_noise_steps", "lecam_weight", "lecam_decay", "ortho_weight",
              "accumulation_steps", "grad_pack_bytes")

JIT_CHOICES = ("auto", "true", "false")


def jit_compile(value):
    """config.train.jit_compile (auto | true | false, or a bool) -> bool for GAN.compile.

    "auto" is False: XLA is off where it is not known to be faster. Measured on this
    project's 2-core CPU (README, Throughput) the XLA step was slower than TensorFlow's
    oneDNN kernels; on a GPU it is not measured here (set true to try it: one replica
    only); a TPUStrategy compiles every step with XLA whatever this says.
    """
    name = str(value).lower()
    if name not in JIT_CHOICES:
        raise errors.ConfigError(f"config.train.jit_compile={value!r}; valid: "
                                 f"{', '.join(JIT_CHOICES)}")
    return name == "true"


AUTO_STEPS_PER_EXECUTION = 10  # The most steps per call that "auto" picks.


def steps_per_execution(config, start=0):
    """Steps per call of the step function: config.train.steps_per_execution, or for 0
    (auto) the largest k <= AUTO_STEPS_PER_EXECUTION dividing num_steps, log_every,
    sample_every, checkpoint_every, eval.every (the nonzero ones) and the step `start` a
    run resumes from (one trained to 6 steps, resumed to 10: 1, not 5, which would run
    to step 11).

    `run` resolves auto once it knows the resume step; `build_gan` alone (notebooks,
    tests, the benchmark) compiles one step per call for auto.

    Why: a call returns to Python once per k steps (the default digits step is ~11 ms, and
    each host round trip with its Keras batch hooks costs a part of that), while a callback
    sees only every k-th step: with k dividing every interval, each event still fires at
    its exact step. The weights do not depend on k (tests/test_gan.py).
    """
    t = config.train
    if int(t.steps_per_execution):
        return int(t.steps_per_execution)
    every = [t.num_steps, t.log_every, t.get("sample_every", 0), t.get("checkpoint_every", 0),
             (config.get("eval") or {}).get("every", 0), start]
    every = [int(e) for e in every if e]
    return max(k for k in range(1, AUTO_STEPS_PER_EXECUTION + 1)
               if all(e % k == 0 for e in every))


# Numeric keys and their valid ranges; checked before any data is read or file written.
_AT_LEAST_1 = ("train.num_steps", "train.global_batch_size", "train.d_steps",
               "train.log_every", "train.keep_checkpoints", "model.latent_dim")
# 0 turns the periodic checkpoints / sample grids off; both are still written at the end.
# steps_per_execution 0 = auto (steps_per_execution below).
_AT_LEAST_0 = ("train.checkpoint_every", "train.sample_every", "train.steps_per_execution")
_WIDTHS = ("model.g_channels", "model.d_channels", "model.hidden")


def _is_int(value):
    return isinstance(value, numbers.Integral) and not isinstance(value, bool)


def _is_real(value):
    return isinstance(value, numbers.Real) and not isinstance(value, bool)


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
            if not _is_int(value) or value < low:
                raise bad(key, value, f"an integer >= {low}")
    weight = config.train.penalty_weight
    if not _is_real(weight) or not math.isfinite(weight) or weight < 0:
        raise bad("train.penalty_weight", weight, "a finite number >= 0")
    present, dropout = _lookup(config, "model.d_dropout")
    if present and not (_is_real(dropout) and 0 <= dropout < 1):
        raise bad("model.d_dropout", dropout, "a number in [0, 1)")
    for key in ("train.g_optimizer.learning_rate", "train.d_optimizer.learning_rate"):
        present, rate = _lookup(config, key)
        if present and not (_is_real(rate) and math.isfinite(rate) and rate > 0):
            raise bad(key, rate, "a finite number > 0")
    for key in _WIDTHS:
        present, widths = _lookup(config, key)
        if present and not (isinstance(widths, (tuple, list)) and widths
                            and all(_is_int(w) and w >= 1 for w in widths)):
            raise bad(key, widths, "a non-empty tuple of integers >= 1")


def _check_eval(e):
    """config.eval: names and numbers (the extractor itself is loaded before training)."""
    if e is None:
        return
    from tf_gan_scale import evaluation
    for key, low in (("every", 0), ("num_samples", 2), ("batch_size", 1)):
        if not _is_int(e[key]) or e[key] < low:
            raise errors.ConfigError(
                f"config.eval.{key} must be an integer >= {low}; Received: {e[key]!r}")
    if e.every > 0:
        names = evaluation.check_metrics(e.metrics)
        if e.best and e.best not in evaluation.metric_keys(names):
            raise errors.ConfigError(
                f"config.eval.best={e.best!r} is not among the scores of config.eval.metrics="
                f"{e.metrics!r}; valid: {', '.join(evaluation.metric_keys(names))}, or ''")
        if not e.extractor:
            raise errors.ConfigError(
                "config.eval.every > 0 needs config.eval.extractor: inception_v3, "
                "fid_inception:PATH.pb or PATH.keras (e.g. from tools/train_classifier.py)")


def cache_dir(path=""):
    """Where reference statistics are cached: `path`, else $XDG_CACHE_HOME or ~/.cache."""
    if path:
        return path
    root = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(root, "tf_gan_scale", "reference")


def make_scorer(config, model, source, strategy, *, chief=True):
    """A function scoring `model.generator` with config.eval (evaluation.evaluate); builds
    the extractor now (inside the strategy scope) so a bad one fails before training."""
    from tf_gan_scale import evaluation
    from tf_gan_scale.metrics import extractors
    e = config.eval
    names = evaluation.check_metrics(e.metrics)
    if e.num_samples > source.num_examples:
        raise errors.ConfigError(f"config.eval.num_samples={e.num_samples} is more than the "
                                 f"{source.num_examples} examples of {source.name}")
    with strategy.scope():
        extractor = extractors.get(e.extractor, source.shape,
                                   weights=e.extractor_weights or None)
    evaluation.check_metrics(names, extractor)
    evaluation.check_counts(names, extractor, e.num_samples, e.allow_rank_deficient)

    def score():
        return evaluation.evaluate(
            model.sampler, model.latent_dim, source, extractor, strategy,
            num_samples=e.num_samples, seed=e.seed, metrics=names, batch_size=e.batch_size,
            cache_dir=cache_dir(e.cache_dir), write_cache=chief,
            allow_rank_deficient=e.allow_rank_deficient, num_classes=model.num_classes)

    return score


def validate(config, num_replicas):
    """Cheap checks of names and numbers, before any data is read or the workdir touched.

    Raises ConfigError naming the key, the value received and the valid choices.
    """
    t = config.train
    losses.get(t.loss)
    penalties.get(t.penalty)
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
    schedules.check(t.get("lr_decay", "none"), t.get("lr_warmup_steps", 0), t.num_steps)
    _check_eval(config.get("eval"))
    for key in ("num_steps", "log_every"):
        if int(t[key]) % steps_per_execution(config):
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
    if placement_of(config):
        from tf_gan_scale.parallel import placement
        placement.check(placement_of(config), num_replicas,
                        jit_compile(t.get("jit_compile", "auto")))
    if jit_compile(t.get("jit_compile", "auto")) and num_replicas > 1 and not \
            isinstance(tf.distribute.get_strategy(), tf.distribute.TPUStrategy):
        raise errors.ConfigError(
            f"config.train.jit_compile={t.jit_compile!r} needs one replica (XLA cannot "
            f"compile a step mirrored over {num_replicas} devices); valid: auto, false, or "
            f"--strategy=one_device")
    k = t.get("accumulation_steps", 1)
    if not _is_int(k) or k < 1:
        raise errors.ConfigError(f"config.train.accumulation_steps must be an integer >= 1; "
                                 f"Received: {k!r}")
    per_replica = t.global_batch_size // num_replicas
    if per_replica % k:
        divisors = [d for d in range(1, per_replica + 1) if per_replica % d == 0]
        raise errors.ConfigError(
            f"config.train.accumulation_steps={k} does not divide the per-replica batch "
            f"{per_replica} (global batch {t.global_batch_size} / {num_replicas} replicas); "
            f"valid: {', '.join(map(str, divisors))}")


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
    return config, tuple(run["data_shape"]), num_classes(config, run.get("num_classes"))


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


def run(config, workdir, strategy, *, tfds_data_dir=None, verbose="auto"):
    """Trains (or resumes) to config.train.num_steps generator steps.

    Returns:
        The GAN model after training.
    """
    t = config.train
    validate(config, strategy.num_replicas_in_sync)
    source = data.load(config.data.source, tfds_data_dir=tfds_data_dir)
    with strategy.scope():
        model = build_gan(config, source.shape, source.num_classes, placement_of(config))
    checkpoint = tf.train.Checkpoint(**model.checkpoint_items())
    # Every worker restores from the shared workdir (all must start from the same state).
    restored = restore(os.path.join(workdir, "checkpoints"), checkpoint)
    start = int(model.step.numpy())
    model.steps_per_execution = steps_per_execution(config, start)  # Before any step.
    # Data position: each generator step consumed d_steps global batches.
    dataset = data.make_dataset(source, global_batch_size=t.global_batch_size,
                                seed=config.seed, start_batch=start * t.d_steps)
    chief = distribute.is_chief(strategy)
    score = None
    if config.get("eval") is not None and config.eval.every > 0:
        score = make_scorer(config, model, source, strategy, chief=chief)
    # --- nothing above wrote to the workdir -------------------------------------------
    logging.info("%s at step %d of %d; %d replicas, global batch %d, data %s (%d examples), "
                 "%d steps per call", f"resumed {restored}" if restored else "starting",
                 start, t.num_steps, strategy.num_replicas_in_sync, t.global_batch_size,
                 source.name, source.num_examples, model.steps_per_execution)
    if start >= t.num_steps:
        logging.info("already at step %d >= num_steps %d; nothing to do", start, t.num_steps)
        return model
    # Only the chief writes the workdir. Saving a checkpoint is a step every worker takes
    # together, so the others save into a private temporary directory, removed at the end.
    out_dir = workdir if chief else tempfile.mkdtemp(prefix="tf_gan_scale_worker_")
    try:
        _train(model, config, source, dataset, strategy, checkpoint, out_dir, chief, start,
               verbose, score, workdir)
    finally:
        if not chief:
            shutil.rmtree(out_dir, ignore_errors=True)
    return model


def _first_images(source, num):
    """The first `num` examples of an in-memory image source, [N, H, W, C] in [-1, 1]
    (None for vectors or streamed sources): the real grid TensorBoard shows."""
    if source.arrays is None or len(source.shape) != 3:
        return None
    return data.sources.to_float(source.arrays["x"][:num]).numpy()


def _callbacks(config, source, strategy, checkpoint, out_dir, chief, start, verbose,
               score=None, workdir=None, manager_fn=tf.train.CheckpointManager):
    """The run's callbacks: stop, checkpoints, preemption; on the chief samples,
    TensorBoard and the progress line; scores on every worker.

    strategy: what Preemption reads of the cluster (its `cluster_resolver`, if any).
    manager_fn(checkpoint, directory, max_to_keep): the checkpoint managers' type."""
    t = config.train
    os.makedirs(out_dir, exist_ok=True)
    manager = manager_fn(checkpoint, os.path.join(out_dir, "checkpoints"),
                         max_to_keep=t.keep_checkpoints)
    cbs = [callbacks.StopAtStep(t.num_steps), callbacks.Checkpoint(manager, t.checkpoint_every),
           callbacks.Preemption(strategy, manager)]
    writer = None
    if chief:
        write_run(out_dir, config, source.shape, source)
        writer = tf.summary.create_file_writer(os.path.join(out_dir, "logs"))
        reference = None
        if source.arrays is not None and len(source.shape) == 1 and source.shape[0] == 2:
            reference = source.arrays["x"][:2000]
        cbs += [callbacks.Samples(os.path.join(out_dir, "samples"), t.sample_every,
                                  seed=config.seed, writer=writer, reference=reference),
                callbacks.Summaries(writer, t.log_every, t.global_batch_size,
                                    real=_first_images(source, 64))]
    if score is not None:  # On every worker: scoring runs collectives.
        cbs.append(callbacks.Evaluate(
            config.eval.every, score, writer=writer,
            path=os.path.join(out_dir, "metrics.jsonl") if chief else None,
            history=os.path.join(workdir, "metrics.jsonl"),
            best=config.eval.best, best_manager=manager_fn(
                checkpoint, os.path.join(out_dir, "checkpoints", "best"), max_to_keep=1)))
    # Keras "epochs" are blocks of log_every steps. Keras' bar would show every block as
    # log_every steps (also a short last one or a resumed first one): ours counts steps.
    if chief and verbose:
        cbs.append(callbacks.Progress(start, t.num_steps, t.log_every,
                                      verbose=1 if verbose == "auto" else verbose))
    return cbs


def _train(model, config, source, dataset, strategy, checkpoint, out_dir, chief, start,
           verbose, score=None, workdir=None):
    t = config.train
    cbs = _callbacks(config, source, strategy, checkpoint, out_dir, chief, start, verbose,
                     score, workdir)
    per_epoch = t.log_every
    first_epoch = start // per_epoch
    last_epoch = math.ceil(t.num_steps / per_epoch)
    model.fit(data.distribute(dataset, strategy), initial_epoch=first_epoch, epochs=last_epoch,
              steps_per_epoch=per_epoch, callbacks=cbs, verbose=0, shuffle=False)
    logging.info("finished at step %d", int(model.step.numpy()))
