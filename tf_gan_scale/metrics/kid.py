"""Kernel Inception Distance (Bińkowski et al. 2018, "Demystifying MMD GANs").

KID is the unbiased estimator of the squared Maximum Mean Discrepancy between real and
generated features under the cubic polynomial kernel

    k(x, y) = (x . y / D + 1)^3,

averaged over random subsets. For one pair of subsets X, Y of m rows each:

    MMD^2_u = sum_{i != j} k(x_i, x_j) / (m (m - 1))
            + sum_{i != j} k(y_i, y_j) / (m (m - 1))
            - 2 sum_{i, j} k(x_i, y_j) / m^2

(the cross term keeps its diagonal, as in the authors' `compute_scores.py`, clean-fid and
torch-fidelity). Unlike FID it is unbiased in the number of samples, and can be slightly
negative when the two distributions are equal. Defaults follow those implementations:
100 subsets of 1,000 rows, each subset drawn without replacement, independently of the
others; the spread reported is the standard deviation over subsets (np.std, ddof=0).
"""

from typing import NamedTuple

import numpy as np

from tf_gan_scale import errors


class MeanStd(NamedTuple):
    """A metric's mean and standard deviation over subsets or splits (floats)."""
    mean: float
    std: float


def as_generator(seed):
    """np.random.Generator from an int seed or a Generator (used as is)."""
    if isinstance(seed, np.random.Generator):
        return seed
    if errors.is_int(seed):
        return np.random.default_rng(int(seed))
    raise ValueError(f"seed must be an int or a numpy Generator; Received: seed={seed!r}")


def check_features(features, name):
    """features as float64 [N, D]; ValueError naming `name` otherwise."""
    x = np.asarray(features, dtype=np.float64)
    if x.ndim != 2 or x.shape[1] < 1:
        raise ValueError(f"{name} must be features [N, D]; Received: shape={x.shape}")
    if not np.all(np.isfinite(x)):
        raise ValueError(f"{name} contain NaN or inf")
    return x


def polynomial_mmd2_unbiased(x, y):
    """Unbiased MMD^2 (formula in the module docstring) of x [m, D] and y [m, D], float.

    The kernel matrices are [m, m]: m = 1,000 rows cost 8 MB each.
    """
    m, d = x.shape

    def kernel(a, b):
        return (a @ b.T / d + 1.0) ** 3

    k_xx, k_yy, k_xy = kernel(x, x), kernel(y, y), kernel(x, y)
    within = (k_xx.sum() - np.trace(k_xx) + k_yy.sum() - np.trace(k_yy)) / (m * (m - 1))
    return float(within - 2.0 * k_xy.sum() / (m * m))


def kid(real_features, fake_features, *, num_subsets=100, subset_size=1000, seed=0):
    """KID of real [N, D] and generated [M, D] features: MeanStd(mean, std) over subsets.

    Args:
        real_features: [N, D].
        fake_features: [M, D], same D.
        num_subsets: number of subset pairs (>= 1).
        subset_size: rows per subset, 2 <= subset_size <= min(N, M); raises otherwise
            (clean-fid silently shrinks it, which changes the estimator's variance).
        seed: int or np.random.Generator. Subset s draws its real rows, then its fake
            rows, from this one stream, so a seed fixes the result.

    Returns:
        MeanStd: mean and std (ddof=0) of MMD^2_u over the subsets. Papers often
        report KID x 1e3.
    """
    x = check_features(real_features, "real_features")
    y = check_features(fake_features, "fake_features")
    if x.shape[1] != y.shape[1]:
        raise ValueError(f"kid: feature dimensions differ; Received: real {x.shape}, "
                         f"fake {y.shape}")
    if int(num_subsets) < 1:
        raise ValueError(f"kid needs num_subsets >= 1; Received: num_subsets={num_subsets}")
    m = int(subset_size)
    if not 2 <= m <= min(len(x), len(y)):
        raise ValueError(f"kid needs 2 <= subset_size <= min(N, M) = {min(len(x), len(y))}; "
                         f"Received: subset_size={subset_size} (pass a smaller subset_size "
                         f"or more samples)")
    rng = as_generator(seed)
    mmds = np.empty(int(num_subsets))
    for s in range(len(mmds)):
        xs = x[rng.choice(len(x), m, replace=False)]
        ys = y[rng.choice(len(y), m, replace=False)]
        mmds[s] = polynomial_mmd2_unbiased(xs, ys)
    return MeanStd(float(mmds.mean()), float(mmds.std()))
