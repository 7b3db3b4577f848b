"""The conditional BigGAN of tests/helpers/mesh_helpers.py as a config for binary runs:
16x16x1 images of 4 classes (the test writes them as `npz:`, set config.data.source),
hierarchical z, shared embedding, conditional batch norm, self-attention at 8x8, spectral
norm in G and D, projection D, LeCam, an EMA generator; SGD (a conv bias right before a
batch norm has a zero gradient in exact arithmetic, and Adam turns its float32 noise into
+-lr steps). Checkpoints, samples and logs at 5 and 10 of 10 steps."""

import ml_collections

from tf_gan_scale import configs


def get_config():
    c = configs.base()
    c.model = ml_collections.ConfigDict({
        "name": "biggan", "latent_dim": 8, "conditional": True, "ch": 4,
        "g_channels": (2, 2), "d_channels": (1, 2), "attention": 8, "shared_dim": 4,
        "sync_bn": True})
    c.train.global_batch_size = 8
    c.train.d_steps = 2
    c.train.num_steps = 10
    c.train.steps_per_execution = 1
    c.train.log_every = c.train.sample_every = c.train.checkpoint_every = 5
    c.train.lecam_weight = 0.1
    c.train.ema.decay, c.train.ema.start = 0.8, 2
    for opt in (c.train.d_optimizer, c.train.g_optimizer):
        opt.name, opt.learning_rate = "sgd", 0.01
    return c
