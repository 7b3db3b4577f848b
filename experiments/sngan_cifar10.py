"""SNGAN (Miyato et al. 2018, arXiv:1802.05957) on CIFAR-10, unconditional ResNet.

    python -m tf_gan_scale.main --config=experiments/sngan_cifar10.py --workdir=/tmp/sngan \
        --strategy=mirrored

The paper's CIFAR-10 ResNet setting: G with three 256-channel up-blocks (4 -> 32), D with
four 128-channel blocks (two downsampling), spectral norm in D, hinge loss, Adam(2e-4,
beta_1=0, beta_2=0.9), n_dis = 5 D updates per G update, batch 64, 50k G steps, learning
rate decayed linearly to 0. Data: tfds:cifar10 (downloaded once by TFDS, or
--tfds_data_dir; held in memory; `tools/prepare_data.py --source=tfds:cifar10` prepares it
as arrayrecord:DIR, docs/data.md). Scoring: FID against the training set with config.eval (set
config.eval.extractor=inception_v3, needs its weights: see docs/evaluation.md).

Hardware and cost: one GPU in the paper; not measured on a GPU here. On this 2-core CPU a
step (5 D updates + 1 G update at batch 64) takes seconds, so the full run is for a GPU.
Expected result: the paper reports FID 21.7 and IS 8.22 for this model (Table 2,
"SN-GANs" with the ResNet, unconditional; its own Inception protocol); not reproduced
here.
"""

from tf_gan_scale import configs


def get_config():
    c = configs.base()
    c.data.source = "tfds:cifar10"
    c.model.name = "resnet"
    c.model.latent_dim = 128
    c.model.g_channels = (256, 256, 256)
    c.model.d_channels = (128, 128, 128, 128)
    c.model.d_downsample = 2
    c.model.g_norm = "batch"
    c.model.d_spectral_norm = True
    for key in ("d_dropout", "d_norm"):  # dcgan options the resnet family does not take.
        del c.model[key]
    c.train.loss = "hinge"
    c.train.d_steps = 5
    c.train.global_batch_size = 64
    c.train.num_steps = 50_000
    c.train.lr_decay = "linear"
    for opt in (c.train.g_optimizer, c.train.d_optimizer):
        opt.learning_rate = 2e-4
        opt.beta_1 = 0.0
        opt.beta_2 = 0.9
    c.train.checkpoint_every = 2_000
    c.train.sample_every = 1_000
    c.eval.num_samples = 10_000
    return c
