"""Placements: G on one device and D on another ("g:0,d:1"), or both split into K
pipeline stages over K devices ("stages:K", parallel/pipeline.py), in one process.

The simple alternative to a mesh when a GAN is too big for one device but fits on two:
every weight whole, each network's weights, optimizer slots and forward and backward ops
on its own device (the `Placement` topology: `GanStep` runs each network under its
device scope), activations (fakes, and d loss / d fake in G's update)
copied between them. With config.train.accumulation_steps = K the batch runs as K
micro-batches (GanStep.micro_batches, strided rows), and the step's dataflow lets G's
forward pass of micro-batch j+1 run while D works on micro-batch j: GPipe's schedule, by
TensorFlow's executor. The numbers are one device's with the same K (batch-norm
statistics per micro-batch, as for accumulation): only where ops run changes.

    python -m tf_gan_scale.main --config=... --workdir=... --placement=g:0,d:1 \\
        --num_cpu_devices=2 --config.train.accumulation_steps=4

"stages:K[,recompute:1]" splits each network into K stages, stage s of both on device s,
and runs the accumulation micro-batches in GPipe's schedule (parallel/pipeline.py); with
recompute:1 the backward re-runs each stage's forward instead of keeping its activations.

Devices are indices into the process's GPUs, else its (logical) CPUs; no strategy
(the step runs under TensorFlow's default one, like one device). Checkpoints are the
one-device ones: a run resumes on any topology.
"""

import tensorflow as tf

from tf_gan_scale import errors
from tf_gan_scale.gan import Topology
from tf_gan_scale.parallel import pipeline
from tf_gan_scale.parallel.pipeline import move_variables

NETS = ("g", "d")
PIPELINE_KEYS = ("stages", "recompute")
FORM = ("valid: g:I,d:J with device indices I != J (e.g. g:0,d:1), or stages:K[,recompute:1] "
        "with K >= 2 (e.g. stages:4)")


def is_pipeline(spec):
    return str(spec).strip().startswith("stages")


def parse(spec):
    """"g:0,d:1" -> {"g": 0, "d": 1}; "stages:4,recompute:1" -> {"stages": 4,
    "recompute": 1}; ConfigError naming the bad part and the forms."""
    if is_pipeline(spec):
        out = {"recompute": 0, **errors.named_ints("--placement", spec, PIPELINE_KEYS, "key",
                                                   "value", FORM)}
        if out["stages"] < 2 or out["recompute"] not in (0, 1):
            raise errors.ConfigError(f"--placement={spec!r}: {FORM}")
        return out
    out = errors.named_ints("--placement", spec, NETS, "network", "device", FORM)
    if sorted(out) != sorted(NETS) or out["g"] == out["d"] or min(out.values()) < 0:
        raise errors.ConfigError(f"--placement={spec!r}: {FORM}")
    return out


def check(spec, num_replicas, xla, step_config=None):
    """ConfigError unless a placement `spec` can run: parsed, one replica (no strategy
    over several devices), no XLA (it compiles for one device), and (with `step_config`,
    a StepConfig) none of the step's knobs the engine cannot run."""
    parse(spec)
    if num_replicas > 1:
        raise errors.ConfigError(f"--placement={spec} puts networks on devices of their own; "
                                 f"it cannot run under a strategy of {num_replicas} "
                                 f"replicas; valid: no strategy (one process)")
    if xla:
        raise errors.ConfigError(f"--placement={spec} with config.train.jit_compile=true: "
                                 f"XLA compiles a step for one device; valid: auto, false")
    engine = "pipeline" if is_pipeline(spec) else "placement"
    bad = step_config.unsupported(engine) if step_config is not None else []
    if bad:
        raise errors.ConfigError(f"--placement={spec} cannot run {', '.join(bad)}; valid: "
                                 f"their defaults, or a strategy / --mesh")


def devices(indices):
    """{"g": I, "d": J} -> {"g": device name, "d": device name}, or {"stages": K, ...} ->
    {"stages": [K device names], "recompute": bool}, of this process's GPUs, else logical
    CPUs; ConfigError when an index is past them."""
    kind = "GPU" if tf.config.list_logical_devices("GPU") else "CPU"
    names = [d.name for d in tf.config.list_logical_devices(kind)]

    def hint(needed):  # What would fit: as many logical CPUs as the spec uses.
        return f"; split the CPU with --num_cpu_devices={needed}" if kind == "CPU" else ""

    if "stages" in indices:
        k = indices["stages"]
        if k > len(names):
            raise errors.ConfigError(
                f"--placement=stages:{k}: {k} stages but the process has {len(names)} {kind} "
                f"device(s); valid: "
                f"{f'stages:2..{len(names)}' if len(names) >= 2 else 'no pipeline'}{hint(k)}")
        return {"stages": names[:k], "recompute": bool(indices.get("recompute"))}
    bad = {net: i for net, i in indices.items() if i >= len(names)}
    if bad:
        spec = ",".join(f"{net}:{indices[net]}" for net in NETS)
        raise errors.ConfigError(
            f"--placement={spec}: device {max(bad.values())} but the process has "
            f"{len(names)} {kind} device(s) (0..{len(names) - 1})"
            f"{hint(max(indices.values()) + 1)}")
    return {net: names[i] for net, i in indices.items()}


class Placement(Topology):
    """G's ops on one device, D's on another: `on(net)` is that network's device scope.
    Forward AND backward ops go where they are created, and GanStep takes each network's
    gradient inside its own scope."""

    def __init__(self, names):
        self.devices = dict(names)

    def on(self, net):
        return tf.device(self.devices[net])


def place(gan, names):
    """Puts `gan`'s G (and its EMA copy) on names["g"], D on names["d"], and makes its
    step run each network there; or, for names {"stages": [devices], "recompute"}, splits
    both into pipeline stages. Before `gan.compile`: the optimizers then create their
    slots beside their weights."""
    if gan.compiled:
        raise ValueError("place the GAN's networks before compiling it")
    if "stages" in names:
        topology = pipeline.Pipeline(gan.generator, gan.discriminator, names["stages"],
                                     names["recompute"])
        topology.place()
        if gan.ema is not None:  # Each EMA weight beside the weight it follows.
            for w_ema, w in zip(gan.ema.model.weights, gan.generator.weights):
                move_variables([w_ema], w._value.device)
        gan.topology = topology
        return
    move_variables(gan.generator.weights, names["g"])
    if gan.ema is not None:
        move_variables(gan.ema.model.weights, names["g"])
    move_variables(gan.discriminator.weights, names["d"])
    gan.topology = Placement(names)
