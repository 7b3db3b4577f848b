"""The frozen TF1 Inception graph of the published FID / IS numbers, run in TF2.

    load(path) -> (function, feature_dim, num_classes)
    function(pixels float32 [N, H, W, 3] in [0, 255]) -> {"features": [N, D], "probs": [N, K]}

The file is classify_image_graph_def.pb from
http://download.tensorflow.org/models/image/imagenet/inception-2015-12-05.tgz, the network of
TTUR's fid.py (bioinf-jku/TTUR, the original FID code) and of improved-gan's
inception_score/model.py (openai/improved-gan, the original IS code). Conventions, as both
use it:
  input    'ExpandDims:0'  float32 [N, H, W, 3], pixel values in [0, 255], any H, W: the
           graph itself resizes to 299x299 (TF1 ResizeBilinear, no half-pixel centers)
           and maps to [-1, 1]. TTUR imports the file under the scope 'FID_Inception_Net'
           and feeds 'FID_Inception_Net/ExpandDims:0': a graph re-exported after that
           import carries the prefix, so both spellings are accepted.
  features 'pool_3:0'      [N, 1, 1, 2048] -> [N, 2048].
  probs    improved-gan's  softmax(pool_3 @ W), W = inputs[1] of 'softmax/logits/MatMul'
           [2048, 1008], NO bias (the graph's own 'softmax:0' is fixed to batch 1): K = 1008.
           Omitted (num_classes None) when the graph has no such MatMul.
TF-GAN's graphs are not accepted: its frozen inceptionv1_for_inception_score.pb takes
already resized [-1, 1] 299x299 images at 'Mul:0' (the resize moved out of the graph, so a
different filter than TTUR's can sneak in), and its current TF-Hub module is a SavedModel.

Running it in TF2: the file is batch-1 (its 'pool_3/_reshape' and 'softmax' hard-code 1;
TTUR patches static shapes to feed batches), and its batch norms are
BatchNormWithGlobalNormalization, an op TF refuses in graphs newer than GraphDef version
9. So the GraphDef is imported inside `tf.compat.v1.wrap_function` with 'ExpandDims:0'
remapped to a [None, None, None, 3] input, each old batch norm rewritten to the same
arithmetic in current ops, node devices cleared (the strategy places replicas), and the
function pruned to the outputs (the JPEG decoder and the batch-1 ops stay out).
"""

import os

import tensorflow as tf

from tf_gan_scale.errors import ConfigError

INPUT = "ExpandDims:0"
POOL = "pool_3:0"
LOGITS_MATMUL = "softmax/logits/MatMul"
PREFIXES = ("", "FID_Inception_Net/")
URL = "http://download.tensorflow.org/models/image/imagenet/inception-2015-12-05.tgz"


def _first_line(error):
    lines = str(error).strip().splitlines()
    return (lines[0] if lines else type(error).__name__)[:300]


def read(path):
    """The GraphDef in `path`; missing or unparsable files raise a one-line ConfigError."""
    if not os.path.isfile(path):
        raise ConfigError(f"fid_inception graph not found: {path} "
                          f"(classify_image_graph_def.pb from {URL})")
    graph_def = tf.compat.v1.GraphDef()
    try:
        with open(path, "rb") as f:
            graph_def.ParseFromString(f.read())
    except Exception as e:  # protobuf DecodeError and friends
        raise ConfigError(f"fid_inception graph {path} is not a GraphDef: "
                          f"{_first_line(e)}") from None
    return graph_def


def _node(name, op, inputs, dtype, **attrs):
    node = tf.compat.v1.NodeDef(name=name, op=op, input=inputs)
    node.attr["dtype" if op == "Const" else "T"].type = dtype
    for key, value in attrs.items():
        node.attr[key].CopyFrom(value)
    return node


def modernize(graph_def):
    """A copy of `graph_def` without node devices and with every
    BatchNormWithGlobalNormalization(t, m, v, beta, gamma) replaced by the ops of its
    kernel (tensorflow/core/kernels/batch_norm_op.h), in the kernel's order:
        (t - m) * (rsqrt(v + eps) * gamma) + beta      (gamma only if scale_after_normalization)
    The last op keeps the node's name, so its consumers are unchanged."""
    out = tf.compat.v1.GraphDef()
    out.versions.CopyFrom(graph_def.versions)
    out.library.CopyFrom(graph_def.library)
    for node in graph_def.node:
        if node.op != "BatchNormWithGlobalNormalization":
            out.node.add().CopyFrom(node)
            out.node[-1].device = ""
            continue
        t, m, v, beta, gamma = node.input[:5]
        control = list(node.input[5:])  # "^name" control inputs stay on the result
        dtype, base = node.attr["T"].type, node.name + "/_modernized_"
        eps = tf.compat.v1.AttrValue(tensor=tf.make_tensor_proto(
            node.attr["variance_epsilon"].f, tf.dtypes.as_dtype(dtype)))
        scale = base + "rsqrt"
        new = [_node(base + "eps", "Const", [], dtype, value=eps),
               _node(base + "var_eps", "AddV2", [v, base + "eps"], dtype),
               _node(scale, "Rsqrt", [base + "var_eps"], dtype)]
        if node.attr["scale_after_normalization"].b:
            new.append(_node(base + "scale", "Mul", [scale, gamma], dtype))
            scale = base + "scale"
        new += [_node(base + "centered", "Sub", [t, m], dtype),
                _node(base + "normalized", "Mul", [base + "centered", scale], dtype),
                _node(node.name, "AddV2", [base + "normalized", beta] + control, dtype)]
        out.node.extend(new)
    return out


def load(path):
    """(function, feature_dim, num_classes) for the graph in `path`; see module docstring.

    function: pixels float32 [N, H, W, 3] in [0, 255] -> {"features": float32 [N, D],
    "probs": float32 [N, K] when num_classes is not None}; a ConcreteFunction of constants
    only, callable eagerly, in tf.function and in replica context.
    """
    graph_def = read(path)
    nodes = {node.name for node in graph_def.node}
    prefix = next((p for p in PREFIXES if {p + INPUT[:-2], p + POOL[:-2]} <= nodes), None)
    if prefix is None:
        raise ConfigError(f"fid_inception graph {path} lacks the tensors {INPUT!r} (float "
                          f"[N, H, W, 3] in [0, 255]) and {POOL!r} (features) of TTUR's "
                          f"classify_image_graph_def.pb (names may carry the prefix "
                          f"'FID_Inception_Net/'); it has {len(nodes)} nodes")
    has_logits = prefix + LOGITS_MATMUL in nodes
    graph_def = modernize(graph_def)

    def run(pixels):
        # input_map swaps ExpandDims:0 for a batch of unknown size: shapes are re-inferred
        # from it, not taken from the batch-1 file.
        returned = tf.graph_util.import_graph_def(
            graph_def, input_map={prefix + INPUT: pixels}, name="",
            return_elements=[prefix + POOL] + ([prefix + LOGITS_MATMUL] if has_logits else []))
        pool, dim = returned[0], returned[0].shape[1:].num_elements()  # None: error below
        out = {"features": tf.reshape(pool, [-1, dim] if dim else [tf.shape(pool)[0], -1])}
        if has_logits:
            out["probs"] = tf.nn.softmax(tf.matmul(out["features"], returned[1].inputs[1]))
        return out

    try:
        wrapped = tf.compat.v1.wrap_function(
            run, [tf.TensorSpec([None, None, None, 3], tf.float32)])
    except Exception as e:
        raise ConfigError(f"fid_inception graph {path} does not run on [N, H, W, 3] "
                          f"images: {_first_line(e)}") from None
    outputs = wrapped.structured_outputs
    if outputs["features"].shape[-1] is None:
        raise ConfigError(f"fid_inception graph {path}: {POOL!r} flattens to "
                          f"{outputs['features'].shape}; its feature size must be static")
    function = wrapped.prune(wrapped.graph.inputs[0], outputs)
    probs = outputs.get("probs")
    return (function, outputs["features"].shape[-1],
            None if probs is None else probs.shape[-1])
