"""One run per workdir: the record WORKDIR/run.lock that a run's chief holds while it runs.

    with run_lock.Claim(workdir, chief=chief, agree=run_lock.across_workers(strategy)) as c:
        prepare.prepare_run(..., claim=c.acquire)   # refused (InUseError: exit 2), or held
        ...                                         # train: only this run writes
    # released (the record removed) however the run ends: done, an error, SIGTERM, a NaN

Why (issue 49): two runs on one workdir (a second terminal, a Slurm requeue while the old
job still ran) restored each other's checkpoints, deleted each other's files through their
CheckpointManagers and overwrote run.json. A run's chief takes the record once the config
is validated, before the workdir is read; a second run is refused with one line naming the
holder, and every worker or DTensor client follows its chief through `agree`, a
collective: the whole second cluster exits 2 together, having written nothing.

The record (JSON): host, pid, started, command, token, space (host, boot and pid namespace:
where the pid means something). Its heartbeat (local disks and NFS: the file's mtime;
gfile URLs: a field) is refreshed by a thread of the holder every HEARTBEAT_S. A holder of
this space is judged by its process (pid and start time): live while it runs, however old
its heartbeat; gone at once when dead (kill -9). Another space's holder is gone when its
heartbeat is older than STALE_S (a lost host, an ended Slurm allocation); a fresh one is
watched: live once it moves, gone if it does not within STALE_S. Taking over logs one
line. Hosts' clocks are assumed to agree within seconds (NTP).

Atomicity (docs/multi_worker.md, "One run per workdir"; lock_storage.py): on local disks
and NFS the record is hard-linked into place (link(2) fails if the name exists: atomic on
both), and a taker renames a stale record aside (one rename wins); a gfile URL (gs://) has
no conditional create: write, wait, read back (best effort).
"""

import datetime
import os
import signal
import socket
import sys
import threading
import time
import uuid

import tensorflow as tf
from absl import logging

from tf_gan_scale import errors, replica
from tf_gan_scale.cluster import rank_log
from tf_gan_scale.cluster.launch import PREEMPTED_EXIT_CODE
# The storage side, offered here too: LOCK_FILE and storage() for what reads the record.
from tf_gan_scale.training.lock_storage import (LOCK_FILE, pid_alive, process_start, space,
                                                storage)

# A beat is one small metadata write (cheap on NFS and object stores, far under GCS's one
# write per second per object); six may be lost to a storage stall or a busy host before
# a live run could pass for a gone one, and a requeued job waits at most a minute.
HEARTBEAT_S = 10.0
STALE_S = 60.0
POLL_S = 0.5  # How often a watched heartbeat is read.

__all__ = ["Claim", "HEARTBEAT_S", "InUseError", "LOCK_FILE", "Lock", "POLL_S", "STALE_S",
           "acquire", "across_workers", "describe", "judge", "pid_alive", "process_start",
           "refusal", "space", "storage"]


class InUseError(errors.ConfigError):
    """The workdir is held by another live run: one line naming it, exit 2."""


def describe(record, age):
    """"host H, pid P, started T, command C; last heartbeat Ns ago"."""
    return (f"host {record.get('host', '?')}, pid {record.get('pid', '?')}, started "
            f"{record.get('started', '?')}, command {record.get('command', '?')!r}; "
            f"last heartbeat {age:.0f}s ago")


def refusal(workdir, record, age):
    """The one line (without `error: `) that refuses a second run."""
    return (f"--workdir={workdir} is in use by another run ({describe(record, age)}); "
            f"valid: wait for it to finish, stop it, or use another --workdir")


def judge(record, age, stale_s=STALE_S):
    """"gone", "live", or None (another space with a fresh heartbeat: watch it).

    A holder of this space (host, boot, pid namespace) is judged by its process alone,
    whatever its heartbeat's age: a stopped or suspended run (SIGSTOP, Slurm's suspend)
    is alive, and a dead one is gone at once; its start time guards against a reused
    pid. Elsewhere only the heartbeat can tell."""
    if record.get("space") == space() and isinstance(record.get("pid"), int):
        pid = record["pid"]
        started = record.get("pid_start")
        alive = pid_alive(pid) and (started is None or started == process_start(pid))
        return "live" if alive else "gone"
    if age > stale_s:
        return "gone"
    return None


def _lost(workdir, found):
    """Another run took our workdir over (our heartbeat stalled past STALE_S, e.g. the
    process was stopped): stop at once, writing nothing more, so one history remains."""
    who = describe(found[0], max(0.0, time.time() - found[1])) if found else "none left"
    rank_log.error(f"--workdir={workdir} was taken over by another run ({who}) after this "
                   f"run's heartbeat stalled; stopping without writing")
    os._exit(1)  # Not SystemExit: no callback may save a checkpoint on the way out.


class Lock:
    """A held run.lock and the thread that refreshes its heartbeat; `release()` ends it."""

    def __init__(self, workdir, store, handle, heartbeat_s=HEARTBEAT_S, on_lost=None,
                 created=()):
        self.workdir, self.store, self.handle, self.created = workdir, store, handle, created
        self._stop = threading.Event()
        self._on_lost = on_lost or _lost  # Looked up now, not at import: tests replace it.
        self._thread = threading.Thread(target=self._beat, args=(heartbeat_s,),
                                        name="run_lock heartbeat", daemon=True)
        self._thread.start()

    def _beat(self, every):
        while not self._stop.wait(every):
            try:
                ours = self.store.beat(self.handle)
            except (OSError, tf.errors.OpError) as e:  # A storage hiccup: try next beat.
                logging.warning("run.lock heartbeat failed: %s", str(e).splitlines()[0])
                continue
            if not ours and not self._stop.is_set():
                self._on_lost(self.workdir, self.store.read())
                return

    def release(self):
        """Stops the heartbeat and removes the record if it is still ours."""
        if self._stop.is_set():
            return
        self._stop.set()
        self._thread.join()
        self.store.release(self.handle)
        for folder in self.created:  # A new run that failed before writing leaves none.
            try:
                os.rmdir(folder)
            except OSError:  # Not empty: the run wrote something; keep it.
                break


def _make_dirs(workdir):
    """Creates a local `workdir` and its missing parents; returns the ones it created,
    deepest first (removed again if the run writes nothing). A path that cannot be a
    directory is bad input: one line."""
    if "://" in str(workdir):
        return ()
    created, folder = [], os.path.abspath(workdir)
    while not os.path.isdir(folder) and folder != os.path.dirname(folder):
        created.append(folder)
        folder = os.path.dirname(folder)
    try:
        os.makedirs(workdir, exist_ok=True)
    except OSError as e:
        raise errors.ConfigError(f"--workdir={workdir} cannot be created ({e.strerror}: "
                                 f"{e.filename}); valid: a directory path this user can "
                                 f"write") from None
    return tuple(created)


def acquire(workdir, *, heartbeat_s=HEARTBEAT_S, stale_s=STALE_S, on_lost=None):
    """Holds `workdir` for this run (a Lock), taking over from a gone holder (one warning
    line); raises InUseError naming a live one."""
    store = storage(workdir)
    created = _make_dirs(workdir)
    record = {"host": socket.gethostname(), "pid": os.getpid(),
              "pid_start": process_start(os.getpid()),
              "started": datetime.datetime.now().astimezone().isoformat(timespec="seconds"),
              "command": " ".join(sys.argv)[:300], "token": uuid.uuid4().hex,
              "space": space()}
    watched = None  # (key, first heartbeat seen, its age then, monotonic time then)
    vanished = 0  # Reads that found no record after a create that found one.
    while True:
        handle = store.create(record)
        if handle is not None:
            return Lock(workdir, store, handle, heartbeat_s, on_lost, created)
        found = store.read()
        if found is None:  # Released meanwhile: try again shortly; never: not a file.
            vanished += 1
            if vanished * POLL_S > stale_s:
                raise errors.ConfigError(
                    f"--workdir={workdir}: {store.path} exists but cannot be read (a "
                    f"dangling link?); valid: remove it if no run uses this workdir")
            time.sleep(POLL_S)
            continue
        holder, beat, key = found
        age = max(0.0, time.time() - beat)
        state = judge(holder, age, stale_s)
        if state is None:
            if watched is None or watched[0] != key:
                watched = (key, beat, age, time.monotonic())
            elif beat != watched[1]:
                state = "live"  # Its heartbeat moved while we watched.
            elif watched[2] + time.monotonic() - watched[3] > stale_s:
                state, age = "gone", watched[2] + time.monotonic() - watched[3]
        if state == "live":
            raise InUseError(refusal(workdir, holder, age))
        if state == "gone" and store.take(key):
            logging.warning("--workdir=%s: taking over from a run that is gone (%s)",
                            workdir, describe(holder, age))
        elif state is None:
            time.sleep(POLL_S)


def across_workers(strategy):
    """agree(flag) under a tf.distribute strategy: whether any worker's flag is set, on
    every worker (replica.any_worker: one all-reduce; none on one worker)."""
    return lambda flag: replica.any_worker(strategy, flag)


class Claim:
    """A run's hold on its workdir, for every task of its cluster: the chief acquires the
    lock, the others follow its decision (`agree(refused) -> any task refused`, a
    collective; None for one process). A context manager: released on any exit."""

    def __init__(self, workdir, *, chief=True, agree=None, **lock_args):
        self.workdir, self.chief, self.lock_args = workdir, chief, lock_args
        self.agree = agree or bool
        self.lock = None

    def acquire(self):
        """Refuses (InUseError on every task) or holds the workdir. Every task calls it
        at the same point: it is a collective."""
        failure = None
        if self.chief:
            try:
                self.lock = acquire(self.workdir, **self.lock_args)
            except Exception as e:  # noqa: BLE001 - re-raised below, after the others know.
                failure = e
        if self.agree(failure is not None):
            if failure is not None:
                raise failure
            found = storage(self.workdir).read()
            if found is None:
                raise InUseError(f"--workdir={self.workdir}: this cluster's chief could not "
                                 f"take it (see its error line); valid: another --workdir")
            raise InUseError(refusal(self.workdir, found[0], max(0.0, time.time() - found[1])))

    def __enter__(self):
        # SIGTERM before training takes it over (data, build, tracing: the Preemption
        # callback's handler) would end the process without unwinding, leaving the
        # record until judged gone. As SystemExit(143), a preempted run's code, it
        # unwinds through __exit__. Only the main thread may set a handler.
        self._sigterm = None
        if threading.current_thread() is threading.main_thread():
            self._sigterm = signal.signal(signal.SIGTERM, _preempted)
        return self

    def __exit__(self, *exc):
        if self._sigterm is not None:
            signal.signal(signal.SIGTERM, self._sigterm)
            self._sigterm = None
        if self.lock is not None:
            self.lock.release()
            self.lock = None


def _preempted(signum, frame):
    del signum, frame
    sys.exit(PREEMPTED_EXIT_CODE)
