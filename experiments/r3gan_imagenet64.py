"""R3GAN "config E" ImageNet at 64x64, class-conditional (Huang et al. 2024, arXiv:2501.05441).

    python -m tf_gan_scale.main --config=experiments/r3gan_imagenet64.py \
        --workdir=/tmp/r3gan_imagenet64 --strategy=mirrored

The official preset (brownvc/R3GAN train.py:249-266; README: --gpus=64 --batch=4096
--mirror=1 --aug=1 --cond=1 --preset=ImageNet-64), frozen by `configs.r3gan("imagenet64")`:
widths 1536 x5 (4x4..64x64), 2 blocks per stage, cardinality 96 (32 channels per group), G
stages 8..64 / D 64..8 in bfloat16; noise 64, expansion 2, global batch 4096. G 103,570,432
and D 107,205,120 parameters, exactly the official's (counted by building its networks:
tests/architectures/test_r3gan.py). Data: tfds:imagenet_resized/64x64 (downsampled ImageNet,
1000 classes; the official prepares its own imagenet-64x64.zip with dataset_tool.py, which
may resize differently).

The official schedules (cosine over T = 2e8 images, no warm-up, constant after; all start at
the first value): lr 2e-4 -> 5e-5 (G and D), Adam beta_2 0.9 -> 0.99 (beta_1 0, eps 1e-8),
gamma (R1 = R2 weight) 1 -> 0.1, EMA half-life 0 -> 50,000,000 images, augmentation p 0 ->
0.4 (not adaptive; R3GAN's pipe: 'bgc' with the colour probabilities halved, plus cutout).
configs.r3gan sets them all (config.train.cosine; augment "r3gan"). num_steps = T / batch
(48,829), the schedules' end: the official code sets no training length. Not here:
--mirror=1 (x-flipped copies of the data).

Hardware and cost: 64 GPUs in the README (batch 64 per GPU; the official launcher is
single-node, so that command does not run as written); not measured on a GPU here. Expected
result: the paper reports FID 2.09 (its protocol: fid50k_full of the EMA generator); not
reproduced here.
"""

from tf_gan_scale import configs


def get_config():
    c = configs.r3gan("imagenet64")
    return c
