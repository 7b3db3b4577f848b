"""Converts between training-run checkpoints and Keras `.keras` files.

    # latest checkpoint of a run -> one .keras file (keras.models.load_model reads it)
    python tools/keras_file.py --workdir=DIR --to_keras=gan.keras
    # a .keras GAN (e.g. trained in a notebook) -> checkpoint of a new run directory
    python tools/keras_file.py --from_keras=gan.keras --config=experiments/digits.py \
        --workdir=DIR
    python -m tf_gan_scale.main --config=experiments/digits.py --workdir=DIR  # resumes

Both networks, both optimizers with their state, and the step move across. --from_keras
needs the config that builds the same networks and optimizers (checked variable by
variable). Nothing is overwritten: --to_keras must not exist, --workdir must hold no
checkpoint. Prints one JSON line: {"step", "checkpoint", "output"|"workdir"}.
"""

import json
import os
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

from absl import flags  # noqa: E402
from ml_collections import config_flags  # noqa: E402

from tf_gan_scale import cli, errors  # noqa: E402

_CONFIG = config_flags.DEFINE_config_file(
    "config", None, "With --from_keras: the config that builds the model.", lock_config=True)
flags.DEFINE_string("workdir", None, "Training run directory (read, or created).")
flags.DEFINE_string("to_keras", None, "Write the run's latest checkpoint to this .keras file.")
flags.DEFINE_string("from_keras", None, "Write this .keras GAN as a checkpoint of --workdir.")
FLAGS = flags.FLAGS


def main(argv):
    del argv
    if not FLAGS.workdir or bool(FLAGS.to_keras) == bool(FLAGS.from_keras):
        raise errors.ConfigError("pass --workdir and exactly one of --to_keras=FILE.keras "
                                 "or --from_keras=FILE.keras (with --config)")
    from tf_gan_scale.artifacts import keras_io
    if FLAGS.to_keras:
        info = keras_io.workdir_to_keras(FLAGS.workdir, FLAGS.to_keras)
    else:
        config = cli.config_value(_CONFIG)
        if config is None:
            raise errors.ConfigError("--from_keras needs --config (the config that builds "
                                     "the model), e.g. --config=experiments/digits.py")
        info = keras_io.keras_to_workdir(FLAGS.from_keras, config, FLAGS.workdir)
    print(json.dumps(info))
    sys.stdout.flush()


if __name__ == "__main__":
    cli.run(main)
