"""latents: the counter-based per-example generator (keys, rows, distributions, contexts)."""

import numpy as np
import pytest
import tensorflow as tf

from tf_gan_scale import latents


def test_keys_are_the_same_eager_and_under_xla():
    # stateless_fold_in's default "auto_select" resolves otherwise under XLA (TPU).
    for seed, step, phase in [(0, 7, 3), (1, 0, latents.G_PHASE), (5, 123456, 2001)]:
        fn = lambda: latents.key(seed, tf.constant(step, tf.int64), phase)  # noqa: E731
        eager = int(fn())
        assert int(tf.function(fn, jit_compile=True)()) == eager
        assert int(tf.function(fn)()) == eager


def test_rows_are_independent_of_which_rows_are_drawn_together():
    k = latents.key(3, 1, 0)
    whole = latents.rows_normal(k, tf.range(12), [5]).numpy()
    part = latents.rows_normal(k, tf.constant([9, 2, 4]), [5]).numpy()
    np.testing.assert_array_equal(part, whole[[9, 2, 4]])
    u = latents.rows_uniform(k, tf.range(12), [5]).numpy()
    np.testing.assert_array_equal(latents.rows_uniform(k, [7], [5]).numpy(), u[[7]])


def test_normal_and_uniform_statistics():
    z = latents.rows_normal(latents.key(0, 0, 0), tf.range(2000), [64]).numpy()
    assert abs(z.mean()) < 0.01 and abs(z.std() - 1.0) < 0.01  # 128k values: se 0.003.
    # Neighbouring rows and neighbouring elements are uncorrelated.
    assert abs(np.corrcoef(z[:-1].ravel(), z[1:].ravel())[0, 1]) < 0.015
    assert abs(np.corrcoef(z[:, :-1].ravel(), z[:, 1:].ravel())[0, 1]) < 0.015
    other_step = latents.rows_normal(latents.key(0, 1, 0), tf.range(2000), [64]).numpy()
    assert abs(np.corrcoef(z.ravel(), other_step.ravel())[0, 1]) < 0.015
    u = latents.rows_uniform(latents.key(0, 0, 0), tf.range(2000), [64]).numpy()
    assert u.min() >= 0.0 and u.max() < 1.0 and abs(u.mean() - 0.5) < 0.005


def test_normal_is_finite_at_the_largest_draw():
    # A key whose row 0 starts with the largest 64-bit draw (found by inverting the mix):
    # a 53-bit uniform + 0.5 rounded to 1.0 there and ndtri gave inf.
    z = latents.rows_normal(tf.constant(-4750455131930738884, tf.int64), [0], [1])
    assert np.isfinite(z.numpy()).all() and z.numpy()[0, 0] > 8.0


def test_example_rows_must_match_the_batch():
    with latents.example_rows(tf.constant([0])):
        with pytest.raises(ValueError, match="declared 1 rows for a batch of 5"):
            latents.current_rows(5)
    np.testing.assert_array_equal(latents.current_rows(3).numpy(), [0, 1, 2])  # Restored.
