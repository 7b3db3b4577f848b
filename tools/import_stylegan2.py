"""Imports an official StyleGAN2-ADA snapshot as a training run of this package.

    python tools/import_stylegan2.py --pkl=network-snapshot-000200.pkl --workdir=DIR \
        [--preset=paper256] [--data_source=arrayrecord:/data/mine] [--freezed=N]

The snapshot (stylegan2-ada-pytorch's network-snapshot-XXXXXX.pkl: G, D, G_ema, the
augment pipe) is read without PyTorch and without running the code it embeds (the
official loader executes it; tf_gan_scale/interop/torch_pickle.py refuses any global
outside a closed list). The networks' config comes from the snapshot's init kwargs, the
training recipe from --preset (configs.stylegan2), the data from --data_source. DIR (new
or empty) then holds run.json and checkpoints/ckpt-0: G, D, G_ema as the EMA generator,
ADA's p, fresh optimizers. tools/sample.py, evaluate.py, export.py and keras_file.py read
it as any run; `python -m tf_gan_scale.main --config=experiments/recorded.py:DIR
--workdir=DIR` trains on from it with the recorded config (run.json). Prints one JSON line: {"workdir", "step",
"ada_p", "model", "data_shape", "num_classes"}. What the package cannot express (a 'skip'
D, other resample filters, ...) is refused in one line naming it; nothing is written.
"""

import json
import os
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

from absl import flags  # noqa: E402

from tf_gan_scale import cli, configs, errors  # noqa: E402

flags.DEFINE_string("pkl", None, "The official snapshot (network-snapshot-XXXXXX.pkl).")
flags.DEFINE_string("workdir", None, "The run directory to create (absent or empty).")
flags.DEFINE_enum("preset", "paper256", sorted(configs.STYLEGAN2_PRESETS),
                  "The StyleGAN2-ADA training recipe to record (configs.stylegan2).")
flags.DEFINE_string("data_source", None, "The data to train on (default: the preset's).")
flags.DEFINE_integer("freezed", None, "Freeze-D: D's first N layers not trained (the "
                     "official --freezed; default: the snapshot's).")
FLAGS = flags.FLAGS


def main(argv):
    del argv
    from tf_gan_scale.interop import stylegan2
    if not FLAGS.pkl or not FLAGS.workdir:
        raise errors.ConfigError("--pkl and --workdir are required")
    if not os.path.isfile(FLAGS.pkl):
        raise errors.ConfigError(f"--pkl={FLAGS.pkl} is not a file; valid: an official "
                                 f"network-snapshot-XXXXXX.pkl")
    info = stylegan2.import_snapshot(FLAGS.pkl, FLAGS.workdir, FLAGS.preset,
                                     FLAGS.data_source, FLAGS.freezed)
    print(json.dumps(info))
    sys.stdout.flush()


if __name__ == "__main__":
    cli.run(main)
