"""Normalization layers by name, with cross-replica batch norm as the default."""

import keras

from tf_gan_scale import errors
from tf_gan_scale.layers.sync_batch_norm import SyncBatchNormalization

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
