"""Gradient accumulation: an update's rows as micro-batches, their gradients summed.

With config.train.accumulation_steps = K an update runs as K micro-batches of B/K rows,
one forward/backward pass each; their gradients are summed on the replica and all-reduced
ONCE (`GanStep.apply`), each micro-batch's losses divided by the FULL global batch, so the
update is the one of the whole batch (exactly, for networks without batch norm).

`micro_batches` says which rows; `d_micro_batches` / `g_micro_batches` run them one after
the other (the default `Topology`'s way; a pipeline, parallel/pipeline.py, runs the same
micro-batches in its schedule); `add_grads` sums two gradients of one variable.
"""

import tensorflow as tf


def micro_batches(accumulation_steps):
    """Slices of a replica's rows for gradient accumulation: micro-batch j of K
    (K = accumulation_steps) holds the rows j, j + K, j + 2K, ... (rows % K == 0 is
    checked before each step: `checks.assert_accumulation_split`).

    Strided, not contiguous, so that micro-batch j is the same set of GLOBAL rows on
    every topology: a replica's rows start at a multiple of its row count, a multiple
    of K, so global row i falls in micro-batch i mod K everywhere. Batch-norm
    statistics (per micro-batch, over every replica's micro-batch j) then match one
    device with the same K."""
    k = accumulation_steps
    if k == 1:
        return [slice(None)]
    return [slice(j, None, k) for j in range(k)]


def d_micro_batches(step_math, real, real_labels, rows, gb, step, k, penalty_due=None):
    """D's gradients of one update of `step_math` (a `GanStep`) summed over its
    micro-batches (`GanStep.micro_batches`), one `d_grads` after the other, in order:
    (grads, [each one's loss share], riders summed)."""
    grads, shares, means = None, [], []
    for part in step_math.micro_batches():
        g, share, m = step_math.d_grads(real[part], real_labels[part], rows[part], gb,
                                        step, k, penalty_due)
        grads = g if grads is None else [add_grads(x, y) for x, y in zip(grads, g)]
        shares.append(share)
        means = m if not means else [x + y for x, y in zip(means, m)]
    return grads, shares, means


def g_micro_batches(step_math, rows, gb, step, real=None, real_labels=None):
    """G's gradients of one update summed over the micro-batches, in order: (grads,
    [each one's loss share], [each one's sum of w] of a style generator, else []). The
    orthogonal regularizer is taken in the first micro-batch only (once per update).
    real / real_labels: G's own real rows, for a paired loss (else None)."""
    grads, shares, w_sums = None, [], []
    for j, part in enumerate(step_math.micro_batches()):
        reals = {} if real is None else {"real": real[part],
                                         "real_labels": real_labels[part]}
        g, share, w_sum = step_math.g_grads(rows[part], gb, step, regularize=j == 0,
                                            **reals)
        grads = g if grads is None else [add_grads(x, y) for x, y in zip(grads, g)]
        shares.append(share)
        if w_sum is not None:
            w_sums.append(w_sum)
    return grads, shares, w_sums


def add_grads(a, b):
    """Sum of two gradients of one variable (None: not connected). Sparse gradients (an
    embedding's IndexedSlices) are summed by concatenating their rows, as TensorFlow
    aggregates them; `+` is not defined for them."""
    if a is None:
        return b
    if b is None:
        return a
    if isinstance(a, tf.IndexedSlices) and isinstance(b, tf.IndexedSlices):
        return tf.IndexedSlices(tf.concat([a.values, b.values], 0),
                                tf.concat([a.indices, b.indices], 0), a.dense_shape)
    return tf.convert_to_tensor(a) + tf.convert_to_tensor(b)
