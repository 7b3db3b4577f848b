"""StepConfig: every knob of the GAN step, validated once.

    config = StepConfig(loss="hinge", d_steps=2, penalty="r1", penalty_weight=0.5)
    config.validate(discriminator=d, num_replicas=2)   # ConfigError naming config.train.<key>

`GAN.compile(**knobs)` builds one from its keyword arguments and the training binary from
`config.train` (`from_train`): the field names ARE the config.train keys, so an error
names the key a user sets in either place. `to_config` / `from_config` are what a `.keras`
file's compile config holds.

Each field's metadata says which engines run it (`ENGINES`: "replicas" for tf.distribute
strategies and one device, "placement" for G and D on two devices, "mesh" for a DTensor
mesh, "pipeline" for K pipeline stages); `unsupported(engine)` lists the knobs that are on
and that an engine cannot run, from which the engines derive their refusals.
"""

import dataclasses
import math
from typing import Any

import keras

from tf_gan_scale import errors, schedules
from tf_gan_scale.architectures import stylegan2
from tf_gan_scale.gan import augment as augment_lib
from tf_gan_scale.gan import checks, losses, penalties

ENGINES = ("replicas", "placement", "mesh", "pipeline")
NOT_PIPELINED = ("replicas", "placement", "mesh")
ADA = "ada"  # config.train.augment value of StyleGAN2-ADA's adaptive pipeline.
R3GAN_AUGMENT = "r3gan"  # R3GAN's AugmentPipe: 'bgc', colour at half p, cutout (ada_pipes.py).
# The augment values run by an AugmentPipe (gan/ada_pipes.py PIPES) on the p variable
# `GAN.ada_p` (checkpointed), which ADA's controller moves when ada_interval > 0.
ADA_PIPES = (ADA, R3GAN_AUGMENT)
JIT_CHOICES = ("auto", "true", "false")


def _knob(default, *, engines=ENGINES, doc, why=""):
    """A field; `why`: why the engines left out cannot run it (shown in the refusal)."""
    return dataclasses.field(default=default,
                             metadata={"engines": engines, "doc": doc, "why": why})


UNTESTED = "no equivalence test under this engine"


@dataclasses.dataclass(frozen=True)
class StepConfig:
    """The step's knobs (GAN.compile's keyword arguments besides the optimizers)."""

    loss: Any = _knob("hinge", doc="a name in losses.LOSSES or a callable with its contract")
    d_steps: int = _knob(1, doc="D updates, each on its own real batch, per G update")
    # Before the other knobs the mesh refuses: its message lists them in this order. Not
    # on a mesh: a DTensor step traced with jit_compile=True ran and matched one device,
    # but was NOT compiled (no "Compiled cluster using XLA" logged, which a plain
    # jit_compile function logs; CPU, TF 2.21): accepting it would claim XLA falsely.
    jit_compile: Any = _knob(False, engines=("replicas",),
                             why="XLA compiles one device's step: a DTensor step traced "
                                 "with it is not compiled, a placed one spans devices",
                             doc="compile the per-replica step with XLA: a bool or "
                                 "auto | true | false (auto: off)")
    accumulation_steps: int = _knob(1, engines=ENGINES,
                                    doc="K micro-batches per update, one all-reduce")
    # Not in a pipeline: a gradient penalty is a second backward pass through every stage.
    penalty: Any = _knob("none", engines=NOT_PIPELINED,
                         why="a second backward pass through every stage",
                         doc="a name in penalties.PENALTIES or a callable")
    penalty_weight: float = _knob(0.0, doc="weight of the per-example penalty in D's loss")
    penalty_fd_sigma: float = _knob(0.0, doc="a penalty on D's clean inputs (r1_r2) by "
                                             "finite difference with this step instead of "
                                             "double backprop (0: exact)")
    penalty_every: int = _knob(1, doc="lazy regularization: the penalty every k-th D "
                                      "update, weight x k (a D without batch norm)")
    lecam_weight: float = _knob(0.0, engines=ENGINES,
                                doc="LeCam regularization (Tseng et al. 2021)")
    lecam_decay: float = _knob(0.99, doc="decay of LeCam's EMA anchors")
    augment: str = _knob("", doc="DiffAugment policy, e.g. color,translation,cutout; or "
                                 "'ada': StyleGAN2-ADA's adaptive bgc pipeline (gan/ada.py); "
                                 "or 'r3gan': R3GAN's AugmentPipe (bgc, colour at p/2, "
                                 "cutout; gan/ada_pipes.py) at probability ada_p")
    ada_target: float = _knob(0.6, doc="ADA: the target of r_t = E[sign(D(real))]")
    ada_p: float = _knob(0.0, doc="ADA: the initial augmentation probability p")
    ada_kimg: float = _knob(500.0, doc="ADA: thousands of images for p to move by 1")
    ada_interval: int = _knob(4, doc="ADA: G steps between adjustments of p (0: p fixed "
                                     "at ada_p, or a schedule's; also for 'r3gan')")
    label_smoothing: float = _knob(0.0, doc="one-sided: D's real target is 1 - s "
                                            "(cross-entropy losses)")
    instance_noise: float = _knob(0.0, doc="std of Gaussian noise on every D input")
    instance_noise_steps: int = _knob(0, doc="anneal instance noise to 0 over this many "
                                             "G steps (0: constant)")
    ortho_weight: float = _knob(0.0, engines=NOT_PIPELINED,
                                why="its gradient is not split by stage",
                                doc="BigGAN's orthogonal regularization of G")
    grad_pack_bytes: int = _knob(0, doc="all-reduce gradients in packs of this size, "
                                        "last layers first (0: one all-reduce)")
    grad_nan_to_num: bool = _knob(False, engines=("replicas", "mesh"), why=UNTESTED,
                                  doc="replace non-finite global gradients (NaN 0, +-inf "
                                      "+-1e5) before each update, as StyleGAN2-ADA's "
                                      "training loop (its float16 blocks have no loss "
                                      "scaling)")
    # StyleGAN2 (Karras et al. 2020): the regularizers as their own optimizer updates.
    lazy_phases: bool = _knob(False, engines=("replicas", "mesh"), why=UNTESTED,
                              doc="the penalty (every penalty_every steps) and path length "
                                  "(every pl_every steps) as their own updates on fresh "
                                  "passes, after the main D and G updates (StyleGAN2's "
                                  "Dreg / Greg), instead of fused into the D update")
    pl_weight: float = _knob(0.0, engines=("replicas", "mesh"), why=UNTESTED,
                             doc="path-length regularization of a style generator "
                                 "(StyleGAN2: 2; needs lazy_phases)")
    pl_every: int = _knob(4, doc="G steps between path-length updates (weight x pl_every)")
    pl_batch_shrink: int = _knob(2, doc="the path-length pass uses 1/k of each chunk's rows")
    pl_decay: float = _knob(0.01, doc="decay of the global path-length mean pl_mean")
    style_mixing: float = _knob(0.0, engines=("replicas", "mesh"), why=UNTESTED,
                                doc="probability of mixing two latents at a cut-off layer "
                                    "(one draw per mbstd chunk) in a style generator")

    # R3GAN's cosine schedules (schedules.py): {images, key: (base, final)}; the step
    # reads penalty_weight's and ada_p's, training/build.py the optimizers' and the EMA's.
    cosine: Any = _knob(None, doc="R3GAN's cosine schedules in images: a mapping of "
                                  "images and (base, final) per schedules.COSINE_KEYS")

    @classmethod
    def names(cls):
        return [f.name for f in dataclasses.fields(cls)]

    @classmethod
    def from_train(cls, train):
        """The knobs config.train sets (its other keys are not the step's)."""
        knobs = {k: train[k] for k in cls.names() if k in train}
        if knobs.get("cosine") is not None:  # A ConfigDict: plain values.
            knobs["cosine"] = {k: (tuple(v) if isinstance(v, (list, tuple)) else v)
                               for k, v in dict(knobs["cosine"]).items()}
        return cls(**knobs)

    @property
    def paired(self):
        """Whether the loss pairs real row i with fake row i (losses.PAIRED): G's update
        then reads its own real batch."""
        return registry_name(self.loss, losses.LOSSES) in losses.PAIRED

    @property
    def in_pass(self):
        """Whether the penalty is taken in D's main pass on its clean inputs
        (penalties.ON_CLEAN_INPUTS: R3GAN's R1 + R2)."""
        return registry_name(self.penalty, penalties.PENALTIES) in penalties.ON_CLEAN_INPUTS

    @property
    def batches_per_step(self):
        """Global real batches one step reads: one per D update, plus G's own with a
        paired loss (R3GAN draws D's and G's reals apart: training_loop.py:287-305)."""
        return self.d_steps + int(self.paired)

    def schedule(self, key):
        """The `schedules.Cosine` that drives knob `key`, or None."""
        return schedules.cosine_schedules(self.cosine).get(key)

    # ---- validation --------------------------------------------------------------------

    def validate(self, *, discriminator=None, generator=None, num_replicas=1, tpu=False):
        """Raises ConfigError (one line naming config.train.<key>, the value and what is
        valid) for the first bad knob. With `discriminator`, also the knobs it cannot run
        (lazy regularization needs a D without batch norm); with `generator`, path length
        and style mixing need a style generator; with `num_replicas`, XLA on
        several replicas (a TPUStrategy compiles every step anyway)."""
        losses.get(self.loss)
        penalties.get(self.penalty)
        schedules.cosine_schedules(self.cosine)
        for key, low in (("d_steps", 1), ("accumulation_steps", 1), ("penalty_every", 1),
                         ("instance_noise_steps", 0), ("grad_pack_bytes", 0)):
            value = getattr(self, key)
            if not errors.is_int(value) or value < low:
                raise _bad(key, value, f"an integer >= {low}")
        for key in ("penalty_weight", "instance_noise", "lecam_weight", "ortho_weight",
                    "penalty_fd_sigma"):
            value = getattr(self, key)
            if not (errors.is_real(value) and math.isfinite(value) and value >= 0):
                raise _bad(key, value, "a finite number >= 0")
        for key in ("pl_every", "pl_batch_shrink"):
            value = getattr(self, key)
            if not errors.is_int(value) or value < 1:
                raise _bad(key, value, "an integer >= 1")
        for key in ("pl_weight", "ada_p", "ada_kimg"):
            value = getattr(self, key)
            if not (errors.is_real(value) and math.isfinite(value) and value >= 0):
                raise _bad(key, value, "a finite number >= 0")
        if not errors.is_int(self.ada_interval) or self.ada_interval < 0:
            raise _bad("ada_interval", self.ada_interval, "an integer >= 0 (0: p fixed)")
        if not (errors.is_real(self.ada_target) and 0.0 < self.ada_target < 1.0):
            raise _bad("ada_target", self.ada_target, "in (0, 1) (StyleGAN2-ADA: 0.6)")
        for key in ("style_mixing", "pl_decay"):
            value = getattr(self, key)
            if not (errors.is_real(value) and 0.0 <= value <= 1.0):
                raise _bad(key, value, "in [0, 1]")
        for key in ("lazy_phases", "grad_nan_to_num"):
            if not isinstance(getattr(self, key), bool):
                raise _bad(key, getattr(self, key), "True or False")
        for key in ("label_smoothing", "lecam_decay"):
            value = getattr(self, key)
            if not (errors.is_real(value) and 0.0 <= value < 1.0):
                raise _bad(key, value, "in [0, 1)")
        if self.augment not in ADA_PIPES:
            augment_lib.check_policy(self.augment)
        if self.schedule("ada_p") is not None and (self.augment not in ADA_PIPES
                                                   or self.ada_interval):
            # R3GAN sets p from its schedule alone: no controller moves it too.
            raise errors.ConfigError(
                f"config.train.cosine.ada_p sets the p of an AugmentPipe at every step; "
                f"Received: augment={self.augment!r}, ada_interval={self.ada_interval}; "
                f"valid: augment in {', '.join(ADA_PIPES)} with ada_interval=0, or "
                f"cosine.ada_p=()")
        if self.label_smoothing and saved_name(self.loss, losses.LOSSES) \
                not in losses.CROSS_ENTROPY:
            raise errors.ConfigError(
                f"config.train.label_smoothing needs a cross-entropy loss; Received: "
                f"config.train.loss={self.loss!r}; valid: {', '.join(losses.CROSS_ENTROPY)}")
        if self.penalty_fd_sigma and not self.in_pass:
            raise errors.ConfigError(
                f"config.train.penalty_fd_sigma={self.penalty_fd_sigma} approximates a "
                f"penalty on D's clean inputs; Received: config.train.penalty="
                f"{self.penalty!r}; valid: {', '.join(penalties.ON_CLEAN_INPUTS)}, or "
                f"penalty_fd_sigma=0")
        if self.schedule("penalty_weight") is not None and (
                saved_name(self.penalty, penalties.PENALTIES) == "none" or self.lazy_phases):
            raise errors.ConfigError(
                f"config.train.cosine.penalty_weight schedules the weight of a penalty in "
                f"the main D update; Received: penalty={self.penalty!r}, lazy_phases="
                f"{self.lazy_phases}; valid: a penalty with lazy_phases=False, or "
                f"cosine.penalty_weight=()")
        if self.in_pass and self.lazy_phases:
            raise errors.ConfigError(
                f"config.train.penalty={self.penalty!r} is taken in the main D pass; "
                f"valid: lazy_phases=False (penalty_every makes it lazy)")
        if discriminator is not None and self.in_pass and \
                checks.has_batch_norm(discriminator):
            raise errors.ConfigError(
                f"config.train.penalty={self.penalty!r} takes each example's gradient from "
                f"one backward pass of the batch, which batch norm in D couples; valid: "
                f"d_norm='none', or penalty='r1'")
        xla = self.xla  # A bad jit_compile value fails here.
        if self.lazy_phases and (self.d_steps != 1 or self.accumulation_steps != 1):
            raise errors.ConfigError(
                f"config.train.lazy_phases=True runs one D update per step without "
                f"micro-batches; Received: d_steps={self.d_steps}, accumulation_steps="
                f"{self.accumulation_steps}; valid: 1 and 1 (or lazy_phases=False)")
        if self.lazy_phases and saved_name(self.penalty, penalties.PENALTIES) not in (
                "r1", "none"):
            raise errors.ConfigError(
                f"config.train.lazy_phases=True runs R1 as its own phase; Received: "
                f"config.train.penalty={self.penalty!r}; valid: r1, none")
        if self.pl_weight and not self.lazy_phases:
            raise errors.ConfigError(
                f"config.train.pl_weight={self.pl_weight} runs as its own phase; valid: "
                f"lazy_phases=True, or pl_weight=0")
        if generator is not None and (self.pl_weight or self.style_mixing):
            if not stylegan2.is_style_generator(generator):
                key = "pl_weight" if self.pl_weight else "style_mixing"
                raise errors.ConfigError(
                    f"config.train.{key}={getattr(self, key)} needs a style generator "
                    f"(a mapping and a synthesis network); valid: config.model.name="
                    f"'stylegan2', or {key}=0")
        if discriminator is not None and self.penalty_every > 1:
            if checks.has_batch_norm(discriminator):
                raise errors.ConfigError(
                    f"config.train.penalty_every={self.penalty_every} (lazy regularization) "
                    f"needs a discriminator without batch norm (its all-reduces cannot sit "
                    f"in a conditional branch); valid: penalty_every=1, or d_norm='none'")
        if xla and num_replicas > 1 and not tpu:
            raise errors.ConfigError(
                f"config.train.jit_compile={self.jit_compile!r} needs one replica (XLA "
                f"cannot compile a step mirrored over {num_replicas} devices); valid: auto, "
                f"false, or --strategy=one_device")

    @property
    def xla(self):
        """jit_compile as a bool ("auto" is off: XLA only where it is known to pay)."""
        if isinstance(self.jit_compile, bool):
            return self.jit_compile
        name = str(self.jit_compile).lower()
        if name not in JIT_CHOICES:
            raise errors.ConfigError(f"config.train.jit_compile={self.jit_compile!r}; valid: "
                                     f"{', '.join(JIT_CHOICES)}")
        return name == "true"

    def is_on(self, name):
        """Whether knob `name` changes the step from the plain one."""
        if name == "jit_compile":
            return self.xla
        if name == "cosine":
            return bool(schedules.cosine_schedules(self.cosine))
        default = next(f.default for f in dataclasses.fields(self) if f.name == name)
        return getattr(self, name) != default

    def unsupported(self, engine):
        """["config.train.<key>=<value> (why)", ...] for the knobs that are on and that
        `engine` (one of ENGINES) cannot run, in field order."""
        out = [f"config.train.{f.name}={getattr(self, f.name)!r} ({f.metadata['why']})"
               for f in dataclasses.fields(self)
               if engine not in f.metadata["engines"] and self.is_on(f.name)]
        # A paired loss runs where a penalty does, R1 + R2 in D's pass with it (the
        # penalty knob's engines: a pipeline refuses both). Beyond replicas, what the
        # equivalence tests ran: one D update per step, R1 + R2 by double backprop.
        tested = engine == "replicas" or (engine in NOT_PIPELINED and self.d_steps == 1)
        if self.paired and not tested:
            steps = f" with d_steps={self.d_steps}" if self.d_steps > 1 else ""
            out.append(f"config.train.loss={saved_name(self.loss, losses.LOSSES)!r}{steps} "
                       f"({UNTESTED})")
        if self.penalty_fd_sigma and engine != "replicas":
            out.append(f"config.train.penalty_fd_sigma={self.penalty_fd_sigma!r} "
                       f"({UNTESTED})")
        # A DiffAugment policy runs anywhere, ADA's pipes on replicas and meshes.
        if self.augment in ADA_PIPES and engine not in ("replicas", "mesh"):
            out.append(f"config.train.augment={self.augment!r} ({UNTESTED})")
        return out

    # ---- (de)serialization for .keras files ----------------------------------------------

    def to_config(self):
        """The knobs as a `.keras` compile config holds them: losses and penalties by
        registry name (a custom callable must be registered with
        keras.saving.register_keras_serializable to be reloaded), jit_compile a bool."""
        out = dataclasses.asdict(self)
        out["loss"] = saved_name(self.loss, losses.LOSSES)
        out["penalty"] = saved_name(self.penalty, penalties.PENALTIES)
        out["jit_compile"] = self.xla
        return out

    @classmethod
    def from_config(cls, config):
        """Inverse of to_config; keys that are not knobs (optimizers...) are ignored."""
        config = {k: v for k, v in config.items() if k in cls.names()}
        for name in ("loss", "penalty"):
            if name in config and not isinstance(config[name], str):
                config[name] = keras.saving.deserialize_keras_object(config[name])
        return cls(**config)


def registry_name(fn, table):
    """A loss's or penalty's name in `table` (given by name or as the function), or None
    for a callable of the user's."""
    if isinstance(fn, str):
        return fn
    return next((name for name, known in table.items() if fn is known), None)


def saved_name(fn, table):
    """How a loss or penalty is saved: its registry name when it is one of ours, else
    Keras' serialization (which must be registered: Keras would otherwise resolve an
    unregistered `hinge` to its own)."""
    name = registry_name(fn, table)
    return name if name is not None else keras.saving.serialize_keras_object(fn)


def _bad(key, value, valid):
    return errors.ConfigError(f"config.train.{key} must be {valid}; Received: {value!r}")
