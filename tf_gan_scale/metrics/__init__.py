"""Evaluation metrics: the numerical core, on features that an extractor produced.

    frechet_distance(mu1, sigma1, mu2, sigma2) -> float        FID from statistics
    feature_statistics(features [N, D]) -> (mu [D], sigma [D, D])
    fid_from_features(real [N, D], fake [M, D]) -> float
    FeatureStats(dim, shift=None)          streaming mean / covariance across replicas
    kid(real, fake, num_subsets=100, subset_size=1000, seed=0) -> MeanStd
    inception_score(probs [N, K], splits=10) -> MeanStd
    precision_recall(real, fake, k=3, batch_size=256) -> PrecisionRecall
    extractors.get(spec, data_shape, weights=None) -> Extractor   images -> features, probs

Everything but FeatureStats and extractors is float64 NumPy/SciPy on the host; FeatureStats
accumulates on each replica and all-reduces once. Each metric's module docstring gives its
formula and the published code it matches.
"""

from tf_gan_scale.metrics import extractors
from tf_gan_scale.metrics.feature_stats import FeatureStats
from tf_gan_scale.metrics.fid import feature_statistics, fid_from_features, frechet_distance
from tf_gan_scale.metrics.inception_score import inception_score
from tf_gan_scale.metrics.kid import MeanStd, kid
from tf_gan_scale.metrics.precision_recall import PrecisionRecall, precision_recall

__all__ = [
    "FeatureStats",
    "MeanStd",
    "PrecisionRecall",
    "extractors",
    "feature_statistics",
    "fid_from_features",
    "frechet_distance",
    "inception_score",
    "kid",
    "precision_recall",
]
