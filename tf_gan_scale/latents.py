"""The one place that owns randomness in training: latents, penalty noise, dropout masks.

Every random value belongs to ONE example: it is a deterministic function of
(seed, step, phase, the example's GLOBAL index in its batch), so one device and N
replicas (on any number of workers) draw the same numbers for the same global batch.
Each replica draws only its own rows, straight from their keys: its cost is O(its
rows), never O(global batch) (at 1,024 replicas, materializing the global batch and
slicing would be 1,024x the work).

How: a counter-based generator. (seed, step, phase) -> a 64-bit key (TensorFlow's
stateless fold-in); row r of that key -> its own stream key = mix(key + r * golden);
element j of the row -> mix(stream + (j + 1) * golden), with `mix` the SplitMix64
finalizer (Steele et al. 2014; passes BigCrush). All of it is vectorized int64
arithmetic (wrapping multiplication), identical on CPU, GPU and in XLA. TensorFlow's own
stateless ops cannot take one key per row without a sequential loop (pfor falls back to
a while loop for them).

Phases separate the draws made within one generator step:
  D update k (k < d_steps) -> phase k; G update -> G_PHASE; penalty noise -> PENALTY_PHASE + k;
  dropout masks -> DROPOUT_PHASE (keyed by the layer's seed and call count, not the step).
Which global rows a replica holds is `replica.global_rows` (what the input pipeline
gives it); `keras.random.SeedGenerator` repeats one stream on every replica and is not
used.
"""

import contextlib
import threading

import numpy as np
import tensorflow as tf

from tf_gan_scale import replica

G_PHASE = 1000
PENALTY_PHASE = 2000
DROPOUT_PHASE = 3000  # layers.ReplicaDropout: (layer seed, call count, DROPOUT_PHASE).
EVAL_PHASE = 4000  # GAN.test_step: (seed, SAMPLE_STEP, EVAL_PHASE), row = evaluation index.
SAMPLE_STEP = -1  # step value used for fixed evaluation/sampling latents.
# Class labels of fake examples: phase LABEL_PHASE + the phase of the latents they go with
# (D update k: LABEL_PHASE + k; G update: LABEL_PHASE + G_PHASE; sampling/evaluation:
# (seed, SAMPLE_STEP, LABEL_PHASE), row = sample index).
# These three are offsets added to another phase (up to G_PHASE + k or EVAL_PHASE), so they
# sit 10,000 apart: LABEL_PHASE + G_PHASE must not be NOISE_PHASE + k (a shared stream
# would correlate the G update's labels with D's instance noise).
LABEL_PHASE = 10_000
NOISE_PHASE = 20_000  # Instance noise of D update k: (seed, step, NOISE_PHASE + k).
AUGMENT_PHASE = 30_000  # DiffAugment of D update k: + k; of the G update: + G_PHASE.
# StyleGAN2 per-layer noise inputs: (G seed, synthesis call count, STYLE_NOISE_PHASE),
# sub-stream = the conv layer's index (layers/stylegan.py, architectures/stylegan2.py).
STYLE_NOISE_PHASE = 40_000
# StyleGAN2 (gan/step.py). Offsets of 100,000 so that none of them plus a phase above
# (up to LABEL_PHASE + G_PHASE, AUGMENT_PHASE + G_PHASE), nor MIX(_LATENT)_PHASE +
# PL_PHASE (400,000, 500,000), meets another.
MIX_PHASE = 100_000  # Style-mixing cut-off of the pass of phase p: + p, row = its chunk.
MIX_LATENT_PHASE = 200_000  # The second latent of style mixing: + p, row = the row.
PL_PHASE = 300_000  # Path-length pass: its latents (its noise image: PL_PHASE + 1).
DREG_PHASE = 700_000  # The lazy R1 pass (its augmentation: AUGMENT_PHASE + DREG_PHASE).


def _i64(hex_constant):
    return int(np.uint64(hex_constant).astype(np.int64))


_GOLDEN = _i64(0x9E3779B97F4A7C15)  # 2^64 / golden ratio: SplitMix64's increment.
_MIX1 = _i64(0xBF58476D1CE4E5B9)
_MIX2 = _i64(0x94D049BB133111EB)


def _shr(x, bits):
    """Logical right shift of int64 (TensorFlow's is arithmetic for signed types)."""
    return tf.bitwise.bitwise_and(tf.bitwise.right_shift(x, bits), (1 << (64 - bits)) - 1)


def _mix(z):
    """SplitMix64 finalizer: int64 -> int64, a bijection that scrambles every bit."""
    z = tf.bitwise.bitwise_xor(z, _shr(z, 30)) * _MIX1
    z = tf.bitwise.bitwise_xor(z, _shr(z, 27)) * _MIX2
    return tf.bitwise.bitwise_xor(z, _shr(z, 31))


def key(seed, step, phase):
    """64-bit key (int64 scalar) of a (seed, step, phase) triple."""
    k = tf.stack([tf.cast(seed, tf.int64), tf.constant(0, tf.int64)])
    # alg pinned: "auto_select" resolves differently under XLA (TPU, jit_compile), which
    # would give other keys there than on CPU/GPU.
    k = tf.random.experimental.stateless_fold_in(k, tf.cast(step, tf.int64), alg="philox")
    k = tf.random.experimental.stateless_fold_in(k, tf.cast(phase, tf.int64), alg="philox")
    return _mix(tf.bitwise.bitwise_xor(k[0], _mix(k[1])))


def stream_bits(keys, rows, size):
    """Random int64 [*keys.shape, len(rows), size]: entry [..., i, j] is element j of the
    stream of global row rows[i] of key keys[...], the bits `rows_uniform` and
    `rows_normal` of that key turn into values.

    keys may hold many keys (any shape): the draws of several keys, e.g. one per
    transform of an augmentation pipeline, then cost one vectorized computation instead of
    one per key (each costs ~20 graph ops per `_mix`: tracing and launching them dominated
    StyleGAN2-ADA's step). Element j of a row does not depend on `size`, so a draw of
    fewer elements is the leading columns of a larger one.
    """
    keys = tf.cast(keys, tf.int64)
    rows = tf.cast(tf.convert_to_tensor(rows), tf.int64)
    stream = _mix(keys[..., None] + rows * _GOLDEN)  # [..., R]: one stream per example.
    j = tf.range(1, tf.cast(size, tf.int64) + 1, dtype=tf.int64) * _GOLDEN  # [size]
    return _mix(stream[..., None] + j)


def uniform_of_bits(bits):
    """Uniform [0, 1) float32 of `stream_bits` (same shape): the top 24 bits, exact in
    float32, at most 1 - 2^-24."""
    return tf.cast(_shr(bits, 40), tf.float32) * (2.0 ** -24)


def normal_of_bits(bits, truncation=None):
    """Standard normal float32 of `stream_bits` (same shape): the inverse normal CDF of a
    uniform strictly inside (0, 1) made of the top 52 bits, computed in float64 (|z| is at
    most 8.3). truncation: see `rows_normal`."""
    # (2 bits + 1) / 2^53 is exact in float64 and lies in [2^-53, 1 - 2^-53]; with 53 bits,
    # bits + 0.5 would round up to 2^53 for the largest value, and ndtri(1) is inf.
    u = (tf.cast(_shr(bits, 12), tf.float64) * 2.0 + 1.0) * (2.0 ** -53)
    if truncation:
        # Phi(-t) = erfc(t / sqrt 2) / 2 (accurate in the tail).
        low = 0.5 * tf.math.erfc(tf.constant(float(truncation) / np.sqrt(2.0), tf.float64))
        u = low + u * (1.0 - 2.0 * low)  # Phi(t) = 1 - Phi(-t).
    return tf.cast(tf.math.ndtri(u), tf.float32)


def _shape(rows, shape):
    return tf.concat([tf.shape(rows)[:1], tf.constant(shape, tf.int32)], 0)


def rows_uniform(k, rows, shape):
    """Uniform [0, 1) noise [len(rows), *shape] (float32) for the global rows `rows` of key
    `k` (24 random bits per value: exact in float32, at most 1 - 2^-24)."""
    size = int(np.prod(shape, dtype=np.int64))
    return tf.reshape(uniform_of_bits(stream_bits(k, rows, size)), _shape(rows, shape))


def rows_normal(k, rows, shape, truncation=None):
    """Standard normal noise [len(rows), *shape] (float32) for the global rows `rows`:
    `normal_of_bits` of their streams.

    truncation: optional float t > 0, the truncation trick (Brock et al. 2018): a normal
    truncated to [-t, t], by mapping the same uniform into (Phi(-t), Phi(t)) before the
    inverse CDF. No resampling loop, and each value is a monotone function of the
    untruncated one (sample i keeps its identity, pulled towards the mode).
    """
    size = int(np.prod(shape, dtype=np.int64))
    return tf.reshape(normal_of_bits(stream_bits(k, rows, size), truncation),
                      _shape(rows, shape))


def rows_labels(k, rows, num_classes):
    """Uniform class labels int32 [len(rows)] in [0, num_classes) for the global rows."""
    u = rows_uniform(k, rows, [])
    return tf.minimum(tf.cast(u * num_classes, tf.int32), num_classes - 1)


def replica_normal(seed, step, phase, per_replica_batch, shape):
    """This replica's latents: rows `replica.global_rows(B)` of the global draw,
    [per_replica_batch, *shape]."""
    return rows_normal(key(seed, step, phase), replica.global_rows(per_replica_batch), shape)


def global_normal(seed, step, phase, global_batch, shape):
    """The whole global batch's latents [global_batch, *shape] (for tests and tools:
    replica r's `replica_normal` equals its rows of this)."""
    return rows_normal(key(seed, step, phase), tf.range(global_batch), shape)


def fixed(seed, num, latent_dim, truncation=None):
    """Latents for sampling and sample grids: [num, latent_dim]; sample i depends on
    (seed, i) only, so the first k of any larger set are the same k."""
    return sample_normal(seed, tf.range(num), latent_dim, truncation)


def sample_normal(seed, rows, latent_dim, truncation=None):
    """Latents of samples `rows` (int [N]) for sampling and evaluation: [N, latent_dim]."""
    return rows_normal(key(seed, SAMPLE_STEP, 0), rows, [latent_dim], truncation)


def sample_labels(seed, rows, num_classes):
    """Class labels int32 [N] of samples `rows` (int [N]) for sampling and evaluation
    (uniform over the classes, as BigGAN's and StudioGAN's FID protocol)."""
    return rows_labels(key(seed, SAMPLE_STEP, LABEL_PHASE), rows, num_classes)


# ---- example rows of the batch a layer is called on ---------------------------------

_ROWS = threading.local()  # MirroredStrategy traces each replica in its own thread.


@contextlib.contextmanager
def example_rows(rows):
    """Declares the global example index of each row of the batch the next layer calls
    see (e.g. D on [real; fake]: rows, then global_batch + rows), for layers that draw
    per-example randomness (`layers.ReplicaDropout`).

    Args:
        rows: int [L], the global index of each of this replica's L rows.
    """
    previous = getattr(_ROWS, "rows", None)
    _ROWS.rows = rows
    try:
        yield
    finally:
        _ROWS.rows = previous


def current_rows(batch_size):
    """Global example indices [batch_size] of the batch being processed: the ones set by
    `example_rows`, else this replica's rows of a global batch made of equal per-replica
    batches (`replica.global_rows`).

    The context is per thread: MirroredStrategy runs each replica in its own thread, so
    set it inside the replica function (as `GAN.train_step` does), not around
    `strategy.run`.
    """
    rows = getattr(_ROWS, "rows", None)
    if rows is None:
        return replica.global_rows(batch_size)
    static = tf.get_static_value(batch_size)
    if rows.shape[0] is not None and static is not None and rows.shape[0] != static:
        raise ValueError(f"example_rows declared {rows.shape[0]} rows for a batch of {static}")
    return rows


# ---- sub-streams of a key ----------------------------------------------------------

_SUBKEY = _i64(0xD1B54A32D192ED03)  # An arbitrary odd constant: salts sub-stream indices.


def subkey(k, i):
    """Key (int64, the broadcast shape of k and i) of sub-stream `i` (int >= 0) of key `k`:
    independent draws from one (seed, step, phase) key, e.g. one per transform of
    `augment.augment`. Elementwise: subkey(k, [i, j]) = [subkey(k, i), subkey(k, j)].

    subkey(k, i) = mix(k xor mix(i * golden + salt)), a fold-in like `key`'s last step:
    distinct i give unrelated keys, and row r of a sub-key (`rows_uniform(subkey(k, i),
    rows, shape)`) still depends only on (k, i, r), so it is the same on one device and
    on N replicas.
    """
    i = tf.cast(i, tf.int64)
    return _mix(tf.bitwise.bitwise_xor(tf.cast(k, tf.int64), _mix(i * _GOLDEN + _SUBKEY)))
