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

Numbers from different extractors are not comparable: every result carries the
extractor's name, and `format_scores` prints them together.
"""

import hashlib
import json
import os

import numpy as np
import tensorflow as tf
from absl import logging

from tf_gan_scale import errors, latents
from tf_gan_scale import metrics as metrics_lib
from tf_gan_scale.data.sources import to_float

METRICS = ("fid", "kid", "is", "pr")
_CACHE_VERSION = 1  # Bump when what a cached reference file means changes.


def check_metrics(names, extractor=None):
    """Tuple of metric names; unknown names (or IS without class probabilities) raise
    ConfigError."""
    if isinstance(names, str):
        names = [n for n in names.replace(" ", "").split(",") if n]
    for name in names:
        errors.choose("metric", name, {m: m for m in METRICS})
    if not names:
        raise errors.ConfigError(f"no metric given; valid: {', '.join(METRICS)}")
    if "is" in names and extractor is not None and extractor.num_classes is None:
        raise errors.ConfigError(
            f"metric 'is' needs class probabilities, which extractor {extractor.name!r} "
            f"does not give (a .keras extractor must end in a softmax Dense layer)")
    return tuple(names)


def _padded(rows_dataset, global_batch):
    """Global batches of `rows_dataset` elements, the last padded: {"row": int32 [GB]
    (-1 for padding), ...}."""
    return rows_dataset.batch(global_batch).map(
        lambda b: {k: _pad(v, global_batch, -1 if k == "row" else 0) for k, v in b.items()})


def _pad(value, size, fill):
    missing = size - tf.shape(value)[0]
    pad = [[0, missing]] + [[0, 0]] * (len(value.shape) - 1)
    return tf.pad(value, pad, constant_values=tf.cast(fill, value.dtype))


def _stream(strategy, dataset, images_fn, extractor, keep):
    """Runs `extractor(images_fn(batch))` on every replica over `dataset` of padded global
    batches. Returns (FeatureStats, {"features" [N, D], "probs" [N, K]} in row order or
    None)."""
    with strategy.scope():
        stats = metrics_lib.FeatureStats(extractor.feature_dim)
    want_probs = keep and extractor.num_classes is not None

    def replica_step(batch):
        rows = batch["row"]
        valid = rows >= 0
        out = extractor(images_fn(batch))
        stats.update(tf.boolean_mask(out["features"], valid))
        if not keep:
            return {}
        kept = {"row": rows, "features": out["features"]}
        if want_probs:
            kept["probs"] = out["probs"]
        return _all_gather(kept)

    @tf.function
    def step(batch):
        out = strategy.run(replica_step, args=(batch,))
        return {k: strategy.experimental_local_results(v)[0] for k, v in out.items()}

    options = tf.data.Options()
    options.experimental_distribute.auto_shard_policy = tf.data.experimental.AutoShardPolicy.DATA
    dist = strategy.experimental_distribute_dataset(dataset.with_options(options))
    parts = {}
    for batch in dist:
        for k, v in step(batch).items():
            parts.setdefault(k, []).append(v.numpy())
    if not keep:
        return stats, None
    rows = np.concatenate(parts.pop("row"))
    order = np.argsort(rows, kind="stable")
    order = order[rows[order] >= 0]
    return stats, {k: np.concatenate(v)[order] for k, v in parts.items()}


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
                  batch_size=256, keep=False):
    """Features of `num_samples` generated examples; fake i from latents (seed, i).

    Returns (FeatureStats, kept features or None) as `_stream`. Create the generator
    (and extractor) inside `strategy.scope()`."""
    gb = _global_batch(strategy, batch_size)
    rows = tf.data.Dataset.range(num_samples).map(lambda i: {"row": tf.cast(i, tf.int32)})
    k = latents.key(seed, latents.SAMPLE_STEP, 0)  # latents.fixed's key: sample grids too.

    def images(batch):
        z = latents.rows_normal(k, tf.maximum(batch["row"], 0), [int(latent_dim)])
        return generator(z, training=False)

    return _stream(strategy, _padded(rows, gb), images, extractor, keep)


def real_examples(source, num_samples):
    """The first `num_samples` examples of `source` in stored order: an unbatched dataset
    of {"x": float32 [*shape] in [-1, 1], "row": int32}."""
    if num_samples > source.num_examples:
        raise errors.ConfigError(f"num_samples={num_samples} is more than the "
                                 f"{source.num_examples} examples of {source.name}")
    if source.arrays is not None:
        x = tf.data.Dataset.from_tensor_slices(source.arrays["x"][:num_samples]).map(to_float)
    else:
        x = source.stream.map(lambda e: e["x"]).take(num_samples)
    rows = tf.data.Dataset.range(num_samples).map(lambda i: tf.cast(i, tf.int32))
    return tf.data.Dataset.zip(x, rows).map(lambda x, r: {"x": x, "row": r})


def _cache_path(cache_dir, source, extractor, num_samples, keep):
    ident = {"source": source.name, "extractor": extractor.name, "n": int(num_samples),
             "keep": bool(keep), "version": _CACHE_VERSION}
    path = extractor.name.split(":", 1)[-1]
    if os.path.isfile(path):  # A file-based extractor: its content, not only its name.
        with open(path, "rb") as f:
            ident["file_sha256"] = hashlib.sha256(f.read()).hexdigest()
    key = hashlib.sha256(json.dumps(ident, sort_keys=True).encode()).hexdigest()[:16]
    return os.path.join(cache_dir, f"reference-{key}.npz")


def reference(source, extractor, strategy, *, num_samples, batch_size=256, keep=False,
              cache_dir=None, write_cache=True):
    """Statistics of the real data: {"mu" [D], "sigma" [D, D], "num_samples", and with
    keep "features" [N, D] (+ "probs")}. Cached in `cache_dir` (keyed by source,
    extractor, its file's content and N): computed once, reused by every evaluation."""
    path = None
    if cache_dir:
        path = _cache_path(cache_dir, source, extractor, num_samples, keep)
        if os.path.isfile(path):
            with np.load(path) as f:
                return {k: f[k] for k in f.files}
    gb = _global_batch(strategy, batch_size)
    stats, kept = _stream(strategy, _padded(real_examples(source, num_samples), gb),
                          lambda b: b["x"], extractor, keep)
    mu, sigma = stats.result()
    ref = {"mu": mu, "sigma": sigma, "num_samples": np.int64(num_samples), **(kept or {})}
    if path and write_cache:
        os.makedirs(cache_dir, exist_ok=True)
        tmp = f"{path}.tmp-{os.getpid()}.npz"
        np.savez(tmp, **ref)
        os.replace(tmp, path)
    return ref


def evaluate(generator, latent_dim, source, extractor, strategy, *, num_samples, seed=0,
             metrics=("fid",), batch_size=256, reference_stats=None, cache_dir=None,
             write_cache=True):
    """Scores `num_samples` generated examples against as many real ones.

    Returns {"extractor": name, "num_samples": N, "fid": float, "kid": {"mean", "std"},
    "is": {"mean", "std"}, "precision": float, "recall": float} for the requested metrics.
    Every replica (and worker) must call this together: it runs collectives.
    """
    metrics = check_metrics(metrics, extractor)
    keep = any(m in metrics for m in ("kid", "pr", "is"))
    keep_real = any(m in metrics for m in ("kid", "pr"))
    ref = reference_stats or reference(source, extractor, strategy, num_samples=num_samples,
                                       batch_size=batch_size, keep=keep_real,
                                       cache_dir=cache_dir, write_cache=write_cache)
    stats, fake = fake_features(generator, latent_dim, extractor, strategy,
                                num_samples=num_samples, seed=seed, batch_size=batch_size,
                                keep=keep)
    out = {"extractor": extractor.name, "num_samples": int(num_samples)}
    if "fid" in metrics:
        mu, sigma = stats.result()
        out["fid"] = metrics_lib.frechet_distance(mu, sigma, ref["mu"], ref["sigma"])
    if "kid" in metrics:
        size = min(1000, num_samples)
        k = metrics_lib.kid(ref["features"], fake["features"], subset_size=size, seed=seed)
        out["kid"] = {"mean": float(k.mean), "std": float(k.std)}
    if "is" in metrics:
        score = metrics_lib.inception_score(fake["probs"], splits=min(10, num_samples))
        out["is"] = {"mean": float(score.mean), "std": float(score.std)}
    if "pr" in metrics:
        pr = metrics_lib.precision_recall(ref["features"], fake["features"], k=3)
        out["precision"], out["recall"] = float(pr.precision), float(pr.recall)
    return out


def format_scores(scores):
    """One line: every metric with the extractor it was computed with."""
    parts = []
    for key in ("fid", "kid", "is", "precision", "recall"):
        if key in scores:
            v = scores[key]
            parts.append(f"{key} {v['mean']:.4g} ± {v['std']:.2g}" if isinstance(v, dict)
                         else f"{key} {v:.4g}")
    return (", ".join(parts) + f" [extractor {scores['extractor']}, "
            f"{scores['num_samples']} samples]")


class FidStreams:
    """For `GAN.evaluate` with `compile(fid_extractor=...)`: float64 feature sums of the
    real and the fake examples `test_step` sees, per replica (`metrics.FeatureStats`: one
    all-reduce each at the end). A plain object, not a Keras or tf.Module attribute of the
    GAN: its state is not part of the model's weights. Create it in the GAN's strategy."""

    def __init__(self, model, spec):
        from tf_gan_scale.metrics import extractors
        shape = tuple(model.generator.output_shape[1:])
        with model.distribute_strategy.scope():
            self.extractor = (extractors.get(spec, shape) if isinstance(spec, str)
                              else spec)
            self.real = metrics_lib.FeatureStats(self.extractor.feature_dim)
            self.fake = metrics_lib.FeatureStats(self.extractor.feature_dim)

    def update(self, real, fake):
        """In replica context: real / fake images [B, *data_shape]."""
        self.real.update(self.extractor(real)["features"])
        self.fake.update(self.extractor(fake)["features"])

    def reset(self):
        self.real.reset()
        self.fake.reset()

    def result(self):
        fid = metrics_lib.frechet_distance(*self.fake.result(), *self.real.result())
        logging.info("fid %.4g [extractor %s]", fid, self.extractor.name)
        return fid
