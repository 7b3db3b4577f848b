"""StyleGAN2 config F (`stylegan2` preset of StyleGAN2-ADA): FFHQ at 1024x1024, with ADA.

    python tools/prepare_data.py --source=folder:/data/ffhq/images1024x1024 \
        --out=/data/ffhq1024
    python -m tf_gan_scale.main --config=experiments/stylegan2_ffhq1024.py \
        --workdir=/tmp/ffhq1024 --strategy=multi_worker_mirrored

The official preset, frozen (cfg_specs['stylegan2']): batch 32 (chunks of 4: minibatch-std
groups of 4), fmaps 1 (512 channels up to 64x64, then 256, 128, 64, 32), an 8-layer mapping,
Adam(0.002, betas (0, 0.99)) adjusted for the lazy phases, R1 gamma 10 every 16 steps, path
length 2 every 4 steps, style mixing 0.9, EMA half-life 10 kimg. G 30,370,060 and D
29,012,513 parameters, as the official.

Hardware and cost: 8 GPUs (V100: 17.55 s/kimg in the official README); not measured on a GPU
here, and far beyond this CPU. Expected result: FID 2.81 for the official config-F weights
(fid50k_full, third-party re-evaluation); not reproduced here.
"""

from tf_gan_scale import configs


def get_config():
    return configs.stylegan2("stylegan2")
