"""Training speed of a config under a strategy, against a plain Keras `train_step` GAN;
with flags, of its input pipeline, its scoring, a placement and DTensor meshes. Prints one
JSON line (the library: tf_gan_scale/training/benchmark.py; every field and the measured
figures: docs/performance.md).

    python tools/benchmark.py --config=experiments/dcgan_mnist.py --synthetic=28,28,1 \
        --strategy=mirrored --num_cpu_devices=2 [--baseline=false]
    python tools/benchmark.py --config=experiments/dcgan_mnist.py --synthetic=28,28,1 \
        --num_workers=2 --baseline=false           # N local workers, multi_worker_mirrored
    python tools/benchmark.py --config=experiments/digits.py --input_only \
        --strategy=one_device                      # pipeline batches/sec vs the train step's
    python tools/benchmark.py --config=experiments/dcgan_mnist.py --synthetic=28,28,1 \
        --num_cpu_devices=2 --baseline=false --mesh=batch:2,model:1 --mesh=batch:1,model:2 \
        [--placement=g:0,d:1]                      # DTensor meshes, G and D on two devices
    python tools/benchmark.py --config=experiments/biggan_imagenet128.py \
        --synthetic=128,128,3 --memory_classes=1000 --num_cpu_devices=4 \
        --mesh=batch:1,model:4                     # bytes per device, built not trained
    python tools/benchmark.py --config=experiments/digits.py \
        --eval_extractor=/tmp/digits_classifier.keras --eval_samples=50000   # scoring

Times are over --steps steps after --warmup steps, the compared runs interleaved
--repeats times (the best of each reported). --synthetic=H,W,C trains on random images of
that shape (a TFDS dataset that is not on this machine: the same compute). The baseline is
`PlainGAN`, the GAN `train_step` users write by hand after the Keras DCGAN example, on one
device with the same networks, data, optimizers and fit loop.
"""

import io
import json
import os
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

from tf_gan_scale import perf  # noqa: E402

perf.tune_malloc()  # Before TensorFlow allocates anything; see perf.py.

from absl import flags  # noqa: E402
from ml_collections import config_flags  # noqa: E402

from tf_gan_scale import cli, distribute, errors  # noqa: E402

_CONFIG = config_flags.DEFINE_config_file("config", None, "ml_collections config file.",
                                          lock_config=True)
flags.DEFINE_string("strategy", "one_device", f"One of {', '.join(distribute.STRATEGIES)}.")
flags.DEFINE_integer("num_cpu_devices", None, "Split the CPU into N logical devices.")
flags.DEFINE_integer("num_gpus", None, "Use the first N local GPUs.")
flags.DEFINE_integer("steps", 30, "Timed generator steps.")
flags.DEFINE_integer("warmup", 5, "Untimed steps first (tracing, pipeline fill).")
flags.DEFINE_integer("repeats", 2, "Timed runs per model, interleaved with the baseline's; "
                     "the fastest counts (the least disturbed by the rest of the machine).")
flags.DEFINE_boolean("baseline", True, "Also time the plain Keras train_step GAN.")
flags.DEFINE_list("synthetic", None, "H,W,C: random uint8 images of this shape instead of "
                  "the config's source (same compute; for data not on this machine).")
flags.DEFINE_string("tfds_data_dir", None, "TensorFlow Datasets data directory.")
flags.DEFINE_integer("num_workers", 1, "Local worker processes (multi_worker_mirrored).")
flags.DEFINE_string("collective", "auto", "Multi-worker all-reduce implementation.")
flags.DEFINE_boolean("input_only", False, "Time the input pipeline alone against the train "
                     "step (no baseline); reports input_headroom.")
flags.DEFINE_float("input_seconds", 2.0, "--input_only: time the pipeline for at least this "
                   "long per repeat (and at least --steps calls).")
flags.DEFINE_list("input_resume_positions", [], "--input_only: also time the first batch "
                  "of a resume at these example positions (e.g. 1e5,1e9).")
flags.DEFINE_string("eval_extractor", None, "Time scoring with this extractor instead.")
flags.DEFINE_integer("eval_samples", 50000, "Generated examples scored (--eval_extractor).")
flags.DEFINE_integer("eval_batch_size", 512, "Global evaluation batch (--eval_extractor).")
flags.DEFINE_boolean("eval_keep", False, "Also gather the features (KID, PR).")
flags.DEFINE_multi_string("mesh", None, "batch:B,model:M: also time training on this "
                          "DTensor mesh (repeatable), interleaved with --strategy's run.")
flags.DEFINE_integer("memory_classes", 0, "With --mesh: report the bytes of weights and "
                     "optimizer slots each device holds for data of --synthetic's shape "
                     "and this many classes (0: unconditional), built, not trained.")
flags.DEFINE_string("placement", None, "g:I,d:J: also time training with G on device I and "
                    "D on device J of this process, interleaved with --strategy's run.")
FLAGS = flags.FLAGS


def run_workers(num_workers):
    """Runs this benchmark as `num_workers` local workers; prints the chief's JSON line."""
    from tf_gan_scale.cluster import launch  # No TensorFlow in the launching process.
    argv = [a for a in sys.argv[1:] if not a.startswith(("--num_workers", "--strategy"))]
    cmd = [sys.executable, os.path.abspath(__file__), *argv,
           "--strategy=multi_worker_mirrored", "--baseline=false"]
    out = io.StringIO()
    rc = launch.launch(cmd, num_workers, out=out, grace_s=10)
    lines = [ln.split("] ", 1)[1] for ln in out.getvalue().splitlines()
             if ln.startswith("[worker 0] {")]
    if rc or not lines:
        sys.stderr.write(out.getvalue()[-5000:])
        raise SystemExit(rc or 1)
    result = json.loads(lines[-1])
    result["workers"] = num_workers
    print(json.dumps(result), flush=True)


def main(argv):
    del argv
    if FLAGS.num_workers < 1:
        raise errors.ConfigError(f"--num_workers must be >= 1; Received: {FLAGS.num_workers}")
    if FLAGS.num_workers > 1 and "TF_CONFIG" not in os.environ:
        return run_workers(FLAGS.num_workers)
    config = cli.config_value(_CONFIG)
    if config is None:
        raise errors.ConfigError("--config is required, e.g. --config=experiments/dcgan_mnist.py")
    if min(FLAGS.steps, FLAGS.warmup, FLAGS.repeats) < 1:
        raise errors.ConfigError("--steps, --warmup and --repeats must be >= 1")
    distribute.configure_cpu_devices(FLAGS.num_cpu_devices)
    strategy = distribute.make_strategy(FLAGS.strategy, num_gpus=FLAGS.num_gpus,
                                        collective=FLAGS.collective,
                                        num_cpu_devices=FLAGS.num_cpu_devices)
    # After the strategy: these import Keras models.
    from tf_gan_scale import data, training
    from tf_gan_scale.training import benchmark
    training.validate(config, strategy.num_replicas_in_sync)
    gb = config.train.global_batch_size
    if FLAGS.synthetic and not FLAGS.eval_extractor:
        try:
            shape = tuple(int(v) for v in FLAGS.synthetic)
        except ValueError:
            raise errors.ConfigError(f"--synthetic must be H,W,C; Received: {FLAGS.synthetic}")
        source = benchmark.synthetic_source(shape, gb)
    else:
        source = data.load(config.data.source, tfds_data_dir=FLAGS.tfds_data_dir)
    common = dict(strategy_name=FLAGS.strategy)
    if FLAGS["memory_classes"].present:
        if not (FLAGS.mesh and FLAGS.synthetic):
            raise errors.ConfigError("--memory_classes reports a mesh's memory: it needs "
                                     "--mesh=batch:B,model:M and --synthetic=H,W,C")
        result = {"memory": [benchmark.mesh_memory(config, source.shape,
                                                   FLAGS.memory_classes, spec)
                             for spec in FLAGS.mesh]}
    elif FLAGS.eval_extractor:
        result = benchmark.time_evaluation(
            config, strategy, source, FLAGS.eval_extractor, num_samples=FLAGS.eval_samples,
            batch_size=FLAGS.eval_batch_size, keep=FLAGS.eval_keep, **common)
    elif FLAGS.input_only:
        result = benchmark.time_input(config, strategy, source, steps=FLAGS.steps,
                                      warmup=FLAGS.warmup, repeats=FLAGS.repeats,
                                      min_seconds=FLAGS.input_seconds,
                                      resume_positions=[float(p) for p in
                                                        FLAGS.input_resume_positions],
                                      **common)
    else:
        if FLAGS.baseline and training.num_classes(config, source.num_classes):
            raise errors.ConfigError("--baseline (a plain unconditional Keras GAN) does not "
                                     "apply to a conditional config; use --baseline=false")
        result = benchmark.time_training(
            config, strategy, source, steps=FLAGS.steps, warmup=FLAGS.warmup,
            repeats=FLAGS.repeats, baseline=FLAGS.baseline, placement=FLAGS.placement or "",
            meshes=FLAGS.mesh or (), **common)
    result = {"config": os.path.basename(config_flags.get_config_filename(FLAGS["config"])),
              **result}
    if distribute.is_chief(strategy):
        print(json.dumps(result), flush=True)


if __name__ == "__main__":
    cli.run(main)
