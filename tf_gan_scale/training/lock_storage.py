"""Where run.lock lives and what a pid means: the storage side of run_lock.py.

`storage(workdir)` is the lock record of a workdir on a local disk or NFS (`LocalFile`:
hard-link creation, rename-aside takeover, the heartbeat as the file's mtime) or at a
gfile URL (`GfileObject`: write, settle, read back; the heartbeat a field). Each offers
create(record) -> handle or None, read() -> (record, heartbeat time, token) or None,
beat(handle) -> still ours, take(token) -> removed, release(handle). `space`,
`pid_alive` and `process_start` say whether a pid of this machine names a live process.
"""

import json
import os
import socket
import time
import uuid

import tensorflow as tf
from absl import logging

from tf_gan_scale import errors

LOCK_FILE = "run.lock"
SETTLE_S = 2.0  # gfile: longer than a write takes to be seen (GCS reads its writes).


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


def process_start(pid):
    """When process `pid` started (clock ticks since boot, /proc/PID/stat field 22), or
    None where that cannot be read: with the pid it names one process, as a pid alone
    does not once the pid is reused."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return int(f.read().rsplit(")", 1)[1].split()[19])
    except (OSError, IndexError, ValueError):
        return None


def parse(text):
    """A record from its JSON; {} for anything else (a holder writes its record whole
    before it links or uploads it, so that is no live run's: judged by its age)."""
    try:
        record = json.loads(text)
    except ValueError:
        return {}
    return record if isinstance(record, dict) else {}


class LocalFile:
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
        record = parse(text)
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
            moved = parse(f.read()).get("token")
        if moved != key:  # Another taker's new record: put it back.
            try:
                os.link(aside, self.path)
            except OSError:  # A third run holds run.lock now: keep that record to see.
                logging.warning("--workdir=%s: a run.lock taken over concurrently is kept "
                                "at %s", os.path.dirname(self.path), aside)
                return False
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


class GfileObject:
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
        record = parse(text)  # {}: no heartbeat, so gone.
        return record, float(record.get("beat", 0.0)), record.get("token")

    def beat(self, record):
        found = self.read()
        if not found or found[2] != record["token"]:
            return False
        self._write(record)  # A taker writing between the read and here: both think so.
        return True

    def take(self, key):
        """Removes the record if it is still `key`'s (then the caller tries to create);
        whether it was."""
        found = self.read()
        if found and found[2] == key:
            tf.io.gfile.remove(self.path)
            return True
        return False

    def release(self, record):
        self.take(record["token"])  # Only our own record.


def storage(workdir):
    """The run.lock of `workdir`, by where it lives."""
    path = os.path.join(workdir, LOCK_FILE)
    return GfileObject(path) if "://" in str(workdir) else LocalFile(path)
