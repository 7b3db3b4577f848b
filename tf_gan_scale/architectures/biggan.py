"""BigGAN generator and discriminator (Brock et al. 2018, arXiv:1809.11096), following
BigGAN-PyTorch's `BigGAN.py` (its `G_arch` / `D_arch` tables) in our own Keras code.

With num_classes > 0 the pair is class-conditional and takes TWO inputs:
  G: [z float32 [B, latent_dim], labels int32 [B]] -> images [B, H, W, C] in [-1, 1]
  D: [x [B, H, W, C], labels int32 [B]] -> logits [B, 1]
With num_classes == 0 both take the single input of every other family (z, resp. x).
Callers tell them apart by `len(model.inputs) == 2`. (Keras refuses an input list that
mixes numpy arrays and tensors in an eager call: pass [z, labels] as both tensors.)

  G: z -> split into len(g_channels) + 1 chunks (hier) -> chunk 0 -> Dense 4*4*C0 ->
     Reshape [4, 4, C0] -> GBlock per entry of g_channels (each doubles the resolution;
     SelfAttention after the block that outputs `attention` x `attention`) ->
     BN -> ReLU -> Conv 3x3 C -> tanh.
     GBlock(c): cBN(c) -> ReLU -> Upsample 2x (nearest) -> Conv 3x3 -> cBN(c) -> ReLU ->
                Conv 3x3, shortcut Upsample 2x -> Conv 1x1; summed.
     c of block i: [shared(labels), z chunk i + 1] (conditional, hier), shared(labels)
     (conditional, not hier), z chunk i + 1 (unconditional, hier); shared is ONE
     Embedding(num_classes, shared_dim) for all blocks. Unconditional without hier: plain
     batch norm (learned scale/offset) instead of cBN.
     cBN (layers.ConditionalBatchNormalization): BN without scale/offset, then
     * (1 + gain(c)) + bias(c) with bias-free Dense gain/bias (BigGAN-PyTorch `ccbn`).
  D: DBlock per entry of d_channels (the first `d_downsample` halve the resolution;
     SelfAttention after the first block that outputs `attention` x `attention`) ->
     ReLU -> global SUM pool -> Dense 1, plus the projection sum(embed(labels) * h) when
     conditional (Miyato & Koyama 2018).
     DBlock: [ReLU] -> Conv 3x3 -> ReLU -> Conv 3x3 -> [AvgPool 2]; shortcut as SNGAN's
     (first block: [AvgPool ->] Conv 1x1; later: Conv 1x1 -> [AvgPool] when the block
     downsamples or changes width, else identity). "Wide" D: hidden width = output width.

Channels are ch * multiplier. Presets by resolution (BigGAN-PyTorch's tables; `ch`, the
attention resolution and d_downsample default to them too):
  32:  G (4, 4, 4)               D (4, 4, 4, 4), 2 downsampling    ch 64, no attention
  64:  G (16, 8, 4, 2)           D (1, 2, 4, 8, 16), 4             ch 64, no attention
  128: G (16, 8, 4, 2, 1)        D (1, 2, 4, 8, 16, 16), 5         ch 96, attention 64
  256: G (16, 8, 8, 4, 2, 1)     D (1, 2, 4, 8, 8, 16, 16), 6      ch 96, attention 64
(BigGAN-PyTorch's default G_attn='64' also puts attention in G's LAST block at 64x64
while its D has no 64x64 block there; `attention` here names one resolution for both
networks, so the 64x64 default is none.) G starts at 4x4, so any other square size
H = 4 * 2**k works with g_channels of length k (d_channels then default to the reverse
of g_channels, every block downsampling down to 4x4).

Spectral norm is Keras' `keras.layers.SpectralNormalization` (as
`layers.SpectralNormalization`, its zero-kernel guard a select) on every Conv2D and Dense
(G and D by default, as BigGAN), including the layers inside cBN and SelfAttention.
Its power-iteration vector `vector_u` is a non-trainable weight (saved in checkpoints),
and its training-mode update reads only the kernel and `u`, never the batch, so every
replica computes identical `u` and kernels (see resnet.py: Keras' layer PROJECTS the
kernel in place, kernel <- kernel / sigma, without the d(sigma)/dW gradient term). The
embeddings: G's shared embedding is a plain Embedding, unnormalized, as in BigGAN-PyTorch
("applying SN to G's embedding seems to randomly cripple G"). D's projection embedding
(BigGAN-PyTorch: SNEmbedding) is `CategoryEncoding` one-hot -> spectrally normalized
bias-free Dense: the Dense kernel [num_classes, features] IS the embedding matrix, so this
is a spectrally normalized embedding with Keras' own wrapper. `SpectralNormalization`
does accept an `Embedding` (it reads `embeddings`), but it casts the layer's output to
the INPUT dtype, so an int32 label lookup returns int32 zeros (Keras 3.15.1), silently.

Batch norm: every batch norm of G is cross-replica by default (sync_bn=True:
SyncBatchNormalization, also inside cBN), so statistics are over the GLOBAL batch and N
replicas match one device; momentum 0.9 and epsilon 1e-5 (BigGAN-PyTorch's 0.1 and 1e-5
in PyTorch's momentum convention). D has no batch norm.

Initialization ("init"): "ortho" (keras.initializers.Orthogonal, BigGAN's default),
"glorot" (GlorotUniform) or "normal" (N(0, 0.02)) for every conv/dense kernel and both
embeddings; biases start at zero (PyTorch keeps its default uniform bias init there).
Each kernel gets its own initializer instance, so `keras.utils.set_random_seed` makes
builds reproducible.
"""

import collections
import math

import keras

from tf_gan_scale import errors
from tf_gan_scale.architectures.resnet import d_block
from tf_gan_scale.layers import (ConditionalBatchNormalization, SelfAttention,
                                 SpectralNormalization, Split, SyncBatchNormalization)
from tf_gan_scale.precision import OUTPUT

# Resolution -> multipliers and defaults, from BigGAN-PyTorch's G_arch / D_arch (out_channels).
PRESETS = {
    32: {"g_channels": (4, 4, 4), "d_channels": (4, 4, 4, 4), "d_downsample": 2, "ch": 64,
         "attention": 0},
    64: {"g_channels": (16, 8, 4, 2), "d_channels": (1, 2, 4, 8, 16), "d_downsample": 4,
         "ch": 64, "attention": 0},
    128: {"g_channels": (16, 8, 4, 2, 1), "d_channels": (1, 2, 4, 8, 16, 16),
          "d_downsample": 5, "ch": 96, "attention": 64},
    256: {"g_channels": (16, 8, 8, 4, 2, 1), "d_channels": (1, 2, 4, 8, 8, 16, 16),
          "d_downsample": 6, "ch": 96, "attention": 64},
}
INITS = ("ortho", "glorot", "normal")
BN_MOMENTUM = 0.9
BN_EPSILON = 1e-5


def _initializer(init):
    """A NEW initializer instance per kernel: an unseeded Keras initializer fixes its seed
    when constructed, so sharing one instance would repeat values across same-shape kernels."""
    if init == "ortho":
        return keras.initializers.Orthogonal()
    if init == "glorot":
        return keras.initializers.GlorotUniform()
    return keras.initializers.RandomNormal(mean=0.0, stddev=0.02)


class _Builder:
    """Layer factories sharing one network's spectral-norm and init settings."""

    def __init__(self, *, sn, power_iterations, init, sync_bn):
        self.sn, self.power_iterations, self.init = sn, power_iterations, init
        self.sync_bn = sync_bn

    def wrap(self, layer):
        if not self.sn:
            return layer
        # The wrapper computes in its layer's policy (a float32 logit layer stays float32).
        return SpectralNormalization(layer, power_iterations=self.power_iterations,
                                                  dtype=layer.dtype_policy)

    def conv(self, filters, k, use_bias=True):
        return self.wrap(keras.layers.Conv2D(filters, k, padding="same", use_bias=use_bias,
                                             kernel_initializer=_initializer(self.init)))

    def dense(self, units, use_bias=True, dtype=None):
        return self.wrap(keras.layers.Dense(units, use_bias=use_bias, dtype=dtype,
                                            kernel_initializer=_initializer(self.init)))

    def attention(self):
        return SelfAttention(spectral_norm=self.sn, power_iterations=self.power_iterations,
                             kernel_initializer=_initializer(self.init))

    def norm(self, x, c):
        """cBN of x conditioned on c, or plain batch norm (learned scale/offset) if c is None.
        Statistics over the global batch unless sync_bn=False."""
        if c is not None:
            return ConditionalBatchNormalization(
                momentum=BN_MOMENTUM, epsilon=BN_EPSILON, synchronized=self.sync_bn,
                spectral_norm=self.sn, power_iterations=self.power_iterations,
                kernel_initializer=_initializer(self.init))([x, c])
        norm = SyncBatchNormalization if self.sync_bn else keras.layers.BatchNormalization
        return norm(momentum=BN_MOMENTUM, epsilon=BN_EPSILON)(x)


def _g_block(b, x, ch, c):
    """G's up-block (BigGAN-PyTorch `GBlock`): [B, r, r, c_in] -> [B, 2r, 2r, ch]; cBN on
    condition c (plain batch norm if None), shortcut Upsample -> Conv 1x1."""
    h = keras.layers.ReLU()(b.norm(x, c))
    h = keras.layers.UpSampling2D(2)(h)
    h = b.conv(ch, 3)(h)
    h = keras.layers.ReLU()(b.norm(h, c))
    h = b.conv(ch, 3)(h)
    s = keras.layers.UpSampling2D(2)(x)
    s = b.conv(ch, 1)(s)
    return keras.layers.Add()([h, s])


def _chunk_sizes(total, parts):
    """Sizes of `parts` consecutive chunks of `total` features, as even as possible (the
    first ones one larger). BigGAN-PyTorch instead drops the remainder of z."""
    return [total // parts + (i < total % parts) for i in range(parts)]


def _multipliers(name, value):
    try:
        value = tuple(int(v) for v in value)
    except (TypeError, ValueError):
        value = None
    if not value or min(value) < 1:
        raise errors.ConfigError(f"biggan {name} must be a non-empty tuple of ints >= 1 "
                                 f"(channel multipliers); Received: {name}={value}")
    return value


def _resolution_error(data_shape, g_channels, bottom_width=4):
    shape = "x".join(str(s) for s in data_shape)
    b = bottom_width
    if g_channels is not None:
        k = len(g_channels)
        return errors.ConfigError(
            f"biggan with g_channels of length {k} and bottom_width {b} makes "
            f"{b * 2 ** k}x{b * 2 ** k} images (bottom_width*2**len(g_channels)); "
            f"Received: {shape}")
    sizes = ", ".join(f"{r}x{r}" for r in PRESETS)
    return errors.ConfigError(f"biggan supports {sizes} (and any bottom_width*2**k with "
                              f"g_channels of length k); Received: {shape}")


def _check_options(num_classes, init, **positive):
    """int(num_classes) after checking it (>= 0), init (INITS) and every `positive` option
    (an int >= 1, or None for the preset's); ConfigError echoing the bad value."""
    if not errors.is_int(num_classes) or num_classes < 0:
        raise errors.ConfigError(f"biggan num_classes must be an int >= 0; "
                                 f"Received: num_classes={num_classes!r}")
    errors.choose("biggan init", init, {i: i for i in INITS})
    for key, value in positive.items():
        if value is not None and (not errors.is_int(value) or value < 1):
            raise errors.ConfigError(f"biggan {key} must be an int >= 1; "
                                     f"Received: {key}={value!r}")
    return int(num_classes)


class _Table(collections.namedtuple("_Table", [
        "data_shape", "latent_dim", "num_classes", "ch", "bottom_width", "g_channels",
        "d_channels", "d_downsample", "attention", "shared_dim", "hier", "g_res", "d_res",
        "slots"])):
    """A BigGAN pair's architecture table, presets applied (BigGAN-PyTorch `G_arch` /
    `D_arch`): G block i outputs [g_res[i], g_res[i], ch * g_channels[i]], D block j
    [d_res[j], d_res[j], ch * d_channels[j]]; attention: a resolution (0: none); slots:
    chunks of z (one per G block plus the stem's when hier, else 1)."""
    __slots__ = ()


def _stage_channels(data_shape, g_channels, d_channels, bottom_width):
    """(preset or None, g_channels, d_channels): checked, or the resolution's preset
    (d_channels: the preset's, else reversed g_channels)."""
    if g_channels is not None:
        g_channels = _multipliers("g_channels", g_channels)
    if d_channels is not None:
        d_channels = _multipliers("d_channels", d_channels)
    if len(data_shape) != 3 or data_shape[0] != data_shape[1] or data_shape[2] < 1:
        raise _resolution_error(data_shape, g_channels, bottom_width)
    res = data_shape[0]
    preset = PRESETS.get(res) if bottom_width == 4 else None
    if g_channels is None:
        if preset is None:
            raise _resolution_error(data_shape, g_channels, bottom_width)
        g_channels = preset["g_channels"]
    elif res != bottom_width * 2 ** len(g_channels):
        raise _resolution_error(data_shape, g_channels, bottom_width)
    if d_channels is None:
        d_channels = preset["d_channels"] if preset else tuple(reversed(g_channels))
    return preset, g_channels, d_channels


def _table(data_shape, *, latent_dim, num_classes, ch, g_channels, d_channels, d_downsample,
           attention, shared_dim, hier, bottom_width):
    """The checked _Table of `build`'s arguments (None: the preset's); ConfigError else."""
    preset, g_channels, d_channels = _stage_channels(data_shape, g_channels, d_channels,
                                                     bottom_width)
    res = data_shape[0]
    max_down = min(len(d_channels), int(math.log2(res)))
    if d_downsample is None:
        # Down to the bottom width (log2(res / bottom_width) halvings).
        d_downsample = min(preset["d_downsample"] if preset else
                           (res // bottom_width).bit_length() - 1, len(d_channels))
    if not errors.is_int(d_downsample) or not 0 <= d_downsample <= max_down:
        raise errors.ConfigError(f"biggan d_downsample must be in [0, {max_down}] (D blocks, "
                                 f"halvings of {res}); Received: d_downsample={d_downsample!r}")
    if ch is None:
        ch = preset["ch"] if preset else 64
    # The resolution each block outputs, in G and in D.
    g_res = tuple(bottom_width * 2 ** (i + 1) for i in range(len(g_channels)))
    d_res = tuple(res >> min(j + 1, d_downsample) for j in range(len(d_channels)))
    if attention is None:
        attention = preset["attention"] if preset else 0
    valid = sorted(set(g_res) & set(d_res))
    if attention != 0 and attention not in valid:
        raise errors.ConfigError(
            f"biggan attention must be 0 (none) or a resolution that a G block and a D block "
            f"both output: {', '.join(map(str, valid)) or 'none here'}; "
            f"Received: attention={attention!r}")
    slots = len(g_channels) + 1 if hier else 1
    if latent_dim < slots:
        raise errors.ConfigError(
            f"biggan with hier=True splits z into {slots} chunks (one per G block plus one); "
            f"latent_dim must be >= {slots}; Received: latent_dim={latent_dim}")
    return _Table(data_shape, latent_dim, num_classes, ch, bottom_width, g_channels,
                  d_channels, d_downsample, attention, shared_dim, hier, g_res, d_res, slots)


def _g_inputs(t, b):
    """G's inputs and what its stages read: (inputs, z0 [B, |chunk 0|] for the stem, one
    condition per G block: [B, shared_dim + |chunk i+1|] / [B, shared_dim] / [B, |chunk|],
    or None (plain batch norm) when unconditional without hier). Module docstring."""
    z = keras.Input((t.latent_dim,), name="z")
    inputs = [z]
    shared = None
    if t.num_classes:
        labels = keras.Input((), dtype="int32", name="labels")
        inputs.append(labels)
        # Not spectrally normalized (BigGAN-PyTorch); one embedding for every block.
        shared = keras.layers.Embedding(t.num_classes, t.shared_dim, name="shared",
                                        embeddings_initializer=_initializer(b.init))(labels)
    if not t.hier:
        return inputs, z, [shared] * len(t.g_channels)
    chunks = Split(_chunk_sizes(t.latent_dim, t.slots), name="z_chunks")(z)
    conds = [keras.layers.Concatenate()([shared, zc]) if t.num_classes else zc
             for zc in chunks[1:]]
    return inputs, chunks[0], conds


def _g_stem(b, t, z0):
    """Linear z0 -> [B, bottom_width, bottom_width, ch * g_channels[0]] (G's first row)."""
    c0 = t.ch * t.g_channels[0]
    x = b.dense(t.bottom_width * t.bottom_width * c0)(z0)
    return keras.layers.Reshape((t.bottom_width, t.bottom_width, c0))(x)


def _g_head(b, x, channels):
    """BN -> ReLU -> Conv 3x3 -> tanh: [B, H, H, c] -> image [B, H, H, channels] (OUTPUT)."""
    x = keras.layers.ReLU()(b.norm(x, None))
    x = b.conv(channels, 3)(x)
    return keras.layers.Activation("tanh", dtype=OUTPUT)(x)


def _generator(t, b):
    """G as the table of Brock et al. 2018 (Appendix B, Table 4 for 128x128; BigGAN-PyTorch
    `G_arch`): z [B, latent_dim] (+ labels [B]) -> stem [B, bw, bw, ch * g_channels[0]] ->
    one up-block per stage i ([B, g_res[i], g_res[i], ch * g_channels[i]]), self-attention
    after the stage at `attention` -> head -> [B, H, H, C] in [-1, 1]."""
    inputs, z0, conds = _g_inputs(t, b)
    x = _g_stem(b, t, z0)
    for mult, c, r in zip(t.g_channels, conds, t.g_res):
        x = _g_block(b, x, t.ch * mult, c)
        if r == t.attention:
            x = b.attention()(x)
    x = _g_head(b, x, t.data_shape[-1])
    return keras.Model(inputs if t.num_classes else inputs[0], x, name="generator")


def _d_head(b, t, h):
    """ReLU -> global SUM pool -> Dense 1, plus the projection sum(embed(labels) * h)
    (Miyato & Koyama 2018) when conditional: [B, r, r, F] -> (labels Input or None,
    logits [B, 1] OUTPUT)."""
    h = keras.layers.ReLU()(h)
    # Global SUM pooling (SNGAN/BigGAN): the mean times the number of positions.
    h = keras.layers.GlobalAveragePooling2D()(h)
    h = keras.layers.Rescaling(float(t.d_res[-1] ** 2))(h)
    logits = b.dense(1, dtype=OUTPUT)(h)
    if not t.num_classes:
        return None, logits
    d_labels = keras.Input((), dtype="int32", name="labels")
    one_hot = keras.layers.CategoryEncoding(t.num_classes, output_mode="one_hot")(d_labels)
    # One-hot @ kernel [num_classes, F] = embedding lookup, spectrally normalized
    # (Keras' wrapper on an Embedding would cast its output to int32: module docstring).
    embed = b.dense(h.shape[-1], use_bias=False)(one_hot)
    projection = keras.layers.Dot(axes=1)([embed, h])  # sum(embed(y) * h): [B, 1].
    return d_labels, keras.layers.Add(dtype=OUTPUT)([logits, projection])


def _discriminator(t, b):
    """D as the table of Brock et al. 2018 (Appendix B, Table 4 for 128x128; BigGAN-PyTorch
    `D_arch`): x [B, H, H, C] -> one down-block per stage j ([B, d_res[j], d_res[j],
    ch * d_channels[j]]; the first d_downsample halve), self-attention after the FIRST
    stage at `attention` -> head -> logits [B, 1] (+ projection of labels [B])."""
    image = keras.Input(t.data_shape, name="x")
    h = image
    # Attention after the FIRST block at that resolution (blocks past d_downsample repeat it).
    attend = t.d_res.index(t.attention) if t.attention in t.d_res else None
    for j, mult in enumerate(t.d_channels):
        h = d_block(h, t.ch * mult, b.conv, down=j < t.d_downsample, first=j == 0)
        if j == attend:
            h = b.attention()(h)
    d_labels, logits = _d_head(b, t, h)
    inputs = image if d_labels is None else [image, d_labels]
    return keras.Model(inputs, logits, name="discriminator")


def build(*, data_shape, latent_dim, num_classes=0, ch=None, g_channels=None, d_channels=None,
          d_downsample=None, attention=None, shared_dim=128, hier=True, sync_bn=True,
          g_spectral_norm=True, d_spectral_norm=True, power_iterations=1, init="ortho",
          bottom_width=4):
    """Builds the BigGAN pair (see the module docstring for layout and presets).

    Args:
        data_shape: (H, H, C): H in PRESETS, or 4 * 2**len(g_channels).
        latent_dim: int, size of z (>= len(g_channels) + 1 when hier).
        num_classes: int >= 0; > 0 makes both networks class-conditional with a second
            input `labels` int32 [B] in [0, num_classes).
        ch: int, base width (channels = ch * multiplier); default the preset's (64 or 96)
            or 64.
        g_channels: OUTPUT multipliers of G's blocks, one block (and one doubling from
            4x4) each; the first Dense makes ch * g_channels[0] channels, block i maps
            g_channels[i - 1] to g_channels[i]. These are BigGAN-PyTorch's `out_channels`
            (128x128: (16, 8, 4, 2, 1)), not its `in_channels` (16, 16, 8, 4, 2).
            Default: the preset's.
        d_channels: OUTPUT multipliers of D's blocks (BigGAN-PyTorch's `out_channels`);
            default the preset's, else reversed g_channels.
        d_downsample: int, how many of D's first blocks halve the resolution; default the
            preset's, else down to 4x4 (at most every block).
        attention: int, the resolution of the self-attention block in G and D (0: none);
            it must be a resolution that a G block and a D block output. Default: 64 at
            128x128 and 256x256, else 0.
        shared_dim: int, size of G's shared class embedding (conditional only).
        hier: bool, hierarchical z: one chunk to the first Dense, one per G block into its
            batch norms.
        sync_bn: bool, cross-replica batch norm in G (statistics over the global batch).
        g_spectral_norm / d_spectral_norm: bool, spectral norm on every conv/dense of G / D.
        power_iterations: int >= 1, power iterations per training-mode call.
        init: "ortho", "glorot" or "normal" (N(0, 0.02)).
        bottom_width: int >= 1, G's starting resolution (BigGAN-PyTorch's `bottom_width`):
            H = bottom_width * 2**len(g_channels), e.g. 7 for 28x28 (MNIST) with two
            blocks. The presets need 4.

    Returns:
        (generator, discriminator); see the module docstring for their inputs.

    Example:
        >>> g, d = build(data_shape=(16, 16, 3), latent_dim=8, num_classes=10, ch=4,
        ...              g_channels=(2, 1), attention=8)
        >>> x = g([z, labels]); logits = d([x, labels])
    """
    data_shape = tuple(data_shape)
    num_classes = _check_options(num_classes, init, ch=ch, shared_dim=shared_dim,
                                 bottom_width=bottom_width, power_iterations=power_iterations,
                                 latent_dim=latent_dim)
    table = _table(data_shape, latent_dim=latent_dim, num_classes=num_classes, ch=ch,
                   g_channels=g_channels, d_channels=d_channels, d_downsample=d_downsample,
                   attention=attention, shared_dim=shared_dim, hier=hier,
                   bottom_width=bottom_width)
    g = _Builder(sn=g_spectral_norm, power_iterations=power_iterations, init=init,
                 sync_bn=sync_bn)
    generator = _generator(table, g)
    d = _Builder(sn=d_spectral_norm, power_iterations=power_iterations, init=init,
                 sync_bn=sync_bn)
    return generator, _discriminator(table, d)
