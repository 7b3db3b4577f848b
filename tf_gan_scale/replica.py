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


def local_rows(global_tensor, per_replica_batch):
    """Rows of a tensor built for the whole global batch that belong to this replica.

    `global_tensor`: [global_batch, ...] -> [per_replica_batch, ...]. Replica r owns rows
    [r*B, (r+1)*B), matching how `experimental_distribute_dataset` splits a global batch.
    """
    start = tf.cast(replica_id(), tf.int32) * per_replica_batch
    return global_tensor[start:start + per_replica_batch]
