"""Metrics: each against a direct NumPy/SciPy transcription of its published formula (written
here, independent of tf_gan_scale.metrics) and against cases with known answers; streaming
statistics against np.cov, on one device and on 2 replicas with one all-reduce."""

import numpy as np
import pytest
import scipy.linalg
import scipy.spatial.distance
import tensorflow as tf

from helpers.graph_ops import all_reduces_per_replica
from tf_gan_scale import metrics


def rng(seed=0):
    return np.random.default_rng(seed)


# ---- References: transcriptions of the published code ---------------------------------

def ref_frechet(mu1, sigma1, mu2, sigma2, eps=1e-6):
    """TTUR / pytorch-fid: sqrtm of the product, eps on the diagonals if not finite."""
    diff = mu1 - mu2
    covmean = scipy.linalg.sqrtm(sigma1 @ sigma2)
    if not np.isfinite(covmean).all():
        offset = np.eye(len(mu1)) * eps
        covmean = scipy.linalg.sqrtm((sigma1 + offset) @ (sigma2 + offset))
    return diff @ diff + np.trace(sigma1) + np.trace(sigma2) - 2 * np.trace(covmean.real)


def ref_mmd2_unbiased(x, y):
    """Bińkowski et al.: pairwise sums over i != j within sets, all pairs across."""
    m, d = x.shape
    k = lambda a, b: (a @ b / d + 1.0) ** 3  # noqa: E731
    xx = sum(k(x[i], x[j]) for i in range(m) for j in range(m) if i != j)
    yy = sum(k(y[i], y[j]) for i in range(m) for j in range(m) if i != j)
    xy = sum(k(x[i], y[j]) for i in range(m) for j in range(m))
    return xx / (m * (m - 1)) + yy / (m * (m - 1)) - 2 * xy / m ** 2


def ref_inception_score(preds, splits):
    """Salimans et al.'s improved-gan code (strictly positive predictions)."""
    scores = []
    for i in range(splits):
        part = preds[(i * preds.shape[0] // splits):((i + 1) * preds.shape[0] // splits), :]
        kl = part * (np.log(part) - np.log(np.expand_dims(np.mean(part, 0), 0)))
        scores.append(np.exp(np.mean(np.sum(kl, 1))))
    return np.mean(scores), np.std(scores)


def ref_precision_recall(real, fake, k):
    """Kynkäänniemi et al.: full distance matrices, radius = (k+1)-th smallest incl. self."""
    def inside(manifold, probes):
        radii = np.sort(scipy.spatial.distance.cdist(manifold, manifold), axis=1)[:, k]
        return np.any(scipy.spatial.distance.cdist(probes, manifold) <= radii[None], axis=1)
    return inside(real, fake).mean(), inside(fake, real).mean()


def random_cov_features(n, d, seed):
    g = rng(seed)
    return g.normal(size=(n, d)) @ g.normal(size=(d, d)) * 0.3 + g.normal(size=d)


# ---- Fréchet distance --------------------------------------------------------------------

@pytest.mark.parametrize("n, d, rtol", [(500, 16, 1e-6), (20, 64, 1e-3), (40, 64, 1e-3)])
def test_frechet_distance_matches_scipy_sqrtm_formula(n, d, rtol):
    # n < d: rank-deficient covariances (the 1e-3 case). Measured: 1e-15 relative
    # when well-conditioned, 1e-8 to 2e-8 when rank-deficient (there it is sqrtm's error).
    x, y = random_cov_features(n, d, 1), rng(2).normal(size=(n, d)) * 1.5 + 0.2
    expected = ref_frechet(x.mean(axis=0), np.cov(x, rowvar=False),
                           y.mean(axis=0), np.cov(y, rowvar=False))
    np.testing.assert_allclose(metrics.fid_from_features(x, y), expected, rtol=rtol)
    mu, sigma = metrics.feature_statistics(x)  # The statistics of the FID code: N - 1.
    np.testing.assert_allclose(sigma, np.cov(x, rowvar=False), rtol=1e-12)
    np.testing.assert_allclose(mu, x.mean(axis=0), rtol=1e-12)


@pytest.mark.parametrize("n, d", [(500, 16), (20, 64), (30, 100)])
def test_frechet_distance_of_identical_statistics_is_zero(n, d):
    # Measured: ours <= 2.3e-13; the sqrtm formula gives -1.4e-5 and -4e-5 (negative) on
    # the two rank-deficient cases.
    mu, sigma = metrics.feature_statistics(random_cov_features(n, d, 3))
    value = metrics.frechet_distance(mu, sigma, mu, sigma)
    assert 0.0 <= value < 1e-9 * np.trace(sigma)
    assert value < 1e-6


def test_frechet_distance_is_never_negative():
    # Unclamped, about 40% of these round to -1e-14 .. -1e-12 (the docstring's clamp).
    for seed in range(20):
        x = rng(seed).normal(size=(50, 8)) * rng(seed + 100).uniform(0.1, 10.0)
        mu, sigma = metrics.feature_statistics(x)
        assert metrics.frechet_distance(mu, sigma, mu, sigma) >= 0.0


def test_frechet_distance_closed_form_for_diagonal_gaussians():
    g = rng(4)
    mu1, mu2 = g.normal(size=6), g.normal(size=6)
    s1, s2 = g.uniform(0.0, 3.0, size=6), g.uniform(0.1, 3.0, size=6)
    s1[0] = 0.0  # A singular covariance too.
    expected = np.sum((mu1 - mu2) ** 2) + np.sum(s1 + s2 - 2 * np.sqrt(s1 * s2))
    value = metrics.frechet_distance(mu1, np.diag(s1), mu2, np.diag(s2))
    np.testing.assert_allclose(value, expected, rtol=1e-12)


def test_frechet_distance_closed_form_rotated_rank_deficient():
    # The same closed form for covariances diagonal in a random basis (they commute), with
    # 20 and 14 zero eigenvalues of 32: eigh returns those as +-1e-16 noise. Measured
    # 3e-16 relative error (the sqrtm formula: 4e-9); square roots of that noise (no
    # threshold in _psd_sqrt, or sqrt of the eigenvalues of A1 S2 A1 instead of the SVD)
    # give ~3e-9.
    g = rng(5)
    q, _ = np.linalg.qr(g.normal(size=(32, 32)))
    s1, s2 = g.uniform(0.1, 3.0, size=32), g.uniform(0.1, 3.0, size=32)
    s1[:20], s2[10:24] = 0.0, 0.0
    mu1, mu2 = g.normal(size=32), g.normal(size=32)
    expected = np.sum((mu1 - mu2) ** 2) + np.sum((np.sqrt(s1) - np.sqrt(s2)) ** 2)
    value = metrics.frechet_distance(mu1, q @ np.diag(s1) @ q.T, mu2, q @ np.diag(s2) @ q.T)
    np.testing.assert_allclose(value, expected, rtol=1e-12)


def test_frechet_distance_rejects_mismatched_shapes():
    with pytest.raises(ValueError, match="sigma1.shape"):
        metrics.frechet_distance(np.zeros(3), np.eye(2), np.zeros(3), np.eye(3))
    with pytest.raises(ValueError, match="different dimensions"):
        metrics.frechet_distance(np.zeros(2), np.eye(2), np.zeros(3), np.eye(3))


# ---- KID ---------------------------------------------------------------------------------

def test_kid_subset_estimator_matches_pairwise_sums():
    x, y = rng(5).normal(size=(7, 4)), rng(6).normal(size=(7, 4)) + 0.5
    from tf_gan_scale.metrics.kid import polynomial_mmd2_unbiased
    np.testing.assert_allclose(polynomial_mmd2_unbiased(x, y), ref_mmd2_unbiased(x, y),
                               rtol=1e-12)


def test_kid_mean_std_over_seeded_subsets():
    real, fake = rng(7).normal(size=(30, 5)), rng(8).normal(size=(25, 5)) * 1.3
    g = np.random.default_rng(11)  # Same draws as kid: real rows, then fake rows.
    mmds = [ref_mmd2_unbiased(real[g.choice(30, 8, replace=False)],
                              fake[g.choice(25, 8, replace=False)]) for _ in range(6)]
    result = metrics.kid(real, fake, num_subsets=6, subset_size=8, seed=11)
    np.testing.assert_allclose(result, (np.mean(mmds), np.std(mmds)), rtol=1e-10)
    assert metrics.kid(real, fake, num_subsets=6, subset_size=8,
                       seed=np.random.default_rng(11)) == result
    assert metrics.kid(real, fake, num_subsets=6, subset_size=8, seed=12) != result


def test_kid_of_a_set_with_itself_is_near_zero_relative_to_a_shift():
    feats = rng(9).normal(size=(400, 8))
    a, b = feats[:200], feats[200:]  # Disjoint halves of one distribution.
    same = metrics.kid(a, b, num_subsets=20, subset_size=100, seed=0)
    shifted = metrics.kid(a, b + 0.5, num_subsets=20, subset_size=100, seed=0)
    # Measured: same -0.021 +- 0.022 (an unbiased estimate may be negative), shifted
    # 1.13 +- 0.13; keeping the within-set diagonals (biased MMD) adds ~+0.15 to `same`.
    assert shifted.mean > 0.5
    assert abs(same.mean) < 0.05 * shifted.mean
    assert abs(same.mean) < 3 * same.std


def test_kid_rejects_subsets_larger_than_the_sets():
    with pytest.raises(ValueError, match="subset_size"):
        metrics.kid(np.zeros((10, 2)), np.zeros((20, 2)))  # Default 1,000.


# ---- Inception Score -----------------------------------------------------------------------

def test_inception_score_matches_reference_code():
    logits = rng(10).normal(size=(53, 7)) * 2.0  # 53 rows: uneven splits.
    probs = np.exp(logits) / np.exp(logits).sum(axis=1, keepdims=True)
    result = metrics.inception_score(probs, splits=5)
    np.testing.assert_allclose(result, ref_inception_score(probs, 5), rtol=1e-12)
    assert result.std > 0.01  # So a ddof=1 std would fail the line above.


def test_inception_score_known_answers():
    uniform = np.full((40, 9), 1.0 / 9)
    np.testing.assert_allclose(metrics.inception_score(uniform, splits=4), (1.0, 0.0),
                               atol=1e-12)
    k, splits = 6, 4
    one_hot = np.eye(k)[np.arange(k * splits * 3) % k]  # Every class equally in every split.
    np.testing.assert_allclose(metrics.inception_score(one_hot, splits=splits), (k, 0.0),
                               rtol=1e-12, atol=1e-12)


def test_inception_score_rejects_logits():
    with pytest.raises(ValueError, match="logits"):
        metrics.inception_score(rng(0).normal(size=(20, 3)), splits=2)


# ---- Precision / recall ---------------------------------------------------------------------

def test_precision_recall_matches_full_distance_reference():
    real = rng(12).normal(size=(60, 3))
    fake = rng(13).normal(size=(45, 3)) * 0.7 + 0.8
    expected = ref_precision_recall(real, fake, k=3)
    assert 0.1 < expected[0] < 0.95 and 0.1 < expected[1] < 0.95  # Non-trivial case.
    for batch_size in (7, 1000):  # Several blocks, and one block holding everything.
        result = metrics.precision_recall(real, fake, k=3, batch_size=batch_size)
        assert result == pytest.approx(expected, abs=1e-12)


def test_precision_recall_known_answers():
    feats = rng(14).normal(size=(50, 4))
    assert metrics.precision_recall(feats, feats, batch_size=16) == (1.0, 1.0)
    # 1-d lattice 0..9: the k=3 radius of 0 is 3, so -3 lies exactly on its ball's
    # boundary (inside, `<=`); the other fakes are far from every real point, but the
    # radius of -3 (its 3rd neighbour, 25) covers all real points.
    real = np.arange(10.0)[:, None]
    fake = np.array([-3.0, 20.0, 21.0, 22.0, 23.0])[:, None]
    assert metrics.precision_recall(real, fake, k=3) == (0.2, 1.0)


def test_precision_recall_needs_more_than_k_rows():
    with pytest.raises(ValueError, match="more than k=3"):
        metrics.precision_recall(np.zeros((3, 2)), np.zeros((10, 2)))


# ---- Streaming statistics ------------------------------------------------------------------

def test_feature_stats_in_chunks_equal_np_cov():
    x = random_cov_features(103, 12, 15).astype(np.float32)
    stats = metrics.FeatureStats(12)
    update = tf.function(stats.update)  # Graph mode, and a ragged last chunk.
    for start in range(0, len(x), 25):
        update(x[start:start + 25])
    mean, cov = stats.result()
    x64 = x.astype(np.float64)
    np.testing.assert_allclose(mean, x64.mean(axis=0), rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(cov, np.cov(x64, rowvar=False), rtol=1e-10, atol=1e-12)
    stats.reset()
    with pytest.raises(ValueError, match="at least 2"):
        stats.result()


def test_feature_stats_with_a_large_mean():
    # Mean 1e4 times the spread: raw sums lose ~eps * 1e8 relative (3e-8 measured), which
    # the docstring states; a shift near the mean restores float64 accuracy (4e-16).
    x = rng(16).normal(size=(1000, 8)) + 1e4
    expected = np.cov(x, rowvar=False)
    for shift, rtol in ((None, 1e-6), (x[:10].mean(axis=0), 1e-10)):
        stats = metrics.FeatureStats(8, shift=shift)
        for start in range(0, len(x), 100):
            stats.update(x[start:start + 100])
        mean, cov = stats.result()
        np.testing.assert_allclose(mean, x.mean(axis=0), rtol=1e-14)
        assert np.max(np.abs(cov - expected)) < rtol * np.max(np.abs(expected))


def count_all_reduces(fn, strategy):
    """Collective all-reduce ops per replica in the graph traced from fn()."""
    return all_reduces_per_replica(tf.function(fn).get_concrete_function().graph, strategy)


def test_feature_stats_two_replicas_match_one_device(mirrored2):
    x = random_cov_features(40, 6, 17).astype(np.float32)
    with mirrored2.scope():
        stats = metrics.FeatureStats(6)
    dataset = tf.data.Dataset.from_tensor_slices(x).batch(10)  # 5 rows per replica.

    @tf.function
    def step(batch):
        mirrored2.run(stats.update, args=(batch,))

    for batch in mirrored2.experimental_distribute_dataset(dataset):
        step(batch)
    # Each replica holds only its own half of the rows until the all-reduce.
    local = mirrored2.experimental_local_results
    assert [float(c.numpy()) for c in local(stats.count)] == [20.0, 20.0]
    sums = [s.numpy() for s in local(stats.sum)]
    assert not np.allclose(sums[0], sums[1])

    one_device = metrics.FeatureStats(6)
    one_device.update(x)
    mean, cov = stats.result()
    mean1, cov1 = one_device.result()
    np.testing.assert_allclose(mean, mean1, rtol=1e-12)
    np.testing.assert_allclose(cov, cov1, rtol=1e-12)
    np.testing.assert_allclose(cov, np.cov(x.astype(np.float64), rowvar=False), rtol=1e-10)
    # Count, sum and outer products travel in ONE all-reduce.
    assert count_all_reduces(lambda: mirrored2.run(stats.all_reduce), mirrored2) == 1


def test_feature_stats_created_outside_the_strategy_fails_loudly(mirrored2):
    stats = metrics.FeatureStats(3)  # Both replicas would race on one set of sums.
    with pytest.raises(ValueError, match="strategy.scope"):
        mirrored2.run(stats.update, args=(tf.zeros([2, 3]),))
