"""Inception Score (Salimans et al. 2016, "Improved Techniques for Training GANs").

    IS = exp( E_x KL( p(y|x) || p(y) ) ),   p(y) = E_x p(y|x),

computed on each of `splits` consecutive, near-equal chunks of the samples (chunk i is
rows [i N // splits, (i + 1) N // splits), as in the authors' code), each chunk with its
own marginal p(y); the result is the mean and standard deviation (np.std, ddof=0) of the
per-chunk scores. It ranges from 1 (every sample predicts the same distribution) to K
(confident predictions, all K classes used equally). 0 log 0 is taken as 0, so one-hot
predictions are valid input.
"""

import numpy as np
import scipy.special

from tf_gan_scale.metrics.kid import MeanStd

# Softmax outputs in float32 sum to 1 within ~1e-6; anything further off is not a
# probability vector (typically logits passed by mistake).
_ROW_SUM_TOLERANCE = 1e-3


def inception_score(probs, *, splits=10):
    """Inception Score of class probabilities p(y|x) [N, K]: MeanStd(mean, std) over splits.

    Args:
        probs: [N, K] rows of class probabilities (non-negative, each summing to 1), e.g.
            the softmax of a classifier's logits for N generated samples.
        splits: number of chunks, 1 <= splits <= N (the reference setting is 10 splits
            of 5,000 samples).

    Returns:
        MeanStd: mean and standard deviation of exp(mean KL) over the chunks.
    """
    p = np.asarray(probs, dtype=np.float64)
    if p.ndim != 2 or p.shape[1] < 1:
        raise ValueError(f"inception_score needs probabilities [N, K]; Received: shape={p.shape}")
    if not np.all(np.isfinite(p)) or np.any(p < 0):
        raise ValueError("inception_score needs probabilities >= 0; Received values that "
                         "are negative, NaN or inf (logits instead of softmax outputs?)")
    worst = float(np.max(np.abs(p.sum(axis=1) - 1.0)))
    if worst > _ROW_SUM_TOLERANCE:
        raise ValueError(f"inception_score needs rows that sum to 1; Received a row off by "
                         f"{worst:.3g} (logits instead of softmax outputs?)")
    n = p.shape[0]
    if not 1 <= int(splits) <= n:
        raise ValueError(f"inception_score needs 1 <= splits <= N = {n}; Received: "
                         f"splits={splits}")
    scores = []
    for i in range(int(splits)):
        part = p[i * n // splits:(i + 1) * n // splits]
        marginal = part.mean(axis=0, keepdims=True)  # p(y) of this chunk [1, K].
        # xlogy gives 0 log 0 = 0; where p(y) = 0 every p(y|x) in the chunk is 0 too.
        kl = np.sum(scipy.special.xlogy(part, part) - scipy.special.xlogy(part, marginal),
                    axis=1)
        scores.append(np.exp(kl.mean()))
    scores = np.asarray(scores)
    return MeanStd(float(scores.mean()), float(scores.std()))
