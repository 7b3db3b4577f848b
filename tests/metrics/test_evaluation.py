"""metrics/scoring.py: FID / KID / IS / PR sharded over replicas equal one device, and equal
the metrics computed directly on the features of the same examples."""

import json

import keras
import numpy as np
import pytest
import tensorflow as tf

from helpers.tiny_gan import LATENT
from tf_gan_scale import architectures, data, errors, latents, metrics
from tf_gan_scale.metrics import scoring

N = 37  # Not a multiple of the batch: the last batch is padded (rows -1).
ALL = ("fid", "kid", "is", "pr", "classes")


class TinyExtractor:
    """The extractor interface (metrics.extractors) around a tiny seeded convnet."""

    name = "test:tiny"
    feature_dim = 6
    num_classes = 10  # The digits' classes: the "classes" metric needs them.

    def __init__(self):
        keras.utils.set_random_seed(1)
        self.body = keras.Sequential([keras.Input((8, 8, 1)), keras.layers.Conv2D(4, 3),
                                      keras.layers.Flatten(),
                                      keras.layers.Dense(6, activation="tanh")])
        self.head = keras.layers.Dense(10, activation="softmax")
        self.head.build((None, 6))

    def __call__(self, images):
        features = self.body(images, training=False)
        return {"features": features, "probs": self.head(features)}


def setup(strategy):
    with strategy.scope():
        keras.utils.set_random_seed(0)
        g, _ = architectures.build("dcgan", data_shape=(8, 8, 1), latent_dim=LATENT,
                                   g_channels=(16, 8, 4), d_channels=(4, 8))
        return g, TinyExtractor()


def score(strategy, **kw):
    g, extractor = setup(strategy)
    source = data.load("embedded:digits")
    return scoring.evaluate(g, LATENT, source, extractor, strategy, num_samples=N,
                               seed=3, metrics=ALL, batch_size=16, **kw)


def test_scores_equal_the_metrics_of_the_same_examples_on_one_device(one_device):
    got = score(one_device)
    g, extractor = setup(one_device)
    fake = extractor(scoring.quantize(g(latents.fixed(3, N, LATENT), training=False)))
    x = data.load("embedded:digits").arrays["x"][:N]
    real = extractor(scoring.quantize(tf.constant(data.sources.to_float(x))))
    np.testing.assert_allclose(
        got["fid"], metrics.fid_from_features(real["features"].numpy(),
                                              fake["features"].numpy()), rtol=1e-6)
    kid = metrics.kid(real["features"].numpy(), fake["features"].numpy(), subset_size=N,
                      seed=3)
    # Subsets of all N examples are all the same set: std is rounding (atol).
    np.testing.assert_allclose([got["kid"], got["kid_std"]], [kid.mean, kid.std],
                               rtol=1e-6, atol=1e-9)
    inception = metrics.inception_score(fake["probs"].numpy(), splits=10)
    np.testing.assert_allclose(got["is"], inception.mean, rtol=1e-6)
    pr = metrics.precision_recall(real["features"].numpy(), fake["features"].numpy())
    assert (got["precision"], got["recall"]) == (pr.precision, pr.recall)
    # Class balance: total variation between the argmax histogram of the fakes and the
    # real labels' histogram.
    hist = np.bincount(np.argmax(fake["probs"].numpy(), 1), minlength=10)
    labels = np.bincount(data.load("embedded:digits").arrays["label"][:N], minlength=10)
    assert got["class_histogram"] == hist.tolist()
    np.testing.assert_allclose(got["class_tv"],
                               0.5 * np.abs(hist / N - labels / N).sum(), rtol=1e-12)
    assert 0 < got["class_tv"] <= 1
    assert got["extractor"] == "test:tiny" and got["num_samples"] == N
    # The check can fail: fakes from other latents score differently.
    other = scoring.evaluate(g, LATENT, data.load("embedded:digits"), extractor,
                                one_device, num_samples=N, seed=4, metrics=("fid",),
                                batch_size=16)
    assert abs(other["fid"] - got["fid"]) > 1e-3


def test_two_replicas_score_what_one_device_scores(one_device, mirrored2):
    one, two = score(one_device), score(mirrored2)
    for key in scoring.SCORE_KEYS:
        np.testing.assert_allclose(two[key], one[key], rtol=1e-6, atol=1e-9, err_msg=key)


def test_reference_statistics_are_cached_and_reused(one_device, tmp_path):
    g, extractor = setup(one_device)
    source = data.load("embedded:digits")
    ref = scoring.reference(source, extractor, one_device, num_samples=N, batch_size=16,
                               cache_dir=str(tmp_path))
    files = list(tmp_path.glob("reference-*.npz"))
    assert len(files) == 1
    # A cached file is what is used next time: alter it and see the alteration come back.
    with np.load(files[0]) as f:
        altered = {k: f[k] for k in f.files}
    altered["mu"] = altered["mu"] + 1.0
    np.savez(files[0], **altered)
    again = scoring.reference(source, extractor, one_device, num_samples=N, batch_size=16,
                                 cache_dir=str(tmp_path))
    np.testing.assert_allclose(again["mu"], ref["mu"] + 1.0)
    x = scoring.quantize(tf.constant(data.sources.to_float(source.arrays["x"][:N])))
    mu, _ = metrics.feature_statistics(extractor(x)["features"].numpy())
    np.testing.assert_allclose(ref["mu"], mu, rtol=1e-5, atol=1e-6)


def test_bad_metric_names_and_is_without_probabilities():
    with pytest.raises(errors.ConfigError,
                       match="unknown metric 'fdi'; valid: classes, fid, is, kid"):
        scoring.check_metrics("fid,fdi")

    class NoProbs:
        name, num_classes = "x.keras", None

    with pytest.raises(errors.ConfigError, match="metric 'is' needs class probabilities"):
        scoring.check_metrics(("is",), NoProbs())


def test_images_are_quantized_to_the_levels_the_png_writer_uses():
    from tf_gan_scale import images
    x = np.random.default_rng(0).uniform(-1.1, 1.1, [1000]).astype(np.float32)
    x[:3] = [0.0, -1.0, 1.0]  # 0 is the tie 127.5: half to even (np.rint), 128.
    np.testing.assert_allclose(scoring.quantize(tf.constant(x)).numpy(),
                               images.to_uint8(x) / 127.5 - 1, atol=1e-6)


def test_external_samples_are_scored_like_generated_ones(one_device):
    # The generator's own quantized images, given as an array, score what it scores.
    g, extractor = setup(one_device)
    source = data.load("embedded:digits")
    images = g(latents.fixed(3, N, LATENT), training=False).numpy()
    from_array = scoring.evaluate(None, LATENT, source, extractor, one_device,
                                     num_samples=0, samples=images, metrics=ALL,
                                     batch_size=16, seed=3)
    got = score(one_device)
    for key in scoring.SCORE_KEYS:
        np.testing.assert_allclose(from_array[key], got[key], rtol=1e-6, atol=1e-9)
    with pytest.raises(errors.ConfigError, match=r"shape \(37, 8, 8\) do not match"):
        scoring.check_samples(images[..., 0], source)
    with pytest.raises(errors.ConfigError, match=r"in \[-1, 1\].*Received: \[0, 255\]"):
        scoring.check_samples(np.linspace(0, 255, N * 64).reshape(N, 8, 8, 1), source)


def test_fid_with_fewer_samples_than_feature_dimensions_is_refused(one_device):
    g, extractor = setup(one_device)
    with pytest.raises(errors.ConfigError, match="5 samples of 6-d features"):
        scoring.evaluate(g, LATENT, data.load("embedded:digits"), extractor, one_device,
                            num_samples=5, metrics=("fid",))
    scores = scoring.evaluate(g, LATENT, data.load("embedded:digits"), extractor,
                                 one_device, num_samples=5, metrics=("fid",),
                                 allow_rank_deficient=True)
    assert np.isfinite(scores["fid"])


def test_a_corrupt_cached_reference_is_recomputed(one_device, tmp_path, caplog):
    g, extractor = setup(one_device)
    source = data.load("embedded:digits")
    ref = scoring.reference(source, extractor, one_device, num_samples=N, batch_size=16,
                               cache_dir=str(tmp_path))
    (path,) = tmp_path.glob("reference-*.npz")
    path.write_bytes(path.read_bytes()[:100])  # Truncated.
    again = scoring.reference(source, extractor, one_device, num_samples=N, batch_size=16,
                                 cache_dir=str(tmp_path))
    np.testing.assert_allclose(again["mu"], ref["mu"])
    assert "unreadable" in caplog.text
    with np.load(path) as f:  # Rewritten whole.
        np.testing.assert_allclose(f["mu"], ref["mu"])


def test_gathered_features_come_back_in_row_order(mirrored2):
    _, extractor = setup(mirrored2)
    x = data.sources.to_float(data.load("embedded:digits").arrays["x"][:N]).numpy()
    rows = np.arange(N, dtype=np.int32)[::-1].copy()  # Fed in reverse order.
    ds = tf.data.Dataset.from_tensor_slices({"x": x[rows], "row": rows})
    _, kept = scoring._stream(mirrored2, scoring._padded(ds, 16), lambda b: b["x"],
                                 extractor, keep=True)
    direct = extractor(scoring.quantize(tf.constant(x)))["features"].numpy()
    np.testing.assert_allclose(kept["features"], direct, atol=1e-6)


def test_the_cache_key_follows_n_and_the_extractor_weights(one_device, tmp_path):
    _, extractor = setup(one_device)
    weights = tmp_path / "weights.h5"
    weights.write_bytes(b"one")
    extractor.weights_path = str(weights)
    source = data.load("embedded:digits")

    def cached(n):
        scoring.reference(source, extractor, one_device, num_samples=n, batch_size=16,
                             cache_dir=str(tmp_path / "cache"))
        return {p.name for p in (tmp_path / "cache").glob("reference-*.npz")}

    first = cached(N)
    assert cached(N) == first  # Same key: reused.
    assert len(cached(N + 1)) == 2  # Another N: another file.
    weights.write_bytes(b"two")  # Same name, other weights: another file.
    assert len(cached(N)) == 3


class _Manager:
    def __init__(self):
        self.saved = []
        self.latest_checkpoint = None

    def save(self, checkpoint_number):
        self.saved.append(checkpoint_number)
        self.latest_checkpoint = f"ckpt-{checkpoint_number}"
        return self.latest_checkpoint


def test_the_best_checkpoint_follows_the_metric_across_a_resume(tmp_path):
    from tf_gan_scale.training import callbacks
    history = tmp_path / "metrics.jsonl"
    scores = iter([3.0, 1.0, 2.0, 0.5, 1.5])

    def score():
        return {"extractor": "x", "num_samples": 10, "fid": next(scores), "is": 1.0}

    manager = _Manager()
    cb = callbacks.Evaluate(2, score, path=str(history), best="fid", best_manager=manager,
                            history=str(history))
    cb.on_train_begin()
    for step in (2, 4, 6):
        cb._fire(step, None)
    assert manager.saved == [2, 4]  # 3, then 1; 2 is worse than 1.
    # A resumed run reads the scores logged so far: 1.0 stays the one to beat.
    manager = _Manager()
    cb = callbacks.Evaluate(2, score, path=str(history), best="fid", best_manager=manager,
                            history=str(history))
    cb.on_train_begin()
    cb._fire(8, None)   # 0.5: better.
    cb._fire(10, None)  # 1.5: worse.
    assert manager.saved == [8]
    lines = [json.loads(line) for line in history.read_text().splitlines()]
    assert [line["step"] for line in lines] == [2, 4, 6, 8, 10]  # Appended, not truncated.
    # Higher is better for IS.
    assert scoring.better("is", 2.0, 1.0) and not scoring.better("fid", 2.0, 1.0)


def test_a_generator_of_another_shape_than_the_reference_is_refused(one_device):
    g, extractor = setup(one_device)
    rgb = data.from_arrays("rgb", np.zeros((50, 8, 8, 3), np.uint8), None)
    with pytest.raises(errors.ConfigError, match=r"generator makes examples of shape "
                                                 r"\(8, 8, 1\) but the reference data rgb"):
        scoring.evaluate(g, LATENT, rgb, extractor, one_device, num_samples=N)


def test_evaluating_again_reuses_the_traced_steps(one_device):
    g, extractor = setup(one_device)
    source = data.load("embedded:digits")
    first = scoring.evaluate(g, LATENT, source, extractor, one_device, num_samples=N,
                                seed=3, metrics=("fid",), batch_size=16)
    second = scoring.evaluate(g, LATENT, source, extractor, one_device, num_samples=N,
                                 seed=3, metrics=("fid",), batch_size=16)
    assert second["fid"] == first["fid"]  # The reused statistics were reset.
    mine = [step for key, (_, step) in scoring._STREAMS.items()
            if key[0] is one_device and key[1] is extractor]
    assert len(mine) == 2  # Real and fake.
    assert [step.experimental_get_tracing_count() for step in mine] == [1, 1]


def test_class_balance_of_known_histograms():
    probs = np.eye(3)[[0, 0, 1, 2]]  # Fakes: classes 0, 0, 1, 2.
    out = scoring.class_balance(probs, np.array([0, 1, 2, 0, 1, 2]))
    assert out["class_histogram"] == [2, 1, 1]
    # |1/2 - 1/3| + |1/4 - 1/3| + |1/4 - 1/3| = 1/3; halved: 1/6.
    assert out["class_tv"] == pytest.approx(1 / 6)
    assert scoring.class_balance(np.eye(3)[[0, 0]], np.array([1, 2]))["class_tv"] == 1.0
    # Stacked MNIST's numbers: modes with a fake, KL(fake frequencies || uniform).
    assert out["class_modes"] == 3
    assert out["class_kl"] == pytest.approx(0.5 * np.log(1.5) + 2 * 0.25 * np.log(0.75))
    one = scoring.class_balance(np.eye(4)[[2, 2, 2]], np.array([0, 1, 2, 3]))
    assert one["class_modes"] == 1 and one["class_kl"] == pytest.approx(np.log(4))
    with pytest.raises(errors.ConfigError, match="classifier of the data's 10 classes"):
        scoring._real_labels(data.load("embedded:digits"), 5,
                                type("E", (), {"num_classes": 3, "name": "x"})())


@pytest.mark.parametrize("workers,replicas", [(1, 2), (2, 4), (3, 3)])
def test_each_worker_builds_only_its_rows_of_an_evaluation_pass(workers, replicas):
    # The real and fake passes on W workers: every row 0..N-1 once over the cluster and
    # each worker the same number of batches (a finite pass must not leave one waiting).
    n, gb = 23, 2 * replicas
    rows = {}
    for w in range(workers):
        ctx = tf.distribute.InputContext(num_input_pipelines=workers, input_pipeline_id=w,
                                         num_replicas_in_sync=replicas)
        batches = [b["row"].numpy() for b in scoring._per_worker(n, gb, lambda r: {})(ctx)]
        rows[w] = np.concatenate(batches)
        assert len(batches) == -(-n // gb) * (replicas // workers)
    got = np.concatenate(list(rows.values()))
    np.testing.assert_array_equal(np.sort(got[got >= 0]), np.arange(n))
    for w in range(workers):
        assert len(rows[w]) == len(got) // workers


def test_full_reference_scores_against_every_real_example(one_device):
    """StyleGAN's fid50k_full convention: num_real=-1 takes the statistics of every real
    example (1,797 digits) whatever the number of fakes, and says so; more real examples
    than the source holds is one line, never silently fewer."""
    g, extractor = setup(one_device)
    source = data.load("embedded:digits")
    full = scoring.evaluate(g, LATENT, source, extractor, one_device, num_samples=N, seed=3,
                            metrics=("fid",), batch_size=16, num_real=-1)
    assert full["num_samples"] == N and full["num_real"] == source.num_examples == 1797
    fake = extractor(scoring.quantize(g(latents.fixed(3, N, LATENT), training=False)))
    real = extractor(scoring.quantize(tf.constant(data.sources.to_float(source.arrays["x"]))))
    np.testing.assert_allclose(full["fid"], metrics.fid_from_features(
        real["features"].numpy(), fake["features"].numpy()), rtol=1e-5)
    assert "1797 real" in scoring.format_scores(full)
    with pytest.raises(errors.ConfigError) as e:
        scoring.evaluate(g, LATENT, source, extractor, one_device, num_samples=N,
                         metrics=("fid",), num_real=5000)
    assert "num_real=5000" in str(e.value) and "1797" in str(e.value)
