"""Pipeline placement (parallel/placement.py): G on one device, D on another of one
process, micro-batches by accumulation_steps; the same numbers as one device with the
same micro-batches (measured: bit for bit), with each network's weights, slots and
forward and backward ops on its own device.
"""

import collections
import importlib.util
import os

import numpy as np
import pytest
import tensorflow as tf

from conftest import REPO, run_cmd, run_cmds, run_in_process
from helpers.mw_helpers import assert_same_checkpoint, checkpoint_arrays
from tf_gan_scale import data, errors
from tf_gan_scale import training
from tf_gan_scale.parallel import placement

SGD = ["--config=tests/helpers/sgd_config.py", "--config.train.steps_per_execution=1",
       "--config.train.accumulation_steps=4"]


@pytest.mark.parametrize("spec, message", [
    ("g:0,d:0", "device indices I != J"),
    ("g:0", "valid: g:I,d:J"),
    ("g:0,e:1", "unknown network 'e'"),
    ("g:0,g:1", "repeated network"),
    ("g:zero,d:1", "device 'zero' of network 'g' is not an integer"),
    ("g:0,d:-1", "device indices I != J"),
])
def test_bad_specs_name_the_part_and_the_form(spec, message):
    with pytest.raises(errors.ConfigError, match=message) as info:
        placement.parse(spec)
    assert "valid: g:I,d:J" in str(info.value)
    assert placement.parse("d:1,g:0") == {"g": 0, "d": 1}


def sgd_config(accumulation_steps=2):
    path = os.path.join(REPO, "tests", "helpers", "sgd_config.py")
    spec = importlib.util.spec_from_file_location("sgd_config", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    config = module.get_config()
    config.train.accumulation_steps = accumulation_steps
    return config


def test_each_network_its_device_forward_and_backward():
    # G on CPU:1, away from TensorFlow's default device, so nothing of G lands there by
    # default; Adam for both (moments beside their weights), an EMA copy of G.
    config = sgd_config()
    config.train.g_optimizer.name = config.train.d_optimizer.name = "adam"
    config.train.ema.decay = 0.9
    source = data.load(config.data.source)
    gan = training.build_gan(config, source.shape, 0, "g:1,d:0")

    def devices(variables):
        return {v._value.device.rsplit("/", 1)[-1] for v in variables}

    assert devices(gan.generator.weights) == devices(gan.ema.model.weights) == {"device:CPU:1"}
    assert devices(gan.discriminator.weights) == {"device:CPU:0"}
    for opt, device in ((gan.g_optimizer, "device:CPU:1"), (gan.d_optimizer, "device:CPU:0")):
        assert devices(v for v in opt.variables if len(v.shape)) == {device}  # Moments.
    batch = next(iter(data.make_dataset(source, global_batch_size=32, seed=0)))
    graph = tf.function(gan.train_step).get_concrete_function(batch).graph
    ops = collections.Counter((op.type, op.device.rsplit("/", 1)[-1]) for op in
                              graph.get_operations() if op.type.startswith("Conv2D"))
    # D: 2 convolutions (Conv2D forward, Conv2DBackprop* backward), on CPU:0; G: 3
    # transposed ones (forward Conv2DBackpropInput, backward Conv2D and
    # Conv2DBackpropFilter), on CPU:1: in both updates, for 2 micro-batches each.
    assert ops == {("Conv2D", "device:CPU:0"): 8, ("Conv2DBackpropFilter", "device:CPU:0"): 8,
                   ("Conv2DBackpropInput", "device:CPU:0"): 8,
                   ("Conv2DBackpropInput", "device:CPU:1"): 12,
                   ("Conv2D", "device:CPU:1"): 6, ("Conv2DBackpropFilter", "device:CPU:1"): 6}


@pytest.mark.slow  # Two runs of the binary, ~12 s each.
def test_placed_run_equals_one_device(tmp_path):
    """SGD, batch norm in G and D, dropout, 4 micro-batches: every checkpointed variable
    of a placed run equals the one-device run with the same micro-batches, bit for bit
    (placement only moves ops; a 2x learning rate would move every weight by ~1e-1)."""
    runs = {}
    for name, flags in (("placed", ["--placement=g:0,d:1", "--num_cpu_devices=2"]),
                        ("one", ["--strategy=one_device"])):
        runs[name] = tmp_path / name
        proc = run_cmd(["-m", "tf_gan_scale.main", f"--workdir={runs[name]}", *SGD, *flags])
        assert proc.returncode == 0, proc.stderr[-3000:]
    assert_same_checkpoint(checkpoint_arrays(runs["placed"]), checkpoint_arrays(runs["one"]))
    assert '"placement": "g:0,d:1"' in (runs["placed"] / "run.json").read_text()


# Bad placements: (flags, the message of the one error line). All but the first fail
# before any device is set up and run in this process (its 2 logical CPUs: what
# --num_cpu_devices=2 asks for); the first needs a process with ONE CPU device.
BAD = [
    (["--placement=g:0,d:1"],  # The CPU not split: one device.
     "device 1 but the process has 1 CPU device(s) (0..0); split the CPU with "
     "--num_cpu_devices=2"),
    (["--placement=g:0,d:2", "--num_cpu_devices=2"],
     "--placement=g:0,d:2: device 2 but the process has 2 CPU device(s) (0..1)"),
    (["--placement=g:1,d:1"], "device indices I != J"),
    (["--placement=g:0,d:1", "--strategy=mirrored"],
     "--placement=g:0,d:1 cannot be combined with --strategy=mirrored"),
    (["--placement=g:0,d:1", "--mesh=batch:1,model:2"], "one of them"),
    (["--placement=g:0,d:1", "--num_cpu_devices=2", "--config.train.jit_compile=true"],
     "XLA compiles a step for one device"),
]


def assert_bad_placements(cases, procs, workdir):
    for (flags, message), proc in zip(cases, procs):
        assert proc.returncode == 2, (flags, proc.stderr[-2000:])
        assert message in proc.stderr.strip().splitlines()[-1], flags
    assert sorted(os.listdir(workdir)) == ["keep.txt"]


def test_bad_placement_exits_2_before_writing(tmp_path):
    (tmp_path / "keep.txt").write_text("existing run")
    assert_bad_placements(BAD[1:], [
        run_in_process(["-m", "tf_gan_scale.main", f"--workdir={tmp_path}", *SGD, *flags])
        for flags, _ in BAD[1:]], tmp_path)


@pytest.mark.slow
def test_bad_placement_of_the_real_binary_exits_2_before_writing(tmp_path):
    (tmp_path / "keep.txt").write_text("existing run")
    cases = BAD[:2]  # One device (its own process), and one case end to end.
    # One at a time: two commands on one workdir at once are two runs, and the second
    # would be refused as such (training/run_lock.py) while the first's input is checked.
    assert_bad_placements(cases, run_cmds([
        ["-m", "tf_gan_scale.main", f"--workdir={tmp_path}", *SGD, *flags]
        for flags, _ in cases], workers=1), tmp_path)


def test_placement_in_process_equals_one_device():
    """The in-process twin of the binary test (2 micro-batches, 3 steps): placed == not."""
    config = sgd_config()
    source = data.load(config.data.source)
    placed = training.build_gan(config, source.shape, 0, "g:0,d:1")
    plain = training.build_gan(config, source.shape, 0)
    batches = iter(data.make_dataset(source, global_batch_size=32, seed=0))
    steps = [tf.function(g.train_step) for g in (placed, plain)]
    for _ in range(3):
        batch = next(batches)
        for step in steps:
            step(batch)
    for a, b in zip(placed.generator.weights + placed.discriminator.weights,
                    plain.generator.weights + plain.discriminator.weights):
        np.testing.assert_array_equal(a.numpy(), b.numpy())


@pytest.mark.slow  # ~11 s: two R3GANs traced, 3 steps each.
def test_r3gan_placed_equals_one_device():
    """R3GAN's step placed (G on CPU:0, D with its double backprop on CPU:1): the paired
    loss reading G's own real batch, R1 + R2 in D's main pass, 2 micro-batches. The same
    numbers as one device, bit for bit (measured), and each network's weights on its
    device."""
    import keras

    from helpers import mesh_helpers
    config = mesh_helpers.config("r3gan_cond", "sgd", train=(
        ("loss", "rpgan"), ("penalty", "r1_r2"), ("penalty_weight", 1.0),
        ("accumulation_steps", 2)))
    shape, classes = mesh_helpers.data_of("r3gan_cond")
    keras.utils.set_random_seed(0)
    placed = training.build_gan(config, shape, classes, "g:0,d:1")
    plain = training.build_gan(config, shape, classes)
    assert {w._value.device[-5:] for w in placed.discriminator.weights} == {"CPU:1"}
    assert {w._value.device[-5:] for w in placed.generator.weights} == {"CPU:0"}
    for a, b in ((placed.generator, plain.generator),
                 (placed.discriminator, plain.discriminator)):
        b.set_weights(a.get_weights())
    start = [w.numpy() for w in plain.generator.weights + plain.discriminator.weights]
    rng = np.random.default_rng(0)
    steps = [tf.function(g.train_step) for g in (placed, plain)]
    for _ in range(3):  # Two batches a step: D's, then G's own reals.
        feed = tuple({"x": tf.constant(np.tanh(rng.standard_normal((8, *shape))), tf.float32),
                      "label": tf.constant(rng.integers(0, classes, 8), tf.int32)}
                     for _ in range(2))
        for step in steps:
            step(feed)
    ends = [(a.numpy(), b.numpy()) for a, b in zip(
        placed.generator.weights + placed.discriminator.weights,
        plain.generator.weights + plain.discriminator.weights)]
    for a, b in ends:
        np.testing.assert_array_equal(a, b)
    assert max(np.max(np.abs(b - s)) for (_, b), s in zip(ends, start)) > 1e-3  # Trained.
