"""training.record: run.json describes the checkpoints beside it, segment by segment; a
resume that changes their math is refused naming every key, unless the user allows it."""

import json
import os

import ml_collections
import pytest
import tensorflow as tf

from conftest import TINY, TINY_RUN_STEPS, copy_run, run_in_process, tree_digest
from tf_gan_scale import configs, errors
from tf_gan_scale.training import prepare, record


def _toy():
    c = configs.base()
    c.model = ml_collections.ConfigDict({"name": "mlp", "latent_dim": 2, "hidden": (8, 8)})
    c.data.source, c.train.global_batch_size, c.train.num_steps = "toy:grid25", 16, 10
    return c


def _trained(c, workdir, step=4):
    """A workdir as a run of `c` leaves it at `step`: a checkpoint and the record."""
    p = prepare.prepare_run(c, workdir, num_replicas=1)
    p.model.step.assign(step)
    tf.train.CheckpointManager(p.checkpoint, os.path.join(workdir, "checkpoints"), 1).save(
        checkpoint_number=step)
    record.write(workdir, c, p.source.shape, p.source, segments=p.segments)
    return p


def _save(prepared, config, workdir, step):
    """A checkpoint of `prepared`'s model at `step` and the record, as a run saves them."""
    prepared.model.step.assign(step)
    tf.train.CheckpointManager(prepared.checkpoint, os.path.join(workdir, "checkpoints"),
                               5).save(checkpoint_number=step)
    record.write(workdir, config, prepared.source.shape, prepared.source,
                 segments=prepared.segments)


def test_math_keys_are_refused_with_both_values_and_free_keys_pass():
    old = record.as_json(_toy())
    new = _toy()
    new.seed, new.train.num_steps, new.train.log_every = 9, 50, 5
    new.train.d_optimizer.learning_rate = 2e-4
    diff = record.changes(old, record.as_json(new))
    assert diff == {"seed": (0, 9), "train.num_steps": (10, 50), "train.log_every": (100, 5),
                    "train.d_optimizer.learning_rate": (1e-4, 2e-4)}
    flat = {"train.lr_decay": "none"}
    assert [k for k in diff if not record.is_free(k, flat)] == [
        "seed", "train.d_optimizer.learning_rate"]
    # A schedule that ends at num_steps makes the run's length part of its math.
    assert not record.is_free("train.num_steps", {"train.lr_decay": "linear"})
    assert record.is_free("eval.every", flat) and record.is_free("parallel.mesh", flat)
    assert not record.is_free("evaluation", flat)  # A prefix matches whole parts only.


def test_a_changed_seed_or_model_is_refused_before_the_restore(tmp_path):
    c = _toy()
    _trained(c, str(tmp_path))
    before = tree_digest(tmp_path)
    c.seed, c.model.latent_dim = 9, 3  # The latent_dim alone would fail the restore.
    with pytest.raises(errors.ConfigError) as e:
        prepare.prepare_run(c, str(tmp_path), num_replicas=1)
    message = str(e.value)
    assert "\n" not in message
    assert "model.latent_dim: 2 -> 3" in message and "seed: 0 -> 9" in message
    assert "--allow_changes=model.latent_dim,seed" in message
    assert tree_digest(tmp_path) == before


def test_free_changes_and_allowed_ones_start_a_segment_at_the_resumed_step(tmp_path):
    c = _toy()
    first = _trained(c, str(tmp_path), step=4)
    assert first.segments == [{"step": 0, "config": record.as_json(c)}]
    c.train.num_steps = 20
    p = prepare.prepare_run(c, str(tmp_path), num_replicas=1)
    assert p.start == 4
    assert [s["step"] for s in p.segments] == [0, 4]
    assert p.segments[1]["changed"] == {"train.num_steps": [10, 20]}
    c.train.g_optimizer.learning_rate = 3e-4
    with pytest.raises(errors.ConfigError, match="train.g_optimizer.learning_rate"):
        prepare.prepare_run(c, str(tmp_path), num_replicas=1)
    p = prepare.prepare_run(c, str(tmp_path), num_replicas=1,
                            allowed_changes=["train.g_optimizer.learning_rate"])
    assert p.segments[1]["changed"]["train.g_optimizer.learning_rate"] == [1e-4, 3e-4]
    # Trained on under it to a checkpoint at 6: the same config again adds nothing, and
    # tools read each checkpoint with the config that trained it.
    _save(p, c, str(tmp_path), 6)
    again = prepare.prepare_run(c, str(tmp_path), num_replicas=1)
    assert again.segments == p.segments
    assert record.load(str(tmp_path))[0].train.g_optimizer.learning_rate == 3e-4
    assert record.load(str(tmp_path), 4)[0].train.g_optimizer.learning_rate == 1e-4
    assert record.load(str(tmp_path), 6)[0].train.g_optimizer.learning_rate == 3e-4


def test_a_fallback_past_a_segment_is_checked_against_the_config_that_trained_it(tmp_path):
    # Seed 0 to 4 and 8; resumed at 8 under seed 9 (allowed) to 12; then 8 and 12 are
    # damaged: the resume falls back to 4, which seed 0 trained. Seed 9 is a change
    # there, seed 0 is not, and the record drops the segment whose steps are retrained.
    c = _toy()
    p = _trained(c, str(tmp_path), step=4)
    _save(p, c, str(tmp_path), 8)
    c.seed = 9
    p = prepare.prepare_run(c, str(tmp_path), num_replicas=1, allowed_changes=["seed"])
    _save(p, c, str(tmp_path), 12)
    for step in (8, 12):
        with open(tmp_path / "checkpoints" / f"ckpt-{step}.data-00000-of-00001", "r+b") as f:
            f.truncate(8)
    with pytest.raises(errors.ConfigError, match="seed: 0 -> 9"):
        prepare.prepare_run(c, str(tmp_path), num_replicas=1)
    c.seed = 0
    p = prepare.prepare_run(c, str(tmp_path), num_replicas=1)
    assert p.start == 4 and [(s["step"], s["config"]["seed"]) for s in p.segments] == [(0, 0)]


def test_a_segment_that_trained_nothing_is_replaced(tmp_path):
    c = _toy()
    _trained(c, str(tmp_path), step=4)
    c.seed = 9  # Resumed at 4 under seed 9, stopped before its first checkpoint...
    p = prepare.prepare_run(c, str(tmp_path), num_replicas=1, allowed_changes=["seed"])
    record.write(str(tmp_path), c, p.source.shape, p.source, segments=p.segments)
    c.seed = 7  # ...then resumed at 4 again under seed 7: compared with seed 0's.
    with pytest.raises(errors.ConfigError, match="seed: 0 -> 7"):
        prepare.prepare_run(c, str(tmp_path), num_replicas=1)
    p = prepare.prepare_run(c, str(tmp_path), num_replicas=1, allowed_changes=["seed"])
    assert [(s["step"], s["config"]["seed"]) for s in p.segments] == [(0, 0), (4, 7)]


def test_a_key_only_one_config_has_is_a_change_unless_it_is_the_default():
    old = record.as_json(_toy())
    new = _toy()
    new.train.g_optimizer.beta_1 = 0.5  # An experiment file's own key: changes the math.
    assert record.changes(old, record.as_json(new)) == {
        "train.g_optimizer.beta_1": (record.ABSENT, 0.5)}
    del old["train"]["lecam_weight"]  # A key a newer version added, at its default: none.
    assert "train.lecam_weight" not in record.changes(old, record.as_json(_toy()))
    old["train"]["lecam_weight"] = 0.5  # Not the default: a change, both ways.
    assert record.changes(old, record.as_json(_toy()))["train.lecam_weight"] == (0.5, 0.0)


def test_allow_changes_must_name_keys_of_the_config(tmp_path):
    with pytest.raises(errors.ConfigError, match="train.sead"):
        record.check(_toy(), str(tmp_path), None, ["train.sead"])


def test_a_record_without_checkpoints_is_replaced(tmp_path):
    c = _toy()
    p = prepare.prepare_run(c, str(tmp_path), num_replicas=1)
    record.write(str(tmp_path), c, p.source.shape, p.source, segments=p.segments)
    c.seed = 3  # Nothing was trained under the old record.
    assert prepare.prepare_run(c, str(tmp_path), num_replicas=1).segments[0]["config"][
        "seed"] == 3


def test_the_binary_refuses_a_changed_seed_and_records_a_longer_run(tiny_run, tmp_path):
    workdir = copy_run(tiny_run, tmp_path / "run")
    before = tree_digest(workdir)
    base = ["-m", "tf_gan_scale.main", f"--workdir={workdir}", *TINY]
    proc = run_in_process([*base, f"--config.train.num_steps={TINY_RUN_STEPS}",
                           "--config.seed=9"])
    assert proc.returncode == 2, proc.stderr[-2000:]
    lines = proc.stderr.strip().splitlines()
    assert lines[-1].startswith("error: ") and "seed: 0 -> 9" in lines[-1], lines[-3:]
    assert tree_digest(workdir) == before  # Nothing restored, written or trained.
    # Allowed, the seed changes; the longer run (a free change) trains 5 more steps and
    # the record says from which step the new config holds.
    proc = run_in_process([*base, f"--config.train.num_steps={TINY_RUN_STEPS + 5}",
                           "--config.seed=9", "--allow_changes=seed"])
    assert proc.returncode == 0, proc.stderr[-2000:]
    with open(workdir / "run.json") as f:
        run = json.load(f)
    assert [s["step"] for s in run["segments"]] == [0, TINY_RUN_STEPS]
    assert run["segments"][1]["changed"] == {
        "seed": [0, 9], "train.num_steps": [TINY_RUN_STEPS, TINY_RUN_STEPS + 5]}
    assert run["segments"][0]["config"]["seed"] == 0
    assert run["config"]["seed"] == 9 and run["config"]["train"]["num_steps"] == 15
    assert tf.train.latest_checkpoint(str(workdir / "checkpoints")).endswith("ckpt-15")
