"""One run per workdir (issue 49; tf_gan_scale/training/run_lock.py): the decision logic
with real files in this process. Two real binaries on one workdir: the slow tier's
tests/integration/test_workdir_lock.py."""

import json
import logging
import os
import shutil
import signal
import socket
import threading
import time

import pytest
import tensorflow as tf

from conftest import TINY, TINY_RUN_STEPS, run_in_process, tree_digest
from tf_gan_scale.training import lock_storage, run_lock


@pytest.fixture(autouse=True)
def no_exit_on_a_lost_lock(monkeypatch):
    """A Lock leaked by a failing test would os._exit the test process at its next beat
    (run_lock._lost): here a lost lock only records itself."""
    lost = []
    monkeypatch.setattr(run_lock, "_lost", lambda workdir, found: lost.append(workdir))
    return lost


def dead_pid():
    """A pid no process of this machine has."""
    pid = 4_000_000
    while run_lock.pid_alive(pid):
        pid -= 1
    return pid


def write_record(workdir, *, pid, space, age=0.0, host="elsewhere", pid_start=None):
    """A run.lock as another run would have left it, its heartbeat `age` seconds old."""
    os.makedirs(workdir, exist_ok=True)
    path = os.path.join(workdir, run_lock.LOCK_FILE)
    with open(path, "w") as f:
        json.dump({"host": host, "pid": pid, "started": "2026-01-01T00:00:00+00:00",
                   "command": "python -m tf_gan_scale.main --workdir=W", "token": "theirs",
                   "space": space, "pid_start": pid_start}, f)
    then = time.time() - age
    os.utime(path, (then, then))
    return path


def token(workdir):
    with open(os.path.join(workdir, run_lock.LOCK_FILE)) as f:
        return json.load(f)["token"]


def test_a_live_holder_is_refused_by_name_and_keeps_its_lock(tmp_path):
    lock = run_lock.acquire(tmp_path)
    try:
        with pytest.raises(run_lock.InUseError) as e:
            run_lock.acquire(tmp_path)
        line = str(e.value)
        assert line.startswith(f"--workdir={tmp_path} is in use by another run (host "
                               f"{socket.gethostname()}, pid {os.getpid()}, started ")
        assert "command " in line and "last heartbeat 0s ago" in line and "\n" not in line
        assert line.endswith("valid: wait for it to finish, stop it, or use another --workdir")
        with open(tmp_path / run_lock.LOCK_FILE) as f:
            assert json.load(f)["pid"] == os.getpid()  # The holder's record is untouched.
    finally:
        lock.release()
    assert not os.path.exists(tmp_path / run_lock.LOCK_FILE)  # Released: removed.
    run_lock.acquire(tmp_path).release()  # And free again.


def test_a_dead_pid_on_this_machine_is_taken_over_at_once_with_one_line(tmp_path, caplog):
    write_record(tmp_path, pid=dead_pid(), space=run_lock.space(), host=socket.gethostname())
    caplog.set_level(logging.WARNING)
    start = time.monotonic()
    lock = run_lock.acquire(tmp_path)
    try:
        assert time.monotonic() - start < 1.0  # No waiting for the heartbeat to age.
        assert token(tmp_path) != "theirs"
        lines = [r.getMessage() for r in caplog.records if "taking over" in r.getMessage()]
        assert len(lines) == 1 and f"--workdir={tmp_path}: taking over from a run that is " \
            f"gone (host {socket.gethostname()}, pid {dead_pid()}" in lines[0]
    finally:
        lock.release()


def test_a_live_holder_on_this_machine_stays_live_however_old_its_heartbeat(tmp_path):
    # A stopped or suspended run (SIGSTOP, Slurm's suspend) beats no more but lives: its
    # process says so, not its heartbeat's age. Its start time tells a reused pid apart.
    here = dict(space=run_lock.space(), host=socket.gethostname(), age=3600.0)
    write_record(tmp_path, pid=os.getpid(), pid_start=run_lock.process_start(os.getpid()),
                 **here)
    with pytest.raises(run_lock.InUseError, match="last heartbeat 3600s ago"):
        run_lock.acquire(tmp_path)
    write_record(tmp_path, pid=os.getpid(),
                 pid_start=run_lock.process_start(os.getpid()) - 1, **here)
    run_lock.acquire(tmp_path).release()  # Another process of this pid: gone.


def test_the_holder_refreshes_its_heartbeat(tmp_path):
    lock = run_lock.acquire(tmp_path, heartbeat_s=0.05)
    try:
        path = tmp_path / run_lock.LOCK_FILE
        old = time.time() - 100
        os.utime(path, (old, old))
        deadline = time.monotonic() + 5
        while os.stat(path).st_mtime < old + 50 and time.monotonic() < deadline:
            time.sleep(0.02)
        assert os.stat(path).st_mtime > time.time() - 5
    finally:
        lock.release()


def test_sigterm_before_training_releases_the_workdir_and_exits_143(tmp_path):
    before = signal.getsignal(signal.SIGTERM)
    with pytest.raises(SystemExit) as e:
        with run_lock.Claim(tmp_path) as claim:
            claim.acquire()
            assert os.path.exists(tmp_path / run_lock.LOCK_FILE)
            signal.raise_signal(signal.SIGTERM)
            time.sleep(1)  # The handler runs at the next bytecode, in this thread.
    assert e.value.code == 143
    assert not os.path.exists(tmp_path / run_lock.LOCK_FILE)
    assert signal.getsignal(signal.SIGTERM) is before


def test_a_stale_heartbeat_of_another_host_is_taken_over(tmp_path):
    write_record(tmp_path, pid=os.getpid(), space="elsewhere/boot/pid:[1]",
                 age=run_lock.STALE_S + 5)  # A live-looking pid: of another machine.
    lock = run_lock.acquire(tmp_path)
    assert token(tmp_path) != "theirs"
    lock.release()


def test_another_hosts_fresh_heartbeat_is_watched_live_if_it_moves_gone_if_not(tmp_path):
    path = write_record(tmp_path, pid=1, space="elsewhere/boot/pid:[1]")
    stop = threading.Event()

    def beat():  # The other host's heartbeat thread.
        while not stop.wait(0.2):
            os.utime(path)

    beater = threading.Thread(target=beat)
    beater.start()
    try:
        start = time.monotonic()
        with pytest.raises(run_lock.InUseError, match="host elsewhere, pid 1,"):
            run_lock.acquire(tmp_path, stale_s=30)
        assert time.monotonic() - start < 5  # Refused once it moved, not after 30 s.
    finally:
        stop.set()
        beater.join()
    start = time.monotonic()  # Now silent: gone after stale_s of watching.
    lock = run_lock.acquire(tmp_path, stale_s=2)
    assert 1.5 < time.monotonic() - start < 10 and token(tmp_path) != "theirs"
    lock.release()


def test_two_takers_of_a_stale_lock_one_wins_the_other_is_refused(tmp_path):
    for round_ in range(10):
        workdir = tmp_path / str(round_)
        write_record(workdir, pid=dead_pid(), space=run_lock.space())
        barrier, results = threading.Barrier(2), []

        def take():
            barrier.wait()
            try:
                results.append(run_lock.acquire(workdir))
            except run_lock.InUseError as e:
                results.append(e)

        threads = [threading.Thread(target=take) for _ in range(2)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        locks = [r for r in results if isinstance(r, run_lock.Lock)]
        assert len(locks) == 1, results  # The loser sees the winner (this pid): live.
        assert len(os.listdir(workdir)) == 1  # run.lock alone: no file aside left over.
        locks[0].release()


def test_a_late_taker_puts_back_the_record_it_moved_aside_by_mistake(tmp_path):
    write_record(tmp_path, pid=dead_pid(), space=run_lock.space())
    store = run_lock.storage(tmp_path)
    _, _, stale_key = store.read()  # What the late taker judged gone...
    winner = run_lock.acquire(tmp_path)  # ...before another taker replaced it.
    mine = token(tmp_path)
    assert store.take(stale_key) is False
    assert token(tmp_path) == mine and os.listdir(tmp_path) == [run_lock.LOCK_FILE]
    winner.release()


def test_release_removes_only_its_own_record_and_a_lost_lock_is_noticed(tmp_path):
    lost = []
    lock = run_lock.acquire(tmp_path, heartbeat_s=0.1,
                            on_lost=lambda workdir, found: lost.append(found[0]["token"]))
    # Another run took it over (as after this one's heartbeat stalled past STALE_S).
    os.remove(tmp_path / run_lock.LOCK_FILE)
    write_record(tmp_path, pid=1, space="elsewhere/boot/pid:[1]")
    deadline = time.monotonic() + 5
    while not lost and time.monotonic() < deadline:
        time.sleep(0.05)
    assert lost == ["theirs"]
    lock.release()
    assert token(tmp_path) == "theirs"  # The other run's record stays.


def test_the_other_tasks_of_a_cluster_follow_the_chiefs_refusal(tmp_path):
    holder = run_lock.acquire(tmp_path)
    try:
        told = []

        def agree(refused):  # The collective: the chief's flag reaches every task.
            told.append(refused)
            return True

        with pytest.raises(run_lock.InUseError, match=f"pid {os.getpid()},"):
            run_lock.Claim(tmp_path, chief=True, agree=agree).acquire()
        with pytest.raises(run_lock.InUseError, match=f"pid {os.getpid()},"):
            run_lock.Claim(tmp_path, chief=False, agree=agree).acquire()
        assert told == [True, False]
        with run_lock.Claim(tmp_path / "free", chief=False, agree=lambda r: False) as claim:
            claim.acquire()  # A follower writes nothing.
        assert not os.path.exists(tmp_path / "free")
    finally:
        holder.release()


def test_across_workers_on_one_worker_is_the_flag_itself(mirrored2):
    agree = run_lock.across_workers(mirrored2)
    assert agree(True) is True and agree(False) is False
    # The default strategy (--placement runs) has no worker devices: no collective either.
    default = run_lock.across_workers(tf.distribute.get_strategy())
    assert default(True) is True and default(False) is False


# The same command (a second terminal: it would resume and train beside the first), and
# the second run with another seed (the in-use line comes before the record's).
@pytest.mark.parametrize("extra", [[], ["--config.seed=9"]], ids=["same", "seed9"])
def test_a_second_run_of_the_binary_is_refused_in_one_line_and_writes_nothing(
        tiny_run, tmp_path, extra):
    """The binary on a workdir that another run holds (here: this process): exit 2, one
    line naming the holder, run.json and the checkpoints byte for byte as they were."""
    workdir = tmp_path / "run"
    shutil.copytree(tiny_run, workdir)
    assert not os.path.exists(workdir / run_lock.LOCK_FILE)  # A finished run released it.
    holder = run_lock.acquire(workdir)
    try:
        before = tree_digest(workdir)
        proc = run_in_process(["-m", "tf_gan_scale.main", f"--workdir={workdir}", *TINY,
                               "--strategy=one_device", *extra,
                               f"--config.train.num_steps={TINY_RUN_STEPS + 5}"])
        errors = [line for line in proc.stderr.splitlines() if line.startswith("error:")]
        assert proc.returncode == 2, proc.stderr[-3000:]
        assert errors == [proc.stderr.strip().splitlines()[-1]]
        assert errors[0].startswith(f"error: --workdir={workdir} is in use by another run "
                                    f"(host {socket.gethostname()}, pid {os.getpid()}, ")
        assert "Traceback" not in proc.stderr
        assert tree_digest(workdir) == before
    finally:
        holder.release()


def test_a_gfile_url_refuses_a_live_holder_and_takes_a_stale_one(monkeypatch):
    """The write-settle-read-back path, on TensorFlow's in-memory ram:// file system."""
    monkeypatch.setattr(lock_storage, "SETTLE_S", 0.01)
    workdir = f"ram://run_lock_test_{os.getpid()}/run"
    lock = run_lock.acquire(workdir)
    with pytest.raises(run_lock.InUseError, match=f"pid {os.getpid()},"):
        run_lock.acquire(workdir)
    lock.release()
    assert run_lock.storage(workdir).read() is None  # Released: removed.
    stale = {"host": "elsewhere", "pid": 1, "token": "theirs", "space": "elsewhere"}
    with tf.io.gfile.GFile(f"{workdir}/{run_lock.LOCK_FILE}", "w") as f:
        f.write(json.dumps(dict(stale, beat=time.time() - run_lock.STALE_S - 5)))
    lock = run_lock.acquire(workdir)
    assert run_lock.storage(workdir).read()[0]["token"] != "theirs"
    lock.release()
