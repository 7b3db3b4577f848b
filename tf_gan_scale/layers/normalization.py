"""Normalization layers by name, with cross-replica batch norm as the default."""

import keras

from tf_gan_scale import errors
from tf_gan_scale.layers.conditional_batch_norm import ConditionalBatchNormalization
from tf_gan_scale.layers.sync_batch_norm import SyncBatchNormalization, check_group_size

NORMS = ("none", "batch")


def make_norm(kind, *, sync_bn=True, name=None):
    """A normalization layer, or None for "none".

    Args:
        kind: one of NORMS.
        sync_bn: bool. True computes batch statistics over the GLOBAL batch (all replicas,
            all workers) with one all-reduce per layer (SyncBatchNormalization), so N
            replicas normalize exactly like one device on the whole batch. False uses
            each replica's local batch.
        name: optional layer name.
    """
    errors.choose("norm", kind, {k: k for k in NORMS})
    if kind == "none":
        return None
    if sync_bn:
        return SyncBatchNormalization(name=name)
    return keras.layers.BatchNormalization(name=name)


def set_group_size(model, group_size):
    """Sets `group_size` (replicas per statistics group, 0: all) on every
    SyncBatchNormalization and ConditionalBatchNormalization inside `model`, at any depth.

    Call it before the training step is traced (the layers read it when traced). Returns
    the number of layers set; per-replica layers (plain BatchNormalization,
    ConditionalBatchNormalization(synchronized=False)) are left alone.
    """
    check_group_size(group_size, 1, name="group_size")
    count = 0
    for layer in model._flatten_layers(include_self=True, recursive=True):
        if isinstance(layer, SyncBatchNormalization) or (
                isinstance(layer, ConditionalBatchNormalization) and layer.synchronized):
            layer.group_size = int(group_size or 0)
            count += 1
    return count


def check_config(group_size, num_replicas, *, sync_bn=True):
    """ConfigError (one line) unless config.model.sync_bn_group_size=`group_size` fits
    `num_replicas` replicas (0, >= the replicas, or a divisor) and cross-replica BN."""
    name = "config.model.sync_bn_group_size"
    check_group_size(group_size, num_replicas, name=name)
    if group_size and not sync_bn:
        raise errors.ConfigError(f"{name}={group_size} needs config.model.sync_bn=True "
                                 f"(per-replica statistics have no groups); valid: 0")


def set_row_groups(model, num_shards):
    """For an engine that runs the global batch as ONE replica split over `num_shards`
    batch shards (a DTensor mesh: shard i holds the i-th contiguous chunk of rows, as
    replica i of a single-worker strategy does): every SyncBatchNormalization (also the one
    inside a ConditionalBatchNormalization) with group_size G normalizes num_shards // G
    contiguous row groups apart (`virtual_groups`), so its statistics are those of
    `num_shards` replicas with group_size G. Call before the step is traced. Returns the
    number of layers with groups.

    Raises ConfigError (naming config.model.sync_bn_group_size) if a G does not divide
    num_shards."""
    count = 0
    for layer in model._flatten_layers(include_self=True, recursive=True):
        if isinstance(layer, SyncBatchNormalization):
            size = check_group_size(layer.group_size, num_shards,
                                    name="config.model.sync_bn_group_size")
            layer.virtual_groups = num_shards // size
            count += layer.virtual_groups > 1
    return count

