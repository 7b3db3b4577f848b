"""The TensorFlow DCGAN tutorial (tensorflow.org/tutorials/generative/dcgan) on MNIST.

    python -m tf_gan_scale.main --config=experiments/dcgan_mnist.py --workdir=/tmp/mnist

The model is the tutorial's, layer for layer (architectures/dcgan.py), with its optimizers
(Adam 1e-4), loss (non-saturating cross-entropy) and batch (256); the tutorial trains 50
epochs = 11,700 steps. Data: tfds:mnist (downloaded once by TFDS, or --tfds_data_dir).
Hardware and cost: 0.76-0.78 s per step on 2 CPU cores (docs/performance.md, measured on
random data of MNIST's shape, 2026-11-30), so ~2.5 hours; a GPU is the place for it (not
measured on a GPU). Expected, as in the
tutorial: clean digits in samples/ by the end.
"""

from tf_gan_scale import configs


def get_config():
    c = configs.base()
    c.data.source = "tfds:mnist"
    c.model.name = "dcgan"
    c.model.latent_dim = 100
    c.model.d_dropout = 0.3
    c.train.num_steps = 11_700
    c.train.global_batch_size = 256
    c.train.loss = "non_saturating"
    c.train.checkpoint_every = 1000
    c.train.sample_every = 500
    return c
