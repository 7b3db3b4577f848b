"""R3GAN "config E" FFHQ at 256x256, unconditional (Huang et al. 2024, arXiv:2501.05441).

    python -m tf_gan_scale.main --config=experiments/r3gan_ffhq256.py \
        --workdir=/tmp/r3gan_ffhq256 --strategy=mirrored

The official preset (brownvc/R3GAN train.py:214-228; README: --gpus=8 --batch=256 --mirror=1
--aug=1 --preset=FFHQ-256), frozen by `configs.r3gan("ffhq256")`: widths 768 x4, 384, 192,
96 (4x4..256x256), 2 blocks per stage, cardinality 96 x4, 48, 24, 12 (16 channels per
group), G stages 32..256 / D 256..32 in bfloat16; noise 64, expansion 2, global batch 256. G
23,057,952 and D 23,009,568 parameters, exactly the official's (counted by building its
networks: tests/architectures/test_r3gan.py). Data: FFHQ is not in TFDS: prepare it at
256x256 (tools/prepare_data.py) into arrayrecord:/data/ffhq256.

The official schedules (cosine over T = 2e7 images, no warm-up, constant after; all start at
the first value): lr 2e-4 -> 5e-5 (G and D), Adam beta_2 0.9 -> 0.99 (beta_1 0, eps 1e-8),
gamma (R1 = R2 weight) 150 -> 15, EMA half-life 0 -> 500,000 images, augmentation p 0 -> 0.3
(not adaptive; R3GAN's pipe: 'bgc' with the colour probabilities halved, plus cutout).
configs.r3gan sets them all (config.train.cosine; augment "r3gan"). num_steps = T / batch
(78,125), the schedules' end: the official code sets no training length. Not here:
--mirror=1 (x-flipped copies of the data).

Hardware and cost: 8 GPUs in the README (batch 32 per GPU); not measured on a GPU here.
Expected result: the paper reports FID 2.75 (its protocol: fid50k_full of the EMA
generator); not reproduced here.
"""

from tf_gan_scale import configs


def get_config():
    c = configs.r3gan("ffhq256")
    return c
