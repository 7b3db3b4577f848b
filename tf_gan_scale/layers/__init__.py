"""Layers used by the architectures; one layer (or factory) per file."""

from tf_gan_scale.layers.normalization import NORMS, make_norm
from tf_gan_scale.layers.replica_dropout import ReplicaDropout

__all__ = ["NORMS", "ReplicaDropout", "make_norm"]
