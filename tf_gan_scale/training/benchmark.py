"""Timing training, the input pipeline and scoring: what tools/benchmark.py measures.

Every time is wall-clock over `steps` steps after `warmup` untimed ones (tracing, pipeline
fill); runs that are compared (a strategy, a plain Keras baseline, a placement, meshes)
are interleaved `repeats` times, so a slow phase of a shared machine hits all alike, and
the best of each is reported. Over the house's 450 lines: the step, mesh, input and
scoring timers share this interleaving and reporting; issue 53 lists its split.
"""

import dataclasses
import glob
import os
import resource
import tempfile
import time

import keras
import numpy as np
import tensorflow as tf
from tensorflow.tsl.profiler.protobuf import xplane_pb2

from tf_gan_scale import architectures, data, perf, precision
from tf_gan_scale.cluster import mesh_spec
from tf_gan_scale.distribute import cost_model
from tf_gan_scale.metrics import extractors, scoring
from tf_gan_scale.parallel import layouts
from tf_gan_scale.parallel import mesh as mesh_lib
from tf_gan_scale.parallel import step as step_lib
from tf_gan_scale.parallel import tensors
from tf_gan_scale.training import build, mesh_runner


class PlainGAN(keras.Model):
    """The hand-written Keras GAN of the Keras DCGAN example
    (keras.io/examples/generative/dcgan_overriding_train_step): BCE losses, one D step on
    concat(real, fake), then one G step, `tf.random.normal` latents; one device, no
    strategy logic. The baseline the framework's step is timed against."""

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


def plain_gan(config, source):
    """PlainGAN with the config's networks (same seed, same precision) and optimizers."""
    keras.utils.set_random_seed(config.seed)
    with precision.policy(config.train.precision):
        g, d = architectures.build(config.model.name, data_shape=source.shape,
                                   latent_dim=config.model.latent_dim,
                                   **build.model_options(config))
    plain = PlainGAN(g, d, config.model.latent_dim)
    plain.compile(build.make_optimizer(config.train.g_optimizer),
                  build.make_optimizer(config.train.d_optimizer))
    return plain


def synthetic_source(shape, global_batch):
    """4 global batches of random uint8 images of `shape` and 10 random classes (so
    conditional configs run too): the compute of a dataset that is not on this machine."""
    rng = np.random.default_rng(0)
    pixels = rng.integers(0, 256, (4 * global_batch,) + tuple(shape), dtype=np.uint8)
    return data.from_arrays(f"synthetic{tuple(shape)}", pixels,
                            rng.integers(0, 10, 4 * global_batch))


def time_fit(model, dataset, steps, warmup):
    """Seconds per step of model.fit over `steps` steps after `warmup` steps (each call
    continues training the same model)."""
    stamps = []

    class Clock(keras.callbacks.Callback):
        def on_train_batch_end(self, batch, logs=None):
            float(logs["d_loss"])  # Wait for the step to finish.
            stamps.append(time.perf_counter())

    model.fit(dataset, epochs=1, steps_per_epoch=warmup + steps, callbacks=[Clock()],
              verbose=0, shuffle=False)
    return (stamps[-1] - stamps[warmup - 1]) / steps


class MeshGan:
    """The GAN of `config` (data of `shape`, `num_classes` classes) as `main --mesh`
    prepares it for mesh `spec` ("batch:B,model:M"): config checked, `dims`, the GAN
    built (plain weights, the run's seed), `nets` (G, D), the layout `overrides`, `plan`
    {weight path: spec} and how many weights it splits; `place` moves it onto the mesh.
    The one set-up of MeshRun and mesh_memory, so both measure the same placement."""

    def __init__(self, config, shape, num_classes, spec):
        mesh_runner.check_config(config)
        self.dims = mesh_spec.parse(spec)
        self.gan = build.build_gan(config, shape, num_classes)
        self.nets = (self.gan.generator, self.gan.discriminator)
        self.overrides = tuple(tuple(o) for o in config.parallel.layouts)
        self.plan = layouts.plan(self.nets, self.dims, self.overrides)
        self.split_weights = sum(any(s) for s in self.plan.values())

    def place(self):
        """A MeshTrainer of the GAN on a mesh of `dims`: weights by the plan, optimizer
        slots like their weights, the step's state replicated. Traces nothing."""
        return step_lib.MeshTrainer(self.gan, mesh_lib.make(self.dims), self.plan)


def _per_device(variables, unit="bytes"):
    """[bytes (unit "params": elements) device 0 holds, device 1, ...] of DTensor-backed
    Keras variables, from their pieces' shapes (`tensors.local_shapes`)."""
    pieces = [[int(np.prod(s)) * (np.dtype(v.dtype).itemsize if unit == "bytes" else 1)
               for s in tensors.local_shapes(v)] for v in variables]
    return [sum(device) for device in zip(*pieces)]


class MeshRun:
    """Training on a DTensor mesh, timed like `time_fit`: the GAN of `config` built
    afresh (same seed: same initial weights as the strategy run), split by the layout
    policy, stepped by MeshTrainer with host batches moved onto the mesh, as `main --mesh`
    runs it (MeshGan).

    Args:
        costs: cost_model.network_costs of the GAN if another MeshRun has them (profiling
            FLOPs is the slow part; the GAN is the same for every mesh).
    """

    def __init__(self, config, source, input_fn, spec, costs=None):
        mesh_gan = MeshGan(config, source.shape, source.num_classes, spec)
        self.dims, nets = mesh_gan.dims, mesh_gan.nets
        # What one device communicates per GAN step, from the cost model (on the plain
        # models, before MeshTrainer moves them): bytes of the tensors of each kind of
        # collective and bytes the device sends in ring collectives (cost_model).
        self.costs = costs or cost_model.network_costs(*nets, source.shape,
                                                       config.model.latent_dim)
        costs = cost_model.mesh_network_costs(*nets, source.shape, config.model.latent_dim,
                                              self.dims, mesh_gan.overrides,
                                              costs=self.costs)
        rows_per_shard = config.train.global_batch_size // self.dims["batch"]
        self.bytes = {kind: {k: int(v) for k, v in sizes.items()} for kind, sizes in
                      cost_model.mesh_step_bytes(costs, self.dims, rows_per_shard,
                                                 config.train.d_steps).items()}
        self.trainer = mesh_gan.place()
        self.batches = self.trainer.batches(input_fn)
        # Batches per GAN step: one per D update, then G's own with a paired loss.
        self.batches_per_step = self.trainer.gan.step_config.batches_per_step
        # Parameters on the first device: what a mesh saves in weight memory.
        self.params = {net.name: _per_device(net.weights, "params")[0] for net in nets}
        self.split = mesh_gan.split_weights

    def time(self, steps, warmup):
        stamps = []
        for _ in range(warmup + steps):
            feed = [next(self.batches) for _ in range(self.batches_per_step)]
            self.trainer.train_step(feed)  # Returns the losses as floats: synchronous.
            stamps.append(time.perf_counter())
        return (stamps[-1] - stamps[warmup - 1]) / steps


def mesh_memory(config, shape, num_classes, spec):
    """What each device of mesh `spec` holds of the GAN of `config` for data of `shape`
    with `num_classes` classes: built and placed as `main --mesh` places it (MeshGan:
    weights by the layout plan, each optimizer slot like its weight), NOT trained, so a
    model too big to train here can be measured.

    Returns {"mesh", "split_weights", "one_device": {"weights", "optimizer"} bytes,
    "per_device": {"weights", "optimizer"} [bytes of device i]} for G, D and their
    optimizers (Keras' own: Adam holds two slots per weight)."""
    mesh_gan = MeshGan(config, shape, num_classes, spec)

    def whole(variables):
        return sum(int(np.prod(v.shape)) * np.dtype(v.dtype).itemsize for v in variables)

    weights = [w for net in mesh_gan.nets for w in net.weights]
    slots = [v for opt in (mesh_gan.gan.g_optimizer, mesh_gan.gan.d_optimizer)
             for v in opt.variables]
    one = {"weights": whole(weights), "optimizer": whole(slots)}
    mesh_gan.place()
    return {"mesh": spec, "split_weights": mesh_gan.split_weights, "one_device": one,
            "per_device": {"weights": _per_device(weights),
                           "optimizer": _per_device(slots)}}


def _timed(times, gb, d_steps):
    """{step_time_s, images_per_sec, all_step_times_s} of one run's repeats (the best)."""
    best = min(times)
    return {"step_time_s": round(best, 5), "images_per_sec": round(gb * d_steps / best, 1),
            "all_step_times_s": [round(t, 4) for t in times]}


def time_training(config, strategy, source, *, strategy_name, steps, warmup, repeats,
                  baseline=False, placement="", meshes=()):
    """The config's GAN under `strategy`, and with `baseline` PlainGAN on one device, with
    `placement` ("g:I,d:J") G and D on two devices, and on each mesh spec of `meshes`,
    interleaved. Returns the report (docs/performance.md shows its fields)."""
    gb, d_steps = config.train.global_batch_size, config.train.d_steps
    input_fn = data.input_fn(source, global_batch_size=gb, seed=config.seed)
    dataset = input_fn()  # Global batches, for the runs without a strategy.
    with strategy.scope():
        model = build.build_gan(config, source.shape, source.num_classes)
    runs = {"tf_gan_scale": (model, data.distribute(input_fn, strategy))}
    if baseline:
        runs["baseline"] = (plain_gan(config, source), dataset)
    if placement:  # Built outside the strategy: a placement runs under none.
        runs["placement"] = (build.build_gan(config, source.shape, source.num_classes,
                                             placement), dataset)
    mesh_runs, costs = {}, None
    for spec in meshes:
        mesh_runs[spec] = MeshRun(config, source, input_fn, spec, costs)
        costs = mesh_runs[spec].costs
    times = {name: [] for name in [*runs, *mesh_runs]}
    for _ in range(repeats):  # Interleaved: a slow phase of the machine hits all alike.
        for name, (m, ds) in runs.items():
            times[name].append(time_fit(m, ds, steps, warmup))
        for spec, run in mesh_runs.items():
            times[spec].append(run.time(steps, warmup))
    step_time = min(times["tf_gan_scale"])
    result = {
        "strategy": strategy_name, "replicas": strategy.num_replicas_in_sync,
        "global_batch": gb, "sync_bn": bool(config.model.get("sync_bn", False)),
        "d_steps": d_steps, "steps": steps, "repeats": repeats,
        "precision": config.train.precision, "xla": bool(model.xla),
        "accumulation_steps": config.train.accumulation_steps,
        **_timed(times["tf_gan_scale"], gb, d_steps)}
    if baseline:
        base_time = min(times["baseline"])
        result["baseline_plain_keras"] = _timed(times["baseline"], gb, 1)
        result["speed_vs_baseline"] = round(base_time / step_time, 3)
    if placement:
        result["placement"] = {"spec": placement, **_timed(times["placement"], gb, d_steps),
                               f"speed_vs_{strategy_name}": round(
                                   step_time / min(times["placement"]), 3)}
        topology = runs["placement"][0].topology
        # Where each device waits: measured from a profile, after the timing.
        result["placement"]["profile"] = device_profile(runs["placement"][0], dataset,
                                                        d_steps)
        if getattr(topology, "stages", None):
            k, m = topology.stages, config.train.accumulation_steps
            result["placement"]["schedule_bubble"] = round((k - 1) / (m + k - 1), 3)
            result["placement"]["params_per_device"] = [
                sum(int(np.prod(w.shape)) for net in (topology.g, topology.d)
                    for w in net.variables[s]) for s in range(k)]
    if mesh_runs:
        result["params_per_device"] = {n.name: n.count_params()
                                       for n in (model.generator, model.discriminator)}
        result["meshes"] = {
            spec: {**_timed(times[spec], gb, d_steps),
                   f"speed_vs_{strategy_name}": round(step_time / min(times[spec]), 3),
                   "params_per_device": run.params, "split_weights": run.split,
                   "bytes_per_device_step": run.bytes}
            for spec, run in mesh_runs.items()}
    return result


def device_profile(model, dataset, d_steps=1, steps=3):
    """Per-device busy time of `model`'s train step from TensorFlow's profiler: each of
    `steps` steps (after one untimed) is traced alone, each op event is attributed to the
    device its node was placed on (the traced graph's op.device; events of no node of
    the step, e.g. copies between devices, are left out), and a device's busy time is the
    union of its ops' intervals. bubble = 1 - busy / (devices x span), span from the
    step's first op to its last. Logical CPUs share the machine's cores: busy time then
    shows the schedule (when a device has work), not a speed.

    Returns {"devices": [...], "span_ms", "busy_ms" per device, "bubble": the median
    over steps, "unattributed_events": op events of no node of the step}."""
    batches = iter(dataset)

    def batch():
        return next(batches) if d_steps == 1 else tuple(next(batches) for _ in range(d_steps))

    fn = tf.function(model.train_step)
    first = batch()
    graph = fn.get_concrete_function(first).graph
    device_of = {op.name: op.device for op in graph.get_operations() if op.device}
    names = sorted({d for d in device_of.values()})
    fn(first)
    runs = []
    for _ in range(steps):
        data_ = batch()
        with tempfile.TemporaryDirectory() as logdir:
            tf.profiler.experimental.start(logdir)
            fn(data_)
            tf.profiler.experimental.stop()
            path = sorted(glob.glob(os.path.join(logdir, "**", "*.xplane.pb"),
                                    recursive=True))[-1]
            space = xplane_pb2.XSpace()
            with open(path, "rb") as f:
                space.ParseFromString(f.read())
        intervals, other = {d: [] for d in names}, 0
        for plane in space.planes:
            for line in plane.lines:
                for event in line.events:
                    full = plane.event_metadata[event.metadata_id].name
                    name = full.split(":")[0]
                    if name not in device_of:
                        other += ":" in full and "::" not in full  # An op ("name:Type").
                        continue
                    start = line.timestamp_ns * 1000 + event.offset_ps
                    intervals[device_of[name]].append((start, start + event.duration_ps))
        every = [iv for ivs in intervals.values() for iv in ivs]
        t0, t1 = min(a for a, _ in every), max(b for _, b in every)
        busy = {d: _union(ivs) for d, ivs in intervals.items()}
        runs.append((1.0 - sum(busy.values()) / (len(names) * (t1 - t0)), t1 - t0, busy,
                     other))
    bubble, span, busy, other = sorted(runs, key=lambda r: r[0])[len(runs) // 2]
    return {"devices": [d.rsplit("/", 1)[-1] for d in names],
            "span_ms": round(span / 1e9, 2),
            "busy_ms": [round(busy[d] / 1e9, 2) for d in names],
            "bubble": round(bubble, 3), "all_bubbles": [round(r[0], 3) for r in runs],
            "unattributed_events": other}


def _union(intervals):
    """Total length of the union of [start, end) intervals."""
    total, end = 0, None
    for a, b in sorted(intervals):
        if end is None or a > end:
            total += b - a
            end = b
        elif b > end:
            total += b - end
            end = b
    return total


def counted(source):
    """(source read through a counter, [rows read so far]): a random-access view of an
    in-memory or random-access source whose every read adds its row count."""
    read, count = source.reader(), [0]
    if read is None:
        return source, None

    def add(n):
        count[0] += int(n)
        return n

    def counting_read(indices):
        n = tf.numpy_function(add, [tf.size(indices)], tf.int32, stateful=True)
        with tf.control_dependencies([n]):
            return read(tf.identity(indices))
    return dataclasses.replace(source, arrays=None, read=counting_read), count


def resume_latency(source, config, strategy, positions):
    """{position: seconds} to the first per-replica batch of this worker's input started
    at each example position (rounded down to a global batch): flat for sources read by
    index, linear for streams."""
    gb = config.train.global_batch_size
    # This worker's InputContext, as distribute_datasets_from_function would make it.
    resolver = getattr(strategy, "cluster_resolver", None)
    workers = int(getattr(strategy.extended, "_num_workers", 1) or 1)
    ctx = tf.distribute.InputContext(
        num_input_pipelines=workers,
        input_pipeline_id=int(resolver.task_id or 0) if resolver and workers > 1 else 0,
        num_replicas_in_sync=strategy.num_replicas_in_sync)
    out = {}
    for position in positions:
        start = time.perf_counter()
        ds = data.make_dataset(source, global_batch_size=gb, seed=config.seed,
                               start_batch=int(position) // gb, input_context=ctx)
        next(iter(ds))
        out[f"{int(position):.0e}".replace("+0", "").replace("+", "")] = round(
            time.perf_counter() - start, 4)
    return out


def time_input(config, strategy, source, *, strategy_name, steps, warmup, repeats,
               min_seconds, resume_positions=()):
    """The input pipeline's batches/sec (pulled as the train step pulls them:
    perf.time_input_pipeline) against the train step's, interleaved; the rows this worker
    read per global batch it pulled (GB / workers when each worker reads only its own
    rows), the latency of a resume at `resume_positions`, and peak memory."""
    t = config.train
    source, count = counted(source)
    input_fn = data.input_fn(source, global_batch_size=t.global_batch_size, seed=config.seed)
    with strategy.scope():
        model = build.build_gan(config, source.shape, source.num_classes)
    per_call = model.step_config.batches_per_step * model.steps_per_execution
    train_data = data.distribute(input_fn, strategy)
    step_times, pipeline = [], []
    for _ in range(repeats):  # Interleaved, as with the baseline.
        step_times.append(time_fit(model, train_data, steps, warmup))
        iterator = iter(data.distribute(input_fn, strategy))
        before = count[0] if count else 0
        pipeline.append(perf.time_input_pipeline(
            iterator, strategy, batches_per_call=per_call, warmup_calls=warmup,
            min_calls=steps, min_seconds=min_seconds))
        pulled = pipeline[-1]["batches"] + warmup * per_call
        del iterator
        if count:
            pipeline[-1]["rows_read_per_batch"] = (count[0] - before) / pulled
    step_time = min(step_times)
    pipe = max(pipeline, key=lambda p: p["batches_per_sec"])
    step_rate = 1.0 / step_time
    train_batches = step_rate * model.step_config.batches_per_step
    return {
        "source": source.name, "strategy": strategy_name,
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
        # d_steps is 1). >= 1: the pipeline keeps up.
        "input_headroom": round(pipe["batches_per_sec"] / train_batches, 2),
        "all_step_times_s": [round(s, 4) for s in step_times],
        "all_pipeline_batches_per_sec": [round(p["batches_per_sec"], 2) for p in pipeline],
        # Rows read from the source per global batch this worker pulled, prefetch
        # included (None for streams): GB / workers when it reads only its replicas' rows.
        "rows_read_per_batch": (round(pipe["rows_read_per_batch"], 1)
                                if "rows_read_per_batch" in pipe else None),
        "resume_first_batch_s": resume_latency(source, config, strategy, resume_positions),
        # ru_maxrss is in KiB on Linux: the whole process (TensorFlow included).
        "peak_rss_mb": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024),
    }


def time_evaluation(config, strategy, source, extractor_spec, *, strategy_name,
                    num_samples, batch_size, keep):
    """Scoring's images/sec (scoring.fake_features over `num_samples` generated examples
    of the config's untrained generator, after a warm-up pass) and the process's peak
    resident memory."""
    with strategy.scope():
        model = build.build_gan(config, source.shape, source.num_classes)
        extractor = extractors.get(extractor_spec, source.shape)

    def score(n):
        stats, _ = scoring.fake_features(
            model.sampler, model.latent_dim, extractor, strategy, num_samples=n, seed=0,
            batch_size=batch_size, keep=keep, num_classes=model.num_classes)
        return stats.result()

    score(2 * batch_size)  # Tracing, first allocations.
    start = time.perf_counter()
    score(num_samples)
    seconds = time.perf_counter() - start
    return {"strategy": strategy_name, "replicas": strategy.num_replicas_in_sync,
            "extractor": extractor.name, "eval_samples": num_samples,
            "keep_features": keep, "seconds": round(seconds, 2),
            "eval_images_per_sec": round(num_samples / seconds, 1),
            # ru_maxrss is in KiB on Linux: the whole process (TensorFlow included).
            "peak_rss_mb": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024)}
