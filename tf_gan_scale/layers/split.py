"""Splits the last axis into consecutive chunks of given sizes (BigGAN's hierarchical z).

A layer rather than `z[:, a:b]` on a KerasTensor: slicing a symbolic tensor adds a Keras
`GetItem` operation to the Functional graph, which is not a Layer, and
`keras.models.clone_model` with a `clone_function` (what `convert.sync_batch_norm`, and so
`GAN(sync_batch_norm="auto")` under several replicas, runs) then fails with
"'GetItem' object has no attribute '_flatten_layers'".
"""

import keras

@keras.saving.register_keras_serializable(package="tf_gan_scale")
class Split(keras.layers.Layer):
    """[B, ..., sum(sizes)] -> list of [B, ..., sizes[i]], in order.

    Args:
        sizes: list of ints >= 1 (their sum must equal the last dimension).
        **kwargs: base Layer arguments (name, dtype).

    Example:
        >>> z0, z1, z2 = Split([4, 3, 3])(tf.random.normal([8, 10]))   # [8, 4], [8, 3], [8, 3]
    """

    def __init__(self, sizes, **kwargs):
        super().__init__(**kwargs)
        self.sizes = [int(s) for s in sizes]
        if not self.sizes or min(self.sizes) < 1:
            raise ValueError(f"Split sizes must be ints >= 1; Received: sizes={sizes}")

    def build(self, input_shape):
        if input_shape[-1] != sum(self.sizes):
            raise ValueError(f"Split sizes {self.sizes} sum to {sum(self.sizes)}, but the "
                             f"last dimension is {input_shape[-1]}")
        self.built = True

    def call(self, inputs):
        bounds = [0]
        for size in self.sizes:
            bounds.append(bounds[-1] + size)
        return [inputs[..., a:e] for a, e in zip(bounds[:-1], bounds[1:])]

    def compute_output_shape(self, input_shape):
        return [tuple(input_shape[:-1]) + (s,) for s in self.sizes]

    def get_config(self):
        return {**super().get_config(), "sizes": list(self.sizes)}
