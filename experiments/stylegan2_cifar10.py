"""StyleGAN2-ADA `cifar` preset: class-conditional CIFAR-10 at 32x32.

    python -m tf_gan_scale.main --config=experiments/stylegan2_cifar10.py \
        --workdir=/tmp/sg2_cifar --strategy=mirrored

The official preset, frozen (cfg_specs['cifar'], with --cond=1): batch 64 (chunks of 32:
minibatch-std groups of 32), fmaps 1 (512 channels), a 2-layer mapping, D 'orig' (no
residuals) with a projection epilogue, Adam(0.0025, betas (0, 0.99)) adjusted for lazy R1,
R1 gamma 0.01 every 16 steps, no path length, no style mixing, EMA half-life 500 kimg ramped
up at 0.05, ADA (target 0.6). G 20,215,315 and D 23,089,664 parameters, as the official.

Hardware and cost: 2 GPUs in the paper (100,000 kimg); not measured on a GPU here. Expected
result: the paper reports FID 2.42 (conditional, ADA; its protocol); not reproduced here.
"""

from tf_gan_scale import configs


def get_config():
    c = configs.stylegan2("cifar")
    c.model.conditional = True
    c.train.num_steps = 100_000_000 // c.train.global_batch_size  # 100,000 kimg.
    return c
