"""BigGAN at 128x128 on ImageNet: the paper's setting (Brock et al. 2018, arXiv:1809.11096).

    # 8 GPUs, one machine:
    python -m tf_gan_scale.main --config=experiments/biggan_imagenet128.py \
        --workdir=gs://BUCKET/biggan128 --strategy=mirrored
    # A TPU pod slice (128 cores), or workers via TF_CONFIG / Slurm / Kubernetes
    # (docs/multi_worker.md):
    python -m tf_gan_scale.main --config=experiments/biggan_imagenet128.py \
        --workdir=gs://BUCKET/biggan128 --strategy=tpu --tpu=NAME

Model: ch 96, G blocks 16-8-4-2-1 (output widths x ch) from 4x4, D blocks 1-2-4-8-16-16,
self-attention at 64x64 in both, hierarchical z (120 = 6 chunks of 20) with a shared 128-d
class embedding into every conditional batch norm (statistics over the GLOBAL batch),
projection D, spectral norm in G and D, orthogonal init. Training: hinge loss, global batch 2048,
Adam(beta_1=0, beta_2=0.999), G lr 1e-4, D lr 4e-4 (TTUR), 2 D updates per G update,
orthogonal regularization 1e-4, EMA of G with decay 0.9999 from step 20,000, truncation
at sampling time (tools/sample.py --truncation=...). Data: tfds:imagenet2012 (manual
download; TFDS must prepare it once), center-cropped and resized to 128x128 (@128). At
63 GB of pixels it streams (order depends on the worker count, resume skips): for several
workers or exact resume prepare it once (docs/data.md) and train on the prepared copy:
    python tools/prepare_data.py --source=tfds:imagenet2012@128 --out=/data/in128
    ... --config.data.source=arrayrecord:/data/in128

Hardware and expected cost (from the sources, not measured here: not measured on a GPU):
the paper trains on a TPU v3 pod with 128 cores for 128x128, "between 24 and 48 hours"
to ~150k-200k G steps; BigGAN-PyTorch trains the same model on 8 V100s with batch 256 x 8
accumulations and reports 15 days to 150k iterations. With 8 GPUs and no gradient
accumulation (issue 11 adds it) the global batch must fit: 2048 / 8 = 256 per GPU at 128x128
needs ~32 GB per GPU; lower global_batch_size otherwise. Expected result (paper's abstract):
IS 166.5 and FID 7.4 at 128x128 (with truncation chosen for the best FID).
"""

import ml_collections

from tf_gan_scale import configs


def get_config():
    c = configs.base()
    c.data.source = "tfds:imagenet2012@128"
    c.model = ml_collections.ConfigDict({
        "name": "biggan", "latent_dim": 120, "conditional": True, "ch": 96,
        "g_channels": (16, 8, 4, 2, 1), "d_channels": (1, 2, 4, 8, 16, 16),
        "attention": 64, "shared_dim": 128, "hier": True, "init": "ortho",
        "sync_bn": True, "g_spectral_norm": True, "d_spectral_norm": True})
    c.train.loss = "hinge"
    c.train.d_steps = 2
    c.train.global_batch_size = 2048
    c.train.num_steps = 200_000
    c.train.g_optimizer = ml_collections.ConfigDict(
        {"name": "adam", "learning_rate": 1e-4, "beta_1": 0.0, "beta_2": 0.999,
         "epsilon": 1e-6})
    c.train.d_optimizer = ml_collections.ConfigDict(
        {"name": "adam", "learning_rate": 4e-4, "beta_1": 0.0, "beta_2": 0.999,
         "epsilon": 1e-6})
    c.train.ortho_weight = 1e-4
    c.train.ema.decay = 0.9999
    c.train.ema.start = 20_000
    c.train.checkpoint_every = 1_000
    c.train.sample_every = 1_000
    c.train.log_every = 100
    c.eval.every = 2_000
    c.eval.extractor = "inception_v3"
    c.eval.metrics = "fid,is"
    c.eval.num_samples = 50_000
    c.eval.batch_size = 500
    return c
