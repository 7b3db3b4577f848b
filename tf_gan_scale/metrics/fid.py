"""Fréchet distance between Gaussians fitted to features (FID, Heusel et al. 2017).

    FD = ||mu1 - mu2||^2 + tr(S1) + tr(S2) - 2 tr( (S1 S2)^(1/2) )

The only delicate term is tr((S1 S2)^(1/2)). The original TTUR / pytorch-fid code takes
`scipy.linalg.sqrtm(S1 @ S2)`: a Schur-based square root of a NON-symmetric matrix,
which returns spurious imaginary parts and, when the product is singular (fewer samples
than feature dimensions), non-finite or inaccurate roots; it then retries with 1e-6 added
to both diagonals, which biases the result. Here the trace is computed from an identity
that needs only symmetric eigen-decompositions and one SVD, see `trace_sqrt_product`.

Everything is float64 NumPy/SciPy on the host: the statistics are O(D^2) numbers however
many samples were seen (`FeatureStats` accumulates them across replicas), and a 2048-d
decomposition takes seconds once per evaluation.
"""

import numpy as np
import scipy.linalg


def feature_statistics(features):
    """Mean [D] and unbiased covariance [D, D] (N - 1 normalization, as np.cov) in float64.

    Args:
        features: array [N, D], N >= 2.

    Returns:
        (mu [D], sigma [D, D]) float64.
    """
    x = np.asarray(features, dtype=np.float64)
    if x.ndim != 2 or x.shape[0] < 2:
        raise ValueError(f"feature_statistics needs features [N >= 2, D]; Received: shape={x.shape}")
    return x.mean(axis=0), np.cov(x, rowvar=False)


def _check_stats(mu, sigma, which):
    mu = np.atleast_1d(np.asarray(mu, dtype=np.float64))
    sigma = np.atleast_2d(np.asarray(sigma, dtype=np.float64))
    if mu.ndim != 1 or sigma.shape != (mu.shape[0], mu.shape[0]):
        raise ValueError(f"frechet_distance needs mu [D] and sigma [D, D]; Received: "
                         f"mu{which}.shape={mu.shape}, sigma{which}.shape={sigma.shape}")
    if not (np.all(np.isfinite(mu)) and np.all(np.isfinite(sigma))):
        raise ValueError(f"frechet_distance: mu{which} / sigma{which} contain NaN or inf")
    # A covariance is symmetric; accumulated sums may be off by rounding, and eigh reads
    # one triangle only, so symmetrize instead of trusting either triangle.
    return mu, 0.5 * (sigma + sigma.T)


def _psd_sqrt(sigma):
    """Symmetric PSD square root [D, D] of sigma [D, D], numerically-zero eigenvalues -> 0.

    Eigenvalues of a rank-deficient covariance that should be 0 come out of eigh as
    +-(D * eps * lambda_max) noise; below that tolerance they carry no information, and
    their square roots (~1e-8 relative) would otherwise leak into the trace.
    """
    w, v = scipy.linalg.eigh(sigma)
    tol = max(w[-1], 0.0) * sigma.shape[0] * np.finfo(np.float64).eps
    w = np.where(w > tol, w, 0.0)
    return (v * np.sqrt(w)) @ v.T


def trace_sqrt_product(sigma1, sigma2):
    """tr((S1 S2)^(1/2)) for symmetric PSD S1, S2 [D, D], as a float.

    With A_i = S_i^(1/2) (symmetric PSD), S1 S2 = A1 (A1 A2 A2) has the same eigenvalues
    as (A1 A2)(A1 A2)^T, so the eigenvalues of S1 S2 are the squared singular values of
    A1 A2 and tr((S1 S2)^(1/2)) = sum of singular values of A1 A2 (its nuclear norm).
    Why this route: eigh and the SVD are backward stable and return real, non-negative
    values, so there are no imaginary parts to drop and no eps offset to add; singular
    values are accurate to eps * ||A1 A2|| absolutely, whereas the square root of an
    eigenvalue of S1 S2 (or of A1 S2 A1) that should be 0 turns rounding of ~1e-16 into
    ~1e-8. This is what keeps rank-deficient covariances (fewer samples than dimensions)
    accurate. Cost: two D x D eigh and one SVD (no complex Schur form).
    """
    a1 = _psd_sqrt(sigma1)
    a2 = _psd_sqrt(sigma2)
    return float(np.sum(np.linalg.svd(a1 @ a2, compute_uv=False)))


def frechet_distance(mu1, sigma1, mu2, sigma2):
    """Fréchet distance between N(mu1, sigma1) and N(mu2, sigma2), as a Python float.

    Args:
        mu1, mu2: means [D].
        sigma1, sigma2: covariances [D, D], symmetric positive semi-definite (they may be
            singular, e.g. estimated from fewer than D samples).

    Returns:
        ||mu1 - mu2||^2 + tr(sigma1) + tr(sigma2) - 2 tr((sigma1 sigma2)^(1/2)), >= 0.
        The distance is a squared Wasserstein-2 distance, never negative; rounding can
        make the sum slightly negative (~1e-13 of the traces) when the two Gaussians are
        equal, so the result is clamped at 0.

    Agrees with the SciPy `sqrtm(sigma1 @ sigma2)` formula of the reference FID code to
    ~1e-15 relative on well-conditioned covariances and ~2e-8 on rank-deficient ones,
    where the difference is sqrtm's error: on a rank-deficient closed-form case this
    is exact to 3e-16 and sqrtm to 4e-9, and for identical rank-deficient statistics
    this gives 2e-13 and sqrtm -1e-5 (tests/metrics/test_metrics.py).

    Example:
        >>> frechet_distance(np.zeros(2), np.eye(2), np.ones(2), 4 * np.eye(2))
        4.0
    """
    mu1, sigma1 = _check_stats(mu1, sigma1, 1)
    mu2, sigma2 = _check_stats(mu2, sigma2, 2)
    if mu1.shape != mu2.shape:
        raise ValueError(f"frechet_distance: statistics of different dimensions; Received: "
                         f"mu1.shape={mu1.shape}, mu2.shape={mu2.shape}")
    diff = mu1 - mu2
    value = (diff @ diff + np.trace(sigma1) + np.trace(sigma2)
             - 2.0 * trace_sqrt_product(sigma1, sigma2))
    return max(float(value), 0.0)


def fid_from_features(real_features, fake_features):
    """FID of two feature sets [N, D] and [M, D] (N, M >= 2), as a float.

    Statistics are those of `feature_statistics` (mean, covariance with N - 1), as in
    the reference FID code. For large N accumulate them with `FeatureStats` instead.
    """
    mu1, sigma1 = feature_statistics(real_features)
    mu2, sigma2 = feature_statistics(fake_features)
    return frechet_distance(mu1, sigma1, mu2, sigma2)
