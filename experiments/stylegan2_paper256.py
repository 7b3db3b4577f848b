"""StyleGAN2-ADA `paper256` (Karras et al. 2020, arXiv:2006.06676): FFHQ at 256x256.

    python tools/prepare_data.py --source=folder:/data/ffhq/images1024x1024 \
        --resolution=256 --out=/data/ffhq256
    python -m tf_gan_scale.main --config=experiments/stylegan2_paper256.py \
        --workdir=/tmp/paper256 --strategy=mirrored

The official preset, frozen (stylegan2-ada-pytorch train.py cfg_specs['paper256']): batch
64 (chunks of 8, the official per-GPU batch at 8 GPUs: minibatch-std groups of 8), fmaps
0.5 (512 channels up to 32x32, then 256, 128, 64), an 8-layer mapping, Adam(0.0025,
betas (0, 0.99)) adjusted for the lazy phases, R1 gamma 1 every 16 steps, path length 2
every 4 steps, style mixing 0.9, EMA half-life 20 kimg, ADA (target 0.6). G 24,767,458 and D
24,001,089 parameters, as the official (tests/architectures/test_stylegan2.py).

Hardware and cost: 8 GPUs in the paper (V100: 4.01 s/kimg, 25,000 kimg); not measured on a
GPU here; on this 2-core CPU one step takes minutes. Expected result: the paper reports FID
4.30 for FFHQ 70k at 256 with ADA (its protocol: fid50k_full); not reproduced here.
"""

from tf_gan_scale import configs


def get_config():
    return configs.stylegan2("paper256")
