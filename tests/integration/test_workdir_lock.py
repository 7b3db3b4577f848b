"""Two runs on one workdir (issue 49; tf_gan_scale/training/run_lock.py), with real
processes: a second run while the first trains is refused in one line (exit 2) and the
first finishes unharmed; a kill -9'd holder is taken over and its run resumed; a second
cluster is refused by every one of its workers, none hangs. The decision logic itself:
tests/training/test_run_lock.py (default tier)."""

import contextlib
import json
import os
import re
import signal
import subprocess
import sys
import time

import pytest

from conftest import REPO, TINY, run_cmd
from helpers.mw_helpers import ENV, Launcher
from tf_gan_scale.training import run_lock

pytestmark = pytest.mark.slow

STEPS = 300  # Long enough that the first run still trains while the second starts.


def command(workdir, *extra):
    return ["-m", "tf_gan_scale.main", f"--workdir={workdir}", *TINY, "--strategy=one_device",
            f"--config.train.num_steps={STEPS}", "--config.train.checkpoint_every=10",
            *extra]


def start(workdir, log):
    """The binary in the background, its output in `log`."""
    return subprocess.Popen([sys.executable, *command(workdir)], cwd=REPO, env=ENV,
                            stdout=log, stderr=subprocess.STDOUT)


def wait_for(what, proc, timeout=120):
    deadline = time.monotonic() + timeout
    while not what():
        assert proc.poll() is None and time.monotonic() < deadline, "the first run ended"
        time.sleep(0.2)


@contextlib.contextmanager
def training(workdir, log):
    """The first run (`start`), yielded once it has saved ckpt-10 (so it holds the
    workdir and trains on); killed on the way out if it still runs."""
    first = start(workdir, log)
    try:
        wait_for(lambda: os.path.exists(workdir / "checkpoints" / "ckpt-10.index"), first)
        yield first
    finally:
        if first.poll() is None:
            first.kill()
            first.wait()


def holder(workdir):
    with open(workdir / run_lock.LOCK_FILE) as f:
        return json.load(f)


def checkpoints(workdir):
    return sorted(int(m.group(1)) for f in os.listdir(workdir / "checkpoints")
                  if (m := re.fullmatch(r"ckpt-(\d+)\.index", f)))


def test_a_second_run_is_refused_naming_the_first_which_finishes_unharmed(tmp_path):
    workdir = tmp_path / "run"
    with open(tmp_path / "first.log", "w+") as log:
        with training(workdir, log) as first:
            pid = holder(workdir)["pid"]
            second = run_cmd(command(workdir, "--config.seed=9"))
            assert first.poll() is None, "the first run ended before the second was refused"
            lines = second.stderr.strip().splitlines()
            assert second.returncode == 2, second.stderr[-3000:]
            assert lines[-1].startswith(f"error: --workdir={workdir} is in use by another run "
                                        f"(host "), lines[-1]
            assert f", pid {pid}, started " in lines[-1] and "main.py --workdir=" in lines[-1]
            assert lines[-1].endswith("valid: wait for it to finish, stop it, or use "
                                      "another --workdir")
            assert first.wait(300) == 0
        log.seek(0)
        out = log.read()
    # One consistent history: the first run's, to its last step, and its config (seed 0).
    assert f"finished at step {STEPS}" in out, out[-3000:]
    assert not re.search(r"^(\[\w+ \d+\] )?error:|Traceback", out, re.M), out[-3000:]
    assert checkpoints(workdir)[-1] == STEPS
    with open(workdir / "run.json") as f:
        assert json.load(f)["config"]["seed"] == 0
    assert not os.path.exists(workdir / run_lock.LOCK_FILE)  # Released at the end.


def test_a_killed_holder_is_taken_over_and_its_run_resumed(tmp_path):
    workdir = tmp_path / "run"
    with open(tmp_path / "first.log", "w") as log:
        with training(workdir, log) as first:
            pid = holder(workdir)["pid"]
            first.send_signal(signal.SIGKILL)  # (The warm-start client passes it on.)
            first.wait()
    deadline = time.monotonic() + 30
    while run_lock.pid_alive(pid):
        assert time.monotonic() < deadline, f"the killed run's process {pid} still runs"
        time.sleep(0.1)
    assert holder(workdir)["pid"] == pid  # kill -9 left its record behind.
    began = time.monotonic()
    second = run_cmd(command(workdir))
    assert second.returncode == 0, second.stderr[-3000:]
    taking = [line for line in second.stderr.splitlines() if "taking over" in line]
    assert len(taking) == 1 and f"pid {pid}," in taking[0], taking
    assert re.search(r"resumed \S+ckpt-\d+ at step \d+ of", second.stderr)
    assert checkpoints(workdir)[-1] == STEPS
    assert not os.path.exists(workdir / run_lock.LOCK_FILE)
    assert time.monotonic() - began < 200  # Not blocked (the same host sees the pid dead).


# Workers of tf.distribute (the chief's decision reaches them by an all-reduce) and
# DTensor clients (by mesh.from_chief).
@pytest.mark.parametrize("mesh", [None, "batch:2,model:1"], ids=["workers", "clients"])
def test_every_task_of_a_second_cluster_is_refused_and_none_hangs(tmp_path, mesh):
    workdir = tmp_path / "run"
    lock = run_lock.acquire(workdir)  # The live run: this process.
    try:
        began = time.monotonic()
        launcher = Launcher(tmp_path, [f"--workdir={workdir}", *TINY,
                                       "--config.train.num_steps=10"], mesh=mesh)
        code = launcher.finish(timeout=240)
        text = launcher.text()
        assert code == 2, text[-3000:]
        assert time.monotonic() - began < 240
        for task in ("client 0", "client 1") if mesh else ("worker 0", "worker 1"):
            lines = [line for line in text.splitlines()
                     if line.startswith(f"[{task}] error: --workdir={workdir} is in "
                                        f"use by another run (host ")]
            assert len(lines) == 1 and f"pid {os.getpid()}," in lines[0], text[-3000:]
        assert os.listdir(workdir) == [run_lock.LOCK_FILE]  # Nothing written by them.
    finally:
        lock.release()


def test_a_run_ended_by_sigterm_or_a_nan_releases_the_workdir(tmp_path):
    """Exit 143 (preempted: saved, restart me) and exit 1 (non-finite) leave no record, so
    the restart or the next command finds the workdir free at once."""
    workdir = tmp_path / "run"
    with open(tmp_path / "first.log", "w") as log:
        with training(workdir, log) as first:
            first.send_signal(signal.SIGTERM)
            assert first.wait(120) == 143
    assert not os.path.exists(workdir / run_lock.LOCK_FILE)
    nan = run_cmd([*command(tmp_path / "nan"), "--config.train.d_optimizer.learning_rate=1e8"])
    assert nan.returncode == 1 and "error: non-finite" in nan.stderr, nan.stderr[-3000:]
    assert not os.path.exists(tmp_path / "nan" / run_lock.LOCK_FILE)
