"""tools/export.py: the generator as a SavedModel, served without tf_gan_scale."""

import hashlib
import json
import os
import shutil
import textwrap

import numpy as np
import pytest

from conftest import TINY_RUN_STEPS, run_cmd, run_in_process
from tf_gan_scale import errors, latents
from tf_gan_scale.artifacts import export

# Loads the SavedModel in a process where importing tf_gan_scale (or any more of Keras
# than TensorFlow itself imports) fails, serves the latents of argv[2] (TF2 and TF1
# loaders) and writes the images to argv[3].
SERVE = textwrap.dedent("""
    import importlib.abc, sys
    BLOCKED = {"tf_gan_scale"}
    class Block(importlib.abc.MetaPathFinder):
        def find_spec(self, name, path=None, target=None):
            if name.split(".")[0] in BLOCKED:
                raise ImportError("blocked: " + name)
    sys.meta_path.insert(0, Block())
    try:
        import tf_gan_scale
        raise SystemExit("tf_gan_scale importable")
    except ImportError:
        pass
    import numpy as np
    import tensorflow as tf  # TensorFlow imports keras itself ...
    BLOCKED.add("keras")  # ... but loading and serving may import nothing more of it.
    model = tf.saved_model.load(sys.argv[1])
    out = model.signatures["serving_default"](z=tf.constant(np.load(sys.argv[2])))
    assert list(out) == ["images"], list(out)
    one = model.signatures["serving_default"](z=tf.constant(np.load(sys.argv[2])[:1]))
    # Inference mode: a row does not depend on the rest of its batch (moving statistics).
    np.testing.assert_allclose(one["images"].numpy(), out["images"].numpy()[:1], atol=1e-6)
    np.save(sys.argv[3], out["images"].numpy())
    # The TF1 session loader, as TF Serving and `saved_model_cli run` load a SavedModel.
    with tf.Graph().as_default(), tf.compat.v1.Session() as sess:
        meta = tf.compat.v1.saved_model.load(sess, ["serve"], sys.argv[1])
        sig = meta.signature_def["serving_default"]
        v1 = sess.run(sig.outputs["images"].name,
                      {sig.inputs["z"].name: np.load(sys.argv[2])})
    np.testing.assert_allclose(v1, out["images"].numpy(), atol=1e-6)
    assert not [m for m in sys.modules if m.startswith("tf_gan_scale")]
    print(int(model.latent_dim.numpy()), int(model.step.numpy()))
""")



def digest(root):
    h = hashlib.sha256()
    for dirpath, dirs, files in sorted(os.walk(root)):
        dirs.sort()
        for name in sorted(files):
            path = os.path.join(dirpath, name)
            h.update(os.path.relpath(path, root).encode())
            with open(path, "rb") as f:
                h.update(f.read())
    return h.hexdigest()


def export_cmd(workdir, output, run=run_cmd):
    return run(["tools/export.py", f"--workdir={workdir}", f"--output={output}"])


@pytest.fixture(scope="module")
def exported(tiny_run, tmp_path_factory):
    """(workdir, export dir, the tool's JSON line) of the shared tiny run (read only)."""
    root = tmp_path_factory.mktemp("export")
    workdir, output = tiny_run, root / "exports" / "generator"  # Parent absent too.
    proc = export_cmd(workdir, output)
    assert proc.returncode == 0, proc.stderr[-3000:]
    lines = proc.stdout.strip().splitlines()
    assert len(lines) == 1, proc.stdout
    return workdir, output, json.loads(lines[0])


@pytest.mark.slow
def test_export_serves_what_sample_writes(exported, tmp_path):
    workdir, output, info = exported
    step = TINY_RUN_STEPS
    assert info == {"step": step, "checkpoint": str(workdir / "checkpoints" / f"ckpt-{step}"),
                    "output": str(output), "latent_dim": 16,
                    "output_shape": [None, 8, 8, 1]}
    assert os.path.isfile(output / "saved_model.pb")
    assert os.listdir(output.parent) == ["generator"]  # No temp dir left.

    # The framework's samples for seed 3 (inference mode, latest checkpoint) ...
    proc = run_cmd(["tools/sample.py", f"--workdir={workdir}", f"--output={tmp_path / 's.npy'}",
                    "--seed=3", "--num_samples=5"])
    assert proc.returncode == 0, proc.stderr[-3000:]
    expected = np.load(tmp_path / "s.npy")
    # ... equal the served images for the same latents, without tf_gan_scale.
    np.save(tmp_path / "z.npy", latents.fixed(3, 5, 16).numpy())
    # A cold interpreter: a warm one (tests/helpers/warm_start.py) has keras imported already,
    # and the check that serving imports nothing more of it would pass vacuously.
    proc = run_cmd(["-c", SERVE, str(output), str(tmp_path / "z.npy"),
                    str(tmp_path / "served.npy")], env={"TF_GAN_SCALE_COLD_START": "1"})
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.split() == ["16", str(step)]
    served = np.load(tmp_path / "served.npy")
    assert served.dtype == np.float32 and served.shape == expected.shape == (5, 8, 8, 1)
    np.testing.assert_allclose(served, expected, rtol=0, atol=1e-5)


def assert_bad(proc, *words):
    assert proc.returncode == 2, (proc.stdout, proc.stderr[-3000:])
    lines = [line for line in proc.stderr.splitlines() if line.startswith("error:")]
    assert len(lines) == 1, proc.stderr[-3000:]
    assert proc.stdout == ""
    for word in words:
        assert word in lines[0], lines[0]


def test_bad_input_one_line_exit_2_nothing_written(tiny_run, tmp_path):
    # In this process (conftest.run_in_process): no process start per case.
    workdir, output = tiny_run, tmp_path / "exports" / "generator"
    output.mkdir(parents=True)
    (output / "saved_model.pb").write_bytes(b"an earlier export")
    before = digest(output)
    # Output exists and is not empty: never overwritten.
    assert_bad(export_cmd(workdir, output, run_in_process), "not empty")
    assert digest(output) == before and os.listdir(output.parent) == ["generator"]
    # No run in the workdir.
    assert_bad(export_cmd(tmp_path / "nowhere", tmp_path / "a", run_in_process),
               "no training run")
    # A run without a checkpoint.
    os.makedirs(tmp_path / "fresh")
    shutil.copy(workdir / "run.json", tmp_path / "fresh" / "run.json")
    assert_bad(export_cmd(tmp_path / "fresh", tmp_path / "b", run_in_process), "no checkpoint")
    assert sorted(os.listdir(tmp_path)) == ["exports", "fresh"]
    assert_bad(run_in_process(["tools/export.py", f"--workdir={workdir}"]), "--output")


@pytest.mark.slow
def test_bad_input_of_the_real_tool_exits_2_and_keeps_an_export(exported, tmp_path):
    workdir, output, _ = exported
    before = digest(output)
    assert_bad(export_cmd(workdir, output), "not empty")
    assert digest(output) == before and os.listdir(output.parent) == ["generator"]
    assert_bad(export_cmd(tmp_path / "nowhere", tmp_path / "a"), "no training run")
    assert os.listdir(tmp_path) == []


def test_library_rejects_before_writing(tmp_path):
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "keep.txt").write_text("mine")
    with pytest.raises(errors.ConfigError, match="not empty"):
        export.export_generator(str(tmp_path), str(tmp_path / "out"))
    with pytest.raises(errors.ConfigError, match="no training run"):
        export.export_generator(str(tmp_path / "nowhere"), str(tmp_path / "new"))
    assert sorted(os.listdir(tmp_path)) == ["out"]
    assert os.listdir(tmp_path / "out") == ["keep.txt"]
