"""tf_gan_scale: train GANs at scale with TensorFlow 2 / Keras 3 and tf.distribute."""

__version__ = "0.1.0"
