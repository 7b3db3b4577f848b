"""Conditional batch norm (BigGAN's `ccbn`): batch statistics, then a per-example affine.

    y = BN(x) * (1 + gain(c)) + bias(c)

BN normalizes with the batch statistics and has no learned scale or offset
(center=False, scale=False); `gain` and `bias` are bias-free Dense layers of a
conditioning vector c (BigGAN: the shared class embedding concatenated with a chunk of
z). As in BigGAN-PyTorch they are initialized like every other linear layer (orthogonal
by default), not to zero: the scale starts at 1 + gain(c), not exactly at 1.

Distributed behaviour: with `synchronized=True` (default) the statistics come from the
framework's `SyncBatchNormalization`, i.e. over the GLOBAL batch of all replicas and
workers (one all-reduce per layer and pass), so N replicas normalize exactly like one
device on the whole batch and the moving statistics agree on every replica. The affine
part is per example (it reads only c), so it needs no communication. With
`group_size=G` the statistics are over groups of G replicas (ghost batch norm, see
`SyncBatchNormalization`). With
`synchronized=False` each replica uses its own batch (Keras' `BatchNormalization`); the
attribute is named like Keras' so `convert.sync_batch_norm` reports such a layer as
keeping per-replica statistics.
"""

import keras
from keras import ops

from tf_gan_scale.layers.spectral_norm import SpectralNormalization
from tf_gan_scale.layers.sync_batch_norm import SyncBatchNormalization, check_group_size


@keras.saving.register_keras_serializable(package="tf_gan_scale")
class ConditionalBatchNormalization(keras.layers.Layer):
    """Batch norm whose scale and offset are linear functions of a conditioning vector.

    Args:
        momentum: float, moving-statistics momentum (Keras convention: new = momentum *
            old + (1 - momentum) * batch; BigGAN's PyTorch 0.1 is 0.9 here).
        epsilon: float added to the variance (BigGAN: 1e-5).
        synchronized: bool, statistics over the global batch (SyncBatchNormalization)
            instead of each replica's batch.
        group_size: int, replicas per statistics group of the SyncBatchNormalization
            (0: all replicas); needs synchronized=True.
        spectral_norm: bool, wrap `gain` and `bias` in `layers.SpectralNormalization`
            (BigGAN: G's linear layers are spectrally normalized).
        power_iterations: int >= 1, power iterations per training-mode call.
        kernel_initializer: initializer of the gain/bias kernels (a name, config dict or
            instance; each kernel gets its own fresh instance, so an unseeded initializer
            does not repeat its values).
        **kwargs: base Layer arguments (name, dtype).

    Inputs: [x [B, ..., C] (channels last), c [B, D]]. Output: [B, ..., C], like x.

    Example:
        >>> cbn = ConditionalBatchNormalization()
        >>> y = cbn([tf.random.normal([8, 4, 4, 16]), tf.random.normal([8, 10])],
        ...         training=True)                      # [8, 4, 4, 16]
    """

    def __init__(self, momentum=0.9, epsilon=1e-5, synchronized=True, spectral_norm=True,
                 power_iterations=1, kernel_initializer="orthogonal", group_size=0, **kwargs):
        super().__init__(**kwargs)
        self.momentum = float(momentum)
        self.epsilon = float(epsilon)
        self.synchronized = bool(synchronized)
        check_group_size(group_size, 1)
        if group_size and not self.synchronized:
            raise ValueError(f"group_size needs synchronized=True (per-replica statistics "
                             f"have no groups); Received: group_size={group_size}")
        self._group_size = int(group_size or 0)
        self.spectral_norm = bool(spectral_norm)
        self.power_iterations = int(power_iterations)
        self.kernel_initializer = keras.initializers.serialize(
            keras.initializers.get(kernel_initializer))

    def _linear(self, units, name):
        dense = keras.layers.Dense(
            units, use_bias=False, name=name,
            kernel_initializer=keras.initializers.get(self.kernel_initializer))
        if not self.spectral_norm:
            return dense
        return SpectralNormalization(
            dense, power_iterations=self.power_iterations, name=f"{name}_sn")

    def build(self, input_shape):
        x_shape, c_shape = input_shape
        channels = x_shape[-1]
        options = {"group_size": self.group_size} if self.synchronized else {}
        norm = SyncBatchNormalization if self.synchronized else keras.layers.BatchNormalization
        self.norm = norm(center=False, scale=False, momentum=self.momentum,
                         epsilon=self.epsilon, name="norm", **options)
        self.gain = self._linear(channels, "gain")
        self.bias = self._linear(channels, "bias")
        self.norm.build(x_shape)
        self.gain.build(c_shape)
        self.bias.build(c_shape)
        self.built = True

    @property
    def group_size(self):
        return self._group_size

    @group_size.setter
    def group_size(self, value):
        """Also sets it on the built SyncBatchNormalization (before the step is traced)."""
        check_group_size(value, 1)
        if value and not self.synchronized:
            raise ValueError(f"group_size needs synchronized=True; Received: "
                             f"group_size={value}")
        self._group_size = int(value or 0)
        if self.built and self.synchronized:
            self.norm.group_size = self._group_size

    def call(self, inputs, training=None):
        x, c = inputs
        h = self.norm(x, training=training)
        # [B, C] -> [B, 1, ..., 1, C]: one scale and offset per example and channel.
        shape = [-1] + [1] * (len(x.shape) - 2) + [x.shape[-1]]
        gain = ops.reshape(1.0 + self.gain(c, training=training), shape)
        bias = ops.reshape(self.bias(c, training=training), shape)
        return h * ops.cast(gain, h.dtype) + ops.cast(bias, h.dtype)

    def compute_output_shape(self, input_shape):
        return input_shape[0]

    def get_config(self):
        return {**super().get_config(), "momentum": self.momentum, "epsilon": self.epsilon,
                "synchronized": self.synchronized, "spectral_norm": self.spectral_norm,
                "power_iterations": self.power_iterations,
                "kernel_initializer": self.kernel_initializer, "group_size": self.group_size}
