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
        [--placement=g:0,d:1 | --placement=stages:2]  # meshes, a placement or pipeline
                                                   # (per-device busy time from a profile)
    python tools/benchmark.py --config=experiments/biggan_imagenet128.py \
        --synthetic=128,128,3 --memory_classes=1000 --num_cpu_devices=4 \
        --mesh=batch:1,model:4                     # bytes per device, built not trained
    python tools/benchmark.py --config=experiments/digits.py --num_cpu_devices=2 \
        --mesh=batch:1,model:2 --mesh_combining    # DTensor's combining pass off vs on
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
flags.DEFINE_boolean("mesh_combining", False, "With one --mesh: time it with DTensor's "
                     "all-reduce combining pass off (the framework's setting) and on, each "
                     "in its own process (TensorFlow reads the switch once), alternating "
                     "--repeats times, and count each step's collectives.")
flags.DEFINE_string("placement", None, "g:I,d:J (G on device I, D on device J) or "
                    "stages:K[,recompute:1] (pipeline stages): also time training so, "
                    "interleaved with --strategy's run, and profile each device's busy "
                    "time (the pipeline's bubble).")
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


COLLECTIVE_OPS = ("CollectiveReduceV2", "CollectiveGatherV2", "CollectiveAllToAllV2",
                  "CollectiveReduceScatterV2")


def count_collectives(dump_dir):
    """{op: count} of the collectives in the last DTensor MLIR dump of the mesh step
    (`_step`): what each device runs per step after every DTensor pass."""
    import re
    names = sorted(n for n in os.listdir(dump_dir) if "__inference__step_" in n)
    if not names:
        raise RuntimeError(f"no DTensor dump of the mesh step in {dump_dir}")
    text = open(os.path.join(dump_dir, names[-1])).read()
    return {op: len(re.findall(rf'"tf\.{op}"', text)) for op in COLLECTIVE_OPS}


def compare_combining():
    """--mesh_combining: the mesh run with the combining pass off and on, each in a child
    process, alternating --repeats times (a slow phase of the machine hits both alike);
    the first of each dumps its MLIR for the collective count. Prints one JSON line."""
    import subprocess
    import tempfile
    from tf_gan_scale import parallel  # No TensorFlow: the package sets an env variable.
    if len(FLAGS.mesh or ()) != 1:
        raise errors.ConfigError(f"--mesh_combining compares one mesh; Received: "
                                 f"--mesh={FLAGS.mesh}")
    argv = [a for a in sys.argv[1:] if not a.startswith(("--mesh_combining", "--repeats",
                                                         "--baseline"))]
    cmd = [sys.executable, os.path.abspath(__file__), *argv, "--repeats=1",
           "--baseline=false"]
    result = {setting: {"step_time_s": []} for setting in ("off", "on")}
    with tempfile.TemporaryDirectory() as tmp:
        for r in range(FLAGS.repeats):
            for setting in ("off", "on"):
                env = dict(os.environ, **{parallel.COMBINE_OPT_IN: "1" if setting == "on"
                                          else "0"})
                dump = os.path.join(tmp, setting)
                if r == 0:  # MLIR dumps (DTensor's passes log them at VLOG 4).
                    env.update(TF_DUMP_GRAPH_PREFIX=dump, TF_CPP_MIN_LOG_LEVEL="0",
                               TF_CPP_VMODULE="dtensor_mlir_passes=4,dump_mlir_util=4")
                proc = subprocess.run(cmd, env=env, capture_output=True, text=True)
                if proc.returncode:
                    sys.stderr.write(proc.stderr[-5000:])
                    raise SystemExit(proc.returncode)
                run = json.loads(proc.stdout.strip().splitlines()[-1])
                mesh = run["meshes"][FLAGS.mesh[0]]
                result[setting]["step_time_s"].append(mesh["step_time_s"])
                if r == 0:
                    result[setting]["collectives_per_step"] = count_collectives(dump)
    for setting in result.values():
        setting["best_step_time_s"] = min(setting["step_time_s"])
    result["off_vs_on_time"] = round(result["off"]["best_step_time_s"]
                                     / result["on"]["best_step_time_s"], 3)
    print(json.dumps({"mesh": FLAGS.mesh[0], "combining": result}), flush=True)


def main(argv):
    del argv
    if FLAGS.mesh_combining:
        return compare_combining()
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
