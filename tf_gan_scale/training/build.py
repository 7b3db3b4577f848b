"""Building a run's GAN from its config: networks, optimizers, the compiled model.

    with strategy.scope():
        model = build.build_gan(config, data_shape, data_classes)

Everything here is a function of the config (and the data's shape and classes): the
same config builds the same weights on every topology (seeded by config.seed), which is
what lets a run resume on another one.
"""

import dataclasses

import keras

from tf_gan_scale import architectures, errors, precision, schedules
from tf_gan_scale.gan import GAN, StepConfig
from tf_gan_scale.layers import normalization
from tf_gan_scale.parallel import placement as placement_lib

OPTIMIZERS = {"adam": keras.optimizers.Adam, "adamw": keras.optimizers.AdamW,
              "sgd": keras.optimizers.SGD, "rmsprop": keras.optimizers.RMSprop}


def make_optimizer(cfg, schedule=None, cosine=None):
    """Optimizer from a config dict {"name": ..., **kwargs}; bad names/keys raise ConfigError.

    schedule: optional (decay, warmup_steps, total_steps) for `schedules.WarmupDecay`
    around the config's learning_rate, in this optimizer's own update count.
    cosine: optional {"learning_rate" and/or "beta_2": schedules.CosineSchedule} (R3GAN's,
    `cosine_options`) in place of the config's values; a beta_2 schedule makes the Adam
    a `schedules.TorchAdam` (torch's update, as R3GAN's)."""
    cfg = dict(cfg)
    cls = errors.choose("optimizer", cfg.pop("name", None), OPTIMIZERS)
    cosine = cosine or {}
    if "learning_rate" in cosine:
        cfg["learning_rate"] = cosine["learning_rate"]
    elif schedule is not None and "learning_rate" in cfg:
        decay, warmup, total = schedule
        if decay != "none" or warmup:
            cfg["learning_rate"] = schedules.WarmupDecay(cfg["learning_rate"], decay=decay,
                                                         warmup_steps=warmup,
                                                         total_steps=total)
    if "beta_2" in cosine:
        cls, cfg["beta_2"] = schedules.TorchAdam, cosine["beta_2"]
    try:
        return cls(**cfg)
    except (TypeError, ValueError) as e:
        raise errors.ConfigError(f"bad optimizer config {dict(cfg)}: {e}") from None


def cosine_options(train):
    """R3GAN's cosine schedules of config.train.cosine (schedules.py) that the optimizers
    and the EMA take: ({key: schedules.CosineSchedule} for G's optimizer, the same for
    D's (evaluated at G step = D's updates // d_steps), the EMA's (base_kimg, final_kimg,
    total_images) or None). The step reads penalty_weight's and ada_p's itself.

    Raises ConfigError (one line) for a schedule together with another schedule of the
    same value (lr_decay, lr_warmup_steps, ema.decay, ema.rampup), with lazy_phases (its
    learning-rate and beta adjustment), or beta_2 for an optimizer other than adam."""
    cos = schedules.cosine_schedules(train.get("cosine"))
    if not cos:
        return {}, {}, None
    if "learning_rate" in cos and (train.get("lr_decay", "none") != "none"
                                   or train.get("lr_warmup_steps", 0)):
        raise errors.ConfigError(
            f"config.train.cosine.learning_rate is a learning-rate schedule of its own; "
            f"Received: lr_decay={train.get('lr_decay')!r}, lr_warmup_steps="
            f"{train.get('lr_warmup_steps')}; valid: lr_decay='none' and lr_warmup_steps=0, "
            f"or cosine.learning_rate=()")
    for key in ("learning_rate", "beta_2"):
        if key in cos and train.get("lazy_phases", False):
            raise errors.ConfigError(
                f"config.train.cosine.{key} cannot run with lazy_phases=True (which "
                f"adjusts the optimizers' rates and betas); valid: lazy_phases=False, or "
                f"cosine.{key}=()")
    if "beta_2" in cos:
        for net in ("g", "d"):
            name = train[f"{net}_optimizer"].get("name")
            if name != "adam":
                raise errors.ConfigError(
                    f"config.train.cosine.beta_2 schedules Adam's beta_2; Received: "
                    f"config.train.{net}_optimizer.name={name!r}; valid: 'adam', or "
                    f"cosine.beta_2=()")
    ema = train.get("ema") or {}
    if "ema_kimg" in cos and (ema.get("decay", 0.0) or ema.get("rampup", 0.0)
                              or ema.get("kimg", 0.0)):
        raise errors.ConfigError(
            f"config.train.cosine.ema_kimg is an EMA half-life schedule of its own; "
            f"Received: ema.decay={ema.get('decay')}, ema.kimg={ema.get('kimg')}, "
            f"ema.rampup={ema.get('rampup')}; valid: all 0, or cosine.ema_kimg=()")
    batch = int(train.global_batch_size)

    def optimizer(updates_per_step):
        return {key: schedules.CosineSchedule(c.base, c.final, c.total_images, batch,
                                              updates_per_step)
                for key, c in cos.items() if key in ("learning_rate", "beta_2")}

    c = cos.get("ema_kimg")
    ema_cosine = None if c is None else (c.base, c.final, c.total_images)
    return optimizer(1), optimizer(int(train.get("d_steps", 1))), ema_cosine


def lazy_adjusted(train):
    """(G, D) optimizer configs, adjusted for StyleGAN2's lazy regularization
    (training_loop.py, "mb_ratio"): a network whose regularizer runs as its own update
    every I steps shares one optimizer between both phases, with learning rate x I/(I+1)
    and betas ^ (I/(I+1)), so that I + 1 updates move it as far as I would. The config
    states the official base values (paper256: lr 0.0025, betas (0, 0.99) -> G 0.002 /
    0.991992 with I = 4, D 0.00235294 / 0.990585 with I = 16)."""
    g_cfg, d_cfg = dict(train.g_optimizer), dict(train.d_optimizer)
    if not train.get("lazy_phases", False):
        return g_cfg, d_cfg
    # G's optimizer is adjusted whenever the phases are on, also without path length
    # (the official cifar preset keeps G_reg_interval = 4 with pl_weight = 0).
    for cfg, every, on in (
            (g_cfg, train.get("pl_every", 4), True),
            (d_cfg, train.get("penalty_every", 1),
             train.get("penalty", "none") != "none" and train.get("penalty_weight", 0.0))):
        if not on:
            continue
        ratio = every / (every + 1.0)
        if "learning_rate" in cfg:
            cfg["learning_rate"] = cfg["learning_rate"] * ratio
        for beta in ("beta_1", "beta_2"):
            if beta in cfg:
                cfg[beta] = cfg[beta] ** ratio
    return g_cfg, d_cfg


def model_options(config):
    """Architecture options: everything in config.model besides name, latent_dim and
    conditional (the number of classes comes from the data: `num_classes`)."""
    return {k: (tuple(v) if isinstance(v, list) else v)
            for k, v in config.model.items()
            if k not in ("name", "latent_dim", "conditional", "sync_bn_group_size")}


def num_classes(config, data_classes):
    """Classes the model is conditioned on: 0 unless config.model.conditional, else the
    data source's (ConfigError when the source has no labels)."""
    if not config.model.get("conditional", False):
        return 0
    if not data_classes or int(data_classes) < 2:
        raise errors.ConfigError(
            f"config.model.conditional=True needs labelled data with >= 2 classes; "
            f"config.data.source={config.data.source!r} has {data_classes or 0}; valid: a "
            f"tfds dataset with a label, npz with y/labels, a folder of class sub-folders, "
            f"embedded:digits, toy:*; or conditional=False")
    return int(data_classes)


def build_networks(config, data_shape, classes=0):
    """(generator, discriminator) of config.model (weights seeded by config.seed)."""
    keras.utils.set_random_seed(config.seed)
    options = model_options(config)
    if "seed" in architectures.options(config.model.name):
        options.setdefault("seed", config.seed)  # Layer seeds (dropout) follow config.seed.
    # Layers compute in config.train.precision; variables and outputs stay float32.
    with precision.policy(config.train.get("precision", "float32")):
        return architectures.build(config.model.name, data_shape=data_shape,
                                   latent_dim=config.model.latent_dim, num_classes=classes,
                                   **options)


def placement_of(config):
    """config.parallel.placement ("g:I,d:J", or "" for none)."""
    return (config.get("parallel") or {}).get("placement", "")


def build_gan(config, data_shape, data_classes=0, placement=""):
    """GAN (built and compiled) for `config`; call inside strategy.scope().

    data_classes: the data source's number of classes (used when config.model.conditional).
    placement: "g:I,d:J" to train G on device I and D on device J of this process
    (parallel/placement.py; the runner passes config.parallel.placement), "" for none.
    Weight initialization is seeded by config.seed, so every topology starts from the
    same weights (variables are created on replica 0 and broadcast).
    """
    classes = num_classes(config, data_classes)
    g, d = build_networks(config, data_shape, classes)
    for net in (g, d):  # Batch statistics over groups of replicas (ghost BN); 0: all.
        normalization.set_group_size(net, config.model.get("sync_bn_group_size", 0))
    t = config.train
    ema = t.get("ema") or {}
    g_cosine, d_cosine, ema_cosine = cosine_options(t)
    # config.model.sync_bn=False asks for per-replica batch norm: keep it so.
    model = GAN(g, d, config.model.latent_dim, seed=config.seed,
                        sync_batch_norm="auto" if config.model.get("sync_bn", True) else False,
                        num_classes=classes, ema_decay=ema.get("decay", 0.0),
                        ema_start=ema.get("start", 0), ema_warmup=ema.get("warmup", 0),
                        ema_kimg=ema.get("kimg", 0.0), ema_rampup=ema.get("rampup", 0.0),
                        ema_batch_size=t.global_batch_size, ema_cosine=ema_cosine)
    if placement:  # G and D on two devices of this process, before the optimizers exist.
        placement_lib.place(model, placement_lib.devices(placement_lib.parse(placement)))
    decay, warmup = t.get("lr_decay", "none"), t.get("lr_warmup_steps", 0)
    mode = t.get("precision", "float32")
    # Schedules count each optimizer's own updates: D makes d_steps per G step.
    g_cfg, d_cfg = lazy_adjusted(t)
    g_opt = make_optimizer(g_cfg, (decay, warmup, t.num_steps), g_cosine)
    d_opt = make_optimizer(d_cfg, (decay, warmup * t.d_steps, t.num_steps * t.d_steps),
                           d_cosine)
    # The step's knobs are config.train keys of the same names (StepConfig).
    model.compile(g_optimizer=precision.optimizer(g_opt, mode),
                  d_optimizer=precision.optimizer(d_opt, mode),
                  steps_per_execution=int(t.steps_per_execution) or 1,
                  **dataclasses.asdict(StepConfig.from_train(t)))
    return model


AUTO_STEPS_PER_EXECUTION = 10  # The most steps per call that "auto" picks.


def steps_per_execution(config, start=0):
    """Steps per call of the step function: config.train.steps_per_execution, or for 0
    (auto) the largest k <= AUTO_STEPS_PER_EXECUTION dividing num_steps, log_every,
    sample_every, checkpoint_every, eval.every (the nonzero ones) and the step `start` a
    run resumes from (one trained to 6 steps, resumed to 10: 1, not 5, which would run
    to step 11).

    `training.run` resolves auto once it knows the resume step; `build_gan` alone (notebooks,
    tests, the benchmark) compiles one step per call for auto.

    Why: a call returns to Python once per k steps (the default digits step is ~11 ms, and
    each host round trip with its Keras batch hooks costs a part of that), while a callback
    sees only every k-th step: with k dividing every interval, each event still fires at
    its exact step. The weights do not depend on k (tests/gan/test_gan.py).
    """
    t = config.train
    if int(t.steps_per_execution):
        return int(t.steps_per_execution)
    every = [t.num_steps, t.log_every, t.get("sample_every", 0), t.get("checkpoint_every", 0),
             (config.get("eval") or {}).get("every", 0), start]
    every = [int(e) for e in every if e]
    return max(k for k in range(1, AUTO_STEPS_PER_EXECUTION + 1)
               if all(e % k == 0 for e in every))
