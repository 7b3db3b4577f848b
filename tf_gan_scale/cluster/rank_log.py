"""Per-rank logs: in a cluster, every task's log lines carry its name and are kept, besides
stderr, in WORKDIR/logs/<task>.log on the shared workdir.

    with rank_log.started(cluster_env.task_name()):   # the binary, before any validation
        ...                                  # lines: "[worker 1] I1205 ...", kept in memory
        rank_log.open_file(workdir)          # the runners, once input can no longer fail
        ...                                  # logs/worker_1.log: the kept lines, then each
        rank_log.error("...")                # the binary's failure line: stderr and file

Why: under Slurm or Kubernetes each task's stderr ends up in its own file or pod; with one
directory every task shares, the lines of a failed multi-worker run are in one place, and
a lost-peer or non-finite error can name the file holding the failing task's last lines.

Names (cluster/env.task_name): "worker 3" -> prefix "[worker 3] ", file logs/worker_3.log;
"chief 0" -> logs/chief_0.log; DTensor client 1 -> "[client 1] ", logs/client_1.log. A single
process has no name: no prefix and no file (its stderr is the one log). tools/launch_local.py
prefixes the output of the processes it starts by the same names, and leaves a line that
already carries its process's prefix as it is: one prefix per line either way.

What the file holds: every absl / Python logging record (TensorFlow's Python logs, Python
warnings through logging.captureWarnings), each line of it prefixed, and the binary's
`error:` lines written through `error`. Not TensorFlow's C++ logs (written to file
descriptor 2 by C++), the chief's progress bar (stdout), or a bad-input line (exit 2:
written before the file may exist, so a bad command leaves the workdir untouched). The file
is appended to: a resumed or restarted run continues it. Under a `gs://` workdir no file is
written (stderr only). The chief's TensorBoard events share logs/ and are unchanged.

Imports no TensorFlow (tools/launch_local.py uses `prefix`).
"""

import contextlib
import logging
import os
import sys

from absl import logging as absl_logging

LOGS = "logs"  # The workdir's folder of TensorBoard events, and of the rank logs.
_KEEP = 10000  # Lines kept before the file opens (start-up logs a few dozen).


def prefix(task):
    """"[worker 3] " for task "worker 3": what starts each of its lines."""
    return f"[{task}] "


def file_name(task):
    """"worker_3.log" for task "worker 3"."""
    return task.replace(" ", "_") + ".log"


def path(workdir, task):
    """WORKDIR/logs/<task>.log."""
    return os.path.join(workdir, LOGS, file_name(task))


class _Prefixed(logging.Formatter):
    """`inner`'s text with `prefix` before each of its lines (a traceback or a multi-line
    warning included)."""

    def __init__(self, inner, start):
        super().__init__()
        self.inner, self.start = inner, start

    def format(self, record):
        text = self.inner.format(record) if self.inner else record.getMessage()
        text = text.rstrip("\n")  # A warning's text ends with one: no empty last line.
        return "\n".join(self.start + line for line in text.split("\n"))


class _KeepThenWrite(logging.Handler):
    """Keeps formatted records in memory until `open` names the file, then writes them
    and each later one to it (flushed: the last lines of a killed task are on disk)."""

    def __init__(self):
        super().__init__()
        self.kept, self.file = [], None

    def emit(self, record):
        try:
            self.write(self.format(record))
        except Exception:  # noqa: BLE001 - logging's rule: a failing handler reports itself.
            self.handleError(record)

    def write(self, text):
        # Under the handler's lock (logging's emit holds it already; `error` does not):
        # another thread's line cannot land between the kept lines and the file's start.
        with self.lock:
            if self.file is None:
                self.kept = (self.kept + [text])[-_KEEP:]
            else:
                self.file.write(text + "\n")
                self.file.flush()

    def open(self, filename):
        os.makedirs(os.path.dirname(filename), exist_ok=True)
        with self.lock:
            self.file = open(filename, "a", encoding="utf-8")
            for text in self.kept:
                self.file.write(text + "\n")
            self.file.flush()
            self.kept = []

    def close(self):
        if self.file is not None:
            self.file.close()
            self.file = None
        super().close()


_ACTIVE = {}  # While `started`: task, handler, and the file's path once open.


@contextlib.contextmanager
def started(task):
    """Inside, this process's log lines carry `task`'s prefix and are kept for its file
    (see the module docstring); task None (one process): nothing changes. Outside again,
    logging is as it was (the binary also runs in-process: cli.run_main)."""
    if task is None:
        yield
        return
    absl_handler = absl_logging.get_absl_handler()
    saved = absl_handler.python_handler.formatter
    formatter = _Prefixed(saved, prefix(task))
    keep = _KeepThenWrite()
    keep.setFormatter(formatter)
    absl_handler.setFormatter(formatter)
    logging.root.addHandler(keep)
    # Python warnings become prefixed log records; whether they were captured before is
    # put back after (the binary also runs in-process, inside a caller's logging).
    captured = getattr(logging, "_warnings_showwarning", None) is not None
    logging.captureWarnings(True)
    _ACTIVE.update(task=task, handler=keep, path=None)
    try:
        yield
    finally:
        _ACTIVE.clear()
        logging.captureWarnings(captured)
        logging.root.removeHandler(keep)
        keep.close()
        absl_handler.setFormatter(saved)


def open_file(workdir):
    """Starts this task's file, WORKDIR/logs/<task>.log, with the lines so far; called
    once nothing can fail on user input any more. Returns its path (None: one process,
    or a workdir on a remote file system, which keeps stderr only)."""
    if not _ACTIVE:
        return None
    if "://" in str(workdir):
        absl_logging.warning("per-task log files need a local or mounted workdir; %s keeps "
                             "this task's lines on stderr only", workdir)
        return None
    if _ACTIVE["path"] is None:
        _ACTIVE["path"] = path(workdir, _ACTIVE["task"])
        _ACTIVE["handler"].open(_ACTIVE["path"])
    return _ACTIVE["path"]


def current():
    """This task's log file if open, else None."""
    return _ACTIVE.get("path")


def peer_file(job, index):
    """The log file of the task TensorFlow names /job:JOB/.../task:INDEX, beside this
    task's (None if this task has no file). DTensor names its clients /job:worker/task:I
    (DTENSOR_JOB_NAME): a client's peers are clients."""
    mine = current()
    if mine is None:
        return None
    task = f"client {index}" if _ACTIVE["task"].startswith("client ") else f"{job} {index}"
    return os.path.join(os.path.dirname(mine), file_name(task))


def error(message):
    """Prints `error: MESSAGE` on one line to stderr, prefixed by this task's name in a
    cluster, and appends it to the task's log file once that is open."""
    line = f"error: {' '.join(str(message).split())}"
    if _ACTIVE:
        line = prefix(_ACTIVE["task"]) + line
        _ACTIVE["handler"].write(line)
    print(line, file=sys.stderr, flush=True)
