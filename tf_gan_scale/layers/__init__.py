"""Layers used by the architectures; one layer (or factory) per file."""

from tf_gan_scale.layers.conditional_batch_norm import ConditionalBatchNormalization
from tf_gan_scale.layers.normalization import NORMS, make_norm
from tf_gan_scale.layers.replica_dropout import ReplicaDropout
from tf_gan_scale.layers.self_attention import SelfAttention
from tf_gan_scale.layers.spectral_norm import SpectralNormalization
from tf_gan_scale.layers.split import Split
from tf_gan_scale.layers.sync_batch_norm import SyncBatchNormalization

__all__ = ["NORMS", "ConditionalBatchNormalization", "ReplicaDropout", "SelfAttention",
           "SpectralNormalization", "Split", "SyncBatchNormalization", "make_norm"]
