"""Cross-replica arithmetic: the single place where losses meet the replica count.

Gradients are SUMMED across replicas (`gan.apply_global_gradients`; Keras 3 optimizers do
the same inside `apply_gradients`). A per-replica loss must therefore be
the replica's share of the global mean: sum of its per-example losses divided by the
*global* batch size. Summed over replicas that is exactly the loss a single device would
compute on the whole global batch, so gradients match too.
"""

import tensorflow as tf


def num_replicas():
    """Replicas in sync (all workers), from either replica or cross-replica context."""
    ctx = tf.distribute.get_replica_context()
    if ctx is not None:
        return ctx.num_replicas_in_sync
    return tf.distribute.get_strategy().num_replicas_in_sync


def replica_id():
    """This replica's index in [0, num_replicas) across all workers (0 outside a strategy)."""
    ctx = tf.distribute.get_replica_context()
    if ctx is None:
        return 0
    return ctx.replica_id_in_sync_group


def global_batch_size(per_replica_batch):
    """Global batch from a per-replica batch size (batches are split evenly: drop_remainder)."""
    return per_replica_batch * num_replicas()


def global_mean(per_example, global_batch):
    """This replica's share of the global-batch mean of `per_example` ([B] -> scalar).

    Divides by the global batch exactly once; the optimizer's cross-replica SUM of
    gradients then yields the gradient of the true global mean.
    """
    per_example = tf.convert_to_tensor(per_example)
    return tf.reduce_sum(per_example) / tf.cast(global_batch, per_example.dtype)


def _layout():
    """(workers, replicas per worker) of the current strategy; (1, 1) outside one."""
    ctx = tf.distribute.get_replica_context()
    strategy = tf.distribute.get_strategy()
    n = num_replicas()
    if ctx is None or n == 1:
        return 1, 1
    if isinstance(strategy, tf.distribute.TPUStrategy):
        # worker_devices lists every core of every host, but the input pipeline shards per
        # host as MultiWorkerMirroredStrategy shards per worker: hosts are the workers
        # here. (By reading TensorFlow's input code; no TPU to test on.)
        hosts = strategy.extended.num_hosts
        return hosts, n // hosts
    local = len(strategy.extended.worker_devices)
    return n // local, local


def global_rows(per_replica_batch):
    """Global indices [per_replica_batch] (int32) of the rows of its global batch that the
    input pipeline hands this replica.

    `experimental_distribute_dataset` rebatches each global batch of B*N rows into N
    chunks of B rows and gives worker w every W-th chunk (auto-sharding by data), and its
    k-th local replica (replica id w*K + k) the k-th of them: chunk k*W + w. With one
    worker that is chunk r for replica r; with 2 workers x 2 replicas, worker 0's
    replicas hold rows [0:B] and [2B:3B]. Latents, penalty noise and dropout masks use
    these indices, so the example paired with row i of the real batch is the one a
    single device pairs with it (tests/test_equivalence.py checks it with 2 workers x 2
    replicas against the pipeline's real rows).
    """
    workers, local = _layout()
    r = tf.cast(replica_id(), tf.int32)
    chunk = (r % local) * workers + r // local
    b = tf.cast(per_replica_batch, tf.int32)
    return chunk * b + tf.range(b)
