"""The training binary and tools/sample.py end to end, as subprocesses."""

import glob
import json
import os
import re

import numpy as np
import pytest
import tensorflow as tf

from helpers.mw_helpers import Launcher, scalars
from conftest import (TINY, TINY_RUN_STEPS, copy_run, run_cmd, run_cmds, run_in_process,
                      tree_digest)


def train(workdir, *extra, steps):
    proc = run_cmd(["-m", "tf_gan_scale.main", f"--workdir={workdir}", *TINY,
                    f"--config.train.num_steps={steps}", *extra])
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc


def sample(workdir, output, seed=0, num=16, process=False):
    """tools/sample.py's JSON line; in this process unless `process` (the real tool)."""
    run = run_cmd if process else run_in_process
    proc = run(["tools/sample.py", f"--workdir={workdir}", f"--output={output}",
                f"--seed={seed}", f"--num_samples={num}"])
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


@pytest.mark.slow
def test_auto_steps_per_execution_keeps_every_event_on_its_step(tiny_run, tmp_path):
    # steps_per_execution=0 (the default; TINY pins 1) picks 5 for 10 steps logged,
    # sampled and checkpointed every 5: events at exactly 5 and 10, and the weights of
    # one step per call (tiny_run) to float32 rounding (the while loop's graph rounds
    # differently).
    one, auto = tiny_run, tmp_path / "auto"
    proc = train(auto, "--config.train.steps_per_execution=0", steps=10)
    assert "5 steps per call" in proc.stderr and "step 10:" in proc.stderr
    assert sorted(f for f in os.listdir(auto / "checkpoints") if f.endswith(".index")) == [
        "ckpt-10.index", "ckpt-5.index"]
    assert sorted(os.listdir(auto / "samples")) == ["step_0000005.png", "step_0000010.png"]
    assert set(scalars(auto, "d_loss")) == {5, 10}
    np.testing.assert_allclose(scalars(auto, "d_loss")[10], scalars(one, "d_loss")[10],
                               rtol=1e-5)
    a, b = sample(one, tmp_path / "a.npy"), sample(auto, tmp_path / "b.npy")
    assert a["step"] == b["step"] == 10
    np.testing.assert_allclose(np.load(tmp_path / "a.npy"), np.load(tmp_path / "b.npy"),
                               atol=1e-5)


def test_train_resume_sample(tiny_run, tmp_path):
    # tiny_run: the same command straight through 10 steps (copied: run again below).
    straight, resumed = copy_run(tiny_run, tmp_path / "straight"), tmp_path / "resumed"
    assert TINY_RUN_STEPS == 10
    train(resumed, steps=6)
    assert sorted(os.listdir(resumed / "checkpoints")) == [
        "checkpoint", "ckpt-5.data-00000-of-00001", "ckpt-5.index",
        "ckpt-6.data-00000-of-00001", "ckpt-6.index"]
    proc = train(resumed, steps=10)  # Same command, more steps: resumes at 6.
    assert "resumed" in proc.stderr and "at step 6 of 10" in proc.stderr
    assert os.path.exists(resumed / "checkpoints" / "ckpt-10.index")
    assert os.path.exists(resumed / "samples" / "step_0000010.png")
    assert set(scalars(resumed, "d_loss")) == {5, 10}
    assert scalars(resumed, "images_per_sec")[10] > 0

    # Exact resume: weights, both optimizers, BN statistics, data position and latents.
    a = sample(straight, tmp_path / "a.npy", process=True)  # The real tool once.
    b = sample(resumed, tmp_path / "b.npy")
    assert a["step"] == b["step"] == 10 and a["num_samples"] == 16
    np.testing.assert_array_equal(np.load(tmp_path / "a.npy"), np.load(tmp_path / "b.npy"))

    # Same seed => same samples; another seed => others; PNG grids too.
    sample(straight, tmp_path / "c.npy")
    sample(straight, tmp_path / "d.npy", seed=1)
    x = np.load(tmp_path / "c.npy")
    assert x.shape == (16, 8, 8, 1) and np.abs(x).max() <= 1.0
    np.testing.assert_array_equal(x, np.load(tmp_path / "a.npy"))
    assert not np.allclose(x, np.load(tmp_path / "d.npy"))
    assert sample(straight, tmp_path / "grid.png")["output"].endswith("grid.png")
    assert os.path.getsize(tmp_path / "grid.png") > 100

    # Running again at the final step does nothing and keeps every file.
    before = tree_digest(straight)
    train(straight, steps=10)
    assert tree_digest(straight) == before


# Bad input of the binary: (args, the message its one error line holds). IN_PROCESS
# cases fail before any device or strategy is set up (flags, config, data path, model),
# so they run in this process (conftest.run_in_process: no process start each) under
# --strategy=one_device where they name no strategy; SUBPROCESS cases need their own
# devices, strategy or cluster environment and run the real binary.
IN_PROCESS = [
    (["--strategy=foo"], "unknown strategy 'foo'; valid: auto, mirrored, multi_worker_mirrored"),
    (["--strategy=parameter_server"], "--strategy=parameter_server: ParameterServerStrategy "
                                      "is not supported: its workers update G and D "
                                      "asynchronously"),
    (["--config.train.num_stpes=3"], "unknown config key 'train.num_stpes'; valid keys of "
                                     "train: accumulation_steps, ada_interval, ada_kimg, ada_p,"),
    (["--config.data.source=hub:x"], "unknown data source kind 'hub'; valid: arrayrecord, embedded"),
    (["--config.data.source=npz:/no/such.npz"], "npz file not found: '/no/such.npz'"),
    (["--config.train.loss=hinj"], "unknown loss 'hinj'; valid: hinge, least_squares"),
    (["--config.model.name=stylegan"],
     "unknown architecture 'stylegan'; valid: biggan, dcgan, mlp, r3gan, resnet, stylegan2"),
    (["--config.model.latent_dim=7"], "holds checkpoints trained with another config "
                                      "(model.latent_dim: 16 -> 7); valid:"),
    (["--config.model.latent_dim=7", "--allow_changes=model.latent_dim"],
     "does not match this config's model"),
    (["--allow_changes=seeed"], "--allow_changes names seeed, not keys of this config"),
    (["--collective=mpi"], "unknown collective 'mpi'; valid: auto, nccl, ring"),
    (["--cluster_resolver=k8s"], "unknown cluster resolver 'k8s'; valid: slurm, tf_config"),
    (["--config.train.steps_per_execution=3"],
     "num_steps=4 is not a multiple of config.train.steps_per_execution=3"),
    (["--config=experiments/nope.py"], "cannot load --config"),
    (["--config=experiments/digits.py", "--config=experiments/gauss2d.py"],
     "--config given 2 times ('experiments/digits.py', 'experiments/gauss2d.py'); pass one "
     "config file"),
    (["--config.train.log_every=0"],
     "config.train.log_every must be an integer >= 1; Received: 0"),
    (["--startup_timeout_s=0"], "--startup_timeout_s must be > 0 seconds; Received: 0.0"),
]
SUBPROCESS = [
    (["--strategy=mirrored", "--num_cpu_devices=2", "--config.train.global_batch_size=33"],
     "global_batch_size=33 is not divisible by the 2 replicas"),
    (["--strategy=mirrored", "--num_cpu_devices=4", "--config.model.sync_bn_group_size=3"],
     "config.model.sync_bn_group_size=3 does not divide the 4 replicas; valid: 0 (all) or "
     "1, 2, 4"),
    (["--strategy=tpu", "--tpu=local"], "--strategy=tpu: no usable TPU"),
    # Nobody listens on port 1: refused at once, not connect_to_cluster's endless wait.
    (["--strategy=tpu", "--tpu=grpc://127.0.0.1:1"], "--tpu='grpc://127.0.0.1:1': cannot connect"),
    (["--strategy=multi_worker_mirrored", "--collective=nccl"], "--collective=nccl needs GPUs"),
    (["--strategy=multi_worker_mirrored", "--cluster_resolver=slurm"],
     "SLURM_STEP_NODELIST is not set; run inside a Slurm job step"),
]


def bad_commands(workdir, cases, strategy=()):
    commands = []
    for args, _ in cases:
        # A --config in args replaces TINY's (naming two is an error of its own).
        tiny = [a for a in TINY if not (a.startswith("--config=") and
                                        any(b.startswith("--config=") for b in args))]
        commands.append(["-m", "tf_gan_scale.main", f"--workdir={workdir}", *tiny,
                         "--config.train.num_steps=4", *strategy, *args])
    return commands


def assert_bad(cases, procs, workdir, before):
    for (args, message), proc in zip(cases, procs):
        errors = [line for line in proc.stderr.splitlines() if line.startswith("error:")]
        assert proc.returncode == 2, (args, proc.stderr[-2000:])
        assert len(errors) == 1 and message in errors[0], (args, errors)
        assert "Traceback" not in proc.stderr, args
        assert tree_digest(workdir) == before, args


def test_bad_input_in_process_is_one_line_exit_2_and_leaves_the_workdir_alone(
        tiny_run, tmp_path):
    workdir = copy_run(tiny_run, tmp_path / "run")
    before = tree_digest(workdir)
    # The case's own --strategy (later on the command line) wins over one_device.
    commands = bad_commands(workdir, IN_PROCESS, ["--strategy=one_device"])
    assert_bad(IN_PROCESS, [run_in_process(c) for c in commands], workdir, before)
    proc = run_in_process(["tools/sample.py", f"--workdir={tmp_path}/none", "--output=x.npy"])
    assert proc.returncode == 2 and "no training run in" in proc.stderr
    # A new run that fails on its data (a batch larger than the source; the dataset itself
    # is built lazily, after the workdir is written) creates no workdir at all.
    fresh = tmp_path / "fresh"
    [proc] = [run_in_process(c) for c in bad_commands(fresh, [(
        ["--strategy=one_device", "--config.train.global_batch_size=4000"], "")])]
    assert proc.returncode == 2 and proc.stderr.strip().splitlines()[-1] == (
        "error: global batch 4000 must be in [1, 1797], the size of embedded:digits")
    assert not fresh.exists()


@pytest.mark.slow
def test_bad_input_of_the_real_binary_is_one_line_exit_2_and_leaves_the_workdir_alone(
        tiny_run, tmp_path):
    workdir = copy_run(tiny_run, tmp_path / "run")
    before = tree_digest(workdir)
    cases = SUBPROCESS + IN_PROCESS[:2]  # And two of the others: the process's exit code.
    assert_bad(cases, run_cmds(bad_commands(workdir, cases)), workdir, before)
    proc = run_cmd(["tools/sample.py", f"--workdir={tmp_path}/none", "--output=x.npy"])
    assert proc.returncode == 2 and "no training run in" in proc.stderr


@pytest.mark.slow
@pytest.mark.parametrize("strategy", [["--strategy=one_device"],
                                      ["--strategy=mirrored", "--num_cpu_devices=2"]])
def test_non_finite_training_stops_with_one_line_and_keeps_the_last_good_checkpoint(
        tmp_path, strategy):
    # Adam at lr 1e8 blows D up: in step 3 its state overflows (at lr 1e9 a moving variance
    # of D's batch norm was inf from step 1 while the loss and gradients stayed finite
    # until step 5), after ckpt-1 and ckpt-2 were written; the same step on 1 device and 2
    # replicas, as the checks see global values. Every float variable of ckpt-2 is finite.
    workdir = tmp_path / "run"
    proc = run_cmd(["-m", "tf_gan_scale.main", f"--workdir={workdir}", *TINY,
                    "--config.train.num_steps=20", "--config.train.checkpoint_every=1",
                    "--config.train.d_optimizer.learning_rate=1e8", *strategy])
    assert proc.returncode == 1, proc.stderr[-3000:]
    errors_ = [line for line in proc.stderr.splitlines() if line.startswith("error:")]
    assert errors_ == [
        "error: non-finite discriminator loss, gradients or weights in generator step 3; "
        "training "
        f"stopped before saving it; latest checkpoint: {workdir}/checkpoints/ckpt-2"]
    assert "Traceback" not in proc.stderr
    reader = tf.train.load_checkpoint(str(workdir / "checkpoints" / "ckpt-2"))
    for name in reader.get_variable_to_shape_map():
        value = reader.get_tensor(name)
        if np.issubdtype(np.asarray(value).dtype, np.floating):
            assert np.isfinite(value).all(), name
    assert not glob.glob(str(workdir / "checkpoints" / "ckpt-3*"))


@pytest.mark.slow
def test_non_finite_training_on_two_workers_names_each_workers_log(tmp_path):
    # The same blow-up on 2 workers: every worker stops at the same step (the checks see
    # global values) and its line, prefixed once, names its own log file, whose last
    # line it is.
    workdir = tmp_path / "run"
    launcher = Launcher(tmp_path, [f"--workdir={workdir}", *TINY,
                                   "--config.train.num_steps=20",
                                   "--config.train.checkpoint_every=1",
                                   "--config.train.d_optimizer.learning_rate=1e8"])
    assert launcher.finish() == 1, launcher.text()[-3000:]
    steps = set()
    for i in (0, 1):
        log = workdir / "logs" / f"worker_{i}.log"
        # (Not at a line start: worker 0's progress bar on stdout ends without one.)
        found = re.findall(rf"\[worker {i}\] error: non-finite discriminator loss, gradients or "
                           rf"weights in generator step (\d+); training stopped before saving "
                           rf"it; latest checkpoint: \S+ckpt-\d+; last lines: "
                           rf"{re.escape(str(log))}$",
                           launcher.text(), re.MULTILINE)
        assert len(found) == 1, launcher.text()[-3000:]
        steps.add(found[0])
        assert log.read_text().splitlines()[-1].startswith(f"[worker {i}] error: non-finite")
    assert len(steps) == 1


@pytest.mark.slow
def test_the_binary_uses_the_last_of_a_repeated_tuple_override(tmp_path):
    proc = run_cmd(["-m", "tf_gan_scale.main", f"--workdir={tmp_path}", *TINY,
                    "--config.model.g_channels=(8,8,8)", "--config.train.num_steps=1"])
    assert proc.returncode == 0, proc.stderr[-2000:]
    run = json.loads((tmp_path / "run.json").read_text())
    assert run["config"]["model"]["g_channels"] == [8, 8, 8]  # Not TINY's + these six.


def test_a_repeated_config_override_means_its_last_value():
    # ml_collections concatenated a repeated tuple override into six widths.
    from tf_gan_scale import cli
    argv = ["main", "--config=c.py", "--config.model.g_channels=(32,16,8)", "--workdir=w",
            "--config.train.num_steps=3", "--config.model.g_channels=(16,8,4)"]
    assert cli.last_override_wins(argv) == [
        "main", "--config=c.py", "--workdir=w", "--config.train.num_steps=3",
        "--config.model.g_channels=(16,8,4)"]
