"""Draws the loss and metric curves of a training run into one PNG (no TensorBoard needed).

    python tools/plot.py --workdir=DIR --output=curves.png

Reads the TensorBoard scalars under DIR/logs (losses, gradient norms, learning rates,
throughput) and the evaluation scores of DIR/metrics.jsonl (or DIR/eval.jsonl), one panel
per kind, vs generator step; scores from different extractors are separate series (see
tf_gan_scale/plot.py). Overwrites --output atomically. Prints one JSON line:
{"output": PATH, "steps": [FIRST, LAST], "series": [NAME, ...]}.
Bad input (no workdir, nothing to plot, --output not .png, a corrupt metrics line): one
`error: ...` line on stderr, exit status 2.
"""

import json
import os
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

from absl import flags  # noqa: E402

from tf_gan_scale import cli, errors  # noqa: E402

flags.DEFINE_string("workdir", None, "Training run directory.")
flags.DEFINE_string("output", None, "Output PNG file (overwritten).")
FLAGS = flags.FLAGS


def main(argv):
    del argv
    from tf_gan_scale.artifacts import plot
    if not FLAGS.workdir or not FLAGS.output:
        raise errors.ConfigError("--workdir and --output are required")
    print(json.dumps(plot.curves(FLAGS.workdir, FLAGS.output)))
    sys.stdout.flush()


if __name__ == "__main__":
    cli.run(main)
