"""tools/keras_file.py: training-run checkpoints <-> .keras files, both ways, exactly."""

import json

import numpy as np
import pytest

from conftest import TINY, TINY_RUN_STEPS, copy_run, run_cmd, run_cmds, run_in_process
from helpers.mw_helpers import assert_same_checkpoint, checkpoint_arrays


def tool(*args, run=run_cmd):
    return run(["tools/keras_file.py", *args])


def one_json_line(proc):
    assert proc.returncode == 0, proc.stderr[-3000:]
    lines = proc.stdout.strip().splitlines()
    assert len(lines) == 1, proc.stdout
    return json.loads(lines[0])


def train(workdir, steps):
    proc = run_cmd(["-m", "tf_gan_scale.main", f"--workdir={workdir}", *TINY,
                    f"--config.train.num_steps={steps}"])
    assert proc.returncode == 0, proc.stderr[-3000:]


@pytest.mark.slow
def test_checkpoint_to_keras_and_back_resumes_as_if_never_converted(tiny_run, tmp_path):
    # tiny_run: the same command straight through 10 steps (read only).
    run, copy, straight = tmp_path / "run", tmp_path / "copy", tiny_run
    assert TINY_RUN_STEPS == 10
    train(run, 5)
    info = one_json_line(tool(f"--workdir={run}", f"--to_keras={tmp_path / 'gan.keras'}"))
    assert info["step"] == 5 and info["checkpoint"].endswith("ckpt-5")
    info = one_json_line(tool(f"--from_keras={tmp_path / 'gan.keras'}", f"--workdir={copy}",
                              *TINY))
    assert info["step"] == 5 and info["checkpoint"].endswith("ckpt-5")
    # The round trip holds every variable of the checkpoint, bit for bit ...
    assert_same_checkpoint(checkpoint_arrays(copy, 5), checkpoint_arrays(run, 5), atol=0)
    # ... so resuming from the converted run equals never stopping.
    train(copy, 10)
    assert_same_checkpoint(checkpoint_arrays(copy, 10), checkpoint_arrays(straight, 10),
                           atol=1e-6)
    # And the .keras file samples what the checkpoint samples.
    sample = run_cmd(["tools/sample.py", f"--workdir={run}", "--num_samples=4",
                      f"--output={tmp_path / 's.npy'}"])
    assert sample.returncode == 0, sample.stderr[-2000:]
    load = run_cmd(["-c", "import tf_gan_scale, keras, numpy as np; from tf_gan_scale import "
                    "latents; m = keras.models.load_model(%r); np.save(%r, m.predict("
                    "latents.fixed(0, 4, m.latent_dim).numpy(), verbose=0))"
                    % (str(tmp_path / "gan.keras"), str(tmp_path / "k.npy"))])
    assert load.returncode == 0, load.stderr[-2000:]
    np.testing.assert_allclose(np.load(tmp_path / "k.npy"), np.load(tmp_path / "s.npy"),
                               atol=1e-6)


def bad_cases(run, keras_file, tmp_path):
    """(args, message) of each kind of bad input, for a run with checkpoints and its
    .keras file."""
    import keras
    keras.Sequential([keras.Input((2,)), keras.layers.Dense(1)]).save(
        tmp_path / "not_a_gan.keras")
    (tmp_path / "text.keras").write_text("hello")
    return [
        ([f"--workdir={run}", f"--to_keras={keras_file}"], "already exists"),
        ([f"--workdir={run}", f"--to_keras={tmp_path / 'gan.h5'}"], "ending in .keras"),
        ([f"--workdir={tmp_path / 'none'}", f"--to_keras={tmp_path / 'x.keras'}"],
         "no training run"),
        ([f"--from_keras={keras_file}", f"--workdir={run}", *TINY], "already holds checkpoints"),
        ([f"--from_keras={keras_file}", f"--workdir={tmp_path / 'new'}"], "needs --config"),
        ([f"--from_keras={keras_file}", f"--workdir={tmp_path / 'new'}",
          *[a for a in TINY if "d_norm" not in a]],  # D without its batch norm.
         "discriminator does not match the config"),
        ([f"--from_keras={keras_file}", f"--workdir={tmp_path / 'new'}", *TINY,
          "--config.train.d_steps=0"], "d_steps"),
        ([f"--workdir={run}"], "exactly one of"),
        ([f"--from_keras={tmp_path / 'not_a_gan.keras'}", f"--workdir={tmp_path / 'new'}",
          *TINY], "holds a Sequential, not a tf_gan_scale GAN"),
        ([f"--from_keras={tmp_path / 'text.keras'}", f"--workdir={tmp_path / 'new'}", *TINY],
         "not a .keras file (not a zip archive)"),
    ]


def assert_bad(cases, procs, keras_file, before, tmp_path):
    for (args, message), proc in zip(cases, procs):
        assert proc.returncode == 2, (args, proc.stderr[-2000:])
        lines = proc.stderr.strip().splitlines()
        assert lines[-1].startswith("error: ") and message in lines[-1], (args, lines[-3:])
    assert keras_file.read_bytes() == before
    assert not (tmp_path / "new" / "checkpoints").exists()
    assert not (tmp_path / "x.keras").exists()


def test_bad_input_is_one_line_and_overwrites_nothing(tiny_run, tmp_path):
    # In this process (conftest.run_in_process): no process start per case. A copy of
    # tiny_run: a --from_keras case names it as the (refused) new workdir.
    run = copy_run(tiny_run, tmp_path / "run")
    keras_file = tmp_path / "gan.keras"
    one_json_line(tool(f"--workdir={run}", f"--to_keras={keras_file}", run=run_in_process))
    before = keras_file.read_bytes()
    cases = bad_cases(run, keras_file, tmp_path)
    procs = [tool(*args, run=run_in_process) for args, _ in cases]
    assert_bad(cases, procs, keras_file, before, tmp_path)


@pytest.mark.slow
def test_bad_input_of_the_real_tool_exits_2(tiny_run, tmp_path):
    run = copy_run(tiny_run, tmp_path / "run")
    keras_file = tmp_path / "gan.keras"
    one_json_line(tool(f"--workdir={run}", f"--to_keras={keras_file}", run=run_in_process))
    before = keras_file.read_bytes()
    cases = [bad_cases(run, keras_file, tmp_path)[i] for i in (0, 3)]  # One of each way.
    procs = run_cmds([["tools/keras_file.py", *args] for args, _ in cases])
    assert_bad(cases, procs, keras_file, before, tmp_path)
