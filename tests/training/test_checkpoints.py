"""A damaged latest checkpoint (issue 49, training/checkpoints.py): a resume passes over
checkpoints that cannot be read, with one line naming the file and the steps lost, keeps
their files for inspection, refuses (exit 2, nothing changed) when none can be read; a
save that does not read back stops the run before it is recorded or old ones removed.

All on copies of the shared tiny run (conftest.tiny_run: ckpt-5 and ckpt-10 of 10 steps),
with real damaged files, in this process (conftest.run_in_process).
"""

import logging
import os

import numpy as np
import pytest
import tensorflow as tf

from conftest import TINY, TINY_RUN_STEPS, copy_run, run_in_process
from tf_gan_scale import errors, training
from tf_gan_scale.training import checkpoints

DATA, INDEX = "ckpt-10.data-00000-of-00001", "ckpt-10.index"


def break_checkpoint(ckpt_dir, kind, step=10):
    """Damages checkpoint ckpt-`step` in ckpt_dir as `kind` says; the file damaged."""
    data = os.path.join(ckpt_dir, f"ckpt-{step}.data-00000-of-00001")
    index = os.path.join(ckpt_dir, f"ckpt-{step}.index")
    if kind == "truncated":  # A full disk, a partial copy: the case.
        os.truncate(data, os.path.getsize(data) // 2)
    elif kind == "missing":
        os.remove(data)
    elif kind == "flipped":  # Bit rot: the sizes are right, a CRC is not.
        with open(data, "r+b") as f:
            f.seek(os.path.getsize(data) // 2)
            byte = f.read(1)[0]
            f.seek(-1, os.SEEK_CUR)
            f.write(bytes([byte ^ 0xFF]))
    elif kind == "truncated_index":
        os.truncate(index, 100)
        return os.path.basename(index)
    return os.path.basename(data)


def files(root):
    """{relative path: bytes} of every file under root."""
    out = {}
    for folder, _, names in os.walk(root):
        for name in names:
            path = os.path.join(folder, name)
            with open(path, "rb") as f:
                out[os.path.relpath(path, root)] = f.read()
    return out


def gan_values(model):
    """Every checkpointed variable's value, in a fixed order."""
    items = model.checkpoint_items()
    return [v.numpy() for name in sorted(items)
            for v in getattr(items[name], "variables", [items[name]])]


def resume(workdir, *extra):
    return run_in_process(["-m", "tf_gan_scale.main", f"--workdir={workdir}", *TINY,
                           f"--config.train.num_steps={TINY_RUN_STEPS}", *extra])


@pytest.mark.parametrize("kind", ["truncated", "missing", "flipped", "truncated_index"])
def test_restore_passes_over_an_unreadable_checkpoint(tiny_run, tmp_path, caplog, kind):
    # What prepare_run, tools/sample.py and tools/evaluate.py restore with.
    caplog.set_level(logging.WARNING)
    run = copy_run(tiny_run, tmp_path / "run")
    ckpt_dir = str(run / "checkpoints")
    broken = break_checkpoint(ckpt_dir, kind)
    before = files(run)
    config, shape, classes = training.load_run(run)
    model, clean = (training.build_gan(config, shape, classes) for _ in range(2))
    path = training.restore(ckpt_dir, tf.train.Checkpoint(**model.checkpoint_items()))
    assert path == os.path.join(ckpt_dir, "ckpt-5") and int(model.step.numpy()) == 5
    [line] = [r.getMessage() for r in caplog.records if "cannot be read" in r.getMessage()]
    assert line.startswith(f"checkpoint {ckpt_dir}/ckpt-10 cannot be read ({broken}: ")
    assert "resuming from ckpt-5: 5 steps will be trained again" in line
    # Exactly ckpt-5's state, although the failed read of ckpt-10 came first.
    tf.train.Checkpoint(**clean.checkpoint_items()).read(
        os.path.join(ckpt_dir, "ckpt-5")).assert_existing_objects_matched()
    for a, b in zip(gan_values(model), gan_values(clean), strict=True):
        np.testing.assert_array_equal(a, b)
    assert files(run) == before  # Restoring writes nothing.


def test_a_lost_state_file_resumes_from_the_files_on_disk(tiny_run, tmp_path):
    # Without checkpoints/checkpoint (a partial copy), the ckpt-* files are the run: a
    # fresh start would train from step 0 and save over them.
    run = copy_run(tiny_run, tmp_path / "run")
    os.remove(run / "checkpoints" / "checkpoint")
    config, shape, classes = training.load_run(run)
    model = training.build_gan(config, shape, classes)
    path = training.restore(str(run / "checkpoints"),
                            tf.train.Checkpoint(**model.checkpoint_items()))
    assert path == str(run / "checkpoints" / "ckpt-10") and int(model.step.numpy()) == 10


def test_tools_sample_the_newest_readable_checkpoint(tiny_run, tmp_path):
    # tools/sample.py (and evaluate, export, keras_file: sampling.load_generator and
    # keras_io restore the same way): the latest passed over, a damaged one named.
    run = copy_run(tiny_run, tmp_path / "run")
    break_checkpoint(run / "checkpoints", "flipped")
    proc = run_in_process(["tools/sample.py", f"--workdir={run}", f"--output={tmp_path}/s.npy",
                           "--num_samples=4"])
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert '"step": 5' in proc.stdout
    proc = run_in_process(["tools/evaluate.py", f"--workdir={run}", "--strategy=one_device",
                           f"--extractor={tmp_path}/unread.keras",  # Loaded after G.
                           f"--checkpoint={run}/checkpoints/ckpt-10"])
    assert proc.returncode == 2, proc.stderr[-3000:]
    [line] = proc.stderr.strip().splitlines()
    assert line.startswith(f"error: checkpoint {run}/checkpoints/ckpt-10 cannot be read "
                           f"({DATA}: ")


def readable(path):
    """True if every tensor of checkpoint `path` reads back."""
    reader = tf.train.load_checkpoint(path)
    return all(reader.get_tensor(name) is not None
               for name in reader.get_variable_to_dtype_map())


def test_resume_from_the_newest_readable_checkpoint(tiny_run, tmp_path, caplog):
    caplog.set_level(logging.INFO)  # absl's lines: logging records, in this process.
    run = copy_run(tiny_run, tmp_path / "run")
    ckpt_dir = run / "checkpoints"
    break_checkpoint(ckpt_dir, "truncated")
    broken = {name: files(ckpt_dir)[name] for name in (DATA, INDEX)}
    proc = resume(run)
    assert proc.returncode == 0, proc.stderr[-3000:]
    [line] = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING
              and "checkpoint" in r.getMessage()]
    assert line == (f"checkpoint {ckpt_dir}/ckpt-10 cannot be read ({DATA}: Read less bytes "
                    f"than requested); resuming from ckpt-5: 5 steps will be trained again "
                    f"(the damaged files are kept, in {ckpt_dir}/damaged)")
    assert f"resumed {ckpt_dir}/ckpt-5 at step 5 of 10" in caplog.text
    # The broken files kept byte for byte; the state file lists readable ones only.
    assert files(ckpt_dir / "damaged") == broken
    assert readable(str(ckpt_dir / "ckpt-10"))
    state = tf.train.get_checkpoint_state(str(ckpt_dir))
    assert [os.path.basename(p) for p in state.all_model_checkpoint_paths] == [
        "ckpt-5", "ckpt-10"]
    assert tf.train.load_checkpoint(str(ckpt_dir / "ckpt-10")).get_tensor(
        "g_optimizer/_iterations/.ATTRIBUTES/VARIABLE_VALUE") == 10


def test_no_readable_checkpoint_refuses_and_changes_nothing(tiny_run, tmp_path):
    run = copy_run(tiny_run, tmp_path / "run")
    break_checkpoint(run / "checkpoints", "truncated")
    break_checkpoint(run / "checkpoints", "missing", step=5)
    before = files(run)
    proc = resume(run)
    assert proc.returncode == 2, proc.stderr[-3000:]
    [line] = [x for x in proc.stderr.splitlines() if x.startswith("error:")]
    assert (f"no checkpoint in {run}/checkpoints can be read: ckpt-10 ({DATA}: Read less "
            f"bytes than requested); ckpt-5 (ckpt-5.data-00000-of-00001: missing)") in line
    assert "valid: another --workdir, or move these files away to start fresh" in line
    assert files(run) == before


@pytest.mark.slow  # Traces and trains 5 steps (~14 CPU-s); the default tier checks the
# manager itself (test_a_short_save_is_neither_recorded_nor_rotates).
def test_a_save_that_does_not_read_back_stops_the_run(tiny_run, tmp_path, monkeypatch):
    # The write of ckpt-15 ends short (as on a full disk): the run stops with one line
    # before ckpt-15 is recorded, and the rotation (keep 1) removes nothing.
    run = copy_run(tiny_run, tmp_path / "run")
    ckpt_dir = run / "checkpoints"
    check = checkpoints.check_written

    def short_write(path):
        data = f"{path}.data-00000-of-00001"
        os.truncate(data, os.path.getsize(data) - 100)
        check(path)

    monkeypatch.setattr(checkpoints, "check_written", short_write)
    before = {n: c for n, c in files(ckpt_dir).items() if "ckpt-15" not in n}
    proc = resume(run, "--config.train.num_steps=15", "--config.train.keep_checkpoints=1")
    assert proc.returncode == 1, proc.stderr[-3000:]
    [line] = [x for x in proc.stderr.splitlines() if x.startswith("error:")]
    assert (f"error: checkpoint {ckpt_dir}/ckpt-15 was written but cannot be read back "
            f"(ckpt-15.data-00000-of-00001: Read less bytes than requested)") in line
    assert {n: c for n, c in files(ckpt_dir).items() if "ckpt-15" not in n} == before
    assert tf.train.latest_checkpoint(str(ckpt_dir)) == str(ckpt_dir / "ckpt-10")


def test_save_check_passes_intact_checkpoints(tmp_path):
    # The check reads a checkpoint back whole: an intact save is recorded as usual.
    v = tf.Variable(tf.range(1000, dtype=tf.float32))
    manager = checkpoints.Manager(tf.train.Checkpoint(v=v), str(tmp_path), max_to_keep=1)
    assert manager.save(checkpoint_number=3) == str(tmp_path / "ckpt-3")
    assert tf.train.latest_checkpoint(str(tmp_path)) == str(tmp_path / "ckpt-3")
    with pytest.raises(errors.CheckpointError, match="ckpt-4.index: missing"):
        checkpoints.check_written(str(tmp_path / "ckpt-4"))


def test_a_short_save_is_neither_recorded_nor_rotates(tmp_path, monkeypatch):
    v = tf.Variable(tf.range(1000, dtype=tf.float32))
    manager = checkpoints.Manager(tf.train.Checkpoint(v=v), str(tmp_path), max_to_keep=1)
    manager.save(checkpoint_number=1)
    check = checkpoints.check_written

    def short_write(path):  # As on a full disk.
        data = f"{path}.data-00000-of-00001"
        os.truncate(data, os.path.getsize(data) - 100)
        check(path)

    monkeypatch.setattr(checkpoints, "check_written", short_write)
    with pytest.raises(errors.CheckpointError, match=r"ckpt-2 was written but cannot be "
                       r"read back \(ckpt-2\.data-00000-of-00001: "):
        manager.save(checkpoint_number=2)
    assert tf.train.latest_checkpoint(str(tmp_path)) == str(tmp_path / "ckpt-1")
    assert os.path.exists(tmp_path / "ckpt-1.index")  # Not rotated out by keep=1.


def test_setting_aside_rewrites_the_state_file_before_any_save(tiny_run, tmp_path):
    # Nothing to train (num_steps 5 <= the restored step): no save hides the state file.
    run = copy_run(tiny_run, tmp_path / "run")
    ckpt_dir = run / "checkpoints"
    break_checkpoint(ckpt_dir, "truncated")
    proc = resume(run, "--config.train.num_steps=5")
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert sorted(os.listdir(ckpt_dir / "damaged")) == sorted([DATA, INDEX])
    assert tf.train.latest_checkpoint(str(ckpt_dir)) == str(ckpt_dir / "ckpt-5")
    state = tf.train.get_checkpoint_state(str(ckpt_dir))
    assert [os.path.basename(p) for p in state.all_model_checkpoint_paths] == ["ckpt-5"]
