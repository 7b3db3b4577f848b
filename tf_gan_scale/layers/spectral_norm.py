"""Spectral normalization (Miyato et al. 2018) as Keras computes it, without a `cond`.

`keras.layers.SpectralNormalization` guards its update with `ops.cond(all(kernel == 0),
keep, normalize)`. Inside a function, TensorFlow builds that as cond_v2, whose gradient
keeps the branch intermediates as optionals (`OptionalNone` for the branch not taken).
DTensor has no layout propagation for `OptionalNone`, so a double backprop through D
(WGAN-GP, R1, path length) failed on a mesh with "'tf.OptionalNone' op does not
implement layout propagation" (docs/notes/dtensor.md). This layer computes both outcomes
and selects by arithmetic: the same values on every engine (an all-zero kernel keeps its kernel and u;
any other kernel is divided by sigma), and one layer for every engine, not a mesh variant.

Keras' semantics are kept as they are, including that the normalized kernel is ASSIGNED
to the wrapped layer's kernel on every training call (so D's gradient reaches the kernel
itself, not through sigma), and the class name, so weight paths
("spectral_normalization/conv2d/kernel") and checkpoints are the same as with Keras'.
"""

import keras
from keras import ops


@keras.saving.register_keras_serializable(package="tf_gan_scale")
class SpectralNormalization(keras.layers.SpectralNormalization):
    """keras.layers.SpectralNormalization with the zero-kernel guard as a select.

    Wraps a layer with a `kernel` or `embeddings` [..., n_out]; vector_u is [1, n_out]."""

    def call(self, inputs, training=False):
        if training:
            kernel, u = self.kernel.value, self.vector_u.value
            new_u, sigma = self._power_iteration()
            # The select as arithmetic: zero = 1.0 for an all-zero kernel, else 0.0. On a
            # mesh, a boolean `all(kernel == 0)` over a split kernel and a `where` with a
            # scalar condition both crashed the step (segmentation fault, TF 2.21).
            zero = ops.cast(ops.equal(ops.max(ops.abs(kernel)), 0), sigma.dtype)
            # An all-zero kernel has sigma 0 (and u from the power iteration 0): divide
            # by 1 instead (0 / 1 = the kernel itself, Keras' `keep` branch) and keep u.
            sigma = sigma * (1 - zero) + zero
            self.vector_u.assign(ops.cast(new_u * (1 - zero) + u * zero, u.dtype))
            self.kernel.assign(ops.cast(ops.divide(kernel, sigma), kernel.dtype))
        output = self.layer(inputs)
        return ops.cast(output, inputs.dtype)

    def _power_iteration(self):
        """(the new u [1, n_out], sigma [1, 1]): Keras' `normalized_weights` before its
        division, so the arithmetic (and its rounding) is Keras'."""
        weights = ops.reshape(self.kernel, [-1, self.kernel_shape[-1]])
        vector_u = self.vector_u.value
        for _ in range(self.power_iterations):
            vector_v = keras.utils.normalize(
                ops.matmul(vector_u, ops.transpose(weights)), axis=None)
            vector_u = keras.utils.normalize(ops.matmul(vector_v, weights), axis=None)
        vector_u = ops.stop_gradient(vector_u)
        vector_v = ops.stop_gradient(vector_v)
        sigma = ops.matmul(ops.matmul(vector_v, weights), ops.transpose(vector_u))
        return vector_u, sigma
