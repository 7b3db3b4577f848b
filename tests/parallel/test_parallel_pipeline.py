"""The multi-stage pipeline (parallel/pipeline.py, --placement=stages:K): G and D each
split into K stages on K devices, the accumulation micro-batches in GPipe's schedule.
Equal to one device with the same micro-batches: bit for bit for the DCGAN (SGD, batch
norm, dropout), within float32 rounding with recomputation (Grappler fuses a forward
without a tape differently: measured 6e-8 after 3 steps) and for the BigGAN (measured
6e-7 after 3 steps; 4.7e-6 is the mesh's measured gap of the same model).
"""

import itertools
import json
import os

import keras
import numpy as np
import pytest
import tensorflow as tf

from conftest import REPO, run_cmd, run_cmds, run_in_process
from helpers import sgd_config as sgd_module
from helpers.mw_helpers import assert_same_checkpoint, checkpoint_arrays
from tf_gan_scale import data, errors, training
from tf_gan_scale.gan import StepConfig
from tf_gan_scale.layers.replica_dropout import ReplicaDropout
from tf_gan_scale.parallel import pipeline, placement
from tf_gan_scale.parallel.pipeline import BACKWARD, FORWARD, Cell
from tf_gan_scale.training import benchmark

TOL = 1e-6  # Recomputation: 6e-8 measured; a 2x learning rate moves weights by >1e-2.


@pytest.mark.parametrize("stages, micros", [(2, 4), (4, 4), (4, 1), (3, 8)])
def test_gpipe_schedule(stages, micros):
    schedule = pipeline.gpipe(stages, micros)
    when = {}
    for t, tick in enumerate(schedule.ticks):
        assert len({c.stage for c in tick}) == len(tick)  # One cell per device per tick.
        for c in tick:
            assert (c.stage, c.micro, c.phase) not in when
            when[(c.stage, c.micro, c.phase)] = t
    assert set(when) == set(itertools.product(range(stages), range(micros),
                                              (FORWARD, BACKWARD)))
    for s, m in itertools.product(range(stages), range(micros)):
        if s:  # A stage's forward after the stage before it; its backward after the next.
            assert when[(s, m, FORWARD)] == when[(s - 1, m, FORWARD)] + 1
            assert when[(s - 1, m, BACKWARD)] == when[(s, m, BACKWARD)] + 1
        assert when[(s, m, BACKWARD)] > when[(stages - 1, micros - 1, FORWARD)]  # All F first.
        if m:  # Each stage sees the micro-batches in order, both ways (accumulation's sum).
            for phase in (FORWARD, BACKWARD):
                assert when[(s, m, phase)] == when[(s, m - 1, phase)] + 1
    assert len(schedule.ticks) == 2 * (micros + stages - 1)
    assert schedule.bubble_fraction == pytest.approx((stages - 1) / (micros + stages - 1))
    assert pipeline.gpipe(2, 2).ticks == (
        (Cell(0, 0, "F"),), (Cell(0, 1, "F"), Cell(1, 0, "F")), (Cell(1, 1, "F"),),
        (Cell(1, 0, "B"),), (Cell(1, 1, "B"), Cell(0, 0, "B")), (Cell(0, 1, "B"),))


def config_of(accumulation_steps=4, lr=0.05):
    config = sgd_module.get_config()
    config.train.accumulation_steps = accumulation_steps
    config.train.g_optimizer.learning_rate = config.train.d_optimizer.learning_rate = lr
    return config


def trained(spec, steps=3, unknown_batch=False, **kwargs):
    """`spec`'s GAN after `steps` steps; with `unknown_batch`, the step traced for
    batches of any size (a user's dataset without drop_remainder, numpy through fit)."""
    config = config_of(**kwargs)
    source = data.load(config.data.source)
    gan = training.build_gan(config, source.shape, 0, spec)
    dataset = data.make_dataset(source, global_batch_size=32, seed=0)
    batches = iter(dataset)
    signature = None
    if unknown_batch:
        signature = [tf.nest.map_structure(
            lambda s: tf.TensorSpec([None, *s.shape[1:]], s.dtype), dataset.element_spec)]
    step = tf.function(gan.train_step, input_signature=signature)
    for _ in range(steps):
        step(next(batches))
    return gan


def weights(gan):
    return [w.numpy() for w in gan.generator.weights + gan.discriminator.weights]


@pytest.fixture(scope="module")
def one_device():
    return trained("")


def test_two_stages_equal_one_device_bit_for_bit(one_device):
    # SGD, batch norm in G and D, dropout, 4 micro-batches, 3 steps (stages:4 on 4 CPUs:
    # the slow binary test). Traced for batches of unknown size: D's loss must still
    # split its logits into real and fake (the slow tests run the static shapes).
    piped = trained("stages:2", unknown_batch=True)
    for a, b in zip(weights(piped), weights(one_device)):
        np.testing.assert_array_equal(a, b)
    # Each stage's weights on its device, every stage starting with a kernel.
    topo = piped.topology
    for net in (topo.g, topo.d):
        for s, stage in enumerate(net.stages):
            assert any(len(w.shape) >= 2 for w in stage[0].operation.trainable_weights)
            assert {w._value.device.rsplit("/", 1)[-1] for w in net.variables[s] +
                    net.state[s]} == {f"device:CPU:{s}"}
        nodes = [n for stage in net.stages for n in stage]
        assert len(nodes) == len({id(n) for n in nodes}) == len(pipeline._graph(net.model)[1])


def test_stage_split_and_refusals():
    dense = keras.Sequential([keras.Input((3,)), keras.layers.Dense(2),
                              keras.layers.BatchNormalization(), keras.layers.Dense(1)])
    net = pipeline.StagedNetwork(dense, ["/device:CPU:0", "/device:CPU:1"])
    # The batch norm (no kernel) stays with the layer before it.
    assert [[n.operation.name for n in s] for s in net.stages] == [
        [dense.layers[0].name, dense.layers[1].name], [dense.layers[2].name]]
    with pytest.raises(errors.ConfigError, match=r"has 2 layers with kernels, fewer than 3 "
                                                 r"stages; valid: stages:2..2"):
        pipeline.StagedNetwork(dense, ["a", "b", "c"])

    class Sub(keras.Model):
        def call(self, x):
            return x

    with pytest.raises(errors.ConfigError, match="not a Sequential or functional"):
        pipeline.StagedNetwork(Sub(), ["a", "b"])
    bad = StepConfig(penalty="wgan_gp", penalty_weight=1.0, ortho_weight=1e-4)
    assert bad.unsupported("pipeline") == [
        "config.train.penalty='wgan_gp' (a second backward pass through every stage)",
        "config.train.ortho_weight=0.0001 (its gradient is not split by stage)"]
    assert bad.unsupported("placement") == []


SGD = ["--config=tests/helpers/sgd_config.py", "--config.train.steps_per_execution=1",
       "--config.train.accumulation_steps=4"]
BAD = [
    (["--placement=stages:1"], "valid: g:I,d:J with device indices I != J (e.g. g:0,d:1), "
                               "or stages:K[,recompute:1] with K >= 2"),
    (["--placement=stages:two"], "value 'two' of key 'stages' is not an integer"),
    (["--placement=stages:2,recompute:2"], "or stages:K[,recompute:1]"),
    (["--placement=stages:3", "--num_cpu_devices=2"],
     "--placement=stages:3: 3 stages but the process has 2 CPU device(s); valid: "
     "stages:2..2; split the CPU with --num_cpu_devices=3"),
    (["--placement=stages:2", "--num_cpu_devices=2", "--config.train.penalty=wgan_gp",
      "--config.train.penalty_weight=10"],
     "--placement=stages:2 cannot run config.train.penalty='wgan_gp' (a second backward "
     "pass through every stage); valid: their defaults, or a strategy / --mesh"),
    (["--placement=stages:2", "--strategy=mirrored"],
     "--placement=stages:2 cannot be combined with --strategy=mirrored"),
    (["--placement=stages:2", "--num_cpu_devices=2", "--config.train.jit_compile=true"],
     "XLA compiles a step for one device"),
]


def test_bad_pipelines_exit_2_before_writing(tmp_path):
    (tmp_path / "keep.txt").write_text("existing run")
    for flags, message in BAD:
        proc = run_in_process(["-m", "tf_gan_scale.main", f"--workdir={tmp_path}", *SGD,
                               *flags])
        assert proc.returncode == 2, (flags, proc.stderr[-2000:])
        assert message in proc.stderr.strip().splitlines()[-1], (flags, proc.stderr[-500:])
    assert sorted(os.listdir(tmp_path)) == ["keep.txt"]
    assert placement.parse("stages:4") == {"stages": 4, "recompute": 0}


@pytest.mark.slow  # Its own process: 4 logical CPUs (~60 s).
def test_two_and_four_stages_on_four_devices_equal_one_device():
    """stages:2 and stages:4 over 4 logical CPUs, 4 micro-batches, 10 SGD steps through
    `fit`, batch norm and dropout: every weight equals one device's, bit for bit; with
    recomputation within float32 rounding."""
    proc = run_cmd([os.path.join(REPO, "tests", "helpers", "pipeline_run.py")])
    assert proc.returncode == 0, proc.stderr[-3000:]
    gaps = json.loads(proc.stdout.strip().splitlines()[-1])
    assert gaps["stages:2"] == gaps["stages:4"] == 0.0, gaps
    assert gaps["stages:4,recompute:1"] < TOL, gaps
    assert gaps["lr_x2"] > 1e4 * TOL, gaps  # A 2x gradient scale fails by far.


@pytest.mark.slow  # Two runs of the binary.
def test_binary_four_stages_trains_the_one_device_model(tmp_path):
    """The binary end to end: --placement=stages:4 --num_cpu_devices=4 trains what one
    device trains. Within float32 rounding, not bit for bit: measured 1.2e-7 after 10
    steps through the binary while the same step through `fit` is exact (above); the
    cause was not found."""
    flags = [*SGD, "--config.model.d_channels=(8,16,16)"]  # D with 4 kernels.
    runs = {name: tmp_path / name for name in ("piped", "one")}
    procs = run_cmds([
        ["-m", "tf_gan_scale.main", f"--workdir={runs['piped']}", *flags,
         "--placement=stages:4", "--num_cpu_devices=4"],
        ["-m", "tf_gan_scale.main", f"--workdir={runs['one']}", *flags,
         "--strategy=one_device"]])
    for proc in procs:
        assert proc.returncode == 0, proc.stderr[-3000:]
    assert_same_checkpoint(checkpoint_arrays(runs["piped"]), checkpoint_arrays(runs["one"]),
                           atol=TOL)
    assert '"placement": "stages:4"' in (runs["piped"] / "run.json").read_text()


def test_union_of_intervals():
    assert benchmark._union([(5, 6), (0, 2), (1, 3), (5, 5)]) == 4


@pytest.mark.slow  # A profiled step (tools/benchmark.py's pipeline report).
def test_profile_sees_each_stage_busy_part_of_the_step():
    gan = trained("stages:2", steps=1)
    source = data.load(config_of().data.source)
    report = benchmark.device_profile(
        gan, data.make_dataset(source, global_batch_size=32, seed=0), steps=1)
    assert report["devices"] == ["device:CPU:0", "device:CPU:1"]
    assert all(0 < busy < report["span_ms"] for busy in report["busy_ms"]), report
    assert 0 < report["bubble"] < 1, report


# ---- the executors on small networks, in this process (eager unless said) ----------------

CPUS = ["/device:CPU:0", "/device:CPU:1"]


def _loss(out):
    """A scalar whose gradient differs per output row (a plain sum would not tell rows
    apart)."""
    out = tf.cast(out, tf.float32)
    weights = tf.range(1.0, 1.0 + tf.cast(tf.size(out), tf.float32))
    return tf.reduce_sum(out * tf.reshape(weights, out.shape))


def _piped_grads(net, entries, recompute=False):
    """net's gradients of _loss summed over the micro-batches `entries` in GPipe's
    schedule over its stages."""
    schedule = pipeline.gpipe(len(net.stages), len(entries))
    rows = [None] * len(entries)

    def tail(m, out):
        return _loss(out), None

    run = pipeline.forward(net, schedule, entries, rows, tail=tail, keep=True,
                           recompute=recompute)
    grads, _ = pipeline.backward(net, run, schedule, entries, rows, tail=tail,
                                 recompute=recompute)
    return [tf.convert_to_tensor(g) for g in grads]


def _tape_grads(model, entries):
    """One tape per micro-batch, the gradients summed in micro-batch order."""
    total = None
    for xs in entries:
        with tf.GradientTape() as tape:
            loss = _loss(model(xs if len(xs) > 1 else xs[0], training=True))
        g = [tf.convert_to_tensor(x) for x in tape.gradient(loss, model.trainable_variables)]
        total = g if total is None else [a + b for a, b in zip(total, g)]
    return total


def _micro_batches(m, shape=(3, 6)):
    return [[tf.random.stateless_normal(shape, [7, j])] for j in range(m)]


def test_backward_sums_micro_batches_in_order_bit_for_bit():
    # Eager (no Grappler to rewrite a chain of adds as one AddN): the order of the sum
    # over micro-batches shows in the last bits.
    keras.utils.set_random_seed(0)
    model = keras.Sequential([keras.Input((6,)), keras.layers.Dense(8),
                              keras.layers.Dense(8), keras.layers.Dense(1)])
    entries = _micro_batches(4)
    piped = _piped_grads(pipeline.StagedNetwork(model, CPUS), entries)
    for a, b in zip(piped, _tape_grads(model, entries)):
        np.testing.assert_array_equal(a, b)


def test_recompute_replays_each_cells_state():
    # Dropout (its call counter keys the mask) and batch norm (moving statistics) in
    # both stages: the backward's re-run must see the state its forward cell saw, and
    # leave the state the forward left.
    def network():
        keras.utils.set_random_seed(0)
        layers = keras.layers
        return keras.Sequential([
            keras.Input((6,)), layers.Dense(8), layers.BatchNormalization(),
            ReplicaDropout(0.5, seed=3), layers.Dense(8), layers.BatchNormalization(),
            ReplicaDropout(0.5, seed=4), layers.Dense(1)])

    entries = _micro_batches(3)
    reference, model = network(), network()
    expected = _tape_grads(reference, entries)
    piped = _piped_grads(pipeline.StagedNetwork(model, CPUS), entries, recompute=True)
    for a, b in zip(piped, expected):
        np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-7)
    for a, b in zip(model.weights, reference.weights):  # Moving statistics, counters.
        np.testing.assert_allclose(a.numpy(), b.numpy(), rtol=1e-6, atol=1e-7)


def _ancestors(tensor):
    seen, todo = set(), [tensor.op]
    while todo:
        op = todo.pop()
        if op.name not in seen:
            seen.add(op.name)
            todo += [x.op for x in op.inputs] + list(op.control_inputs)
    return seen


def test_each_tick_waits_for_the_previous_one():
    # In a traced step only the data decide an order, unless the ticks are chained:
    # every cell of tick t must depend on every output of tick t - 1, forward and
    # backward (there, stage 0's micro-batch m after micro-batch m - 1).
    keras.utils.set_random_seed(0)
    net = pipeline.StagedNetwork(keras.Sequential([
        keras.Input((6,)), keras.layers.Dense(8), keras.layers.Dense(1)]), CPUS)
    schedule = pipeline.gpipe(2, 3)
    entries, rows, kept = _micro_batches(3), [None] * 3, {}

    @tf.function
    def step():
        def tail(m, out):
            return _loss(out), None

        run = pipeline.forward(net, schedule, entries, rows, tail=tail, keep=True)
        _, entry_grads = pipeline.backward(net, run, schedule, entries, rows, tail=tail)
        kept.update(outputs=run.outputs, entry_grads=entry_grads)
        return entry_grads

    step.get_concrete_function()
    forward_ticks = schedule.phase(FORWARD)
    for before, tick in zip(forward_ticks, forward_ticks[1:]):
        for cell in tick:
            reached = set().union(*(_ancestors(t) for t in
                                    kept["outputs"][(cell.stage, cell.micro)].values()))
            for c in before:
                for t in kept["outputs"][(c.stage, c.micro)].values():
                    assert t.op.name in reached, (cell, c)
    grads = [g[0] for g in kept["entry_grads"]]
    for m in range(1, 3):
        assert grads[m - 1].op.name in _ancestors(grads[m]), m


def test_stages_of_a_functional_network_with_labels_shared_layers_and_ops():
    # A tensor used by both stages, int labels through an embedding (sparse gradient),
    # a keras.ops call (an Operation without weights), a layer called in both stages
    # (its gradient has a part from each) and a float16 output seeded with a float32
    # gradient (G's output under a mixed policy, seeded through its float32 cast).
    keras.utils.set_random_seed(0)
    layers = keras.layers
    x, y = keras.Input((6,)), keras.Input((), dtype="int32")
    shared = layers.Dense(6, name="shared")
    h1 = layers.Dense(6, name="first")(x)
    h2 = shared(layers.Dense(6, name="second")(h1))
    h3 = layers.Dense(6, name="third")(layers.Concatenate()([h2, h1]))
    h4 = layers.Multiply()([shared(h3), layers.Embedding(5, 6, name="embed")(y)])
    out = layers.Dense(1, name="out", dtype="float16")(keras.ops.tanh(h4))
    model = keras.Model([x, y], out)
    net = pipeline.StagedNetwork(model, CPUS)
    calls = [[n.operation.name for n in stage] for stage in net.stages]
    assert "shared" in calls[0] and "shared" in calls[1], calls
    entries = [[e[0], tf.constant([1, 4, j], tf.int32)] for j, e in enumerate(
        _micro_batches(2))]
    expected = _tape_grads(model, entries)
    for a, b in zip(_piped_grads(net, entries), expected):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)
    # Seeded from outside (G's backward in the G update): float32 seeds, float16 output.
    schedule, rows = pipeline.gpipe(2, 2), [None, None]
    run = pipeline.forward(net, schedule, entries, rows, keep=True)
    seeds = [tf.ones([3, 1], tf.float32) for _ in entries]
    grads, entry_grads = pipeline.backward(net, run, schedule, entries, rows, seeds=seeds)
    assert all(g is not None for g in grads) and len(entry_grads[0]) == 1
