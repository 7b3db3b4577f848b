"""DCGAN on scikit-learn's handwritten digits (8x8, embedded in the package): the default.

    python -m tf_gan_scale.main --config=experiments/digits.py --workdir=/tmp/digits

Needs no network. Hardware and cost: 2 CPU cores, 38-43 s for 3000 steps at global batch 64
(measured 2026-12-01, quiet; see docs/performance.md). Expected result: recognizable digits in
/tmp/digits/samples/step_0003000.png.
"""

from tf_gan_scale import configs


def get_config():
    c = configs.base()
    c.data.source = "embedded:digits"
    c.model.latent_dim = 32
    c.model.g_channels = (128, 64, 32)
    c.model.d_channels = (32, 64)
    c.train.num_steps = 3000
    c.train.global_batch_size = 64
    c.train.g_optimizer.learning_rate = 2e-4
    c.train.d_optimizer.learning_rate = 2e-4
    c.train.g_optimizer.beta_1 = 0.5
    c.train.d_optimizer.beta_1 = 0.5
    c.train.checkpoint_every = 1000
    c.train.sample_every = 500
    return c
