"""Scoring a generator across replicas: FID, KID, Inception Score, precision / recall.

    with strategy.scope():
        extractor = metrics.extractors.get("digits_classifier.keras", data_shape)
    scores = evaluation.evaluate(generator, latent_dim, source, extractor, strategy,
                                 num_samples=10_000, seed=0, metrics=("fid", "kid"))

Work is sharded over every replica and worker of `strategy`: each global batch of
examples (real images, or generated ones) is split over the replicas, each replica runs
the extractor on its rows and adds them to its float64 running sums
(`metrics.FeatureStats`, one all-reduce at the end). KID, IS and precision / recall need
the features themselves: each batch's features (and class probabilities) are gathered
from every replica with their row numbers (one all-reduce) and put in row order on the host.

What makes the numbers topology-independent: fake example i is generated from latents
keyed by (seed, i) alone (`latents.fixed(seed, N)[i]`: the images of the sample grids),
and real example i is example i of the source in its stored order. Batches are padded to
a multiple of the replica count with rows marked -1, which no statistic counts, so the
same N examples are scored by one device, N replicas and N workers.

Protocol (what makes published numbers comparable, fixed here): the generator runs in
inference mode (moving batch-norm statistics); real and generated images alike are
quantized to the 256 levels of uint8 before extraction (`quantize`), as images saved to
PNG would be; the extractor resizes both the same way (named in its docstring); the
number of samples is part of every result. Numbers from different extractors are not
comparable: every result carries the extractor's name, and `format_scores` prints them
together.
"""

import hashlib
import json
import os

import numpy as np
import tensorflow as tf
from absl import logging

from tf_gan_scale import errors, latents, replica
from tf_gan_scale import metrics as metrics_lib
from tf_gan_scale.architectures.calls import call_generator
from tf_gan_scale.data import pipeline, sources
from tf_gan_scale.data.sources import to_float
from tf_gan_scale.metrics import extractors

METRICS = ("fid", "kid", "is", "pr", "classes")
_CACHE_VERSION = 2  # Bump when what a cached reference file means changes.


def quantize(images):
    """[-1, 1] float images -> the nearest of the 256 uint8 levels, back in [-1, 1]
    (x -> round((x + 1) * 127.5) / 127.5 - 1, clipped, ties to even): the levels
    `images.to_uint8` writes to PNG."""
    levels = tf.round(tf.clip_by_value((images + 1.0) * 127.5, 0.0, 255.0))
    return levels / 127.5 - 1.0


def check_metrics(names, extractor=None):
    """Tuple of metric names; unknown names (or IS without class probabilities) raise
    ConfigError."""
    if isinstance(names, str):
        names = [n for n in names.replace(" ", "").split(",") if n]
    for name in names:
        errors.choose("metric", name, {m: m for m in METRICS})
    if not names:
        raise errors.ConfigError(f"no metric given; valid: {', '.join(METRICS)}")
    for name in ("is", "classes"):
        if name in names and extractor is not None and extractor.num_classes is None:
            raise errors.ConfigError(
                f"metric {name!r} needs class probabilities, which extractor "
                f"{extractor.name!r} does not give (a .keras extractor must end in a softmax "
                f"Dense layer)")
    return tuple(names)


def _padded(rows_dataset, global_batch):
    """Global batches of `rows_dataset` elements, the last padded: {"row": int32 [GB]
    (-1 for padding), ...}."""
    return rows_dataset.batch(global_batch).map(
        lambda b: {k: _pad(v, global_batch, -1 if k == "row" else 0) for k, v in b.items()})


def _per_worker(num_samples, global_batch, make):
    """The padded global batches over rows 0..num_samples-1 as an input function for
    `distribute_datasets_from_function`: each worker builds only its replicas' chunks of
    each batch (data.pipeline.Split: local replica k of worker w takes chunk k*W + w), and
    every worker the same number of batches (no collective waits on a worker that ran
    out). make(rows int64 [B], clamped to the last row) -> {name: [B, ...]}; "row" is
    added: int32 [B], -1 past the end."""
    num_batches = -(-num_samples // global_batch)

    def fn(ctx):
        split = pipeline.Split.of(ctx)
        split.check(global_batch)
        local = len(split.chunks)

        def load(e):
            rows = split.positions(e, global_batch)
            out = make(tf.minimum(rows, num_samples - 1))
            out["row"] = tf.where(rows < num_samples, tf.cast(rows, tf.int32), -1)
            return out

        options = tf.data.Options()
        options.experimental_distribute.auto_shard_policy = (
            tf.data.experimental.AutoShardPolicy.OFF)  # Already this worker's rows.
        ds = tf.data.Dataset.range(num_batches * local).map(
            load, num_parallel_calls=tf.data.AUTOTUNE, deterministic=True)
        return ds.with_options(options).prefetch(tf.data.AUTOTUNE)
    return fn


def _pad(value, size, fill):
    missing = size - tf.shape(value)[0]
    pad = [[0, missing]] + [[0, 0]] * (len(value.shape) - 1)
    return tf.pad(value, pad, constant_values=tf.cast(fill, value.dtype))


# (strategy, extractor, keep, *what images_fn depends on) -> (FeatureStats, traced step):
# evaluating again (every `config.eval.every` steps) reuses both instead of retracing.
_STREAMS = {}


def _stream(strategy, dataset, images_fn, extractor, keep, memo=None):
    """Runs `extractor(images_fn(batch))` on every replica over `dataset`: padded global
    batches (`_padded`, DATA-sharded: every worker builds each whole batch) or a
    `_per_worker` input function (each worker builds its rows only). Returns (FeatureStats, {"features" [N, D], "probs" [N, K]} in row order or
    None). `memo`: a tuple naming everything `images_fn` depends on, to reuse the traced
    step and the statistics' variables across calls."""
    key = None if memo is None else (strategy, extractor, bool(keep)) + tuple(memo)
    if key in _STREAMS:
        stats, step = _STREAMS[key]
        stats.reset()
    else:
        stats, step = _make_step(strategy, images_fn, extractor, keep)
        if key is not None:
            _STREAMS[key] = stats, step
    if isinstance(dataset, tf.data.Dataset):
        options = tf.data.Options()
        options.experimental_distribute.auto_shard_policy = (
            tf.data.experimental.AutoShardPolicy.DATA)
        dist = strategy.experimental_distribute_dataset(dataset.with_options(options))
    else:
        dist = strategy.distribute_datasets_from_function(dataset)
    parts = {}
    for batch in dist:
        for k, v in step(batch).items():
            parts.setdefault(k, []).append(v)
    if not keep:
        return stats, None
    # One host transfer per name at the end, not one per batch.
    parts = {k: np.concatenate([t.numpy() for t in v]) for k, v in parts.items()}
    rows = parts.pop("row")
    order = np.argsort(rows, kind="stable")
    order = order[rows[order] >= 0]
    return stats, {k: v[order] for k, v in parts.items()}


def _make_step(strategy, images_fn, extractor, keep):
    """(FeatureStats, tf.function step(batch) -> gathered outputs) for `_stream`."""
    with strategy.scope():
        stats = metrics_lib.FeatureStats(extractor.feature_dim)
    want_probs = keep and extractor.num_classes is not None

    def replica_step(batch):
        rows = batch["row"]
        valid = rows >= 0
        out = extractor(quantize(images_fn(batch)))
        stats.update(tf.boolean_mask(out["features"], valid))
        if not keep:
            return {}
        kept = {"row": rows, "features": out["features"]}
        if want_probs:
            kept["probs"] = out["probs"]
        return _all_gather(kept)

    @tf.function(autograph=False)  # Plain Python around ops: nothing to convert.
    def step(batch):
        out = strategy.run(replica_step, args=(batch,))
        return {k: strategy.experimental_local_results(v)[0] for k, v in out.items()}

    return stats, step


def _all_gather(values):
    """{name: [b, ...]} of this replica -> {name: [replicas * b, ...]} of all, on every
    replica (so every worker has every row). In replica context.

    An all-reduce of one-hot slots rather than `ReplicaContext.all_gather`, which fails
    under MultiWorkerMirroredStrategy in TF 2.21 ("destinations can not be empty"): each
    replica writes its rows into its own slot of a zero buffer and the buffers are summed,
    ONE collective for all names (float32; row numbers are exact below 2^24).
    """
    ctx = tf.distribute.get_replica_context()
    if ctx is None or ctx.num_replicas_in_sync == 1:
        return values
    n = ctx.num_replicas_in_sync
    slot = tf.one_hot(ctx.replica_id_in_sync_group, n, dtype=tf.float32)
    names = sorted(values)
    buffers = []
    for name in names:
        v = tf.cast(values[name], tf.float32)
        buffers.append(tf.reshape(slot, [n] + [1] * len(v.shape)) * v[None])
    summed = ctx.all_reduce(tf.distribute.ReduceOp.SUM, buffers)
    return {name: tf.cast(tf.reshape(s, tf.concat([[-1], tf.shape(s)[2:]], 0)),
                          values[name].dtype) for name, s in zip(names, summed)}


def _global_batch(strategy, batch_size):
    n = strategy.num_replicas_in_sync
    return max(1, -(-int(batch_size) // n)) * n  # A multiple of the replica count.


def fake_features(generator, latent_dim, extractor, strategy, *, num_samples, seed,
                  batch_size=256, keep=False, num_classes=0):
    """Features of `num_samples` generated examples; fake i from latents (seed, i) and,
    for a conditional generator (num_classes > 0), a uniform class label from (seed, i).

    Returns (FeatureStats, kept features or None) as `_stream`. Create the generator
    (and extractor) inside `strategy.scope()`."""
    gb = _global_batch(strategy, batch_size)

    def images(batch):
        rows = tf.maximum(batch["row"], 0)
        # latents.fixed's latents: the sample grids' too.
        z = latents.sample_normal(seed, rows, int(latent_dim))
        labels = latents.sample_labels(seed, rows, num_classes) if num_classes else None
        return call_generator(generator, z, labels)

    return _stream(strategy, _per_worker(num_samples, gb, lambda rows: {}), images,
                   extractor, keep,
                   memo=(generator, int(latent_dim), int(seed), int(num_classes), "fake"))


def real_examples(source, num_samples):
    """The first `num_samples` examples of `source` in stored order: an unbatched dataset
    of {"x": float32 [*shape] in [-1, 1], "row": int32}."""
    _check_real_count(source, num_samples)
    x = sources.examples(source, num_samples).map(lambda e: to_float(e["x"]))
    rows = tf.data.Dataset.range(num_samples).map(lambda i: tf.cast(i, tf.int32))
    return tf.data.Dataset.zip(x, rows).map(lambda x, r: {"x": x, "row": r})


def _check_real_count(source, num_samples):
    if num_samples > source.num_examples:
        raise errors.ConfigError(f"num_samples={num_samples} is more than the "
                                 f"{source.num_examples} examples of {source.name}")


def _cache_path(cache_dir, source, extractor, num_samples, keep):
    """Keyed by source (its spec names the split), resolution, N, the extractor and a
    fingerprint of its weights file: a changed key is a new file, recomputed."""
    ident = {"source": source.name, "shape": list(source.shape), "n": int(num_samples),
             "extractor": extractor.name, "keep": bool(keep), "version": _CACHE_VERSION}
    weights = getattr(extractor, "weights_path", None)
    if weights and os.path.isfile(weights):
        with open(weights, "rb") as f:
            ident["weights_sha256"] = hashlib.sha256(f.read()).hexdigest()
    key = hashlib.sha256(json.dumps(ident, sort_keys=True).encode()).hexdigest()[:16]
    return os.path.join(cache_dir, f"reference-{key}.npz")


def _read_cache(path, extractor):
    """The cached reference at `path`, or None (absent; unreadable: warned)."""
    if not os.path.isfile(path):
        return None
    try:
        with np.load(path) as f:
            ref = {k: f[k] for k in f.files}
        if ref["mu"].shape != (extractor.feature_dim,):
            raise ValueError(f"mu has shape {ref['mu'].shape}")
        return ref
    except Exception as e:  # Truncated or foreign file: recompute it.
        logging.warning("reference statistics %s are unreadable (%s); recomputing", path,
                        str(e).splitlines()[0][:200] if str(e) else type(e).__name__)
        return None


def reference(source, extractor, strategy, *, num_samples, batch_size=256, keep=False,
              cache_dir=None, write_cache=True):
    """Statistics of the real data: {"mu" [D], "sigma" [D, D], "num_samples", and with
    keep "features" [N, D] (+ "probs")}. Cached in `cache_dir` (keyed by source,
    extractor, its file's content and N): computed once, reused by every evaluation."""
    _check_real_count(source, num_samples)
    path = _cache_path(cache_dir, source, extractor, num_samples, keep) if cache_dir else None
    ref = _read_cache(path, extractor) if path else None
    # Every worker must take the same branch (computing runs collectives): a worker whose
    # cache it cannot read (another machine's ~/.cache, a file appearing meanwhile) makes
    # all of them recompute. One tiny all-reduce.
    if replica.any_worker(strategy, ref is None):
        ref = None
    if ref is not None:
        return ref
    gb = _global_batch(strategy, batch_size)
    read = source.reader()
    if read is not None:  # Each worker reads only its rows of the first N examples.
        real = _per_worker(num_samples, gb, lambda rows: {"x": to_float(read(rows)["x"])})
    else:  # A stream: every worker reads the first N, keeps its rows.
        real = _padded(real_examples(source, num_samples), gb)
    stats, kept = _stream(strategy, real, lambda b: b["x"], extractor, keep, memo=("real",))
    mu, sigma = stats.result()
    ref = {"mu": mu, "sigma": sigma, "num_samples": np.int64(num_samples), **(kept or {})}
    if path and write_cache:
        os.makedirs(cache_dir, exist_ok=True)
        tmp = f"{path}.tmp-{os.getpid()}.npz"
        np.savez(tmp, **ref)
        os.replace(tmp, path)
    return ref


def check_counts(metrics, extractor, num_samples, allow_rank_deficient=False):
    """Enough samples for each metric, else ConfigError: FID needs N >= D (fewer give
    rank-deficient covariances: a biased, unstable number) unless allowed; precision /
    recall need N > k = 3 neighbours; KID and IS need N >= 2."""
    if num_samples < 2:
        raise errors.ConfigError(f"scoring needs num_samples >= 2; Received: {num_samples}")
    if "fid" in metrics and num_samples < extractor.feature_dim and not allow_rank_deficient:
        raise errors.ConfigError(
            f"FID from {num_samples} samples of {extractor.feature_dim}-d features uses "
            f"rank-deficient covariances (a biased, unstable number); use num_samples >= "
            f"{extractor.feature_dim} or allow_rank_deficient (--allow_rank_deficient)")
    if "pr" in metrics and num_samples <= 3:
        raise errors.ConfigError(f"precision/recall use k = 3 nearest neighbours: they need "
                                 f"num_samples > 3; Received: {num_samples}")


def check_samples(samples, source, tolerance=0.01):
    """Images from elsewhere to score: float [N, *source.shape], finite, in [-1, 1]
    (up to `tolerance`); else ConfigError naming what is wrong."""
    samples = np.asarray(samples)
    if samples.ndim < 2 or tuple(samples.shape[1:]) != tuple(source.shape):
        raise errors.ConfigError(
            f"samples of shape {tuple(samples.shape)} do not match the reference data "
            f"{source.name} of example shape {tuple(source.shape)}")
    if not np.issubdtype(samples.dtype, np.floating) or not np.isfinite(samples).all():
        raise errors.ConfigError(f"samples must be finite floats in [-1, 1]; Received "
                                 f"dtype {samples.dtype}")
    low, high = float(samples.min()), float(samples.max())
    if low < -1 - tolerance or high > 1 + tolerance:
        raise errors.ConfigError(f"samples must be in [-1, 1] (the project's range); "
                                 f"Received: [{low:.4g}, {high:.4g}]")
    return samples.astype(np.float32)


def real_count(num_real, num_samples, source, key="num_real"):
    """How many real examples a score uses: num_real > 0 itself, 0 as many as the fakes
    (num_samples), -1 every example of `source` (StyleGAN's "full": fid50k_full scores
    50k fakes against the whole dataset). More than the source holds is one ConfigError
    line: a score never silently uses fewer."""
    if not errors.is_int(num_real) or num_real < -1:
        raise errors.ConfigError(f"{key} must be -1 (every real example), 0 (as many as the "
                                 f"generated ones) or a count; Received: {num_real!r}")
    n = {0: num_samples, -1: source.num_examples}.get(int(num_real), int(num_real))
    if n > source.num_examples:
        raise errors.ConfigError(
            f"{key}={num_real} asks for {n} real examples but {source.name} has "
            f"{source.num_examples}; valid: -1 (all of them), or at most {source.num_examples}")
    return n


def evaluate(generator, latent_dim, source, extractor, strategy, *, num_samples, seed=0,
             metrics=("fid",), batch_size=256, reference_stats=None, cache_dir=None,
             write_cache=True, samples=None, allow_rank_deficient=False, num_classes=0,
             num_real=0):
    """Scores `num_samples` generated examples (or the given `samples`) against the first
    `real_count(num_real, num_samples)` real ones of `source` (default: as many).

    Args:
        generator: Keras model [B, latent_dim] -> [B, *shape] (or [z, labels] -> images
            with num_classes > 0: fake i gets a uniform label keyed by (seed, i)); created
            in the strategy's scope. Unused (may be None) with `samples`.
        samples: optional float array [N, *shape] in [-1, 1]: images from anywhere
            (another framework), scored on the same terms; N replaces num_samples.
        allow_rank_deficient: FID with fewer samples than feature dimensions (singular
            covariances, a biased and unstable number) is refused unless True.
    Returns:
        {"extractor": name, "num_samples": N generated, "num_real": real examples, "fid",
        "kid", "kid_std", "is", "is_std", "precision", "recall": floats} for the requested
        metrics (KID over subsets of min(1000, N, num_real), IS over min(10, N) splits,
        PR with k = 3).
    Every replica (and worker) must call this together: it runs collectives.
    """
    metrics = check_metrics(metrics, extractor)
    if samples is not None:
        samples = check_samples(samples, source)
        num_samples = len(samples)
    elif tuple(generator.output_shape[1:]) != tuple(source.shape):
        raise errors.ConfigError(
            f"the generator makes examples of shape {tuple(generator.output_shape[1:])} but "
            f"the reference data {source.name} has {tuple(source.shape)}")
    check_counts(metrics, extractor, num_samples, allow_rank_deficient)
    n_real = real_count(num_real, num_samples, source)
    check_counts(metrics, extractor, n_real, allow_rank_deficient)
    if "classes" in metrics:
        real_labels = _real_labels(source, n_real, extractor)
    keep = any(m in metrics for m in ("kid", "pr", "is", "classes"))
    keep_real = any(m in metrics for m in ("kid", "pr"))
    ref = reference_stats or reference(source, extractor, strategy, num_samples=n_real,
                                       batch_size=batch_size, keep=keep_real,
                                       cache_dir=cache_dir, write_cache=write_cache)
    if samples is None:
        stats, fake = fake_features(generator, latent_dim, extractor, strategy,
                                    num_samples=num_samples, seed=seed,
                                    batch_size=batch_size, keep=keep,
                                    num_classes=num_classes)
    else:
        ds = tf.data.Dataset.from_tensor_slices(
            {"x": samples, "row": np.arange(num_samples, dtype=np.int32)})
        stats, fake = _stream(strategy, _padded(ds, _global_batch(strategy, batch_size)),
                              lambda b: b["x"], extractor, keep, memo=("samples",))
    out = {"extractor": extractor.name, "num_samples": int(num_samples),
           "num_real": int(ref["num_samples"])}
    if "fid" in metrics:
        mu, sigma = stats.result()
        out["fid"] = metrics_lib.frechet_distance(mu, sigma, ref["mu"], ref["sigma"])
    if "kid" in metrics:
        size = min(1000, num_samples, int(ref["num_samples"]))
        k = metrics_lib.kid(ref["features"], fake["features"], subset_size=size, seed=seed)
        out["kid"], out["kid_std"] = float(k.mean), float(k.std)
    if "is" in metrics:
        score = metrics_lib.inception_score(fake["probs"], splits=min(10, num_samples))
        out["is"], out["is_std"] = float(score.mean), float(score.std)
    if "pr" in metrics:
        pr = metrics_lib.precision_recall(ref["features"], fake["features"], k=3)
        out["precision"], out["recall"] = float(pr.precision), float(pr.recall)
    if "classes" in metrics:
        out.update(class_balance(fake["probs"], real_labels))
    return out


def _real_labels(source, num_samples, extractor):
    """Labels [N] of the first N real examples, for the "classes" metric (ConfigError when
    the source has none in memory or the classifier has another number of classes)."""
    if source.arrays is None or source.num_classes < 2:
        raise errors.ConfigError(f"metric 'classes' needs a labelled in-memory source; "
                                 f"{source.name} is not")
    if extractor.num_classes != source.num_classes:
        raise errors.ConfigError(
            f"metric 'classes' needs a classifier of the data's {source.num_classes} "
            f"classes; extractor {extractor.name!r} has {extractor.num_classes} (train one "
            f"with tools/train_classifier.py)")
    return np.asarray(source.arrays["label"][:num_samples])


def class_balance(probs, real_labels):
    """How the generated examples spread over the classes, by the classifier's argmax:
    {"class_tv": total variation distance between the fake and the real class
    frequencies (0 = the same balance, 1 = disjoint), "class_histogram": fake counts,
    "class_modes": classes with at least one fake, "class_kl": KL(fake frequencies ||
    uniform over the K classes) in nats (log K - entropy: 0 when even, log K when all on
    one class)}. The last two are Stacked MNIST's numbers (VEEGAN, PacGAN, R3GAN: modes
    covered of 1,000 and the reverse KL to uniform).

    probs: [N, K] class probabilities of N fakes; real_labels: [M] labels of real data."""
    k = probs.shape[1]
    fake = np.bincount(np.argmax(probs, axis=1), minlength=k)
    real = np.bincount(real_labels, minlength=k)
    tv = 0.5 * np.abs(fake / fake.sum() - real / real.sum()).sum()
    p = fake[fake > 0] / fake.sum()
    return {"class_tv": float(tv), "class_histogram": fake.tolist(),
            "class_modes": int(np.count_nonzero(fake)),
            "class_kl": float(np.sum(p * np.log(p * k)))}


SCORE_KEYS = ("fid", "kid", "kid_std", "is", "is_std", "precision", "recall", "class_tv")
HIGHER_IS_BETTER = ("is", "precision", "recall")


def metric_keys(names):
    """The score keys (one per number worth ranking checkpoints by) of metric names."""
    keys = {"fid": ["fid"], "kid": ["kid"], "is": ["is"], "pr": ["precision", "recall"],
            "classes": ["class_tv"]}
    return tuple(k for n in names for k in keys[n])


def better(key, new, old):
    """Whether score `new` beats `old` for score `key` (lower FID/KID, higher IS/PR)."""
    if old is None:
        return True
    return new > old if key in HIGHER_IS_BETTER else new < old


def format_scores(scores):
    """One line: every metric with the extractor it was computed with."""
    parts = []
    for key in ("fid", "kid", "is", "precision", "recall", "class_tv"):
        if key in scores:
            std = scores.get(f"{key}_std")
            parts.append(f"{key} {scores[key]:.4g}" + (f" ± {std:.2g}" if std is not None
                                                        else ""))
    if "class_modes" in scores:
        parts.append(f"class_modes {scores['class_modes']} / "
                     f"{len(scores['class_histogram'])}, class_kl {scores['class_kl']:.4g}")
    real = (f", {scores['num_real']} real" if scores.get("num_real") is not None
            and scores.get("num_real") != scores["num_samples"] else "")
    return (", ".join(parts) + f" [extractor {scores['extractor']}, "
            f"{scores['num_samples']} samples{real}]")


class FidStreams:
    """For `GAN.evaluate` with `compile(fid_extractor=...)`: float64 feature sums of the
    real and the fake examples `test_step` sees, per replica (`metrics.FeatureStats`: one
    all-reduce each at the end). A plain object, not a Keras or tf.Module attribute of the
    GAN: its state is not part of the model's weights. Create it in the GAN's strategy."""

    def __init__(self, model, spec):
        shape = tuple(model.generator.output_shape[1:])
        with model.distribute_strategy.scope():
            self.extractor = (extractors.get(spec, shape) if isinstance(spec, str)
                              else spec)
            self.real = metrics_lib.FeatureStats(self.extractor.feature_dim)
            self.fake = metrics_lib.FeatureStats(self.extractor.feature_dim)

    def update(self, real, fake):
        """In replica context: real / fake images [B, *data_shape]."""
        self.real.update(self.extractor(quantize(real))["features"])
        self.fake.update(self.extractor(quantize(fake))["features"])

    def reset(self):
        self.real.reset()
        self.fake.reset()

    def result(self):
        fid = metrics_lib.frechet_distance(*self.fake.result(), *self.real.result())
        logging.info("fid %.4g [extractor %s]", fid, self.extractor.name)
        return fid
