"""Feature extractors for the metrics, chosen by a spec string (`--extractor=`).

    get(spec, data_shape, *, weights=None) -> Extractor
    extractor(images [B, H, W, C] in [-1, 1]) -> {"features": [B, D], "probs": [B, K]}

Spec kinds (KINDS):
  inception_v3            keras.applications.InceptionV3 (ImageNet): 2048-d pool features,
                          1000-way probs; input resized to 299x299 by tf.image.resize
                          bilinear (half-pixel centers, no antialias), grey -> RGB. Not the
                          published-FID network: its numbers differ from papers'.
  fid_inception:PATH.pb   the frozen TF1 Inception graph of TTUR's FID and improved-gan's IS
                          (classify_image_graph_def.pb): numbers comparable with papers'.
                          Conventions and sources: frozen_graph.py.
  PATH.keras              (or keras:PATH.keras) a saved Keras model, e.g. a domain classifier.
  stacked:PATH.keras      a one-channel classifier of K classes run on each of the C channels
                          of [B, H, W, C] images (Stacked MNIST: 3 digits, one per channel):
                          features are the C channels' features side by side [B, C * D];
                          probs are the joint class of the C channels, [B, K^C], class
                          index k_0 * K^(C-1) + ... + k_(C-1) (channel 0 the most
                          significant digit), each channel's probabilities multiplied, so
                          its argmax is the per-channel argmaxes' mode (VEEGAN / PacGAN's
                          protocol: 1,000 modes for 3 channels of 10 digits).

Numbers from different extractors are not comparable: print `extractor.name` beside them.
Extractors do not quantize: issue 9's protocol (uint8 levels before extraction, for real
and generated images alike) is the caller's job.

Call `get` inside the `strategy.scope()` whose replicas will call the extractor, so Keras
weights become mirrored variables (the frozen graph holds constants only). The call is
plain TF ops in inference mode, traceable in tf.function and inside `strategy.run`.
"""

import os
import socket
import urllib.parse
import urllib.request

import keras
import tensorflow as tf

from tf_gan_scale.errors import ConfigError
from tf_gan_scale.metrics import frozen_graph

KINDS = ("inception_v3", "fid_inception:PATH.pb", "PATH.keras", "stacked:PATH.keras")

# keras.applications.inception_v3's own download (include_top=True).
INCEPTION_V3_FILE = "inception_v3_weights_tf_dim_ordering_tf_kernels.h5"
INCEPTION_V3_URL = ("https://storage.googleapis.com/tensorflow/keras-applications/"
                    "inception_v3/" + INCEPTION_V3_FILE)
INCEPTION_V3_MD5 = "9a0d58056eeedaa3f26cb7ebd46da564"
INCEPTION_V3_SIZE = 299
# Set (to anything but "" or "0") to never try a download: tests, air-gapped clusters.
OFFLINE_ENV = "TF_GAN_SCALE_OFFLINE"


class Extractor:
    """Images [B, H, W, C] in [-1, 1] -> {"features": [B, D], "probs": [B, K] if K}.

    Attributes:
        name: printed next to every metric, e.g. "inception_v3",
            "fid_inception:/abs/graph.pb", "keras:/abs/model.keras".
        feature_dim: D.
        num_classes: K when class probabilities are available (Inception Score), else None.
        data_shape: (H, W, C) the extractor accepts.
        weights_path: absolute path of the file the weights came from (None: random init,
            tests only); what a reference-statistics cache should fingerprint.
        model: the Keras model called (features and probs outputs), or None (graph).
    Built by `get`; `fn` maps float32 images to the output dict with TF ops.
    """

    def __init__(self, fn, *, name, feature_dim, num_classes, data_shape, weights_path,
                 model=None):
        self._fn = fn
        self.model = model
        self.name = name
        self.feature_dim = int(feature_dim)
        self.num_classes = None if num_classes is None else int(num_classes)
        self.data_shape = tuple(data_shape)
        self.weights_path = weights_path

    def __call__(self, images):
        """images: float [B, H, W, C] in [-1, 1], C = data_shape[-1].

        Returns {"features": float32 [B, D]} plus "probs": float32 [B, K] when
        num_classes is not None. Shape checks happen at trace time only.
        """
        images = tf.convert_to_tensor(images)
        if images.shape.rank != 4 or not images.shape[1:].is_compatible_with(self.data_shape):
            raise ConfigError(f"extractor {self.name} takes images [B, "
                              f"{', '.join(map(str, self.data_shape))}]; Received: "
                              f"shape={images.shape.as_list()}")
        out = self._fn(tf.cast(images, tf.float32))
        return {k: tf.cast(v, tf.float32) for k, v in out.items()}

    def __repr__(self):
        return f"Extractor({self.name}, D={self.feature_dim}, K={self.num_classes})"


def _first_line(error):
    lines = str(error).strip().splitlines()
    return (lines[0] if lines else type(error).__name__)[:300]


def _to_rgb(images):
    """[B, H, W, 1 or 3] -> [B, H, W, 3]: grey repeated, as the Inception networks need."""
    return tf.repeat(images, 3, axis=-1) if images.shape[-1] == 1 else images


# ---- inception_v3: keras.applications ------------------------------------------------

def _keras_extractor(model, preprocess, **kwargs):
    """An Extractor over a Keras model whose outputs are [features, probs] (num_classes
    given) or features, called in inference mode on `preprocess(images)`."""
    def fn(images):
        outputs = model(preprocess(images), training=False)
        outputs = outputs if isinstance(outputs, (list, tuple)) else [outputs]
        # A head's input may be [B, h, w, c]: features are always [B, D].
        result = {"features": tf.reshape(outputs[0], [-1, kwargs["feature_dim"]])}
        if kwargs["num_classes"] is not None:
            result["probs"] = outputs[1]
        return result
    return Extractor(fn, model=model, **kwargs)


def _inception_v3_extractor(data_shape, weights_path):
    """Builds the extractor from a weights file, or random weights if None (tests only)."""
    # Built in float32 whatever the run's global policy (mixed_float16 training would
    # otherwise give the metric network half-precision features).
    policy = keras.config.dtype_policy()
    keras.config.set_dtype_policy("float32")
    try:
        base = keras.applications.InceptionV3(
            include_top=True, weights=weights_path,
            input_shape=(INCEPTION_V3_SIZE, INCEPTION_V3_SIZE, 3))
    except Exception as e:  # h5py/keras raise many types for a bad file
        raise ConfigError(f"cannot load InceptionV3 weights from {weights_path}: "
                          f"{_first_line(e)}") from None
    finally:
        keras.config.set_dtype_policy(policy)
    # One input tensor, not a list: a list-input model warns when called with a tensor.
    model = keras.Model(base.input, [base.get_layer("avg_pool").output, base.output])

    def preprocess(images):
        # [-1, 1] is already InceptionV3's input range (its preprocess_input: x/127.5 - 1).
        size = [INCEPTION_V3_SIZE, INCEPTION_V3_SIZE]
        return tf.image.resize(_to_rgb(images), size, method="bilinear")

    return _keras_extractor(model, preprocess, name="inception_v3", feature_dim=2048,
                            num_classes=1000, data_shape=data_shape, weights_path=weights_path)


def _keras_home():
    """keras' cache directory, read NOW (keras reads $KERAS_HOME once, at import)."""
    if os.environ.get("KERAS_HOME"):
        return os.environ["KERAS_HOME"]
    home = os.path.expanduser("~")
    return os.path.join(home if os.access(home, os.W_OK) else "/tmp", ".keras")


def _no_network_reason():
    """Why a download cannot work, or None. Checked first, because urllib has no timeout
    and can hang for minutes on a firewalled host."""
    if os.environ.get(OFFLINE_ENV, "") not in ("", "0"):
        return f"{OFFLINE_ENV} is set"
    proxy = urllib.request.getproxies().get("https")
    parts = urllib.parse.urlsplit(proxy if proxy else INCEPTION_V3_URL)
    host, port = parts.hostname, parts.port or (443 if parts.scheme == "https" else 80)
    try:
        socket.create_connection((host, port), timeout=3).close()
        return None
    except OSError as e:
        return f"no network ({host}:{port}: {e})"


def _inception_v3_weights(weights):
    """weights=PATH, else keras' cache file, else one download; else one-line ConfigError."""
    if weights is not None:
        path = os.path.abspath(os.path.expanduser(weights))
        if not os.path.isfile(path):
            raise ConfigError(f"InceptionV3 weights file not found: {weights} "
                              f"(--extractor_weights / weights= takes an .h5 file of "
                              f"keras.applications.InceptionV3(include_top=True))")
        return path
    cache_dir = _keras_home()
    cached = os.path.join(cache_dir, "models", INCEPTION_V3_FILE)
    if os.path.isfile(cached):
        return cached
    reason = _no_network_reason()
    if reason is None:
        timeout = socket.getdefaulttimeout()
        socket.setdefaulttimeout(60)  # a stalled transfer fails instead of hanging
        try:
            return keras.utils.get_file(INCEPTION_V3_FILE, INCEPTION_V3_URL,
                                        cache_subdir="models", cache_dir=cache_dir,
                                        file_hash=INCEPTION_V3_MD5)
        except Exception as e:
            reason = f"download failed: {_first_line(e)}"
        finally:
            socket.setdefaulttimeout(timeout)
    raise ConfigError(f"no InceptionV3 weights: pass --extractor_weights=PATH (weights=PATH) "
                      f"or put {INCEPTION_V3_URL} at {cached} ({reason})")


# ---- fid_inception: the frozen TF1 graph of TTUR / improved-gan (frozen_graph.py) ------

def _graph_def_extractor(path, data_shape):
    """The published-FID network from a local frozen GraphDef: TTUR's conventions, see
    frozen_graph.py (input 'ExpandDims:0' in [0, 255], features 'pool_3:0' [N, 2048],
    improved-gan's probs [N, 1008])."""
    function, feature_dim, num_classes = frozen_graph.load(path)

    def fn(images):
        # [-1, 1] -> the float32 pixel values [0, 255] TTUR feeds (uint8 images as float);
        # the graph resizes to 299x299 itself (TF1 bilinear, no half-pixel centers).
        return function(tf.clip_by_value((_to_rgb(images) + 1.0) * 127.5, 0.0, 255.0))

    return Extractor(fn, name=f"fid_inception:{path}", feature_dim=feature_dim,
                     num_classes=num_classes, data_shape=data_shape, weights_path=path)


# ---- PATH.keras: a user's model -------------------------------------------------------

def _activation(layer):
    """"softmax", "linear", ... for Dense / Activation layers, else None."""
    if isinstance(layer, (keras.layers.Dense, keras.layers.Activation)):
        return getattr(layer.activation, "__name__", None)
    return None


def _is_softmax(layer):
    return isinstance(layer, keras.layers.Softmax) or _activation(layer) == "softmax"


def _producer(tensor):
    """The layer whose output `tensor` (a KerasTensor of a functional graph) is."""
    history = getattr(tensor, "_keras_history", None)
    return history[0] if history else None


def _keras_file_extractor(path, data_shape):
    """A saved Keras model; a trailing softmax head also gives probs.

    Head: the last layer is Dense(activation="softmax"), or a Softmax / Activation
    ("softmax") layer (then together with a linear Dense right before it, if any).
    Features = the head's input, flattened; probs = the model's output. Without a head
    the output is the features. Either way the output must be [N, D or K]. Functional
    and Sequential models only: a subclassed one has no layer graph to check or cut.
    """
    if not os.path.isfile(path):
        raise ConfigError(f"Keras extractor file not found: {path}")
    try:
        model = keras.saving.load_model(path, compile=False)
    except Exception as e:
        raise ConfigError(f"cannot load Keras extractor {path}: {_first_line(e)}") from None
    name = f"keras:{path}"
    try:
        inputs, outputs = model.inputs, model.outputs
    except (AttributeError, ValueError):  # subclassed and never built on a known shape
        inputs = outputs = None
    if not inputs or len(inputs) != 1 or len(outputs) != 1:
        raise ConfigError(f"Keras extractor {path} must have one input and one output "
                          f"(a Functional or Sequential model)")
    model_shape = tuple(inputs[0].shape[1:])
    if len(model_shape) != 3 or any(m is not None and m != d
                                    for m, d in zip(model_shape, data_shape)):
        raise ConfigError(f"Keras extractor {path} takes images {model_shape}, the data "
                          f"has shape {tuple(data_shape)}")
    if len(outputs[0].shape) != 2 or outputs[0].shape[-1] is None:
        raise ConfigError(f"Keras extractor {path} outputs shape {tuple(outputs[0].shape)}; "
                          f"it needs features [N, D] (or a softmax head's probs [N, K])")
    head = model.layers[-1] if model.layers and _is_softmax(model.layers[-1]) else None
    if head is not None and not isinstance(head, keras.layers.Dense):
        before = _producer(head.input)
        if isinstance(before, keras.layers.Dense) and _activation(before) == "linear":
            head = before
    if head is None:
        features_only = keras.Model(inputs[0], outputs[0])  # list-input models warn per call
        return _keras_extractor(features_only, tf.identity, name=name,
                                feature_dim=outputs[0].shape[-1], num_classes=None,
                                data_shape=data_shape, weights_path=path)
    features = head.input
    dim = tf.TensorShape(features.shape[1:]).num_elements()
    if dim is None:
        raise ConfigError(f"Keras extractor {path}: the softmax head's input has shape "
                          f"{tuple(features.shape)}; its feature size must be static")
    two_outputs = keras.Model(inputs[0], [features, outputs[0]])
    return _keras_extractor(two_outputs, tf.identity, name=name, feature_dim=dim,
                            num_classes=outputs[0].shape[-1], data_shape=data_shape,
                            weights_path=path)


def _stacked_extractor(path, data_shape):
    """`stacked:PATH.keras`: the one-channel classifier at PATH on each channel (see KINDS)."""
    channels = data_shape[-1]
    base = _keras_file_extractor(path, data_shape[:-1] + (1,))
    if base.num_classes is None:
        raise ConfigError(f"stacked:{path} needs a classifier (a softmax head) to name each "
                          f"channel's class; this model outputs features only")
    k = base.num_classes

    def fn(images):
        outs = [base(images[..., c:c + 1]) for c in range(channels)]
        joint = outs[0]["probs"]
        for out in outs[1:]:  # [B, K^c] x [B, K] -> [B, K^(c+1)], the new channel last.
            joint = tf.reshape(joint[:, :, None] * out["probs"][:, None, :],
                               [-1, joint.shape[1] * k])
        return {"features": tf.concat([o["features"] for o in outs], axis=1), "probs": joint}

    return Extractor(fn, name=f"stacked:{path}", feature_dim=channels * base.feature_dim,
                     num_classes=k ** channels, data_shape=data_shape,
                     weights_path=base.weights_path, model=base.model)


# ---- lookup ---------------------------------------------------------------------------

def get(spec, data_shape, *, weights=None):
    """The extractor named by `spec`, for images of `data_shape` (H, W, C).

    Call inside the strategy scope that will run it (its Keras variables are mirrored).

    Args:
        spec: "inception_v3", "fid_inception:PATH.pb", "PATH.keras" or "keras:PATH.keras",
            "stacked:PATH.keras".
        data_shape: (H, W, C) of the images the extractor will see (C = 1 or 3 for the
            Inception kinds; the model's input shape for .keras).
        weights: inception_v3 only: an .h5 / .weights.h5 file of
            keras.applications.InceptionV3(include_top=True). Default: keras' cache file
            ($KERAS_HOME or ~/.keras, models/inception_v3_weights_tf_dim_ordering_tf_kernels
            .h5), else one download (skipped when TF_GAN_SCALE_OFFLINE is set or the host is
            unreachable).

    Raises:
        ConfigError: one line naming the bad value (unknown kind, missing or corrupt file,
            shape mismatch, no weights and no network).
    """
    try:
        shape = tuple(int(d) for d in data_shape)
    except (TypeError, ValueError):
        shape = ()
    if len(shape) != 3 or min(shape) < 1:
        raise ConfigError(f"extractor data_shape must be (H, W, C) > 0; "
                          f"Received: data_shape={data_shape!r}")
    data_shape, spec = shape, str(spec)
    if (spec == "inception_v3" or spec.startswith("fid_inception:")) and shape[-1] not in (1, 3):
        raise ConfigError(f"extractor {spec} takes grey or RGB images (1 or 3 channels); "
                          f"Received: data_shape={shape}")
    if spec == "inception_v3":
        return _inception_v3_extractor(data_shape, _inception_v3_weights(weights))
    if weights is not None:
        raise ConfigError(f"--extractor_weights / weights= only applies to inception_v3; "
                          f"Received: extractor={spec!r}, weights={weights!r}")
    if spec.startswith("fid_inception:") and spec != "fid_inception:":
        path = os.path.abspath(os.path.expanduser(spec[len("fid_inception:"):]))
        return _graph_def_extractor(path, data_shape)
    if spec.startswith("stacked:") and spec != "stacked:":
        return _stacked_extractor(os.path.abspath(os.path.expanduser(spec[len("stacked:"):])),
                                  data_shape)
    if (spec.startswith("keras:") and spec != "keras:") or spec.endswith(".keras"):
        path = spec[len("keras:"):] if spec.startswith("keras:") else spec
        return _keras_file_extractor(os.path.abspath(os.path.expanduser(path)), data_shape)
    raise ConfigError(f"unknown extractor {spec!r}; valid: {', '.join(KINDS)} "
                      f"(or keras:PATH.keras)")
