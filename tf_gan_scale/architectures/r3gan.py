"""R3GAN (Huang, Gokaslan, Kuleshov, Tompkin, NeurIPS 2024, arXiv:2501.05441): the
official brownvc/R3GAN `R3GAN/Networks.py` ("config E"), in NHWC.

Formulas, presets, the official file:line of each part and the parameter counts:
docs/r3gan.md. No normalization, no mapping network, no noise inputs, no minibatch std,
no equalized learning rate, no tanh: a residual ConvNet with a fix-up initialization.

G (name "generator"): z [B, latent_dim] (+ labels int32 [B]: z ++ Embed(labels), the
embedding latent_dim wide) -> stage 0 `GenerativeBasis` (a learned 4x4 basis [4, 4, W0]
~ N(0, 1) times a bias-free Linear of the input, broadcast) + blocks -> stages 1.. each
`transition` (1x1 conv if the width changes, THEN x2 upsample, [1,3,3,1] filter, gain 4)
+ blocks -> `aggregation` 1x1 conv -> image [B, R, R, C] float32, no activation.

D (name "discriminator"): x [B, R, R, C] (+ labels) -> `extraction` 1x1 conv -> stages
R..8 each blocks + transition (x2 downsample FIRST, then 1x1 conv if the width changes)
-> the 4x4 stage: blocks + `DiscriminativeBasis` (depthwise 4x4 valid conv, flatten,
bias-free Linear to 1; conditional: to E = widths[0] and the projection
sum(features * Embed(labels)), Networks.py:171) -> [B, 1] float32 logits.

Block (every stage, G and D): x + conv1x1(act(gconv3x3(act(conv1x1(x))))), the inverted
bottleneck W -> expansion*W -> W, the 3x3 grouped (`cardinality` groups), convs without
bias, act = BiasedActivation (bias + leaky ReLU 0.2, gain 1).

Init (Networks.py:7-35): every conv / linear N(0, gain / sqrt(fan_in)) (fan_in per group
for the grouped conv); block layers 1 and 2 gain sqrt(2 / (1 + 0.2^2)) * L^(-1/4), L = the
network's total blocks; block layer 3 zero (every block the identity at init); others 1;
D's embedding 1 / sqrt(E); G's basis N(0, 1).

Precision: the official computes G's last `bf16_stages` stages and D's first (the same
resolutions) in bfloat16. Here those stages' layers take the run's policy
(config.train.precision: with mixed_bfloat16 they compute in bfloat16), every other layer
is float32 (so float32 runs are float32 throughout). Unlike the official, G's aggregation
layer is float32 (`precision.OUTPUT`: samples and R2 inputs float32); no loss scaling.
"""

import math

import keras
import tensorflow as tf

from tf_gan_scale import errors
from tf_gan_scale.layers.grouped_conv import IMPLEMENTATIONS, GroupedConv2D
from tf_gan_scale.layers.stylegan import downsample2d, upsample2d
from tf_gan_scale.precision import OUTPUT

LRELU_SLOPE = 0.2
LRELU_GAIN = math.sqrt(2.0 / (1.0 + LRELU_SLOPE ** 2))  # BiasedActivation.Gain


def msr(gain, fan_in):
    """MSRInitializer: N(0, gain / sqrt(fan_in)); gain 0 is zeros (Networks.py:7-14)."""
    if gain == 0:
        return "zeros"
    return keras.initializers.RandomNormal(stddev=gain / math.sqrt(fan_in))


def block_gain(total_blocks):
    """Gain of a block's layers 1 and 2: sqrt(2/(1+0.2^2)) * L^(-1/4) (Networks.py:31)."""
    return LRELU_GAIN * total_blocks ** (-1.0 / 4.0)


@keras.saving.register_keras_serializable(package="tf_gan_scale")
class BiasedActivation(keras.layers.Layer):
    """[B, ..., C] -> leaky_relu(x + bias, 0.2), bias [C] zero-initialized, gain 1
    (FusedOperators.py: bias_act(..., act='lrelu', gain=1))."""

    def build(self, input_shape):
        self.bias = self.add_weight(name="bias", shape=(int(input_shape[-1]),),
                                    initializer="zeros")

    def call(self, x):
        return tf.nn.leaky_relu(tf.nn.bias_add(x, tf.cast(self.bias, x.dtype)),
                                alpha=LRELU_SLOPE)


@keras.saving.register_keras_serializable(package="tf_gan_scale")
class LearnedBasis(keras.layers.Layer):
    """GenerativeBasis' basis: v [B, W] -> basis[None] * v[:, None, None, :] [B, S, S, W],
    basis [S, S, W] ~ N(0, 1), S = `size` (the official 4; Networks.py:77-85, NCHW
    (W, 4, 4) there)."""

    def __init__(self, size=4, **kwargs):
        super().__init__(**kwargs)
        self.size = int(size)

    def build(self, input_shape):
        self.basis = self.add_weight(
            name="basis", shape=(self.size, self.size, int(input_shape[-1])),
            initializer=keras.initializers.RandomNormal(stddev=1.0))

    def call(self, v):
        # An einsum, not the broadcast product basis[None] * v[:, None, None, :]: the
        # same values, but DTensor crashes (SIGSEGV, TF 2.21) differentiating that
        # broadcast with v split over examples.
        return tf.einsum("bw,hxw->bhxw", v, tf.cast(self.basis, v.dtype))

    def compute_output_shape(self, input_shape):
        return (input_shape[0], self.size, self.size, input_shape[-1])

    def get_config(self):
        return {**super().get_config(), "size": self.size}


@keras.saving.register_keras_serializable(package="tf_gan_scale")
class Resample(keras.layers.Layer):
    """x2 resampling with the [1,3,3,1] filter: "up" (upfirdn2d.upsample2d, gain 4) or
    "down" (upfirdn2d.downsample2d); no weights (Resamplers.py)."""

    def __init__(self, mode, **kwargs):
        super().__init__(**kwargs)
        if mode not in ("up", "down"):
            raise ValueError(f"mode must be 'up' or 'down'; Received: mode={mode!r}")
        self.mode = mode

    def call(self, x):
        return upsample2d(x) if self.mode == "up" else downsample2d(x)

    def compute_output_shape(self, s):
        f = (lambda n: None if n is None else (n * 2 if self.mode == "up" else n // 2))
        return (s[0], f(s[1]), f(s[2]), s[3])

    def get_config(self):
        return {**super().get_config(), "mode": self.mode}


def conv1x1(filters, fan_in, gain, name, dtype):
    """Convolution(K=1): bias-free 1x1 conv, MSR init."""
    return keras.layers.Conv2D(filters, 1, use_bias=False, kernel_initializer=msr(gain, fan_in),
                               name=name, dtype=dtype)


def residual_block(x, *, width, groups, expansion, gain, impl, dtype, name):
    """ResidualBlock (Networks.py:25-45): x + L3(act(L2(act(L1(x))))), [B, H, W, width]."""
    wide = width * expansion
    y = conv1x1(wide, width, gain, f"{name}_conv1", dtype)(x)
    y = BiasedActivation(name=f"{name}_act1", dtype=dtype)(y)
    y = GroupedConv2D(wide, groups=groups, implementation=impl, name=f"{name}_conv2",
                      kernel_initializer=msr(gain, 9 * wide // groups), dtype=dtype)(y)
    y = BiasedActivation(name=f"{name}_act2", dtype=dtype)(y)
    y = conv1x1(width, wide, 0.0, f"{name}_conv3", dtype)(y)  # Zero: identity at init.
    return keras.layers.Add(name=f"{name}_add", dtype=dtype)([x, y])


def stage_blocks(x, stage, *, total, expansion, impl, prefix):
    """The stage's residual blocks."""
    for j in range(stage["blocks"]):
        x = residual_block(x, width=stage["width"], groups=stage["groups"],
                           expansion=expansion, gain=block_gain(total), impl=impl,
                           dtype=stage["dtype"], name=f"{prefix}{stage['res']}_block{j}")
    return x


def generative_basis(z, width, size):
    """GenerativeBasis: bias-free Linear(z_in -> W) times the learned SxS basis."""
    v = keras.layers.Dense(width, use_bias=False, kernel_initializer=msr(1.0, z.shape[-1]),
                           name="basis_linear", dtype="float32")(z)
    return LearnedBasis(size, name="basis", dtype="float32")(v)


def g_transition(x, stage, width_in):
    """UpsampleLayer (Networks.py:47-60): 1x1 conv if the width changes, then x2 up."""
    name, dtype = f"g{stage['res']}", stage["dtype"]
    if width_in != stage["width"]:
        x = conv1x1(stage["width"], width_in, 1.0, f"{name}_transition", dtype)(x)
    return Resample("up", name=f"{name}_up", dtype=dtype)(x)


def d_transition(x, stage, width_out):
    """DownsampleLayer (Networks.py:62-75): x2 down, then 1x1 conv if the width changes."""
    name, dtype = f"d{stage['res']}", stage["dtype"]
    x = Resample("down", name=f"{name}_down", dtype=dtype)(x)
    if width_out != stage["width"]:
        x = conv1x1(width_out, stage["width"], 1.0, f"{name}_transition", dtype)(x)
    return x


def discriminative_basis(x, width, out_dim):
    """DiscriminativeBasis (Networks.py:87-95): depthwise SxS valid conv over the whole
    [B, S, S, W] map (the official S = 4), flatten, bias-free Linear(W -> out_dim); float32."""
    size = int(x.shape[1])
    x = keras.layers.DepthwiseConv2D(size, padding="valid", use_bias=False,
                                     depthwise_initializer=msr(1.0, size * size),
                                     name="d4_basis",
                                     dtype="float32")(x)
    x = keras.layers.Flatten(name="d4_flatten", dtype="float32")(x)
    return keras.layers.Dense(out_dim, use_bias=False, kernel_initializer=msr(1.0, width),
                              name="d4_linear", dtype=OUTPUT)(x)


def embedding(num_classes, dim, gain, name):
    """A bias-free Linear of the one-hot label (Networks.py:141,163), as an Embedding:
    fan_in = num_classes."""
    return keras.layers.Embedding(num_classes, dim, embeddings_initializer=msr(gain, num_classes),
                                  name=name, dtype="float32")


def stage_plan(res, widths, blocks_, cardinality, bf16_stages, bottom=4):
    """G's stages, bottom x bottom first: [{res, width, blocks, groups, dtype}]; dtype None
    (the run's policy) for the last bf16_stages, else float32. D uses the reverse."""
    n = len(widths)
    per = lambda v: tuple(v) if isinstance(v, (tuple, list)) else (v,) * n  # noqa: E731
    blocks_, cardinality = per(blocks_), per(cardinality)
    stages = int(math.log2(res // bottom)) + 1
    if n != stages or len(blocks_) != n or len(cardinality) != n:
        raise errors.ConfigError(
            f"r3gan needs one width, block count and cardinality per stage "
            f"{bottom}x{bottom}..{res}x{res} ({stages} stages); Received: widths={tuple(widths)}, "
            f"blocks={blocks_}, cardinality={cardinality}")
    if not 0 <= int(bf16_stages) < n:
        raise errors.ConfigError(f"bf16_stages must be in [0, {n - 1}] (the first stage stays "
                                 f"float32); Received: bf16_stages={bf16_stages!r}")
    plan = []
    for i, (w, b, g) in enumerate(zip(widths, blocks_, cardinality)):
        plan.append({"res": bottom * 2 ** i, "width": int(w), "blocks": int(b), "groups": int(g),
                     "dtype": None if i >= n - int(bf16_stages) else "float32"})
    return plan


def generator(plan, *, data_shape, latent_dim, num_classes, expansion, impl):
    """Generator (Networks.py:129-149): basis stage, upsampling stages, aggregation."""
    z = keras.Input((latent_dim,), name="z")
    inputs, x = z, z
    if num_classes:
        labels = keras.Input((), dtype="int32", name="labels")
        e = embedding(num_classes, latent_dim, 1.0, "embedding")(labels)
        inputs, x = [z, labels], keras.layers.Concatenate(name="z_embedding",
                                                          dtype="float32")([z, e])
    total = sum(s["blocks"] for s in plan)
    width = None
    for stage in plan:
        if width is None:
            x = generative_basis(x, stage["width"], stage["res"])
        else:
            x = g_transition(x, stage, width)
        x = stage_blocks(x, stage, total=total, expansion=expansion, impl=impl, prefix="g")
        width = stage["width"]
    image = conv1x1(data_shape[-1], width, 1.0, "aggregation", OUTPUT)(x)
    return keras.Model(inputs, image, name="generator")


def discriminator(plan, *, data_shape, num_classes, expansion, impl):
    """Discriminator (Networks.py:151-173): extraction, stages R..4, basis, projection."""
    plan = plan[::-1]
    image = keras.Input(data_shape, name="x")
    x = conv1x1(plan[0]["width"], data_shape[-1], 1.0, "extraction", plan[0]["dtype"])(image)
    total = sum(s["blocks"] for s in plan)
    for i, stage in enumerate(plan):
        x = stage_blocks(x, stage, total=total, expansion=expansion, impl=impl, prefix="d")
        if i + 1 < len(plan):
            x = d_transition(x, stage, plan[i + 1]["width"])
    width = plan[-1]["width"]
    logits = discriminative_basis(x, width, width if num_classes else 1)
    if not num_classes:
        return keras.Model(image, logits, name="discriminator")
    labels = keras.Input((), dtype="int32", name="labels")
    e = embedding(num_classes, width, 1.0 / math.sqrt(width), "embedding")(labels)
    logits = keras.layers.Dot(axes=1, name="projection", dtype=OUTPUT)([logits, e])
    return keras.Model([image, labels], logits, name="discriminator")


def build(*, data_shape, latent_dim, num_classes=0, widths=(768, 768, 768, 768),
          blocks=2, cardinality=96, expansion=2, bf16_stages=0, grouped_conv="auto",
          bottom_width=4):
    """(G, D) of R3GAN; see the module docstring.

    Args:
        data_shape: (R, R, C), R = bottom_width * 2^k, k >= 1.
        latent_dim: noise dimension (the official 64); also G's label-embedding width.
        num_classes: 0 (unconditional) or the classes (G embedding latent_dim wide, D's
            projection widths[0] wide, as the official).
        widths: G's stage widths, smallest first (one per resolution bottom_width..R);
            D the reverse.
        blocks, cardinality: residual blocks and 3x3 groups per stage (int: every stage),
            G's order; cardinality divides expansion * width.
        expansion: the block's inverted-bottleneck factor (2).
        bf16_stages: G's last / D's first stages that follow the run's precision policy
            (the official's bfloat16 stages); the others are float32.
        grouped_conv: GroupedConv2D implementation ("auto", or one of
            layers.grouped_conv.IMPLEMENTATIONS).
        bottom_width: the side of G's learned basis and D's depthwise basis conv (the
            official 4; 7 gives 28x28 MNIST as 7, 14, 28, the way BigGAN's bottom_width does).
    """
    res, width, channels = data_shape
    bottom = int(bottom_width) if errors.is_int(bottom_width) else 0
    if bottom < 2:
        raise errors.ConfigError(f"bottom_width must be an int >= 2 (the official 4); "
                                 f"Received: bottom_width={bottom_width!r}")
    k = res // bottom
    if res != width or res % bottom or k < 2 or k & (k - 1):
        raise errors.ConfigError(f"r3gan needs square images whose side is bottom_width "
                                 f"({bottom}) times a power of two >= 2; "
                                 f"Received: data_shape={tuple(data_shape)}")
    if grouped_conv != "auto" and grouped_conv not in IMPLEMENTATIONS:
        raise errors.ConfigError(f"unknown grouped_conv {grouped_conv!r}; valid: auto, "
                                 f"{', '.join(IMPLEMENTATIONS)}")
    plan = stage_plan(res, widths, blocks, cardinality, bf16_stages, bottom)
    for s in plan:
        if (s["width"] * expansion) % s["groups"]:
            raise errors.ConfigError(
                f"cardinality {s['groups']} does not divide expansion * width = "
                f"{s['width'] * expansion} at {s['res']}x{s['res']}")
    common = dict(num_classes=int(num_classes), expansion=int(expansion), impl=grouped_conv)
    g = generator(plan, data_shape=tuple(data_shape), latent_dim=int(latent_dim), **common)
    d = discriminator(plan, data_shape=tuple(data_shape), **common)
    return g, d
