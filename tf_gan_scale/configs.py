"""The default config: every key a run reads, in one place.

Experiment files (`experiments/*.py`) start from `base()` and override; with
`lock_config=True` a typo in an override (`--config.train.num_stpes=5`) fails.

Stable keys (a contract): config.seed, config.data.source, config.train.num_steps,
config.train.global_batch_size, and for dcgan config.model.d_dropout.

Numeric keys are range-checked by `training.validate` before a run touches its workdir
(e.g. log_every >= 1, checkpoint_every >= 0, 0 <= d_dropout < 1, learning_rate > 0).
"""

import math

import ml_collections

from tf_gan_scale import data, errors


def base():
    c = ml_collections.ConfigDict()
    c.seed = 0  # Seeds latents, penalty noise, data order and weight init.

    c.data = ml_collections.ConfigDict()
    c.data.source = data.DEFAULT_SOURCE

    # name and latent_dim, plus the options of architectures.build(name) (see each family).
    c.model = ml_collections.ConfigDict()
    c.model.name = "dcgan"
    c.model.latent_dim = 100
    c.model.d_dropout = 0.3
    c.model.sync_bn = True
    # Replicas per batch-norm statistics group (ghost BN, layers.SyncBatchNormalization):
    # 0 = all replicas; else a divisor of the replica count.
    c.model.sync_bn_group_size = 0
    c.model.g_norm = "batch"
    c.model.d_norm = "none"
    c.model.g_channels = (256, 128, 64)
    c.model.d_channels = (64, 128)
    # True: condition G and D on the data's class labels (architectures with a
    # num_classes option, e.g. biggan); the number of classes comes from the source.
    c.model.conditional = False

    c.train = ml_collections.ConfigDict()
    c.train.num_steps = 1000          # Generator steps.
    c.train.global_batch_size = 256   # Summed over all replicas and workers.
    c.train.d_steps = 1               # D updates (each on its own real batch) per G update.
    c.train.loss = "non_saturating"
    c.train.penalty = "none"
    c.train.penalty_weight = 0.0
    c.train.g_optimizer = ml_collections.ConfigDict(
        {"name": "adam", "learning_rate": 1e-4})
    c.train.d_optimizer = ml_collections.ConfigDict(
        {"name": "adam", "learning_rate": 1e-4})
    # Learning-rate schedule of both optimizers (schedules.py): warm-up, then decay.
    c.train.lr_decay = "none"         # none | linear | cosine (to 0 at num_steps).
    c.train.lr_warmup_steps = 0
    # EMA of G's weights (gan/ema.py), used for samples and scores when decay > 0.
    c.train.ema = ml_collections.ConfigDict({"decay": 0.0, "start": 0, "warmup": 0})
    # StyleGAN2-ADA's EMA instead when kimg > 0: half-life in thousands of images, ramped
    # up with the images seen (rampup > 0), gan/ema.py.
    c.train.ema.kimg = 0.0
    c.train.ema.rampup = 0.0
    # Stabilizers (GAN.compile documents each): 0 / "" = off.
    c.train.penalty_every = 1         # Lazy penalty: every k-th D update, weight x k.
    c.train.penalty_fd_sigma = 0.0    # r1_r2 by finite difference with this step (0: exact).
    c.train.augment = ""              # DiffAugment policy: color,translation,cutout; or
    c.train.ada_target = 0.6          # "ada": StyleGAN2-ADA's adaptive pipeline, whose p
    c.train.ada_p = 0.0               # starts here and moves by 1 per ada_kimg x 1000
    c.train.ada_kimg = 500.0          # images towards E[sign D(real)] = ada_target, every
    c.train.ada_interval = 4          # ada_interval steps (0: p fixed).
    # StyleGAN2: R1 (penalty_every) and path length (pl_every) as their own updates.
    c.train.lazy_phases = False
    c.train.pl_weight = 0.0           # Path-length regularization (StyleGAN2: 2).
    c.train.pl_every = 4
    c.train.pl_batch_shrink = 2
    c.train.pl_decay = 0.01
    c.train.style_mixing = 0.0        # Style-mixing probability (StyleGAN2: 0.9).
    c.train.grad_nan_to_num = False   # NaN/inf gradients -> 0/+-1e5 (StyleGAN2-ADA).
    c.train.label_smoothing = 0.0     # One-sided: D's real target 1 - s.
    c.train.instance_noise = 0.0      # Std of noise on D's inputs, annealed linearly
    c.train.instance_noise_steps = 0  # to 0 over this many steps (0: constant).
    c.train.lecam_weight = 0.0        # LeCam regularization (Tseng et al. 2021).
    c.train.lecam_decay = 0.99
    c.train.ortho_weight = 0.0        # BigGAN's orthogonal regularization of G.
    # R3GAN's cosine schedules in images (schedules.py): each (base, final) takes the
    # place of the key it names, over `images` images seen; () = that key stays constant.
    c.train.cosine = ml_collections.ConfigDict(
        {"images": 0.0, "learning_rate": (), "beta_2": (), "penalty_weight": (),
         "ema_kimg": (), "ada_p": ()})
    # Steps per call of the step function (fewer host round trips); 0 = auto: the largest
    # k <= 10 that divides num_steps, log_every and every nonzero event interval
    # (training.steps_per_execution), so logs, grids, checkpoints and scores still fall on
    # their exact steps.
    c.train.steps_per_execution = 0
    # Throughput (precision.py, GAN.compile): float32 | mixed_bfloat16 | mixed_float16;
    # XLA for the per-replica step: auto | true | false; micro-batches per update.
    c.train.precision = "float32"
    c.train.jit_compile = "auto"
    c.train.accumulation_steps = 1
    c.train.grad_pack_bytes = 0       # Gradient all-reduce in packs (0: one; multi-worker).
    # Steps between checkpoints / sample grids; 0 turns the periodic ones off (one is
    # still written when training ends, and a checkpoint on preemption).
    c.train.checkpoint_every = 500
    c.train.keep_checkpoints = 3
    c.train.sample_every = 500
    c.train.log_every = 100           # TensorBoard scalars; one progress bar per block.

    # Scoring during training (metrics/scoring.py); tools/evaluate.py scores a checkpoint.
    c.eval = ml_collections.ConfigDict()
    c.eval.every = 0                  # Generator steps between evaluations; 0: none.
    c.eval.extractor = ""             # inception_v3 | fid_inception:PATH.pb | PATH.keras
    c.eval.extractor_weights = ""     # inception_v3 weights file (else the Keras cache).
    c.eval.metrics = "fid"            # Comma-separated: fid, kid, is, pr, classes.
    c.eval.num_samples = 10000        # Generated examples (fake i from latents (seed, i)).
    c.eval.num_real = 0               # Real ones (the first N): 0 as many, -1 all ("full").
    c.eval.batch_size = 256           # Global evaluation batch.
    c.eval.seed = 0                   # Fake example i comes from latents (seed, i).
    c.eval.cache_dir = ""             # Reference statistics; "" = ~/.cache/tf_gan_scale.
    c.eval.best = "fid"               # Keep checkpoints/best by this score; "" = none.
    c.eval.allow_rank_deficient = False  # FID from fewer samples than feature dimensions.

    # Model / hybrid parallelism on a DTensor mesh (tf_gan_scale/parallel/, docs/model_parallel.md).
    c.parallel = ml_collections.ConfigDict()
    c.parallel.mesh = ""              # "batch:B,model:M" (or --mesh); "": tf.distribute.
    # Overrides of the layout policy: ((regex over "model/weight path", "spec"), ...),
    # spec per dimension "-" or an axis, e.g. (("generator/dense/kernel", "model,-"),).
    c.parallel.layouts = ()
    # "g:I,d:J" (or --placement): G on device I, D on device J of one process, micro-
    # batches by train.accumulation_steps (parallel/placement.py); "": off.
    c.parallel.placement = ""
    return c


# ---- StyleGAN2-ADA presets ---------------------------------------------------------------

# The official presets (stylegan2-ada-pytorch train.py cfg_specs), frozen: `auto` depends
# on the GPU count and is not one of them. chunk = the official per-GPU batch (batch /
# ref_gpus): the minibatch-std groups, style-mixing cut-offs and path-length rows are
# drawn per chunk of global rows, so the result does not depend on the replica count.
STYLEGAN2_PRESETS = {
    #            res   batch chunk mbstd fmaps  lr      gamma  ema  ramp  map  mixing pl  D
    "paper256": (256, 64, 8, 8, 0.5, 0.0025, 1.0, 20.0, 0.0, 8, 0.9, 2.0, "resnet"),
    "stylegan2": (1024, 32, 4, 4, 1.0, 0.002, 10.0, 10.0, 0.0, 8, 0.9, 2.0, "resnet"),
    "cifar": (32, 64, 32, 32, 1.0, 0.0025, 0.01, 500.0, 0.05, 2, 0.0, 0.0, "orig"),
}


def stylegan2(preset):
    """config for StyleGAN2-ADA preset `preset` (STYLEGAN2_PRESETS), over base().

    Everything the official preset fixes: resolution (via the source), batch, minibatch-
    std group and chunk, channels (fmaps), Adam(lr, betas (0, 0.99), eps 1e-8) for G and
    D (lazy_phases adjusts them by I/(I+1): training/build.py), R1 gamma (penalty_weight =
    gamma / 2, every 16 steps), path length (weight 2, every 4 steps), style mixing, the
    EMA half-life in kimg and its ramp-up, the mapping depth, D's architecture, ADA
    (target 0.6, 500 kimg, interval 4), float16 in the top 4 resolutions with conv clamp
    256 and gradient cleaning. ConfigError for an unknown preset."""
    row = errors.choose("stylegan2 preset", preset, STYLEGAN2_PRESETS)
    (res, batch, chunk, mbstd, fmaps, lr, gamma, ema, ramp, layers, mixing, pl,
     d_arch) = row
    c = base()
    # FFHQ is not in TFDS: prepare it (tools/prepare_data.py) into arrayrecord:DIR.
    c.data.source = "tfds:cifar10" if res == 32 else f"arrayrecord:/data/ffhq{res}"
    c.model = ml_collections.ConfigDict()
    c.model.name = "stylegan2"
    c.model.latent_dim = 512
    c.model.conditional = False
    c.model.w_dim = 512
    c.model.mapping_layers = layers
    c.model.fmaps = fmaps
    c.model.channel_max = 512
    c.model.mbstd_group = mbstd
    c.model.mbstd_chunk = chunk
    c.model.d_architecture = d_arch
    # Mixed precision the StyleGAN2-ADA way (its default; --fp32 is the escape, here
    # num_fp16_res = 0 and conv_clamp = 0): the top 4 resolutions in float16, every
    # conv clamped to +-256, no loss scaling, non-finite gradients cleaned.
    c.model.num_fp16_res = 4
    c.model.conv_clamp = 256.0
    t = c.train
    t.global_batch_size = batch
    t.num_steps = 25_000_000 // batch  # The official 25,000 kimg.
    t.loss = "non_saturating"
    for opt in (t.g_optimizer, t.d_optimizer):
        opt.name, opt.learning_rate = "adam", lr
        opt.beta_1, opt.beta_2, opt.epsilon = 0.0, 0.99, 1e-8
    t.penalty, t.penalty_weight, t.penalty_every = "r1", gamma / 2.0, 16
    t.lazy_phases = True
    t.pl_weight, t.pl_every = pl, 4
    t.style_mixing = mixing
    t.grad_nan_to_num = True  # training_loop.py: misc.nan_to_num on every gradient.
    t.ema.kimg, t.ema.rampup = ema, ramp
    t.augment = "ada"
    c.eval.num_samples = 50_000  # fid50k_full: 50k fakes against every real image.
    c.eval.num_real = -1
    return c


# ---- R3GAN presets ------------------------------------------------------------------------

# The official presets (brownvc/R3GAN train.py:178-279, README.md launch commands), frozen.
# Widths / blocks / cardinality are G's, 4x4 first (D takes them reversed); bf16 = the
# stages the official runs in bfloat16 (G's last, D's first). gamma is the R1 = R2 weight
# at the start of its cosine schedule (penalty_weight = gamma / 2).
R3GAN_PRESETS = {
    # preset: (res, G widths, cardinality, bf16 stages, global batch, gamma)
    "cifar10": (32, (768,) * 4, (96,) * 4, 3, 512, 0.05),
    "ffhq64": (64, (768,) * 4 + (384,), (96,) * 4 + (48,), 4, 256, 2.0),
    "ffhq256": (256, (768,) * 4 + (384, 192, 96), (96,) * 4 + (48, 24, 12), 4, 256, 150.0),
    "imagenet32": (32, (1536,) * 4, (96,) * 4, 3, 4096, 0.5),
    "imagenet64": (64, (1536,) * 5, (96,) * 5, 4, 4096, 1.0),
}
# Their cosine schedules (train.py:189-266): (T images, final EMA half-life in kimg,
# final augmentation p); every preset: lr 2e-4 -> 5e-5, beta_2 0.9 -> 0.99,
# gamma -> gamma / 10, EMA half-life and p from 0.
R3GAN_SCHEDULES = {
    "cifar10": (2e7, 5000.0, 0.55),
    "ffhq64": (2e7, 500.0, 0.3),
    "ffhq256": (2e7, 500.0, 0.3),
    "imagenet32": (2e8, 50000.0, 0.5),
    "imagenet64": (2e8, 50000.0, 0.4),
}
R3GAN_SOURCES = {"cifar10": "tfds:cifar10", "ffhq64": "arrayrecord:/data/ffhq64",
                 "ffhq256": "arrayrecord:/data/ffhq256",
                 "imagenet32": "tfds:imagenet_resized/32x32",
                 "imagenet64": "tfds:imagenet_resized/64x64"}


def r3gan(preset):
    """config for R3GAN preset `preset` (R3GAN_PRESETS: "config E"), over base().

    The architecture exactly (architectures/r3gan.py: 2 blocks per stage, expansion 2, noise
    64, the bfloat16 stages under config.train.precision=mixed_bfloat16), class-conditional
    for CIFAR-10 and ImageNet (README --cond=1), the global batch, the RpGAN loss with
    R1 + R2 (gamma / 2 each, every step, on the un-augmented inputs), Adam(betas (0,
    beta_2), eps 1e-8) for G and D, the official cosine schedules of lr, beta_2, gamma,
    the EMA half-life and p over T images (R3GAN_SCHEDULES), R3GAN's augmentation pipe,
    and num_steps = T / batch. ConfigError for an unknown preset."""
    _res, widths, cardinality, bf16, batch, gamma = errors.choose("r3gan preset", preset,
                                                                  R3GAN_PRESETS)
    c = base()
    c.data.source = R3GAN_SOURCES[preset]
    c.model = ml_collections.ConfigDict({
        "name": "r3gan", "latent_dim": 64,
        "conditional": not preset.startswith("ffhq"), "widths": widths, "blocks": 2,
        "cardinality": cardinality, "expansion": 2, "bf16_stages": bf16, "grouped_conv": "auto",
        "bottom_width": 4})
    t = c.train
    t.global_batch_size = batch
    t.precision = "mixed_bfloat16"  # The official's bfloat16 stages (bf16_stages).
    t.loss, t.penalty, t.penalty_weight, t.penalty_every = "rpgan", "r1_r2", gamma / 2, 1
    for opt in (t.g_optimizer, t.d_optimizer):
        opt.name, opt.learning_rate = "adam", 2e-4
        opt.beta_1, opt.beta_2, opt.epsilon = 0.0, 0.9, 1e-8
    # The official schedules, evaluated at the images seen before each step
    # (schedules.py), and R3GAN's augmentation pipe at the scheduled p, no controller.
    images, ema_kimg, p = R3GAN_SCHEDULES[preset]
    t.cosine.images = images
    t.cosine.learning_rate, t.cosine.beta_2 = (2e-4, 5e-5), (0.9, 0.99)
    t.cosine.penalty_weight = (gamma / 2, gamma / 20)
    t.cosine.ema_kimg, t.cosine.ada_p = (0.0, ema_kimg), (0.0, p)
    t.augment, t.ada_p, t.ada_interval = "r3gan", 0.0, 0
    t.num_steps = int(math.ceil(images / batch))  # The schedules' end (the official
    # code sets no training length).
    c.eval.num_samples = 50_000  # fid50k_full: 50k fakes against every real image.
    c.eval.num_real = -1
    return c



def r3gan_mnist():
    """R3GAN scaled to 28x28 MNIST on 2 CPU cores (not an official preset; the official
    code has none for MNIST): r3gan("cifar10")'s parts with a 7x7 basis (7, 14, 28), G
    widths 128, 64, 32 (D the reverse), one block per stage, cardinality 16, 8, 4 (16
    channels per group), batch 32, 1,600 steps, the official schedules' shapes over the
    run's 51,200 images (lr 2e-4 -> 5e-5, beta_2 0.9 -> 0.99, gamma 0.1 -> 0.01, EMA
    half-life 0 -> 10 kimg), no augmentation (the official p schedules are for small or
    diverse data), float32. experiments/mnist.py runs it as it is (docs/quality.md: 1.43x
    the tutorial DCGAN's wall time for its 96,000 images); stacked_mnist.py changes the
    data and the length."""
    c = r3gan("cifar10")
    m = c.model
    m.bottom_width = 7
    m.widths, m.blocks, m.cardinality = (128, 64, 32), 1, (16, 8, 4)
    m.bf16_stages = 0
    t = c.train
    t.precision = "float32"
    t.global_batch_size = 32
    t.num_steps = 1600
    t.cosine.images = 51_200.0
    t.cosine.penalty_weight = (0.05, 0.005)
    t.cosine.ema_kimg = (0.0, 10.0)
    t.cosine.ada_p = ()
    t.augment = ""
    t.checkpoint_every = t.sample_every = 400
    t.log_every = 100
    c.eval.num_samples, c.eval.num_real = 10_000, 0
    return c