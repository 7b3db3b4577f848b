"""Improved precision and recall (Kynkäänniemi et al. 2019, NeurIPS).

Each set of features approximates its manifold by the union of balls around its points,
the radius of a point being the distance to its k-th nearest neighbour in the same set
(the point itself excluded; k = 3 in the paper). Then

    precision = fraction of generated points inside at least one real point's ball,
    recall    = fraction of real points inside at least one generated point's ball,

a point on a ball's boundary counting as inside (`<=`, as the authors' code).

Memory: distances are computed for `batch_size` rows at a time against a whole set, so a
pass needs O(batch_size * N) numbers, never the N x N matrix; three passes (radii of the
real set, radii of the generated set, then both memberships from the same real-fake
distance blocks). Distances are float64 (squared, via |a|^2 + |b|^2 - 2 a.b, clipped at
0), so with N = 50,000 and D = 2,048 each pass is ~5e12 multiply-adds: minutes on a CPU.
"""

from typing import NamedTuple

import numpy as np

from tf_gan_scale.metrics.kid import check_features


class PrecisionRecall(NamedTuple):
    """Improved precision and recall, floats in [0, 1]."""
    precision: float
    recall: float


def _squared_distances(a, b, b_sq_norms):
    """Squared Euclidean distances [n, m] of a [n, D] to b [m, D]; b_sq_norms = |b|^2 [m]."""
    d = np.sum(a * a, axis=1)[:, None] + b_sq_norms[None, :] - 2.0 * (a @ b.T)
    return np.maximum(d, 0.0, out=d)  # Rounding can leave tiny negatives (e.g. self).


def knn_radii(features, k, batch_size):
    """Squared distance [N] of each row of features [N, D] to its k-th nearest other row.

    Row i's own distance (0) is among its N distances, so the k-th neighbour excluding
    self is the (k+1)-th smallest: index k after a partial sort.
    """
    sq = np.sum(features * features, axis=1)
    radii = np.empty(len(features))
    for start in range(0, len(features), batch_size):
        d = _squared_distances(features[start:start + batch_size], features, sq)
        radii[start:start + batch_size] = np.partition(d, k, axis=1)[:, k]
    return radii


def precision_recall(real_features, fake_features, *, k=3, batch_size=256):
    """Improved precision and recall of real [N, D] and generated [M, D] features.

    Args:
        real_features: [N, D], N > k.
        fake_features: [M, D], M > k, same D.
        k: the radius of a point is the distance to its k-th nearest neighbour.
        batch_size: rows per distance block; peak memory ~ 3 * 8 * batch_size * max(N, M)
            bytes (about 300 MB at 50,000 samples and the default 256).

    Returns:
        PrecisionRecall(precision, recall).
    """
    x = check_features(real_features, "real_features")
    y = check_features(fake_features, "fake_features")
    if x.shape[1] != y.shape[1]:
        raise ValueError(f"precision_recall: feature dimensions differ; Received: real "
                         f"{x.shape}, fake {y.shape}")
    k, batch_size = int(k), int(batch_size)
    if k < 1 or batch_size < 1:
        raise ValueError(f"precision_recall needs k >= 1 and batch_size >= 1; Received: "
                         f"k={k}, batch_size={batch_size}")
    if min(len(x), len(y)) <= k:
        raise ValueError(f"precision_recall needs more than k={k} rows in each set; "
                         f"Received: {len(x)} real, {len(y)} fake")
    real_radii = knn_radii(x, k, batch_size)
    fake_radii = knn_radii(y, k, batch_size)
    x_sq = np.sum(x * x, axis=1)
    fake_inside = np.zeros(len(y), dtype=bool)  # Inside some real ball -> precision.
    real_inside = np.zeros(len(x), dtype=bool)  # Inside some fake ball -> recall.
    for start in range(0, len(y), batch_size):
        d = _squared_distances(y[start:start + batch_size], x, x_sq)  # [b, N]
        fake_inside[start:start + batch_size] = np.any(d <= real_radii[None, :], axis=1)
        real_inside |= np.any(d <= fake_radii[start:start + batch_size, None], axis=0)
    return PrecisionRecall(float(fake_inside.mean()), float(real_inside.mean()))
