"""The one place that owns randomness in training: latents and per-example noise.

Every random tensor is a deterministic function of (seed, step, phase, global example
index), built with stateless ops. Each replica materializes the rows of the *global* batch
it owns, so 1 device and N replicas see the same latents for the same global batch.
(`keras.random.SeedGenerator` repeats one stream on every replica and is not used here.)

Phases separate the draws made within one generator step:
  D update k (k < d_steps) -> phase k; G update -> G_PHASE; penalty noise -> PENALTY_PHASE + k.
"""

import tensorflow as tf

from tf_gan_scale import replica

G_PHASE = 1000
PENALTY_PHASE = 2000
SAMPLE_STEP = -1  # step value used for fixed evaluation/sampling latents.


def _key(seed, step, phase):
    """Stateless seed [2] (int64) for a (seed, step, phase) triple."""
    key = tf.stack([tf.cast(seed, tf.int64), tf.constant(0, tf.int64)])
    key = tf.random.experimental.stateless_fold_in(key, tf.cast(step, tf.int64))
    return tf.random.experimental.stateless_fold_in(key, tf.cast(phase, tf.int64))


def global_normal(seed, step, phase, global_batch, shape):
    """Standard normal noise for a whole global batch: [global_batch, *shape], float32."""
    return tf.random.stateless_normal(
        tf.concat([[global_batch], tf.constant(shape, tf.int32)], 0),
        seed=_key(seed, step, phase))


def global_uniform(seed, step, phase, global_batch, shape):
    """Uniform [0, 1) noise for a whole global batch: [global_batch, *shape], float32."""
    return tf.random.stateless_uniform(
        tf.concat([[global_batch], tf.constant(shape, tf.int32)], 0),
        seed=_key(seed, step, phase))


def replica_normal(seed, step, phase, per_replica_batch, shape):
    """This replica's rows of `global_normal`: [per_replica_batch, *shape]."""
    gb = replica.global_batch_size(per_replica_batch)
    return replica.local_rows(global_normal(seed, step, phase, gb, shape), per_replica_batch)


def replica_uniform(seed, step, phase, per_replica_batch, shape):
    """This replica's rows of `global_uniform`: [per_replica_batch, *shape]."""
    gb = replica.global_batch_size(per_replica_batch)
    return replica.local_rows(global_uniform(seed, step, phase, gb, shape), per_replica_batch)


def fixed(seed, num, latent_dim):
    """Latents for sampling and sample grids: [num, latent_dim]; same seed => same latents."""
    return global_normal(seed, SAMPLE_STEP, 0, num, [latent_dim])
