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
gfile URLs: a field) is refreshed by a thread of the holder every HEARTBEAT_S. A holder is
gone when it ran in this space and its pid is dead (kill -9: seen at once), or its
heartbeat is older than STALE_S (a lost host, an ended Slurm allocation); another host's
fresh heartbeat is watched: live once it moves, gone if it does not within STALE_S. Taking
over logs one line. Hosts' clocks are assumed to agree within seconds (NTP).

Atomicity (docs/multi_worker.md, "One run per workdir"): on local disks and NFS the record
is hard-linked into place (link(2) fails if the name exists: atomic on both), and a taker
renames a stale record aside (one rename wins); a gfile URL (gs://) has no conditional
create: write, wait SETTLE_S, read back (best effort).
"""

import datetime
import json
import os
import socket
import sys
import threading
import time
import uuid

import tensorflow as tf
from absl import logging

from tf_gan_scale import errors, replica
from tf_gan_scale.cluster import rank_log

LOCK_FILE = "run.lock"
# A beat is one small metadata write (cheap on NFS and object stores, far under GCS's one
# write per second per object); six may be lost to a storage stall or a busy host before
# a live run could pass for a gone one, and a requeued job waits at most a minute.
HEARTBEAT_S = 10.0
STALE_S = 60.0
SETTLE_S = 2.0  # gfile: longer than a write takes to be seen (GCS reads its writes).
POLL_S = 0.5  # How often a watched heartbeat is read.


class InUseError(errors.ConfigError):
    """The workdir is held by another live run: one line naming it, exit 2."""


def space():
    """Where a pid names a process: this host, its boot and this pid namespace."""
    parts = [socket.gethostname()]
    try:
        with open("/proc/sys/kernel/random/boot_id") as f:
            parts += [f.read().strip(), os.readlink("/proc/self/ns/pid")]
    except OSError:  # Not Linux: the host name alone.
        pass
    return "/".join(parts)


def pid_alive(pid):
    """Whether process `pid` of this space runs (a zombie, killed but not reaped, is dead)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # Another user's process.
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return True


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
    """"gone", "live", or None (another space with a fresh heartbeat: watch it)."""
    if age > stale_s:
        return "gone"
    if record.get("space") == space() and isinstance(record.get("pid"), int):
        return "live" if pid_alive(record["pid"]) else "gone"
    return None


def _parse(text):
    """A record from its JSON; {} for anything else (a holder writes its record whole
    before it links or uploads it, so that is no live run's: judged by its age)."""
    try:
        record = json.loads(text)
    except ValueError:
        return {}
    return record if isinstance(record, dict) else {}


class _LocalFile:
    """run.lock on a local disk or NFS; a holder's handle is its open file (its inode:
    while open, its number is not reused)."""

    def __init__(self, path):
        self.path = path

    def create(self, record):
        tmp = f"{self.path}.{record['token']}"
        with open(tmp, "w") as f:
            json.dump(record, f)
        fd = os.open(tmp, os.O_RDONLY)
        try:
            os.link(tmp, self.path)  # Atomic; fails if run.lock exists.
        except OSError as e:
            if os.fstat(fd).st_nlink < 2:  # NFS: a retried link may fail yet have worked.
                os.close(fd)
                if isinstance(e, FileExistsError):
                    return None
                raise errors.ConfigError(  # E.g. a FUSE mount without hard links.
                    f"--workdir={os.path.dirname(self.path)}: cannot create {LOCK_FILE} "
                    f"({e}); valid: a directory on a local disk or NFS, or a gs:// URL")
        finally:
            os.remove(tmp)
        return fd

    def read(self):
        """(record, heartbeat time, key) or None; open() revalidates NFS's attributes."""
        try:
            with open(self.path) as f:
                st = os.fstat(f.fileno())
                text = f.read()
        except FileNotFoundError:
            return None
        record = _parse(text)
        # The key is the token, not the inode: a removed record's inode number is reused.
        return record, st.st_mtime, record.get("token")

    def beat(self, fd):
        """Refreshes our heartbeat; False if run.lock is no longer ours."""
        now = time.time()
        os.utime(fd, (now, now))  # Our inode, wherever a taker may have moved it.
        try:
            return os.stat(self.path).st_ino == os.fstat(fd).st_ino
        except FileNotFoundError:
            return False

    def take(self, key):
        aside = f"{self.path}.{uuid.uuid4().hex}.stale"
        try:
            os.rename(self.path, aside)  # Of two takers, one rename wins.
        except FileNotFoundError:
            return False
        with open(aside) as f:
            moved = _parse(f.read()).get("token")
        if moved != key:  # Another taker's new record: put it back.
            try:
                os.link(aside, self.path)
            except OSError:
                pass
            os.remove(aside)
            return False
        os.remove(aside)
        return True

    def release(self, fd):
        try:
            if os.stat(self.path).st_ino == os.fstat(fd).st_ino:
                os.remove(self.path)
        except FileNotFoundError:
            pass
        os.close(fd)


class _GfileObject:
    """run.lock at a gfile URL (gs://...): write, settle, read back; a handle is a token."""

    def __init__(self, path):
        self.path = path

    def _write(self, record):
        with tf.io.gfile.GFile(self.path, "w") as f:
            f.write(json.dumps(dict(record, beat=time.time())))

    def create(self, record):
        if tf.io.gfile.exists(self.path):
            return None
        self._write(record)
        time.sleep(SETTLE_S)  # Every concurrent write is visible after this: last one wins.
        found = self.read()
        return record if found and found[2] == record["token"] else None

    def read(self):
        try:
            with tf.io.gfile.GFile(self.path) as f:
                text = f.read()
        except tf.errors.NotFoundError:
            return None
        record = _parse(text)  # {}: no heartbeat, so gone.
        return record, float(record.get("beat", 0.0)), record.get("token")

    def beat(self, record):
        found = self.read()
        if not found or found[2] != record["token"]:
            return False
        self._write(record)  # A taker writing between the read and here: both think so.
        return True

    def take(self, key):  # Removes the record if it is still `key`'s; then try to create.
        found = self.read()
        if found and found[2] == key:
            tf.io.gfile.remove(self.path)
        return True

    def release(self, record):
        self.take(record["token"])


def storage(workdir):
    """The run.lock of `workdir`, by where it lives."""
    path = os.path.join(workdir, LOCK_FILE)
    return _GfileObject(path) if "://" in str(workdir) else _LocalFile(path)


def _lost(workdir, found):
    """Another run took our workdir over (our heartbeat stalled past STALE_S, e.g. the
    process was stopped): stop at once, writing nothing more, so one history remains."""
    who = describe(found[0], max(0.0, time.time() - found[1])) if found else "none left"
    rank_log.error(f"--workdir={workdir} was taken over by another run ({who}) after this "
                   f"run's heartbeat stalled; stopping without writing")
    os._exit(1)  # Not SystemExit: no callback may save a checkpoint on the way out.


class Lock:
    """A held run.lock and the thread that refreshes its heartbeat; `release()` ends it."""

    def __init__(self, workdir, store, handle, heartbeat_s=HEARTBEAT_S, on_lost=_lost,
                 created=False):
        self.workdir, self.store, self.handle, self.created = workdir, store, handle, created
        self._stop = threading.Event()
        self._on_lost = on_lost
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
        if self.created:  # A new run that failed before writing leaves no workdir.
            try:
                os.rmdir(self.workdir)
            except OSError:
                pass


def acquire(workdir, *, heartbeat_s=HEARTBEAT_S, stale_s=STALE_S, on_lost=_lost):
    """Holds `workdir` for this run (a Lock), taking over from a gone holder (one warning
    line); raises InUseError naming a live one."""
    store = storage(workdir)
    created = "://" not in str(workdir) and not os.path.isdir(workdir)
    if created:
        os.makedirs(workdir, exist_ok=True)
    record = {"host": socket.gethostname(), "pid": os.getpid(),
              "started": datetime.datetime.now().astimezone().isoformat(timespec="seconds"),
              "command": " ".join(sys.argv)[:300], "token": uuid.uuid4().hex,
              "space": space()}
    watched = None  # (key, first heartbeat seen, its age then, monotonic time then)
    while True:
        handle = store.create(record)
        if handle is not None:
            return Lock(workdir, store, handle, heartbeat_s, on_lost, created)
        found = store.read()
        if found is None:  # Released meanwhile: try again.
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
        return self

    def __exit__(self, *exc):
        if self.lock is not None:
            self.lock.release()
            self.lock = None
