"""From a Source to batches: global ones, or each worker's per-replica ones.

The global row is the unit. Global batch g holds the examples at stream positions
i = g * GB .. (g + 1) * GB - 1, and for in-memory and random-access sources position i
is the example
    epoch = i // N,  index = index_shuffle(i % N, seed=(seed, epoch))
(a stateless random permutation per epoch, as NVlabs/edm2's sampler). Under a strategy
every worker builds only its own replicas' rows (`distribute`): global batch g splits
into R chunks of B = GB / R rows, and local replica k of worker w (W workers) gets chunk
k*W + w, the rows `replica.global_rows` names. So the examples of every step are the
same on any number of workers and replicas, each worker reads 1/W of them, and a run
resumed after n batches starts at position n * GB with no reads (O(1) at any position).

Streamed sources (TFDS TFRecord builds too large for memory) cannot seek: each worker
reads its own 1/W part of the split through a uint8 shuffle buffer, so their order
depends on W; resuming skips this worker's own consumed examples (exact on the same
numbers of workers and replicas) up to STREAM_SKIP_LIMIT, past which the shuffle is re-seeded at the
position instead (O(1), not the same examples); one log line says which.
"""

import dataclasses
import functools

import tensorflow as tf
from absl import logging

from tf_gan_scale import errors
from tf_gan_scale.data.sources import to_float

SHUFFLE_BUFFER = 10_000  # For streamed sources only; of uint8 examples.
# A streamed resume skips (decodes) up to this many examples per worker (~25-34 us each,
# ~1 minute), and past it re-seeds instead.
STREAM_SKIP_LIMIT = 2_000_000
_ENDLESS = 2 ** 62
_INDEX_SHUFFLE_PAD = 498247692  # What index_shuffle puts before a [2] seed.


def permuted(positions, num_examples, seed):
    """Stream positions int64 [n] -> example indices int64 [n] (see the module docstring).

    tf.random.experimental.index_shuffle(i % n, [seed, i // n], n - 1) for a whole batch
    in one op: the per-element map it replaces cost ~20 us per example. The raw op takes
    [n, 3] seeds; the wrapper pads its [2] seed with this constant in front (and pads a
    matrix seed along the wrong axis), so it is called directly: the permutation is
    bit-identical to the per-element one (tests/data/test_data.py checks it, and pins
    its first values, so a TensorFlow upgrade that changes it fails a test).
    """
    n = tf.constant(num_examples, tf.int64)
    rows = tf.shape(positions, out_type=tf.int64)
    key = tf.stack([tf.fill(rows, tf.constant(_INDEX_SHUFFLE_PAD, tf.int64)),
                    tf.fill(rows, tf.constant(seed, tf.int64)), positions // n], -1)
    return tf.raw_ops.RandomIndexShuffle(index=positions % n, seed=key,
                                         max_index=tf.fill(rows, n - 1), rounds=4)


@dataclasses.dataclass(frozen=True)
class Split:
    """Which rows of each global batch one process builds.

    Each global batch splits into `num_chunks` chunks of GB / num_chunks rows; this
    process builds `chunks` (chunk ids, in the order its consumers take them), one
    element per chunk per global batch. Streams, which cannot pick rows, read part
    `part` of `num_parts` of the data instead."""
    num_chunks: int
    chunks: tuple
    num_parts: int = 1
    part: int = 0

    @classmethod
    def of(cls, input_context):
        """A tf.distribute.InputContext's split (None: whole global batches): local
        replica k of worker w (W workers) takes chunk k*W + w (replica.global_rows)."""
        if input_context is None:
            return cls(1, (0,))
        ctx = input_context
        workers, w = ctx.num_input_pipelines, ctx.input_pipeline_id
        replicas = ctx.num_replicas_in_sync
        return cls(replicas, tuple(k * workers + w for k in range(replicas // workers)),
                   workers, w)

    def positions(self, e, global_batch_size):
        """Stream positions int64 [GB / num_chunks] of this process's e-th element (an
        int64 scalar tensor): chunk chunks[e % K] of global batch e // K."""
        per, local = global_batch_size // self.num_chunks, len(self.chunks)
        chunk = tf.gather(tf.constant(self.chunks, tf.int64), e % local)
        return (e // local) * global_batch_size + chunk * per + tf.range(per, dtype=tf.int64)

    def check(self, global_batch_size):
        if global_batch_size % self.num_chunks:
            raise errors.ConfigError(
                f"global batch {global_batch_size} must split evenly over "
                f"{self.num_chunks} replicas; valid: a multiple of {self.num_chunks}")


def _random_access(source, read, gb, seed, start_batch, repeat, split):
    n = source.num_examples
    local = len(split.chunks)
    start_example = start_batch * gb
    stop_batch = (_ENDLESS // gb if repeat
                  else start_batch + ((start_example // n + 1) * n - start_example) // gb)

    rows = gb // split.num_chunks

    def load(e):
        ex = read(permuted(split.positions(e, gb), n, seed))
        # Static shapes, as batch(drop_remainder=True) gives (XLA, TPU).
        return {"x": tf.ensure_shape(to_float(ex["x"]), [rows, *source.shape]),
                "label": tf.ensure_shape(ex["label"], [rows])}

    ds = tf.data.Dataset.range(start_batch * local, stop_batch * local)
    return ds.map(load, num_parallel_calls=tf.data.AUTOTUNE, deterministic=True)


def _streamed(source, gb, seed, start_batch, repeat, split):
    workers, w = split.num_parts, split.part
    if split.num_chunks % workers:  # E.g. a mesh whose "model" axis spans clients.
        raise errors.ConfigError(
            f"{source.name} is a stream: each of the {workers} workers (or DTensor clients) "
            f"must hold rows of its own, but the global batch splits into "
            f"{split.num_chunks} parts; valid: a prepared source (arrayrecord:DIR, "
            f"tools/prepare_data.py), or a mesh with a batch axis divisible by the clients")
    rows_per_chunk = gb // split.num_chunks
    part = source.shard(workers, w)
    # Parts differ by at most one example, so each holds at least its share of a global
    # batch (GB <= N and GB % W == 0 are checked): no worker runs dry.
    part_size = source.num_examples // workers
    consumed = start_batch * rows_per_chunk * len(split.chunks)  # This part's so far.
    skip = consumed
    if consumed > STREAM_SKIP_LIMIT:
        # O(1) instead of decoding `consumed` examples: a new shuffle order from here on.
        seed, skip = (seed * 1_000_003 + start_batch) % 2 ** 31, 0
    if consumed:
        logging.info("%s is a stream (no random access): worker %d of %d %s", source.name,
                     w, workers,
                     f"skips its {consumed} consumed examples (exact if the run had "
                     f"{workers} workers x {len(split.chunks)} replicas)" if skip else
                     f"re-seeds its shuffle at batch {start_batch} instead of skipping "
                     f"{consumed} examples (> {STREAM_SKIP_LIMIT}): O(1), not the examples "
                     f"an uninterrupted run would see; prepare the data for an exact resume")
    ds = part.shuffle(min(SHUFFLE_BUFFER, max(part_size, 1)), seed=seed,
                      reshuffle_each_iteration=True)
    if repeat:
        ds = ds.repeat()
    ds = ds.skip(skip).batch(rows_per_chunk, drop_remainder=True)
    return ds.map(lambda ex: {"x": to_float(ex["x"]), "label": ex["label"]},
                  num_parallel_calls=tf.data.AUTOTUNE, deterministic=True)


def check_batch_size(source, global_batch_size):
    """ConfigError unless a global batch fits in `source` (an epoch holds at least one).
    prepare_run calls it before a run writes anything; make_dataset again for its callers."""
    if not 0 < global_batch_size <= source.num_examples:
        raise errors.ConfigError(
            f"global batch {global_batch_size} must be in [1, {source.num_examples}], "
            f"the size of {source.name}")


def make_dataset(source, *, global_batch_size, seed, start_batch=0, repeat=True,
                 input_context=None, split=None):
    """Batches of `source`.

    Args:
        source: a data.Source.
        global_batch_size: int, examples per batch summed over all replicas.
        seed: int, determines the example order.
        start_batch: int, global batches already consumed (to resume where a run stopped).
        repeat: bool; True is endless, False stops at the end of the current epoch.
        input_context: a tf.distribute.InputContext (W workers, this one w, R replicas):
            this worker's per-replica batches, K = R / W per global batch in local
            replica order (see the module docstring); None: whole global batches.
        split: instead of input_context, any Split (the mesh's per-client rows).

    Returns:
        tf.data.Dataset of {"x": float32 [B, *shape], "label": int32 [B]}, B the global
        batch (no input_context) or the per-replica batch.
    """
    check_batch_size(source, global_batch_size)
    per_worker = split is not None or input_context is not None
    split = split or Split.of(input_context)
    split.check(global_batch_size)
    read = source.reader()
    if read is not None:
        ds = _random_access(source, read, global_batch_size, int(seed), int(start_batch),
                            repeat, split)
    else:
        ds = _streamed(source, global_batch_size, int(seed), int(start_batch), repeat, split)
    options = tf.data.Options()
    options.deterministic = True
    # Per-worker datasets hold this worker's rows already: TensorFlow must not shard them
    # again. Global batches (`distribute(dataset, strategy)`) shard by DATA: each worker
    # keeps its rows of the global batch (OFF would train every worker on the whole batch:
    # the equivalence tests fail; FILE, AUTO's pick for a TFDS stream, other examples).
    policy = tf.data.experimental.AutoShardPolicy
    options.experimental_distribute.auto_shard_policy = (
        policy.OFF if per_worker else policy.DATA)
    return ds.with_options(options).prefetch(tf.data.AUTOTUNE)


def input_fn(source, *, global_batch_size, seed, start_batch=0):
    """The run's input as a function of an InputContext (see make_dataset): `distribute`
    gives it to the strategy; called with no argument it gives global batches (one
    process feeding every device: a placement, the mesh)."""
    return functools.partial(make_dataset, source, global_batch_size=global_batch_size,
                             seed=seed, start_batch=start_batch)


def distribute(data, strategy):
    """A strategy's distributed dataset.

    data: an `input_fn` (each worker builds only its replicas' rows), or a tf.data.Dataset
        of global batches (Keras notebooks: every worker builds the whole batch and
        TensorFlow keeps its rows; replica r of one worker gets rows [r*B, (r+1)*B)).
    Either way replica r holds the rows `replica.global_rows` names; the global batch
    must be divisible by the replica count."""
    if isinstance(data, tf.data.Dataset):
        return strategy.experimental_distribute_dataset(data)
    return strategy.distribute_datasets_from_function(
        lambda ctx: data(input_context=ctx))
