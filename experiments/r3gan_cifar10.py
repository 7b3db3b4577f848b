"""R3GAN "config E" CIFAR-10 at 32x32, class-conditional (Huang et al. 2024, arXiv:2501.05441).

    python -m tf_gan_scale.main --config=experiments/r3gan_cifar10.py \
        --workdir=/tmp/r3gan_cifar10 --strategy=mirrored

The official preset (brownvc/R3GAN train.py:178-196; README: --gpus=8 --batch=512 --mirror=1
--aug=1 --cond=1 --preset=CIFAR10), frozen by `configs.r3gan("cifar10")`: widths 768 x4
(4x4..32x32), 2 blocks per stage, cardinality 96 (16 channels per group), G stages 8,16,32 /
D 32,16,8 in bfloat16; noise 64, expansion 2, global batch 512. G 20,781,952 and D
21,280,512 parameters, exactly the official's (counted by building its networks:
tests/architectures/test_r3gan.py). Data: tfds:cifar10 (labels: 10 classes).

The official schedules (cosine over T = 2e7 images, no warm-up, constant after; all start at
the first value): lr 2e-4 -> 5e-5 (G and D), Adam beta_2 0.9 -> 0.99 (beta_1 0, eps 1e-8),
gamma (R1 = R2 weight) 0.05 -> 0.005, EMA half-life 0 -> 5,000,000 images, augmentation p 0
-> 0.55 (not adaptive; R3GAN's pipe: 'bgc' with the colour probabilities halved, plus
cutout). configs.r3gan sets them all (config.train.cosine; augment "r3gan"). num_steps = T /
batch (39,063), the schedules' end: the official code sets no training length. Not here:
--mirror=1 (x-flipped copies of the data).

Hardware and cost: 8 GPUs in the README (batch 64 per GPU); not measured on a GPU here.
Expected result: the paper reports FID 1.96 (its protocol: fid50k_full of the EMA
generator); not reproduced here.
"""

from tf_gan_scale import configs


def get_config():
    c = configs.r3gan("cifar10")
    return c
