"""Exports the generator of a training run's latest checkpoint as a TensorFlow SavedModel.

    python tools/export.py --workdir=DIR --output=DIR

Signature `serving_default(z: float32 [B, latent_dim]) -> {"images": float32 [B, ...]}`,
inference mode, plain TF ops: `tf.saved_model.load(DIR)` needs no tf_gan_scale.
--output must not exist or be empty (never overwritten). Prints one JSON line:
{"step": STEP, "checkpoint": PATH, "output": DIR, "latent_dim": N, "output_shape": [...]}.
"""

import json
import os
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

from absl import flags  # noqa: E402

from tf_gan_scale import cli, errors  # noqa: E402

flags.DEFINE_string("workdir", None, "Training run directory.")
flags.DEFINE_string("output", None, "SavedModel directory to create (absent or empty).")
FLAGS = flags.FLAGS


def main(argv):
    del argv
    from tf_gan_scale.artifacts import export
    if not FLAGS.workdir or not FLAGS.output:
        raise errors.ConfigError("--workdir and --output are required")
    info = export.export_generator(FLAGS.workdir, FLAGS.output)
    print(json.dumps(info))
    sys.stdout.flush()


if __name__ == "__main__":
    cli.run(main)
