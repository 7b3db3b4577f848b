"""Class-conditional BigGAN on CIFAR-10: BigGAN-PyTorch's `launch_cifar_ema.sh` setting.

    python -m tf_gan_scale.main --config=experiments/biggan_cifar10.py --workdir=/tmp/bigc10 \
        --strategy=mirrored

G and D at 32x32 (G blocks 4-4-4 x ch 64, D 4-4-4-4 x ch 64, no attention), conditional
batch norm from the class embedding, projection D, spectral norm in G and D, N(0, 0.02)
init, hinge loss, Adam(2e-4, beta_1=0, beta_2=0.999) for both, 4 D updates per G update,
EMA of G (decay 0.9999 from step 1,000) used for samples and scores. BigGAN-PyTorch trains
batch 50 for 500 epochs on 2 GPUs; here the global batch is 64 (divisible by 1, 2, 4 or 8
replicas) and 100k G steps (~512 epochs of 50k images at 4 D batches per step).
Data: tfds:cifar10 with its labels (config.model.conditional=True); 150 MB, held in memory:
the same order on any topology and exact resume. Or prepared (docs/data.md):
`python tools/prepare_data.py --source=tfds:cifar10 --out=DIR`, then
--config.data.source=arrayrecord:DIR.

Hardware and cost: 2 GPUs in BigGAN-PyTorch; not measured on a GPU here. On this 2-core
CPU it is far too slow for the full run. Expected result: StudioGAN's benchmark lists
BigGAN on CIFAR-10 at an FID of about 8 (its protocol, its code); not reproduced here.
"""

import ml_collections

from tf_gan_scale import configs


def get_config():
    c = configs.base()
    c.data.source = "tfds:cifar10"
    c.model = ml_collections.ConfigDict({
        "name": "biggan", "latent_dim": 128, "conditional": True, "ch": 64,
        "g_channels": (4, 4, 4), "d_channels": (4, 4, 4, 4), "attention": 0,
        "shared_dim": 128, "hier": False, "init": "normal", "sync_bn": True,
        "g_spectral_norm": True, "d_spectral_norm": True})
    c.train.loss = "hinge"
    c.train.d_steps = 4
    c.train.global_batch_size = 64
    c.train.num_steps = 100_000
    for opt in (c.train.g_optimizer, c.train.d_optimizer):
        opt.learning_rate = 2e-4
        opt.beta_1 = 0.0
        opt.beta_2 = 0.999
    c.train.ema.decay = 0.9999
    c.train.ema.start = 1_000
    c.train.checkpoint_every = 2_000
    c.train.sample_every = 1_000
    return c
