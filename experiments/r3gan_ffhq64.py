"""R3GAN "config E" FFHQ at 64x64, unconditional (Huang et al. 2024, arXiv:2501.05441).

    python -m tf_gan_scale.main --config=experiments/r3gan_ffhq64.py \
        --workdir=/tmp/r3gan_ffhq64 --strategy=mirrored

The official preset (brownvc/R3GAN train.py:198-212; README: --gpus=8 --batch=256 --mirror=1
--aug=1 --preset=FFHQ-64), frozen by `configs.r3gan("ffhq64")`: widths 768 x4, 384
(4x4..64x64), 2 blocks per stage, cardinality 96 x4, 48 (16 channels per group), G stages
8..64 / D 64..8 in bfloat16; noise 64, expansion 2, global batch 256. G 22,429,824 and D
22,381,440 parameters, exactly the official's (counted by building its networks:
tests/architectures/test_r3gan.py). Data: FFHQ is not in TFDS: prepare it at 64x64
(tools/prepare_data.py) into arrayrecord:/data/ffhq64.

The official schedules (cosine over T = 2e7 images, no warm-up, constant after; all start at
the first value): lr 2e-4 -> 5e-5 (G and D), Adam beta_2 0.9 -> 0.99 (beta_1 0, eps 1e-8),
gamma (R1 = R2 weight) 2 -> 0.2, EMA half-life 0 -> 500,000 images, augmentation p 0 -> 0.3
(not adaptive; R3GAN's pipe: 'bgc' with the colour probabilities halved, plus cutout).
configs.r3gan sets them all (config.train.cosine; augment "r3gan"). num_steps = T / batch
(78,125), the schedules' end: the official code sets no training length. Not here:
--mirror=1 (x-flipped copies of the data).

Hardware and cost: 8 GPUs in the README (batch 32 per GPU); not measured on a GPU here.
Expected result: the paper reports an FID for this preset (its protocol: fid50k_full of the
EMA generator; the figure is not copied here: not checked against the paper); not reproduced
here."""

from tf_gan_scale import configs


def get_config():
    c = configs.r3gan("ffhq64")
    return c
