"""MLP GAN on PacGAN's 2D grid of 25 Gaussians (toy:grid25; toy:ring8 also works).

    python -m tf_gan_scale.main --config=experiments/gauss2d.py --workdir=/tmp/grid25

Hardware and cost: 2 CPU cores, 5.7 ms/step (tools/benchmark.py); the whole 5,000-step run
took 36 s including start-up (measured 2026-11-30).
Expected: the sample scatter in samples/ covers most of the 25 modes (mode collapse shows
as missing modes).
"""

import ml_collections

from tf_gan_scale import configs


def get_config():
    c = configs.base()
    c.data.source = "toy:grid25"
    c.model = ml_collections.ConfigDict({
        "name": "mlp", "latent_dim": 2, "hidden": (128, 128, 128),
        "g_norm": "batch", "d_norm": "none", "sync_bn": True})
    c.train.num_steps = 5000
    c.train.global_batch_size = 256
    c.train.g_optimizer.learning_rate = 1e-4
    c.train.d_optimizer.learning_rate = 1e-4
    c.train.checkpoint_every = 1000
    c.train.sample_every = 1000
    return c
