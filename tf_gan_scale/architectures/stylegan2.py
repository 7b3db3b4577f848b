"""StyleGAN2 (Karras et al. 2020) as in stylegan2-ada-pytorch (training/networks.py).

Formulas, constants and the official file:function of each part: docs/stylegan2.md.
Over the house's 450 lines: the networks (MappingNetwork, SynthesisNetwork) and the
builders that read as the official architecture are one architecture, kept whole until
issue 53 moves the two networks to a module of their own.

G (functional, name "generator"): z [B, latent_dim] (+ labels int32 [B]) -> `mapping`
(MappingNetwork: w [B, w_dim]) -> `broadcast` (RepeatVector: ws [B, num_ws, w_dim]) ->
`synthesis` (SynthesisNetwork: image [B, R, R, C] float32, roughly in [-1, 1], no tanh).
The step code calls `parts(G)` -> (mapping, synthesis) separately (style mixing, path
length); both layers work on their own, outside the functional graph.

  synthesis: learned 4x4 const -> b4 (conv1, torgb) -> blocks 8..R (conv0 up 2, conv1,
  torgb), architecture 'skip': img = upsample2d(img) + torgb(x). Conv j uses ws[:, j];
  the torgb of block k (b4 is k = 0) uses ws[:, 2k+1], i.e. it shares its w with the
  next block's conv0 (official w_idx bookkeeping). Channels ch(res) =
  min(int(fmaps*32768) // res, channel_max).

D (functional, name "discriminator"): x [B, R, R, C] (+ labels) -> [B, 1] float32:
  fromrgb (1x1, lrelu) in the first block; blocks R..8: 'resnet' (skip 1x1 down, no bias,
  gain sqrt 1/2; conv0 3x3; conv1 3x3 down 2 gain sqrt 1/2; summed) or 'orig' (no skip);
  epilogue at 4x4: minibatch stddev -> conv 3x3 -> fc -> out. Conditional: out has
  cmap_dim = ch(4) features and the logit is sum(out * cmap) / sqrt(cmap_dim), cmap from
  an 8-layer mapping network of the labels (z_dim 0, lr_mul 0.01).

Randomness (one device = N replicas): the synthesis network's noise in training mode is
drawn per example from its GLOBAL row (`latents.current_rows`) and a checkpointed call
counter (`SynthesisNetwork.calls`, +1 per training-mode call): see
`layers.stylegan.layer_noise`. Inference (training=False) uses each layer's constant
noise buffer, so samples are a deterministic function of (z, labels). Minibatch stddev
groups are formed inside chunks of `mbstd_chunk` GLOBAL rows (`layers.stylegan.MinibatchStd`).
"""

import math

import keras
import numpy as np
import tensorflow as tf

from tf_gan_scale import errors, latents
from tf_gan_scale.layers.stylegan import (EqualizedConv2D, EqualizedDense, MinibatchStd,
                                          SynthesisLayer, ToRGB, check_mbstd, conv_clamp_value,
                                          layer_noise, noise_key, normalize_2nd_moment,
                                          upsample2d)
from tf_gan_scale.precision import OUTPUT


def track(layer, sublayers):
    """Makes sublayers held in a list attributes of `layer` too (by their names).

    Keras 3 tracks a list of layers for `weights` and `.keras` files, but TensorFlow's
    object-graph checkpoints (tf.train.Checkpoint, what training saves) do not see
    inside it: a model whose weights only an optimizer references (the EMA copy) lost
    them on resume. As attributes they are saved; Keras does not count them twice."""
    for sub in sublayers:
        setattr(layer, sub.name, sub)


def channels(res, fmaps=1.0, channel_max=512):
    """ch(res) = min(channel_base // res, channel_max), channel_base = int(fmaps * 32768)."""
    return min(int(fmaps * 32768) // res, channel_max)


FP16 = "mixed_float16"  # A float16 block's policy: float32 variables, float16 arithmetic.


def fp16_resolution(resolution, num_fp16_res):
    """The lowest resolution whose blocks compute in float16: max(2^(log2 R + 1 - n), 8)
    (SynthesisNetwork / Discriminator.__init__); None when num_fp16_res is 0."""
    if not num_fp16_res:
        return None
    return max(2 ** (int(round(math.log2(resolution))) + 1 - int(num_fp16_res)), 8)


def block_dtype(res, resolution, num_fp16_res):
    """dtype= for the layers of the block at `res`: FP16 in the top num_fp16_res
    resolutions, else None (the run's policy)."""
    low = fp16_resolution(resolution, num_fp16_res)
    return FP16 if low is not None and res >= low else None


def num_ws(resolution):
    """Number of w vectors the synthesis network takes: 2*log2(resolution) - 2."""
    return 2 * int(round(math.log2(resolution))) - 2


def truncate(ws, w_avg, psi, cutoff=None):
    """Truncation trick: w_avg + psi * (ws - w_avg) on ws [B, num_ws, w_dim] (all layers,
    or the first `cutoff`). Training never truncates."""
    t = w_avg + psi * (ws - w_avg)
    if cutoff is None:
        return t
    return tf.concat([t[:, :cutoff], ws[:, cutoff:]], axis=1)


@keras.saving.register_keras_serializable(package="tf_gan_scale")
class MappingNetwork(keras.layers.Layer):
    """MappingNetwork: (z, labels) -> w [B, w_dim] (float32).

    x = normalize_2nd_moment(z) (if z_dim > 0); conditional: y = normalize_2nd_moment(
    FC(one_hot(labels), c_dim -> w_dim, lr_mul 1)) concatenated after x; then num_layers
    FCs (-> w_dim, lrelu, lr_mul). With w_avg_beta set it holds a non-trainable `w_avg`
    [w_dim] (initial 0), used only for truncation (`truncate`), never in training.

    w_avg is NOT updated by calls: the step calls `update_w_avg(mapping, mean_w)` with the
    mean w of the GLOBAL batch (summed on G's gradient all-reduce), so N replicas keep the
    w_avg one device keeps, without an extra collective per mapping call (the official
    code updates it per GPU from its own rows and keeps rank 0's; SG3 only in the Dgen
    pass). Every replica assigns the same value: aggregation only_first_replica.

    Call: z [B, z_dim]; [z, labels int32 [B]] when conditional; labels alone when
    z_dim == 0 (D's label mapping).
    """

    def __init__(self, *, z_dim, c_dim=0, w_dim=512, num_layers=8, lr_mul=0.01,
                 w_avg_beta=0.995, **kwargs):
        kwargs.setdefault("dtype", "float32")  # Official: the mapping stays float32.
        super().__init__(**kwargs)
        self.z_dim, self.c_dim, self.w_dim = int(z_dim), int(c_dim), int(w_dim)
        self.num_layers, self.lr_mul = int(num_layers), float(lr_mul)
        self.w_avg_beta = None if w_avg_beta is None else float(w_avg_beta)
        if self.z_dim <= 0 and self.c_dim <= 0:
            raise ValueError("MappingNetwork needs z_dim > 0 or c_dim > 0")
        self.embed = (EqualizedDense(self.w_dim, name="embed", dtype="float32")
                      if self.c_dim else None)
        self.fcs = [EqualizedDense(self.w_dim, "lrelu", lr_mul=self.lr_mul, name=f"fc{i}",
                                   dtype="float32") for i in range(self.num_layers)]
        track(self, self.fcs)

    def build(self, input_shape):
        if self.embed is not None:
            self.embed.build((None, self.c_dim))
        features = (self.z_dim if self.z_dim else 0) + (self.w_dim if self.c_dim else 0)
        for fc in self.fcs:
            fc.build((None, features))
            features = self.w_dim
        self.w_avg = None
        if self.w_avg_beta is not None:
            self.w_avg = self.add_weight(name="w_avg", shape=(self.w_dim,),
                                         initializer="zeros", trainable=False,
                                         aggregation="only_first_replica")

    def _split(self, inputs):
        if self.z_dim and self.c_dim:
            return inputs[0], inputs[1]
        return (inputs, None) if self.z_dim else (None, inputs)

    def call(self, inputs, training=False):
        z, labels = self._split(inputs)
        parts = []
        if z is not None:
            parts.append(normalize_2nd_moment(z))
        if labels is not None:
            one_hot = tf.one_hot(tf.cast(tf.reshape(labels, [-1]), tf.int32), self.c_dim)
            parts.append(normalize_2nd_moment(self.embed(one_hot)))
        x = parts[0] if len(parts) == 1 else tf.concat(parts, axis=1)
        for fc in self.fcs:
            x = fc(x)
        return x

    def compute_output_shape(self, input_shape):
        first = input_shape[0] if (self.z_dim and self.c_dim) else input_shape
        return (first[0], self.w_dim)

    def get_config(self):
        return {**super().get_config(), "z_dim": self.z_dim, "c_dim": self.c_dim,
                "w_dim": self.w_dim, "num_layers": self.num_layers, "lr_mul": self.lr_mul,
                "w_avg_beta": self.w_avg_beta}


@keras.saving.register_keras_serializable(package="tf_gan_scale")
class SynthesisNetwork(keras.layers.Layer):
    """SynthesisNetwork (architecture 'skip'): ws [B, num_ws, w_dim] -> image
    [B, R, R, img_channels] float32.

    Noise: training=True draws each conv's noise per example (`layer_noise` of the key
    `noise_key(seed, calls)`: this layer's seed, the incremented call counter; the rows
    `latents.current_rows(B)`); training=False uses each conv's constant buffer.
    `calls` is a checkpointed int64 non-trainable weight (aggregation only_first_replica:
    replicas run in lockstep), so a resumed run continues the same noise sequence.

    Args:
        resolution: R, a power of two >= 4. img_channels: C. w_dim: style size.
        fmaps, channel_max: channel widths (`channels`). conv_clamp: None or float.
        seed: int, the noise seed (random and constant noise).
        num_fp16_res: the top resolutions whose layers compute in float16 (`block_dtype`;
            0: every layer uses the run's policy).
    """

    def __init__(self, *, resolution, img_channels, w_dim=512, fmaps=1.0, channel_max=512,
                 conv_clamp=None, seed=0, num_fp16_res=0, **kwargs):
        super().__init__(**kwargs)
        self.resolution, self.img_channels = int(resolution), int(img_channels)
        self.w_dim, self.fmaps, self.channel_max = int(w_dim), float(fmaps), int(channel_max)
        self.conv_clamp = conv_clamp_value(conv_clamp)
        self.seed, self.num_fp16_res = int(seed), int(num_fp16_res)
        self.block_res = [2 ** i for i in range(2, int(math.log2(self.resolution)) + 1)]
        ch = lambda r: channels(r, self.fmaps, self.channel_max)  # noqa: E731
        common = dict(w_dim=self.w_dim, conv_clamp=self.conv_clamp, noise_seed=self.seed)
        self.convs, self.torgbs = [], []
        for res in self.block_res:
            dtype = {"dtype": block_dtype(res, self.resolution, self.num_fp16_res)}
            if res > 4:
                self.convs.append(SynthesisLayer(ch(res), resolution=res, up=2,
                                                 layer_index=len(self.convs),
                                                 name=f"b{res}_conv0", **common, **dtype))
            self.convs.append(SynthesisLayer(ch(res), resolution=res,
                                             layer_index=len(self.convs),
                                             name=f"b{res}_conv1", **common, **dtype))
            self.torgbs.append(ToRGB(self.img_channels, w_dim=self.w_dim,
                                     conv_clamp=self.conv_clamp, name=f"b{res}_torgb",
                                     **dtype))
        track(self, self.convs + self.torgbs)
        self.num_ws = num_ws(self.resolution)

    def build(self, input_shape):
        ch = lambda r: channels(r, self.fmaps, self.channel_max)  # noqa: E731
        self.const = self.add_weight(name="const", shape=(4, 4, ch(4)),
                                     initializer=keras.initializers.RandomNormal(stddev=1.0))
        self.calls = self.add_weight(name="calls", shape=(), dtype="int64",
                                     initializer="zeros", trainable=False,
                                     aggregation="only_first_replica")
        c_in = ch(4)
        for conv in self.convs:
            conv.build((None, None, None, c_in))
            c_in = conv.filters
        for res, torgb in zip(self.block_res, self.torgbs):
            torgb.build((None, res, res, ch(res)))

    def call(self, ws, training=False):
        b = tf.shape(ws)[0]
        noise_of = lambda j, res: None  # noqa: E731  (constant buffers)
        if training:
            count = self.calls.assign_add(1)
            rows = latents.current_rows(b)
            call_key = noise_key(self.seed, count)
            noise_of = lambda j, res: layer_noise(call_key, j, rows, res)  # noqa: E731
        # expand_dims, not const[None]: on a DTensor mesh a new-axis slice that does not
        # name every dimension (t[None], t[:, None]) crashes layout propagation (SIGSEGV).
        x = tf.tile(tf.expand_dims(tf.cast(self.const, self.compute_dtype), 0), [b, 1, 1, 1])
        img, j = None, 0
        for k, (res, torgb) in enumerate(zip(self.block_res, self.torgbs)):
            for _ in range(1 if res == 4 else 2):
                x = self.convs[j](x, ws[:, j], noise=noise_of(j, res))
                j += 1
            y = torgb(x, ws[:, 2 * k + 1])  # float32
            img = y if img is None else upsample2d(img) + y
        return img

    def compute_output_shape(self, input_shape):
        return (input_shape[0], self.resolution, self.resolution, self.img_channels)

    def get_config(self):
        return {**super().get_config(), "resolution": self.resolution,
                "img_channels": self.img_channels, "w_dim": self.w_dim, "fmaps": self.fmaps,
                "channel_max": self.channel_max, "conv_clamp": self.conv_clamp,
                "seed": self.seed, "num_fp16_res": self.num_fp16_res}


def update_w_avg(mapping, mean_w):
    """w_avg <- beta * w_avg + (1 - beta) * mean_w (the official lerp(mean, w_avg, beta)).

    mean_w: [w_dim], the mean w of the GLOBAL batch (the same on every replica)."""
    beta = mapping.w_avg_beta
    new = beta * mapping.w_avg + (1.0 - beta) * tf.cast(mean_w, tf.float32)
    return mapping.w_avg.assign(new)


def num_ws_of(synthesis):
    """Number of ws [B, num_ws, w_dim] a SynthesisNetwork layer takes."""
    return synthesis.num_ws


def mbstd_chunk(discriminator):
    """The minibatch-stddev chunk (rows) of a StyleGAN2 discriminator; 0 if it has none."""
    chunks = [layer.chunk for layer in getattr(discriminator, "layers", [])
              if isinstance(layer, MinibatchStd)]
    return chunks[0] if chunks else 0


def check_batch(model_config, per_replica_batch):
    """ConfigError unless the per-replica batch is a multiple of the minibatch-stddev chunk
    (model_config: config.model with mbstd_group / mbstd_chunk, defaults 4 / 0): a chunk
    must never straddle two replicas, or groups would depend on the replica count."""
    group = int(model_config.get("mbstd_group", 4))
    chunk = int(model_config.get("mbstd_chunk", 0)) or group
    if per_replica_batch % chunk:
        fits = [c for c in range(group, per_replica_batch + 1, group)
                if per_replica_batch % c == 0]
        raise errors.ConfigError(
            f"stylegan2 minibatch-std chunks of {chunk} rows (config.model.mbstd_chunk, "
            f"mbstd_group={group}) must not straddle replicas; the per-replica batch "
            f"{per_replica_batch} is not a multiple of {chunk}; valid: "
            + (f"mbstd_chunk in {', '.join(map(str, fits))} (multiples of mbstd_group dividing "
               f"{per_replica_batch}), or " if fits else "")
            + f"a per-replica batch that is a multiple of {chunk}")


def parts(generator):
    """(mapping layer, synthesis layer) of a StyleGAN2 generator (or a clone of one)."""
    return generator.get_layer("mapping"), generator.get_layer("synthesis")


def sample(generator, z, labels=None, psi=1.0, cutoff=None):
    """Images [B, R, R, C] float32 of a StyleGAN2 generator in inference mode (constant
    noise) for z [B, latent_dim] (and labels int32 [B] when conditional), with the
    truncation trick w_avg + psi (w - w_avg) on the first `cutoff` layers (all: None)."""
    mapping, synthesis = parts(generator)
    w = mapping([z, tf.cast(labels, tf.int32)] if labels is not None else z, training=False)
    ws = tf.tile(w[:, None, :], [1, synthesis.num_ws, 1])
    if psi != 1.0:
        ws = truncate(ws, tf.convert_to_tensor(mapping.w_avg), float(psi), cutoff)
    return tf.cast(synthesis(ws, training=False), tf.float32)


def is_style_generator(model):
    """Whether `model` is a StyleGAN2 generator (has the mapping and synthesis layers)."""
    names = {layer.name: layer for layer in getattr(model, "layers", [])}
    return (isinstance(names.get("mapping"), MappingNetwork)
            and isinstance(names.get("synthesis"), SynthesisNetwork))


def _check(data_shape, d_architecture, mbstd_group, mbstd_chunk, fmaps, channel_max,
           mapping_layers):
    if len(data_shape) != 3 or data_shape[0] != data_shape[1]:
        raise errors.ConfigError(f"stylegan2 needs square images (H, W, C) with H == W; "
                                 f"Received: data_shape={data_shape}")
    r = data_shape[0]
    if not errors.is_int(r) or r < 8 or r & (r - 1):
        raise errors.ConfigError(f"stylegan2 resolution must be a power of two >= 8; "
                                 f"Received: data_shape={data_shape}")
    if d_architecture not in ("resnet", "orig"):
        raise errors.ConfigError(f"stylegan2 d_architecture must be 'resnet' or 'orig'; "
                                 f"Received: d_architecture={d_architecture!r}")
    try:
        check_mbstd(None, mbstd_group, mbstd_chunk or mbstd_group)
    except ValueError as e:
        raise errors.ConfigError(f"stylegan2 mbstd_chunk: {e}") from None
    if mbstd_group < 1 or fmaps <= 0 or channel_max < 1 or mapping_layers < 1:
        raise errors.ConfigError(
            f"stylegan2 needs mbstd_group >= 1, fmaps > 0, channel_max >= 1, mapping_layers "
            f">= 1; Received: mbstd_group={mbstd_group}, fmaps={fmaps}, "
            f"channel_max={channel_max}, mapping_layers={mapping_layers}")
    if channels(r, fmaps, channel_max) < 1:
        raise errors.ConfigError(f"stylegan2 fmaps={fmaps} gives 0 channels at {r}x{r}; "
                                 f"fmaps must be >= {r / 32768}")


def _generator(data_shape, latent_dim, num_classes, *, mapping, synthesis):
    """G as stylegan2-ada-pytorch `Generator` (networks.py; Karras et al. 2020, Fig. 7b skip):
    z [B, latent_dim] (+ labels int32 [B]) -> MappingNetwork (`mapping` kwargs) -> w
    [B, w_dim] -> broadcast ws [B, num_ws, w_dim] -> SynthesisNetwork (`synthesis` kwargs:
    its per-resolution blocks b4..bR) -> image [B, R, R, C] float32."""
    z = keras.Input((latent_dim,), name="z")
    inputs = z
    if num_classes > 0:
        labels = keras.Input((), dtype="int32", name="labels")
        inputs = [z, labels]
    w = MappingNetwork(z_dim=latent_dim, c_dim=num_classes, name="mapping", **mapping)(inputs)
    ws = keras.layers.RepeatVector(num_ws(data_shape[0]), name="broadcast", dtype="float32")(w)
    img = SynthesisNetwork(resolution=data_shape[0], img_channels=data_shape[2],
                           name="synthesis", **synthesis)(ws)
    return keras.Model(inputs, img, name="generator")


def _d_block(x, r, tmp, out, *, first, resnet, conv_clamp, dtype):
    """D's block at r (networks.py:DiscriminatorBlock, 'resnet' or 'orig'): [B, r, r, C or
    tmp] -> [fromrgb 1x1 lrelu: B, r, r, tmp, first block only] -> conv0 3x3 [B, r, r, tmp]
    -> conv1 3x3 down 2 [B, r/2, r/2, out], plus (resnet) skip 1x1 down 2 without bias;
    both gains sqrt 1/2 when resnet. dtype: `block_dtype` (None: the run's policy)."""
    half = float(np.sqrt(0.5))
    dtype = {"dtype": dtype}
    if first:
        x = EqualizedConv2D(tmp, 1, "lrelu", conv_clamp=conv_clamp, name=f"b{r}_fromrgb",
                            **dtype)(x)
    if resnet:
        y = EqualizedConv2D(out, 1, down=2, use_bias=False, gain=half, name=f"b{r}_skip",
                            **dtype)(x)
    x = EqualizedConv2D(tmp, 3, "lrelu", conv_clamp=conv_clamp, name=f"b{r}_conv0",
                        **dtype)(x)
    x = EqualizedConv2D(out, 3, "lrelu", down=2, gain=half if resnet else 1.0,
                        conv_clamp=conv_clamp, name=f"b{r}_conv1", **dtype)(x)
    if resnet:
        x = keras.layers.Add(name=f"b{r}_add", **dtype)([y, x])
    return x


def _d_epilogue(x, c4, out_dim, *, mbstd_group, mbstd_chunk, conv_clamp):
    """D's 4x4 epilogue (networks.py:DiscriminatorEpilogue), float32 as the official:
    [B, 4, 4, c4] -> minibatch stddev [B, 4, 4, c4 + 1] -> conv 3x3 [B, 4, 4, c4] ->
    fc [B, c4] -> out [B, out_dim] (OUTPUT)."""
    x = MinibatchStd(mbstd_group, mbstd_chunk, name="b4_mbstd", dtype="float32")(x)
    x = EqualizedConv2D(c4, 3, "lrelu", conv_clamp=conv_clamp, name="b4_conv",
                        dtype="float32")(x)
    x = keras.layers.Flatten(name="b4_flatten", dtype="float32")(x)
    x = EqualizedDense(c4, "lrelu", name="b4_fc", dtype="float32")(x)
    return EqualizedDense(out_dim, name="b4_out", dtype=OUTPUT)(x)


def _d_projection(x, num_classes, cmap_dim, mapping_lr_mul):
    """The conditional head (networks.py:DiscriminatorEpilogue with cmap): (labels Input,
    sum(out * cmap) / sqrt(cmap_dim) [B, 1]) for out [B, cmap_dim], cmap [B, cmap_dim] from
    an 8-layer mapping of the labels (z_dim 0)."""
    d_labels = keras.Input((), dtype="int32", name="labels")
    cmap = MappingNetwork(z_dim=0, c_dim=num_classes, w_dim=cmap_dim, num_layers=8,
                          lr_mul=mapping_lr_mul, w_avg_beta=None, name="mapping")(d_labels)
    x = keras.layers.Dot(axes=1, name="projection", dtype=OUTPUT)([x, cmap])
    x = keras.layers.Rescaling(1.0 / float(np.sqrt(cmap_dim)), name="cmap_scale",
                               dtype=OUTPUT)(x)
    return d_labels, x


def _discriminator(data_shape, num_classes, *, widths, d_architecture, conv_clamp,
                   num_fp16_res, mbstd_group, mbstd_chunk, mapping_lr_mul):
    """D as stylegan2-ada-pytorch `Discriminator` (networks.py; Karras et al. 2020, Fig. 7c
    residual): x [B, R, R, C] -> one block per resolution r = R, R/2, .., 8 ([B, r/2, r/2,
    ch(r/2)]) -> 4x4 epilogue -> logits [B, 1] float32 (+ cmap projection of labels [B]).
    widths: {fmaps, channel_max} of `channels`."""
    res = data_shape[0]
    ch = lambda r: channels(r, **widths)  # noqa: E731
    image = keras.Input(data_shape, name="x")
    x = image
    for r in (2 ** k for k in range(int(math.log2(res)), 2, -1)):
        x = _d_block(x, r, ch(r), ch(r // 2), first=r == res,
                     resnet=d_architecture == "resnet", conv_clamp=conv_clamp,
                     dtype=block_dtype(r, res, num_fp16_res))
    cmap_dim = ch(4) if num_classes > 0 else 0
    x = _d_epilogue(x, ch(4), cmap_dim or 1, mbstd_group=mbstd_group,
                    mbstd_chunk=mbstd_chunk, conv_clamp=conv_clamp)
    if num_classes <= 0:
        return keras.Model(image, x, name="discriminator")
    d_labels, x = _d_projection(x, num_classes, cmap_dim, mapping_lr_mul)
    return keras.Model([image, d_labels], x, name="discriminator")


def build(*, data_shape, latent_dim=512, num_classes=0, w_dim=512, mapping_layers=8,
          fmaps=1.0, channel_max=512, mbstd_group=4, mbstd_chunk=0, d_architecture="resnet",
          conv_clamp=None, mapping_lr_mul=0.01, w_avg_beta=0.995, seed=0, num_fp16_res=0,
          d_freeze_layers=0):
    """Builds the StyleGAN2 pair (module docstring).

    Args:
        data_shape: (R, R, C), R a power of two >= 8.
        latent_dim: z_dim. num_classes: 0 (unconditional) or the number of classes.
        w_dim: size of w. mapping_layers: FC layers of G's mapping (8; presets auto and
            cifar use 2). fmaps, channel_max: ch(res) = min(int(fmaps*32768)//res,
            channel_max) (paper256: fmaps 0.5; stylegan2/cifar: 1).
        mbstd_group: minibatch-stddev group size (stylegan2 4, paper256 8, cifar 32).
        mbstd_chunk: rows per virtual chunk of global rows (0 = mbstd_group); the
            official batch_gpu is the faithful choice.
        d_architecture: "resnet" (every preset but cifar) or "orig" (cifar).
        conv_clamp: None or 0 (no clamp: the official --fp32), or 256 (official with
            mixed precision).
        mapping_lr_mul: lr multiplier of the mapping FCs (0.01). w_avg_beta: w_avg EMA.
        seed: int, seed of the noise inputs (weights use Keras' global seed).
        num_fp16_res: StyleGAN2-ADA's mixed precision (official presets: 4, with
            conv_clamp 256): G's and D's blocks in the top num_fp16_res resolutions (not
            below 8x8) compute in float16 with float32 variables; the mapping, the styles,
            the image sum and D's 4x4 epilogue stay float32. No loss scaling: the presets
            set train.grad_nan_to_num, as the official training loop cleans gradients.
        d_freeze_layers: Freeze-D (Mo et al. 2020; the official --freezed=N, for transfer
            learning): D's first N layers, in the official order (each block from the top
            resolution: fromrgb, conv0, conv1, skip), are not trained (Keras
            trainable=False: no gradient, no update); the 4x4 epilogue never is.

    Returns:
        (generator [z] or [z, labels int32 [B]] -> [B, R, R, C] float32,
         discriminator [x] or [x, labels] -> [B, 1] float32 logits).

    Example:
        >>> g, d = build(data_shape=(32, 32, 3), latent_dim=32, w_dim=32, fmaps=1 / 64,
        ...              mapping_layers=2)
    """
    data_shape = tuple(data_shape)
    _check(data_shape, d_architecture, mbstd_group, mbstd_chunk, fmaps, channel_max,
           mapping_layers)
    if not errors.is_int(num_fp16_res) or num_fp16_res < 0:
        raise errors.ConfigError(f"stylegan2 num_fp16_res must be an integer >= 0 (the "
                                 f"official presets: 4); Received: num_fp16_res="
                                 f"{num_fp16_res!r}")
    widths = {"fmaps": fmaps, "channel_max": channel_max}
    generator = _generator(
        data_shape, latent_dim, num_classes,
        mapping={"w_dim": w_dim, "num_layers": mapping_layers, "lr_mul": mapping_lr_mul,
                 "w_avg_beta": w_avg_beta},
        synthesis={"w_dim": w_dim, **widths, "conv_clamp": conv_clamp, "seed": seed,
                   "num_fp16_res": num_fp16_res})
    discriminator = _discriminator(
        data_shape, num_classes, widths=widths, d_architecture=d_architecture,
        conv_clamp=conv_clamp, num_fp16_res=num_fp16_res, mbstd_group=mbstd_group,
        mbstd_chunk=mbstd_chunk, mapping_lr_mul=mapping_lr_mul)
    freeze_d(discriminator, d_freeze_layers, data_shape[0], d_architecture)
    return generator, discriminator


def d_layers(resolution, d_architecture):
    """D's block layers in the official numbering (networks.py:DiscriminatorBlock's
    trainable_gen): from the top resolution down, fromrgb (top block), conv0, conv1, skip
    (resnet)."""
    names = []
    for r in (2 ** k for k in range(int(math.log2(resolution)), 2, -1)):
        names += [f"b{r}_fromrgb"] if r == resolution else []
        names += [f"b{r}_conv0", f"b{r}_conv1"]
        names += [f"b{r}_skip"] if d_architecture == "resnet" else []
    return names


def freeze_d(discriminator, n, resolution, d_architecture):
    """Freeze-D: D's first `n` layers (`d_layers`) not trainable; ConfigError for n < 0
    or more layers than D's blocks have."""
    names = d_layers(resolution, d_architecture)
    if not errors.is_int(n) or not 0 <= n <= len(names):
        raise errors.ConfigError(f"stylegan2 d_freeze_layers must be an integer in [0, "
                                 f"{len(names)}] (D's block layers: {', '.join(names)}); "
                                 f"Received: d_freeze_layers={n!r}")
    for name in names[:n]:
        discriminator.get_layer(name).trainable = False
