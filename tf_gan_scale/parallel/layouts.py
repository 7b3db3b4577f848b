"""Which weight is split how: the layout policy, and sharding built Keras models by it.

A layout spec gives, per dimension of a weight, the mesh axis it is split over or None
(written "-" in configs): ("None", "model") for a [in, out] kernel split by output
columns. Specs are chosen by the type of the layer that owns the weight (RULES: extend the
registry for a new layer type), then overridden per weight path by regexes, as Keras'
`LayoutMap` does:

  Dense       kernel [in, out]: column-parallel (None, "model") when M divides out, else
              row-parallel ("model", None) when M divides in, else replicated
  Embedding   embeddings [V, D]: (None, "model") when M divides D
  Conv2D / Conv2DTranspose  kernel split on its output channels when M divides them and
              it holds at least CONV_SPLIT_MIN_PARAMS values, else replicated. A split
              convolution is computed as a sum over its taps (conv.py: DTensor splits a
              Keras convolution only with replicated filters); the others split over
              examples only.
  everything else (biases, normalization, spectral-norm vectors, counters): replicated.
  KEEP_WHOLE: weights replicated by default although their rule could split them (where
              DTensor fails on the split).

Overrides (config `parallel.layouts`): ((regex, "spec"), ...), "spec" like "-,model";
the LAST override whose regex `re.search`es a weight's path wins. An override that
matches no weight, names an unknown axis, has the wrong rank or splits a dimension the
axis size does not divide is a ConfigError naming it and what would fit.
"""

import math
import re

import keras
from tensorflow.experimental import dtensor

from tf_gan_scale import errors
from tf_gan_scale.cluster.mesh_spec import AXES, MODEL
from tf_gan_scale.architectures.stylegan2 import MappingNetwork
from tf_gan_scale.layers.grouped_conv import GroupedConv2D
from tf_gan_scale.layers.stylegan import EqualizedConv2D, EqualizedDense, SynthesisLayer, ToRGB
from tf_gan_scale.parallel import conv, tensors

# Convolution kernels from this many values (4 MB in float32; a 3x3 conv of 384 -> 384
# channels holds 1.3M) are split by default: below it the saved memory is small and the
# tap-sum convolution (kh x kw einsums) and the gather of its output cost more. An
# override splits (or replicates) any convolution whatever its size.
CONV_SPLIT_MIN_PARAMS = 1 << 20


def _dense(layer, weight, model_size):
    if weight is not getattr(layer, "kernel", None) or len(weight.shape) != 2:
        return None
    n_in, n_out = weight.shape
    if n_out % model_size == 0:
        return (None, MODEL)  # Column-parallel: each device computes out / M features.
    if n_in % model_size == 0:
        return (MODEL, None)  # Row-parallel: partial sums over in / M, then one all-reduce.
    return None


def _embedding(layer, weight, model_size):
    if len(weight.shape) != 2 or weight.shape[1] % model_size:
        return None
    return (None, MODEL)  # Each device holds D / M of every class's embedding.


def _conv(layer, weight, model_size):
    axis = conv.out_axis(layer)
    if (weight is not layer.kernel or weight.shape[axis] % model_size or conv.unsupported(layer)
            or math.prod(weight.shape) < CONV_SPLIT_MIN_PARAMS):
        return None
    return tuple(MODEL if a == axis else None for a in range(len(weight.shape)))


def _grouped_conv(layer, weight, model_size):
    # Split in whole groups: each device computes its groups from its channels alone.
    return _conv(layer, weight, model_size) if layer.groups % model_size == 0 else None


# Layer type -> fn(layer, weight, model_size) -> spec or None (replicated). isinstance
# order: the first matching type decides.
RULES = {keras.layers.Dense: _dense, keras.layers.Embedding: _embedding,
         keras.layers.Conv2D: _conv, keras.layers.Conv2DTranspose: _conv,
         EqualizedConv2D: _conv, EqualizedDense: _dense, GroupedConv2D: _grouped_conv}


# Weights the default plan keeps whole although a rule above could split them, because
# DTensor fails on the split (probed on BigGAN's G; an override can still split them, and
# the docs quote the errors): path regexes, applied before the overrides.
# - G's shared class embedding: its output is concatenated with a z chunk (e.g. 128 + 20
#   = 148 or 131 features), and DTensor requires every split dimension to divide: "requires
#   dimension 1 to be divisible by sharding ... size=131".
# - the conditional batch norm's gain / bias Dense layers (one per G block, fed by that
#   concatenation): "output layout of Relayout op after layout propagation does not match
#   layout specified by Relayout op" in G's gradient.
# - StyleGAN2's style affines (w -> one scale per input channel of a modulated conv):
#   split, the toRGB's 1-channel output failed "requires dimension 3 to be divisible by
#   sharding ... size=1" (the styles split the channels its 1x1 convolution sums).
# All are small next to the convolutions (BigGAN-128: 148 x 1536 per cBN Dense;
# StyleGAN2-256: 512 x 512 per affine).
KEEP_WHOLE = (r"^generator/shared/embeddings$",
              r"^generator/.*conditional_batch_normalization[^/]*/",
              r"^generator/synthesis/.*/affine/")


def parse_spec(text, path=None):
    """"-,model" -> (None, "model"); ConfigError for an unknown axis name."""
    spec = []
    for part in str(text).split(","):
        part = part.strip()
        if part in ("-", "", "None"):
            spec.append(None)
        elif part in AXES:
            spec.append(part)
        else:
            where = f" (for {path})" if path else ""
            raise errors.ConfigError(f"layout {text!r}{where}: unknown axis {part!r}; valid "
                                     f"per dimension: -, {', '.join(AXES)}")
    return tuple(spec)


def format_spec(spec):
    return ",".join(axis or "-" for axis in spec)


def _leaf_layers(model):
    """Layers that own weights directly (no sub-layers): a wrapper's inner Dense counts as
    a Dense; the wrapper's own vectors fall back to replicated."""
    for layer in model._flatten_layers(include_self=False, recursive=True):
        if not list(layer._flatten_layers(include_self=False, recursive=False)):
            yield layer


def weight_path(model, weight):
    """The name a plan and its overrides use: "<model>/<weight path>" (Keras paths of
    nested layers, e.g. BigGAN's "spectral_normalization/dense/kernel", lack the model)."""
    path = weight.path
    return path if path.startswith(model.name + "/") else f"{model.name}/{path}"


def plan(models, dims, overrides=()):
    """The layout of every weight of `models` on a mesh of `dims`.

    Args:
        models: built Keras models (e.g. (generator, discriminator)).
        dims: {"batch": B, "model": M} (mesh.parse).
        overrides: ((regex, spec text), ...) per weight path.

    Returns:
        {weight_path: spec tuple (one entry per dimension, an axis name or None)}.
    """
    m = dims[MODEL]
    weights, kernels = {}, {}  # kernels: a convolution's kernel path -> the layer.
    for model in models:
        for w in model.weights:
            path = weight_path(model, w)
            if path in weights:
                raise ValueError(f"two weights named {path}: name the models apart")
            weights[path] = (w, None)
        for layer in _leaf_layers(model):
            rule = next((fn for kind, fn in RULES.items() if isinstance(layer, kind)), None)
            for w in layer.weights:
                spec = rule(layer, w, m) if (rule and m > 1) else None
                weights[weight_path(model, w)] = (w, spec)
            if isinstance(layer, CONSTRAIN_INPUT + (GroupedConv2D, keras.layers.DepthwiseConv2D)):
                kernels[weight_path(model, layer.kernel)] = layer  # Overrides checked.
        for layer in model._flatten_layers(include_self=False, recursive=True):
            if isinstance(layer, SynthesisLayer):  # Not a leaf (it owns its affine).
                path = weight_path(model, layer.kernel)
                weights[path] = (layer.kernel, _conv(layer, layer.kernel, m) if m > 1 else None)
                kernels[path] = layer
    out = {path: spec or (None,) * len(w.shape) for path, (w, spec) in weights.items()}
    for pattern in KEEP_WHOLE:
        for path in out:
            if re.search(pattern, path):
                out[path] = (None,) * len(out[path])
    for pattern, text in overrides:
        hits = [p for p in out if re.search(pattern, p)]
        if not hits:
            raise errors.ConfigError(
                f"layout override {pattern!r} matches no weight; weight paths: "
                f"{', '.join(sorted(out)[:12])}{' ...' if len(out) > 12 else ''}")
        for path in hits:
            spec = parse_spec(text, path)
            _check(path, weights[path][0].shape, spec, dims, kernels.get(path))
            out[path] = spec
    return out


def _splittable(layer):
    """The kernel dimensions of `layer` a layout may split, or None for any: a
    convolution only its output channels, and only where the tap-sum convolution computes
    it (conv.py). Returns (dimensions, why not more)."""
    if layer is None:
        return None, ""
    kind = type(layer).__name__
    if conv.out_axis(layer) is None:
        return (), (f"a {kind} kernel cannot be split (only Conv2D and Conv2DTranspose "
                    f"kernels: DTensor runs other convolutions with replicated filters)")
    why = conv.unsupported(layer)
    if why:
        return (), f"a {kind} with {why} cannot be split"
    return (conv.out_axis(layer),), (f"a {kind} kernel can be split on its output "
                                    f"channels (dimension {conv.out_axis(layer)}) only")


def _check(path, shape, spec, dims, layer=None):
    """ConfigError unless `spec` fits a weight of `shape` (of convolution `layer`, if
    one) on a mesh of `dims`; the message lists the layouts that fit."""
    if len(spec) != len(shape):
        raise errors.ConfigError(
            f"layout {format_spec(spec)!r} for {path} has {len(spec)} dimensions; the "
            f"weight has shape {tuple(shape)} ({len(shape)}: e.g. "
            f"{format_spec((None,) * len(shape))!r})")
    used = [a for a in spec if a]
    if len(used) != len(set(used)):
        raise errors.ConfigError(f"layout {format_spec(spec)!r} for {path} splits two "
                                 f"dimensions over the same axis")
    allowed, rule = _splittable(layer)
    for i, (size, axis) in enumerate(zip(shape, spec)):
        if not axis:
            continue
        fits = [format_spec(tuple(axis if j == k else None for k in range(len(shape))))
                for j, s in enumerate(shape)
                if s % dims[axis] == 0 and (allowed is None or j in allowed)]
        fits = ", ".join(fits + ["replicated"])
        if allowed is not None and i not in allowed:
            raise errors.ConfigError(f"layout {format_spec(spec)!r} for {path}: {rule}; "
                                     f"layouts that fit: {fits}")
        if size % dims[axis]:
            raise errors.ConfigError(
                f"layout {format_spec(spec)!r} for {path}: dimension {i} of size {size} is "
                f"not divisible by {axis}={dims[axis]}; layouts that fit: {fits}")
        if isinstance(layer, GroupedConv2D) and layer.groups % dims[axis]:
            raise errors.ConfigError(
                f"layout {format_spec(spec)!r} for {path}: a GroupedConv2D splits in whole "
                f"groups, and its {layer.groups} groups are not divisible by "
                f"{axis}={dims[axis]}; valid: replicated, or a mesh whose {axis} axis "
                f"divides {layer.groups}")


# Where DTensor's layout propagation goes wrong, activations are constrained back to
# examples-only splitting ([batch, -, ...]), like GSPMD's with_sharding_constraint
# (identity values; a no-op where the layout already is that):
# - outputs of Reshape / Flatten: after a split weight they keep "model" on a spatial or
#   feature axis (a Reshape of a column-parallel Dense's output), and convolutions then
#   fail ("only supports batch parallel layouts");
# - inputs of convolutions: D's input [real; fake] is a concatenation of two batch-split
#   tensors along the split axis, and a convolution on it fails SPMD expansion ("output
#   inconsistent with the provided layout") unless it is relaid out first.
# - outputs of GlobalAveragePooling2D: a row-parallel Dense after it (SNGAN's and BigGAN's
#   D heads) pushes its "model" split back into the 4-D activations ("SPMD expansion
#   resulted in op output inconsistent with the provided layout").
# - inputs of StyleGAN2's convolution layers (EqualizedConv2D; the modulated SynthesisLayer
#   and ToRGB, which own a sub-layer and so are constrained apart): DTensor's Conv2D
#   expansion does not relayout its input, and G's first conv takes the learned 4x4 const
#   TILED to the batch (replicated, not split: "Expected shape: <16,4,4,8> got shape:
#   <8,4,4,8>"), D's epilogue conv the minibatch-std output; unconstrained, the
#   replicated layout also reached D's input and failed its gradient ("output layout of
#   Relayout op after layout propagation does not match layout specified by Relayout op").
CONSTRAIN_OUTPUT = (keras.layers.Reshape, keras.layers.Flatten,
                    keras.layers.GlobalAveragePooling2D)
CONSTRAIN_INPUT = (keras.layers.Conv1D, keras.layers.Conv2D, keras.layers.Conv3D,
                   keras.layers.Conv1DTranspose, keras.layers.Conv2DTranspose,
                   keras.layers.Conv3DTranspose, EqualizedConv2D)
CONSTRAIN_INPUT_COMPOSITE = (SynthesisLayer, ToRGB)  # Not leaves (their affine Dense).
# - the output w of StyleGAN2's mapping network: in the path-length phase (a second
#   backward through the synthesis network, on half of each chunk's rows) layout
#   propagation wanted the mapping's normalize_2nd_moment mean replicated while its input
#   was split over examples ("EmitAllScatter was passed a desired_layout ... which was
#   not more sharded than the original_layout", in tf.Mean).
CONSTRAIN_OUTPUT_COMPOSITE = (MappingNetwork,)


def _constrain(layer, mesh, where):
    call = layer.call

    def constrained(inputs, *args, **kwargs):
        if where == "input":
            return call(tensors.by_example(inputs, mesh), *args, **kwargs)
        return tensors.by_example(call(inputs, *args, **kwargs), mesh)

    layer.call = constrained  # This instance only.


def _split(weight):
    """Whether a (Keras) variable on a mesh is split over any axis."""
    return not dtensor.fetch_layout(weight._value).is_fully_replicated()


def shard(models, mesh, weight_plan):
    """Moves every weight of `models` onto `mesh` with its planned layout, in place.

    Each Keras variable keeps its object, path and trainability; its backing tf.Variable
    becomes a `dtensor.DVariable` (docs/notes/dtensor.md: Keras 3 ignores `layout=` on
    TensorFlow, so the backing variable is swapped). Reshape / Flatten outputs
    and convolution inputs are constrained to split over examples only (CONSTRAIN_OUTPUT,
    CONSTRAIN_INPUT); convolutions with split kernels compute by taps (conv.use_taps);
    average pooling by strided slices (conv.use_slice_pool).
    Optimizers must be built after this.
    """
    for model in models:
        for layer in model._flatten_layers(include_self=False, recursive=True):
            if isinstance(layer, CONSTRAIN_INPUT_COMPOSITE):
                _constrain(layer, mesh, "input")
            if isinstance(layer, CONSTRAIN_OUTPUT_COMPOSITE):
                _constrain(layer, mesh, "output")
        for w in model.weights:
            tensors.place(w, mesh, weight_plan[weight_path(model, w)])
        for layer in _leaf_layers(model):
            if isinstance(layer, CONSTRAIN_OUTPUT):
                _constrain(layer, mesh, "output")
            elif isinstance(layer, tuple(conv.OUT_AXIS)) and _split(layer.kernel):
                conv.use_taps(layer, lambda x: tensors.by_example(x, mesh))
            elif isinstance(layer, CONSTRAIN_INPUT):
                _constrain(layer, mesh, "input")
            elif isinstance(layer, keras.layers.AveragePooling2D):
                conv.use_slice_pool(layer)  # MeshTrainer refused the ones it cannot.
            elif isinstance(layer, keras.layers.DepthwiseConv2D):
                conv.use_depthwise_taps(layer)  # Likewise.
        for layer in model._flatten_layers(include_self=False, recursive=True):
            if isinstance(layer, SynthesisLayer) and _split(layer.kernel):
                conv.use_taps(layer)  # Its input is constrained above.


