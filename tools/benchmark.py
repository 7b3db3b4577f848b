"""Training speed of a config under a strategy, against a plain Keras `train_step` GAN.

    python tools/benchmark.py --config=experiments/dcgan_mnist.py --synthetic=28,28,1 \
        --strategy=one_device
    python tools/benchmark.py --config=experiments/dcgan_mnist.py --synthetic=28,28,1 \
        --strategy=mirrored --num_cpu_devices=2 --baseline=false

Prints one JSON line: images/sec (real images consumed per second, global) and seconds
per generator step, timed over --steps steps after --warmup steps, with data from the
config's source (or random images of a given shape with --synthetic=H,W,C, e.g. for a
TFDS dataset that is not on this machine: the compute is the same). With --baseline, the same networks are also
trained by `PlainGAN` below -- the GAN `train_step` users write by hand after the Keras
DCGAN example (keras.io/examples/generative/dcgan_overriding_train_step) -- on one
device, with the same data, optimizers and fit loop, and the ratio is reported.

Multi-worker: `--num_workers=N` starts N local workers (tf_gan_scale.launch, as
tools/launch_local.py does) that run this benchmark under multi_worker_mirrored at the
same global batch; the chief's JSON line is printed with "workers": N.

    python tools/benchmark.py --config=experiments/dcgan_mnist.py --synthetic=28,28,1 \
        --num_workers=2 --baseline=false [--config.model.sync_bn=false]

Input pipeline: `--input_only` times the config's input pipeline alone (data.load ->
data.make_dataset at the global batch -> data.distribute under --strategy, pulled with
`next(iterator)` d_steps x steps_per_execution times per tf.function call, as the train
step pulls it; perf.time_input_pipeline) and the train step of the same config and
strategy, interleaved, and reports the pipeline's batches/sec, the train step's steps/sec
and batches/sec (d_steps batches per step) and their ratio, "input_headroom": how many
times faster the pipeline produces batches than the train step consumes them.

    python tools/benchmark.py --config=experiments/digits.py --input_only --strategy=one_device

Model / hybrid parallelism: `--mesh=batch:B,model:M` (repeatable) also times training on
each DTensor mesh (parallel.step.MeshTrainer, as `main --mesh` trains), interleaved with
the --strategy run, and reports per mesh images/sec, the ratio to the --strategy run and
the parameters each device holds (split weights count 1/M), and the bytes one device
communicates per GAN step by kind of collective, from the cost model
(cost_model.mesh_step_bytes: "messages", the tensors' bytes; "sent", what a ring sends).
A model with a wide first G layer, on one device against 2x1 and 1x2 meshes of 2 logical
CPUs:

    python tools/benchmark.py --config=experiments/dcgan_mnist.py --synthetic=28,28,1 \
        --config.model.g_channels='(1024,128,64)' --num_cpu_devices=2 --baseline=false \
        --mesh=batch:2,model:1 --mesh=batch:1,model:2

Pipeline placement: `--placement=g:0,d:1` also times the same GAN with G and D on two
devices of this process (parallel/placement.py, as `main --placement` trains; no
strategy), interleaved with the --strategy run; give both the same micro-batches
(--config.train.accumulation_steps):

    python tools/benchmark.py --config=experiments/dcgan_mnist.py --synthetic=28,28,1 \
        --num_cpu_devices=2 --baseline=false --placement=g:0,d:1 \
        --config.train.accumulation_steps=4

Evaluation: `--eval_extractor=SPEC` times scoring instead (scoring.fake_features: the
config's generator, untrained, and the extractor over --eval_samples generated examples,
FID statistics streamed, features kept with --eval_keep for KID/PR), after a warm-up pass,
and reports images/sec and the process's peak resident memory.

    python tools/benchmark.py --config=experiments/digits.py \
        --eval_extractor=/tmp/digits_classifier.keras --eval_samples=50000
"""

import io
import json
import os
import sys
import time

import numpy as np

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
flags.DEFINE_string("eval_extractor", None, "Time scoring with this extractor instead.")
flags.DEFINE_integer("eval_samples", 50000, "Generated examples scored (--eval_extractor).")
flags.DEFINE_integer("eval_batch_size", 512, "Global evaluation batch (--eval_extractor).")
flags.DEFINE_boolean("eval_keep", False, "Also gather the features (KID, PR).")
flags.DEFINE_multi_string("mesh", None, "batch:B,model:M: also time training on this "
                          "DTensor mesh (repeatable), interleaved with --strategy's run.")
flags.DEFINE_string("placement", None, "g:I,d:J: also time training with G on device I and "
                    "D on device J of this process, interleaved with --strategy's run.")
FLAGS = flags.FLAGS


def plain_gan_class():
    import keras
    import tensorflow as tf

    class PlainGAN(keras.Model):
        """The hand-written Keras GAN: BCE losses, one D step on concat(real, fake), then
        one G step, `tf.random.normal` latents; one device, no strategy logic."""

        def __init__(self, generator, discriminator, latent_dim):
            super().__init__()
            self.generator, self.discriminator = generator, discriminator
            self.latent_dim = latent_dim
            self.built = True

        def compile(self, g_optimizer, d_optimizer):
            super().compile()
            self.g_optimizer, self.d_optimizer = g_optimizer, d_optimizer
            self.bce = keras.losses.BinaryCrossentropy(from_logits=True)

        def train_step(self, batch):
            real = batch["x"]
            b = tf.shape(real)[0]
            fake = self.generator(tf.random.normal([b, self.latent_dim]), training=True)
            labels = tf.concat([tf.ones([b, 1]), tf.zeros([b, 1])], 0)
            with tf.GradientTape() as tape:
                logits = self.discriminator(tf.concat([real, fake], 0), training=True)
                d_loss = self.bce(labels, logits)
            grads = tape.gradient(d_loss, self.discriminator.trainable_weights)
            self.d_optimizer.apply_gradients(zip(grads, self.discriminator.trainable_weights))
            with tf.GradientTape() as tape:
                fake = self.generator(tf.random.normal([b, self.latent_dim]), training=True)
                g_loss = self.bce(tf.ones([b, 1]), self.discriminator(fake, training=True))
            grads = tape.gradient(g_loss, self.generator.trainable_weights)
            self.g_optimizer.apply_gradients(zip(grads, self.generator.trainable_weights))
            return {"d_loss": d_loss, "g_loss": g_loss}

    return PlainGAN


def time_fit(model, dataset, steps, warmup):
    """Seconds per step of model.fit over `steps` steps after `warmup` steps (each call
    continues training the same model)."""
    import keras
    stamps = []

    class Clock(keras.callbacks.Callback):
        def on_train_batch_end(self, batch, logs=None):
            float(logs["d_loss"])  # Wait for the step to finish.
            stamps.append(time.perf_counter())

    model.fit(dataset, epochs=1, steps_per_epoch=warmup + steps, callbacks=[Clock()],
              verbose=0, shuffle=False)
    return (stamps[-1] - stamps[warmup - 1]) / steps


class MeshRun:
    """Training on a DTensor mesh, timed like `time_fit`: the GAN of `config` built
    afresh (same seed: same initial weights as the --strategy run), split by the layout
    policy, stepped by MeshTrainer with host batches moved onto the mesh, as `main --mesh`
    runs it."""

    def __init__(self, config, source, dataset, spec, costs=None):
        """costs: cost_model.network_costs of the GAN if another MeshRun has them
        (profiling FLOPs is the slow part; the GAN is the same for every mesh)."""
        from tf_gan_scale import training
        from tf_gan_scale.distribute import cost_model
        from tf_gan_scale.cluster import mesh_spec
        from tf_gan_scale.parallel import layouts, mesh as mesh_lib, step as step_lib
        from tf_gan_scale.parallel import tensors
        from tf_gan_scale.training import mesh_runner
        mesh_runner.check_config(config)
        self.dims = mesh_spec.parse(spec)
        mesh = mesh_lib.make(self.dims)
        gan = training.build_gan(config, source.shape, source.num_classes)
        nets = (gan.generator, gan.discriminator)
        overrides = tuple(tuple(o) for o in config.parallel.layouts)
        plan = layouts.plan(nets, self.dims, overrides)
        # What one device communicates per GAN step, from the cost model (on the plain
        # models, before MeshTrainer moves them): bytes of the tensors of each kind of
        # collective and bytes the device sends in ring collectives (cost_model).
        self.costs = costs or cost_model.network_costs(*nets, source.shape,
                                                       config.model.latent_dim)
        costs = cost_model.mesh_network_costs(*nets, source.shape, config.model.latent_dim,
                                              self.dims, overrides, costs=self.costs)
        per_device = config.train.global_batch_size // self.dims["batch"]
        self.bytes = {kind: {k: int(v) for k, v in sizes.items()} for kind, sizes in
                      cost_model.mesh_step_bytes(costs, self.dims, per_device,
                                                 config.train.d_steps).items()}
        self.trainer = step_lib.MeshTrainer(gan, mesh, plan)
        self.batches = iter(dataset)
        self.d_steps = config.train.d_steps
        # Parameters on the first device: what a mesh saves in weight memory.
        self.params = {net.name: sum(int(np.prod(tensors.local_shapes(w)[0]))
                                     for w in net.weights) for net in nets}
        self.split = sum(any(s) for s in plan.values())

    def time(self, steps, warmup):
        stamps = []
        for _ in range(warmup + steps):
            feed = [self.trainer.batch(b["x"], b["label"])
                    for b in (next(self.batches) for _ in range(self.d_steps))]
            self.trainer.train_step(feed)  # Returns the losses as floats: synchronous.
            stamps.append(time.perf_counter())
        return (stamps[-1] - stamps[warmup - 1]) / steps


def run_workers(num_workers):
    """Runs this benchmark as `num_workers` local workers; prints the chief's JSON line."""
    from tf_gan_scale.cluster import launch
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


def time_evaluation(config, strategy):
    """Prints {"eval_images_per_sec", "seconds", "peak_rss_mb", ...} for scoring."""
    import resource
    from tf_gan_scale import data, training
    from tf_gan_scale.metrics import scoring
    from tf_gan_scale.metrics import extractors
    source = data.load(config.data.source, tfds_data_dir=FLAGS.tfds_data_dir)
    shape = source.shape
    with strategy.scope():
        model = training.build_gan(config, shape, source.num_classes)
        extractor = extractors.get(FLAGS.eval_extractor, shape)

    def score(n):
        stats, _ = scoring.fake_features(
            model.sampler, model.latent_dim, extractor, strategy, num_samples=n, seed=0,
            batch_size=FLAGS.eval_batch_size, keep=FLAGS.eval_keep,
            num_classes=model.num_classes)
        return stats.result()

    score(2 * FLAGS.eval_batch_size)  # Tracing, first allocations.
    start = time.perf_counter()
    score(FLAGS.eval_samples)
    seconds = time.perf_counter() - start
    result = {"config": os.path.basename(config_flags.get_config_filename(FLAGS["config"])),
              "strategy": FLAGS.strategy, "replicas": strategy.num_replicas_in_sync,
              "extractor": extractor.name, "eval_samples": FLAGS.eval_samples,
              "keep_features": FLAGS.eval_keep, "seconds": round(seconds, 2),
              "eval_images_per_sec": round(FLAGS.eval_samples / seconds, 1),
              # ru_maxrss is in KiB on Linux: the whole process (TensorFlow included).
              "peak_rss_mb": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024)}
    if distribute.is_chief(strategy):
        print(json.dumps(result), flush=True)


def time_input(config, strategy, source, dataset, model):
    """Prints the pipeline's batches/sec against the train step's (--input_only)."""
    from tf_gan_scale import data
    t = config.train
    per_call = t.d_steps * model.steps_per_execution
    train_data = data.distribute(dataset, strategy)
    step_times, pipeline = [], []
    for _ in range(FLAGS.repeats):  # Interleaved, as with the baseline.
        step_times.append(time_fit(model, train_data, FLAGS.steps, FLAGS.warmup))
        iterator = iter(data.distribute(dataset, strategy))
        pipeline.append(perf.time_input_pipeline(
            iterator, strategy, batches_per_call=per_call, warmup_calls=FLAGS.warmup,
            min_calls=FLAGS.steps, min_seconds=FLAGS.input_seconds))
        del iterator
    step_time = min(step_times)
    pipe = max(pipeline, key=lambda p: p["batches_per_sec"])
    step_rate = 1.0 / step_time
    train_batches = step_rate * t.d_steps
    result = {
        "config": os.path.basename(config_flags.get_config_filename(FLAGS["config"])),
        "source": source.name, "strategy": FLAGS.strategy,
        "replicas": strategy.num_replicas_in_sync, "global_batch": t.global_batch_size,
        "d_steps": t.d_steps, "steps_per_execution": model.steps_per_execution,
        "batches_per_call": per_call,
        "pipeline_batches_per_sec": round(pipe["batches_per_sec"], 2),
        "pipeline_images_per_sec": round(pipe["batches_per_sec"] * t.global_batch_size, 1),
        "pipeline_timed_batches": pipe["batches"],
        "train_steps_per_sec": round(step_rate, 3),
        "train_batches_per_sec": round(train_batches, 3),
        "step_time_s": round(step_time, 5),
        # Batches produced per batch consumed (= pipeline / train steps per sec when
        # d_steps is 1). >= 1: the pipeline keeps up; the issue asks for >= 10.
        "input_headroom": round(pipe["batches_per_sec"] / train_batches, 2),
        "all_step_times_s": [round(s, 4) for s in step_times],
        "all_pipeline_batches_per_sec": [round(p["batches_per_sec"], 2) for p in pipeline],
    }
    if distribute.is_chief(strategy):
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
    import keras
    from tf_gan_scale import architectures, data, precision, training

    training.validate(config, strategy.num_replicas_in_sync)
    if FLAGS.eval_extractor:
        return time_evaluation(config, strategy)
    gb = config.train.global_batch_size
    if FLAGS.synthetic:
        try:
            shape = tuple(int(v) for v in FLAGS.synthetic)
        except ValueError:
            raise errors.ConfigError(f"--synthetic must be H,W,C; Received: {FLAGS.synthetic}")
        rng = np.random.default_rng(0)
        pixels = rng.integers(0, 256, (4 * gb,) + shape, dtype=np.uint8)
        # 10 random classes, so conditional configs run too.
        source = data.from_arrays(f"synthetic{shape}", pixels, rng.integers(0, 10, 4 * gb))
    else:
        source = data.load(config.data.source, tfds_data_dir=FLAGS.tfds_data_dir)
    dataset = data.make_dataset(source, global_batch_size=gb, seed=config.seed)
    with strategy.scope():
        model = training.build_gan(config, source.shape, source.num_classes)
    runs = {"tf_gan_scale": (model, data.distribute(dataset, strategy))}
    if FLAGS.input_only:
        return time_input(config, strategy, source, dataset, model)
    if FLAGS.baseline and model.num_classes:
        raise errors.ConfigError("--baseline (a plain unconditional Keras GAN) does not "
                                 "apply to a conditional config; use --baseline=false")
    if FLAGS.baseline:
        keras.utils.set_random_seed(config.seed)
        # The same networks in the same precision (the plain GAN's own Keras way).
        with precision.policy(config.train.precision):
            g, d = architectures.build(config.model.name, data_shape=source.shape,
                                       latent_dim=config.model.latent_dim,
                                       **training.model_options(config))
        plain = plain_gan_class()(g, d, config.model.latent_dim)
        plain.compile(training.make_optimizer(config.train.g_optimizer),
                      training.make_optimizer(config.train.d_optimizer))
        runs["baseline"] = (plain, dataset)
    if FLAGS.placement:  # Built outside the strategy: a placement runs under none.
        runs["placement"] = (training.build_gan(config, source.shape, source.num_classes,
                                                 FLAGS.placement), dataset)
    meshes, costs = {}, None
    for spec in FLAGS.mesh or ():
        meshes[spec] = MeshRun(config, source, dataset, spec, costs)
        costs = meshes[spec].costs
    # Interleaved, so a slow phase of the machine hits both alike.
    times = {name: [] for name in runs}
    for _ in range(FLAGS.repeats):
        for name, (m, ds) in runs.items():
            times[name].append(time_fit(m, ds, FLAGS.steps, FLAGS.warmup))
        for spec, mesh_runner in meshes.items():
            times.setdefault(spec, []).append(mesh_runner.time(FLAGS.steps, FLAGS.warmup))
    step_time = min(times["tf_gan_scale"])
    result = {
        "config": os.path.basename(config_flags.get_config_filename(FLAGS["config"])),
        "strategy": FLAGS.strategy,
        "replicas": strategy.num_replicas_in_sync, "global_batch": gb,
        "sync_bn": bool(config.model.get("sync_bn", False)),
        "d_steps": config.train.d_steps, "steps": FLAGS.steps, "repeats": FLAGS.repeats,
        "precision": config.train.precision, "xla": bool(model.xla),
        "accumulation_steps": config.train.accumulation_steps,
        "step_time_s": round(step_time, 5),
        "images_per_sec": round(gb * config.train.d_steps / step_time, 1),
        "all_step_times_s": [round(t, 4) for t in times["tf_gan_scale"]],
    }
    if FLAGS.baseline:
        base_time = min(times["baseline"])
        result["baseline_plain_keras"] = {
            "step_time_s": round(base_time, 5), "images_per_sec": round(gb / base_time, 1),
            "all_step_times_s": [round(t, 4) for t in times["baseline"]]}
        result["speed_vs_baseline"] = round(base_time / step_time, 3)
    if FLAGS.placement:
        placed = min(times["placement"])
        result["placement"] = {
            "spec": FLAGS.placement, "step_time_s": round(placed, 5),
            "images_per_sec": round(gb * config.train.d_steps / placed, 1),
            f"speed_vs_{FLAGS.strategy}": round(step_time / placed, 3),
            "all_step_times_s": [round(t, 4) for t in times["placement"]]}
    if meshes:
        nets = (model.generator, model.discriminator)
        result["params_per_device"] = {n.name: n.count_params() for n in nets}
        result["meshes"] = {}
        for spec, mesh_runner in meshes.items():
            mesh_time = min(times[spec])
            result["meshes"][spec] = {
                "step_time_s": round(mesh_time, 5),
                "images_per_sec": round(gb * config.train.d_steps / mesh_time, 1),
                f"speed_vs_{FLAGS.strategy}": round(step_time / mesh_time, 3),
                "params_per_device": mesh_runner.params, "split_weights": mesh_runner.split,
                "bytes_per_device_step": mesh_runner.bytes,
                "all_step_times_s": [round(t, 4) for t in times[spec]]}
    if distribute.is_chief(strategy):
        print(json.dumps(result), flush=True)


if __name__ == "__main__":
    cli.run(main)
