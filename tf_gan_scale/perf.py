"""Process-level performance settings, applied by the binaries before TensorFlow starts.

glibc malloc serves large blocks (activations of a few MB) with mmap and returns freed
memory to the OS; TensorFlow on CPU then pays page faults to re-zero the same memory at
every step (what that cost when it was measured: docs/performance.md). Keeping freed
memory in the heap
(as `MALLOC_MMAP_THRESHOLD_` / `MALLOC_TRIM_THRESHOLD_` would) removes it. The cost: the
process keeps its peak heap instead of shrinking after it.

`time_input_pipeline` times an input pipeline alone (tools/benchmark.py --input_only).
"""

import ctypes
import ctypes.util
import time

_M_TRIM_THRESHOLD = -1
_M_TOP_PAD = -2
_M_MMAP_THRESHOLD = -3
_GIB = 2 ** 30


def tune_malloc():
    """Keeps freed memory for reuse (glibc only; a no-op elsewhere). Returns True if set."""
    name = ctypes.util.find_library("c")
    if not name:
        return False
    try:
        libc = ctypes.CDLL(name)
        mallopt = libc.mallopt
    except (OSError, AttributeError):
        return False
    return bool(mallopt(_M_MMAP_THRESHOLD, _GIB)
                and mallopt(_M_TRIM_THRESHOLD, 2 * _GIB - 1)
                and mallopt(_M_TOP_PAD, _GIB // 2))


def time_input_pipeline(iterator, strategy, *, batches_per_call, warmup_calls=2,
                        min_calls=10, min_seconds=1.0):
    """Speed of a distributed input pipeline alone, pulled the way the train step pulls it.

    Each call of one tf.function takes `batches_per_call` batches with `next(iterator)`
    (GAN.make_train_function takes d_steps x steps_per_execution per call) and hands each
    to `strategy.run`, which only sums one example per replica, so the batch must arrive
    on every replica's device. Timed after `warmup_calls` calls (tracing, prefetch fill)
    over at least `min_calls` calls and `min_seconds` seconds, so the batches prefetched
    during the warm-up are a small part of the count.

    Args:
        iterator: iter(data.distribute(dataset, strategy)), endless.
        strategy: the tf.distribute strategy the dataset was distributed with.
    Returns:
        {"batches": int, "seconds": float, "batches_per_sec": float}, timed part only.
    """
    # Not at the top: main.py imports this module to tune malloc BEFORE TensorFlow loads.
    import tensorflow as tf

    def touch(batch):
        return tf.reduce_sum(batch["x"][:1])

    @tf.function(autograph=False)
    def pull(iterator):
        total = tf.constant(0.0)
        for _ in range(batches_per_call):
            out = strategy.run(touch, args=(next(iterator),))
            total += tf.add_n([tf.identity(v) for v in
                               strategy.experimental_local_results(out)])
        return total

    for _ in range(warmup_calls):
        float(pull(iterator))
    calls = 0
    start = time.perf_counter()
    while calls < min_calls or time.perf_counter() - start < min_seconds:
        float(pull(iterator))  # Waits for the call's batches.
        calls += 1
    seconds = time.perf_counter() - start
    batches = calls * batches_per_call
    return {"batches": batches, "seconds": seconds, "batches_per_sec": batches / seconds}
