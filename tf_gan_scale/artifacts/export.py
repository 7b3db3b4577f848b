"""The generator of a training run as a TensorFlow SavedModel for serving (tools/export.py).

    info = export.export_generator("runs/digits", "exported/digits")

The SavedModel has one signature, `serving_default(z: float32 [B, latent_dim]) ->
{"images": float32 [B, *data_shape]}` (NHWC images in [-1, 1], or [B, D] vectors under
the same key), computed in inference mode (batch norm uses its moving statistics, dropout
is off). The graph holds plain TensorFlow ops and variables only, so
`tf.saved_model.load(path)` needs neither Keras custom objects nor tf_gan_scale, and the
TF1 session loader of TF Serving and `saved_model_cli run` loads it too.

Inputs are named: a conditional generator's signature is `serving_default(z, labels:
int32 [B])`; unconditional exports keep `z` alone. The weights are those `tools/sample.py`
uses: the EMA generator's when the run trained one, else the generator's.
"""

import os
import shutil
import tempfile

import tensorflow as tf

from tf_gan_scale import errors
from tf_gan_scale.artifacts import sampling

SIGNATURE = "serving_default"
OUTPUT_KEY = "images"


class _Serving(tf.Module):
    """The generator's variables and the traced inference function, nothing of Keras.

    The Keras model itself is not an attribute: saving it as a child object makes the
    TF1-style loader (TF Serving, `saved_model_cli run`) fail with "Could not find
    variable". Tracking its underlying tf.Variables in a list, as keras.export does,
    loads in both `tf.saved_model.load` and TF Serving.
    """

    def __init__(self, generator, latent_dim, step):
        super().__init__(name="exported_generator")
        self.weights = [v.value for v in generator.variables]  # The tf.Variables.
        # Served alongside the weights, so a client can size its latents.
        self.latent_dim = tf.Variable(latent_dim, dtype=tf.int64, trainable=False,
                                      name="latent_dim")
        self.step = tf.Variable(step, dtype=tf.int64, trainable=False, name="step")

        z_spec = tf.TensorSpec([None, latent_dim], tf.float32, name="z")
        # training=False: batch norm normalizes with its moving statistics (no
        # cross-replica collective is traced) and dropout is the identity.
        if getattr(generator, "num_classes", 0):
            @tf.function(input_signature=[z_spec, tf.TensorSpec([None], tf.int32,
                                                                name="labels")],
                         autograph=False)
            def serve(z, labels):
                images = generator([z, labels], training=False)
                return {OUTPUT_KEY: tf.cast(images, tf.float32)}
        else:
            @tf.function(input_signature=[z_spec], autograph=False)
            def serve(z):
                images = generator(z, training=False)
                return {OUTPUT_KEY: tf.cast(images, tf.float32)}

        self.serve = serve


def _check_output(output):
    """Output must be absent or an empty directory (an export never overwrites)."""
    if os.path.lexists(output):
        if not os.path.isdir(output):
            raise errors.ConfigError(f"--output {output!r} exists and is not a directory")
        if os.listdir(output):
            raise errors.ConfigError(
                f"--output {output!r} exists and is not empty; choose a new directory")


def export_generator(workdir, output):
    """Writes the latest checkpoint's generator of the run in `workdir` as a SavedModel
    in `output` (absent or empty). Returns {"step", "checkpoint", "output", "latent_dim",
    "output_shape"}. Bad input raises ConfigError before anything is written; the model
    is written to a temporary directory beside `output` and renamed at the end, so a
    crash never leaves half an export."""
    _check_output(output)
    # The same loading as tools/sample.py: the export serves what sampling shows.
    generator, latent_dim, step, path = sampling.load_generator(workdir)
    module = _Serving(generator, latent_dim, step)
    concrete = module.serve.get_concrete_function()
    output_shape = concrete.structured_outputs[OUTPUT_KEY].shape.as_list()

    target = os.path.abspath(output)
    parent = os.path.dirname(target)
    os.makedirs(parent, exist_ok=True)
    tmp = tempfile.mkdtemp(prefix=f".{os.path.basename(target)}.tmp-", dir=parent)
    try:
        saved = os.path.join(tmp, "model")
        tf.saved_model.save(module, saved, signatures={SIGNATURE: concrete})
        _check_output(target)  # Still absent or empty (no one wrote there meanwhile).
        if os.path.isdir(target):
            os.rmdir(target)
        os.rename(saved, target)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return {"step": step, "checkpoint": path, "output": os.fspath(output),
            "latent_dim": latent_dim, "output_shape": output_shape}
