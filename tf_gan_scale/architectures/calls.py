"""The call contract of a generator or discriminator: one input, or two when conditional.

A conditional network (`architectures.build(..., num_classes=N)` with N > 0, or a user's
Keras model with two inputs) takes [inputs, labels int32 [B]]; every other one takes its
input alone. Training, sampling, scoring and export call networks through these helpers,
so that rule lives here once.
"""

import tensorflow as tf


def is_conditional(model):
    """A conditional network takes two inputs: [z or x, labels int32 [B]]; every other
    one takes a single input."""
    return len(getattr(model, "inputs", None) or ()) == 2


def call_generator(generator, z, labels=None, training=False):
    """generator(z) or, for a conditional generator, generator([z, labels]):
    z [B, latent_dim], labels int32 [B] -> [B, *data_shape] float32."""
    if is_conditional(generator):
        if labels is None:
            raise ValueError("a conditional generator needs class labels")
        out = generator([z, tf.cast(labels, tf.int32)], training=training)
    else:
        out = generator(z, training=training)
    # float32 whatever the policy (precision.py): what losses, D and samples expect.
    return tf.cast(out, tf.float32)


def generate(generator, z, batch_size=256, labels=None):
    """generator(z) (or generator([z, labels]) if conditional) in inference mode, in
    chunks: z [N, latent_dim], labels int [N] -> [N, *data_shape]."""
    out = [call_generator(generator, z[i:i + batch_size],
                          None if labels is None else labels[i:i + batch_size])
           for i in range(0, int(z.shape[0]), batch_size)]
    return tf.concat(out, 0)
