"""From a Source to global batches: shuffle per epoch, batch, distribute, prefetch.

The example order is a deterministic function of (seed, position in the stream). For
in-memory sources, example i of the endless stream is
    epoch = i // N,  index = index_shuffle(i % N, seed=(seed, epoch))
(a stateless random permutation per epoch), so a run resumed after n batches starts the
stream at i = n * global_batch and sees exactly the batches it would have seen without
the interruption, at no cost. Streamed sources use a seeded shuffle buffer and skip.
"""

import tensorflow as tf

from tf_gan_scale import errors
from tf_gan_scale.data.sources import to_float

SHUFFLE_BUFFER = 10_000  # For streamed sources only.
_ENDLESS = 2 ** 62
_INDEX_SHUFFLE_PAD = 498247692  # What index_shuffle puts before a [2] seed.


def _indexed(source, global_batch_size, seed, start_example, repeat):
    n = source.num_examples
    x = tf.constant(source.arrays["x"])
    labels = tf.constant(source.arrays["label"])

    def permuted(i):  # i int64 [GB] -> example indices [GB]
        # tf.random.experimental.index_shuffle(i % n, [seed, i // n], n - 1) for a whole
        # batch in one op: the per-element map it replaces cost ~20 us per example (5 ms
        # per 256-row batch, more than a small GAN's step). The raw op takes [GB, 3]
        # seeds; the wrapper pads its [2] seed with this constant in front (and pads a
        # matrix seed along the wrong axis), so it is called directly: the permutation
        # is bit-identical to the per-element one (tests/data/test_data.py checks it).
        rows = tf.shape(i, out_type=tf.int64)
        key = tf.stack([tf.fill(rows, tf.constant(_INDEX_SHUFFLE_PAD, tf.int64)),
                        tf.fill(rows, tf.constant(seed, tf.int64)), i // n], -1)
        return tf.raw_ops.RandomIndexShuffle(
            index=i % n, seed=key, max_index=tf.fill(rows, tf.constant(n - 1, tf.int64)),
            rounds=4)

    def gather(i):  # i [GB] -> one batch, gathered and converted in one op each.
        idx = permuted(i)
        return {"x": to_float(tf.gather(x, idx)), "label": tf.gather(labels, idx)}

    stop = _ENDLESS if repeat else (start_example // n + 1) * n
    ds = tf.data.Dataset.range(start_example, stop)
    ds = ds.batch(global_batch_size, drop_remainder=True)
    return ds.map(gather, num_parallel_calls=tf.data.AUTOTUNE, deterministic=True)


def _streamed(source, global_batch_size, seed, start_example, repeat):
    ds = source.stream.shuffle(min(SHUFFLE_BUFFER, source.num_examples), seed=seed,
                               reshuffle_each_iteration=True)
    if repeat:
        ds = ds.repeat()
    # Exact but linear in the position: a resumed run re-reads what it skips.
    return ds.skip(start_example).batch(global_batch_size, drop_remainder=True)


def make_dataset(source, *, global_batch_size, seed, start_batch=0, repeat=True):
    """Global batches of `source`.

    Args:
        source: a data.Source.
        global_batch_size: int, examples per batch summed over all replicas.
        seed: int, determines the example order.
        start_batch: int, batches already consumed (to resume where a run stopped).
        repeat: bool; True is endless, False stops at the end of the current epoch.

    Returns:
        tf.data.Dataset of {"x": float32 [global_batch_size, *shape],
                            "label": int32 [global_batch_size]}.
    """
    if not 0 < global_batch_size <= source.num_examples:
        raise errors.ConfigError(
            f"global batch {global_batch_size} must be in [1, {source.num_examples}], "
            f"the size of {source.name}")
    make = _indexed if source.arrays is not None else _streamed
    ds = make(source, global_batch_size, int(seed), int(start_batch) * global_batch_size, repeat)
    options = tf.data.Options()
    options.deterministic = True
    return ds.with_options(options).prefetch(tf.data.AUTOTUNE)


def distribute(dataset, strategy):
    """Splits each global batch across the strategy's replicas; which rows each replica
    gets is `replica.global_rows` (with one worker, replica r gets rows [r*B/N, (r+1)*B/N)).
    The global batch must be divisible by the replica count."""
    return strategy.experimental_distribute_dataset(dataset)
