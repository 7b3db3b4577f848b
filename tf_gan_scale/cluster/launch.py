"""Runs a multi-worker command as N local processes: what a cluster manager does, on one box.

    rc = launch(["python", "-m", "tf_gan_scale.main", ...], num_workers=2)

Each worker gets TF_CONFIG for a cluster of `num_workers` tasks on free loopback ports and
its own log prefix (`[worker i] `); with `mesh="batch:B,model:M"`, the DTENSOR_* variables
of one DTensor client each instead (prefix `[client i] `), and `--mesh=...` after its
command (a mesh run over all workers' devices, tf_gan_scale/parallel/). The prefix is the
name the binary gives its own lines (cluster/rank_log.py): a line that starts with it
already is passed on as it is, so each line carries one. The group lives and dies together:
  * a worker exiting non-zero (a crash, or 143 after a preemption checkpoint) ends the
    group: the others get `grace_s` to exit on their own (a peer failure reaches them
    through the collectives), then SIGKILL;
  * SIGINT/SIGTERM to the launcher are forwarded as SIGTERM to every worker (so each
    saves a preemption checkpoint, or stops waiting for the cluster: exit 143), then
    SIGKILL after `grace_s`; no restart follows;
  * a worker that never reached the cluster (never logged cluster/startup.py's WAITING
    line) while others did is named when the group ends ("never joined: worker 0");
  * after a failure the whole group is started again, on fresh ports, up to
    `max_restarts` times; a training command resumes from its latest checkpoint.
Only processes started here (and their process groups) are ever signalled.

This module does not import TensorFlow.
"""

import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time

from tf_gan_scale.cluster import env as cluster_env
from tf_gan_scale.cluster import mesh_spec, rank_log, startup

PREEMPTED_EXIT_CODE = 143  # 128 + SIGTERM: "stopped after saving; restart me".


def free_ports(n, host="127.0.0.1"):
    """n distinct TCP ports free on `host` right now."""
    socks = [socket.socket() for _ in range(n)]
    try:
        for s in socks:
            s.bind((host, 0))
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


def num_local_gpus():
    """Physical NVIDIA GPUs visible here (0 without nvidia-smi), without importing TF."""
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is not None:
        return len([d for d in visible.split(",") if d.strip() not in ("", "-1")])
    if shutil.which("nvidia-smi") is None:
        return 0
    try:
        out = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, timeout=20)
    except (OSError, subprocess.SubprocessError):
        return 0
    return sum(1 for line in out.stdout.splitlines() if line.startswith("GPU "))


def worker_commands(cmd, num_workers, devices_per_worker, num_gpus, host="127.0.0.1",
                    ports=None, mesh=None):
    """[(argv, env_updates)] for each worker.

    Devices: with GPUs, worker i sees GPUs [i*K, (i+1)*K) through CUDA_VISIBLE_DEVICES;
    on CPU with K > 1 each worker gets `--num_cpu_devices=K` (our binaries' flag), i.e.
    K logical CPU replicas per worker.
    mesh: "batch:B,model:M" for a DTensor mesh over all workers' devices (B x M must be
    num_workers x K): DTENSOR_* variables instead of TF_CONFIG, `--mesh=...` appended.
    """
    if num_workers < 1:
        raise ValueError(f"--num_workers must be >= 1; Received: {num_workers}")
    if devices_per_worker < 1:
        raise ValueError(f"--devices_per_worker must be >= 1; Received: {devices_per_worker}")
    if num_gpus and num_workers * devices_per_worker > num_gpus:
        raise ValueError(f"--num_workers={num_workers} x --devices_per_worker="
                         f"{devices_per_worker} needs {num_workers * devices_per_worker} "
                         f"GPUs; this machine has {num_gpus}")
    if mesh is not None:
        if any(a.startswith("--mesh") for a in cmd):
            raise ValueError(f"--mesh={mesh} and a --mesh in the command; give it once")
        mesh_spec.check(mesh_spec.parse(mesh), num_workers * devices_per_worker,
                       f"devices ({num_workers} workers x {devices_per_worker})")
    ports = ports or free_ports(num_workers, host)
    hosts = [f"{host}:{p}" for p in ports]
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    gpu_ids = ([d.strip() for d in visible.split(",")] if visible
               else [str(i) for i in range(num_gpus)])
    out = []
    for i in range(num_workers):
        if mesh is None:
            env, argv = {"TF_CONFIG": cluster_env.tf_config(hosts, i)}, list(cmd)
        else:
            env, argv = cluster_env.client_env(hosts, i), list(cmd) + [f"--mesh={mesh}"]
        if num_gpus:
            env["CUDA_VISIBLE_DEVICES"] = ",".join(
                gpu_ids[i * devices_per_worker:(i + 1) * devices_per_worker])
        elif devices_per_worker > 1:
            argv.append(f"--num_cpu_devices={devices_per_worker}")
        out.append((argv, env))
    return out


class _Group:
    """The worker processes of one attempt, with their log pumps."""

    def __init__(self, commands, out, lock, mesh=False):
        self.procs, self.pumps = [], []
        # When each worker exited (monotonic s), recorded by a thread that waits for it:
        # the supervisor reports the worker that failed FIRST. Polling cannot tell: a
        # killed worker's peer sees its collective reset and exits within one poll
        # interval, and the lower index would be reported.
        self.exited_at = {}
        self.joined = set()  # Workers that logged startup.WAITING: they reached the cluster.
        self.names = []  # Each task's name for itself ("worker i", or "client i" on a mesh).
        for i, (argv, env) in enumerate(commands):
            proc = subprocess.Popen(
                argv, env=dict(os.environ, **env), stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, bufsize=1,
                errors="replace",
                # Own process group: a terminal's Ctrl-C reaches the launcher only, which
                # forwards it; and killing the group takes the worker's children too.
                start_new_session=True)
            # The task's own name for itself (its lines may carry it already): a client
            # when the launcher makes a mesh or the command asks for one itself (then its
            # TF_CONFIG makes it DTensor client i, and it prefixes "[client i] ").
            client = mesh or any(a.startswith("--mesh") for a in argv)
            name = (cluster_env.task_name(env, mesh=client)
                    or f"{'client' if client else 'worker'} {i}")
            self.names.append(name)
            pump = threading.Thread(target=self._pump, args=(i, name, proc, out, lock),
                                    daemon=True)
            pump.start()
            threading.Thread(target=self._note_exit, args=(i, proc), daemon=True).start()
            self.procs.append(proc)
            self.pumps.append(pump)

    def _note_exit(self, i, proc):
        proc.wait()
        self.exited_at[i] = time.monotonic()

    def _pump(self, i, name, proc, out, lock):
        prefix = rank_log.prefix(name)
        for line in proc.stdout:
            if startup.WAITING in line:
                self.joined.add(i)
            line = line if line.endswith("\n") else line + "\n"
            with lock:
                out.write(line if line.startswith(prefix) else prefix + line)
                out.flush()

    def never_joined(self):
        """"; never joined: worker I, ..." (or "client I" on a mesh) when some tasks reached
        the cluster and these did not (stuck or dead before it: what the others wait
        for), else ""."""
        missing = [i for i in range(len(self.procs)) if i not in self.joined]
        if not self.joined or not missing:
            return ""
        return "; never joined: " + ", ".join(self.names[i] for i in missing)

    def signal_all(self, sig):
        for p in self.procs:
            if p.poll() is None:
                try:
                    os.killpg(p.pid, sig)
                except ProcessLookupError:
                    pass

    def end(self, grace_s):
        """Gives the workers `grace_s` to exit, SIGKILLs the rest; returns their exit codes."""
        deadline = time.monotonic() + grace_s
        for p in self.procs:
            try:
                p.wait(max(deadline - time.monotonic(), 0))
            except subprocess.TimeoutExpired:
                self.signal_all(signal.SIGKILL)
                break
        return [_exit_code(p.wait()) for p in self.procs]

    def close(self):
        self.signal_all(signal.SIGKILL)
        for p in self.procs:
            p.wait()
        for t in self.pumps:
            t.join(timeout=5)


def _exit_code(rc):
    return 128 - rc if rc < 0 else rc  # Killed by signal N -> 128 + N, as a shell reports.


def launch(cmd, num_workers, *, devices_per_worker=1, max_restarts=0, grace_s=30.0,
           num_gpus=None, out=None, poll_s=0.1, mesh=None):
    """Runs `cmd` as `num_workers` local workers; returns the exit code for the launcher.

    0 when every worker of an attempt exits 0; otherwise the code of the worker that failed
    first, by exit time (128 + N for a death by signal N), of the last attempt.
    """
    out = out or sys.stdout
    lock = threading.Lock()
    num_gpus = num_local_gpus() if num_gpus is None else num_gpus
    stop = []  # Signals received by the launcher.
    handlers = {}

    def on_signal(signum, frame):
        del frame
        stop.append(signum)

    if threading.current_thread() is threading.main_thread():
        for sig in (signal.SIGINT, signal.SIGTERM):
            handlers[sig] = signal.signal(sig, on_signal)

    def say(msg):
        with lock:
            out.write(f"[launch] {msg}\n")
            out.flush()

    try:
        rc = 0
        for attempt in range(max_restarts + 1):
            commands = worker_commands(cmd, num_workers, devices_per_worker, num_gpus,
                                       mesh=mesh)
            say(f"attempt {attempt + 1}/{max_restarts + 1}: starting {num_workers} workers: "
                f"{' '.join(os.path.basename(a) if k == 0 else a for k, a in enumerate(commands[0][0]))}")
            group = _Group(commands, out, lock, mesh=mesh is not None)
            try:
                rc, why = _supervise(group, stop, grace_s, poll_s)
            finally:
                group.close()
            if rc == 0:
                say("all workers finished")
                return 0
            say(why)
            if stop:
                return rc
            if attempt < max_restarts:
                say(f"restarting the group ({attempt + 1} of {max_restarts} restarts)")
        return rc
    finally:
        for sig, handler in handlers.items():
            signal.signal(sig, handler)


def _supervise(group, stop, grace_s, poll_s):
    """Waits for the group; returns (exit code, reason)."""
    while True:
        if stop:
            # Forward as SIGTERM: the workers' preemption handlers save a checkpoint.
            group.signal_all(signal.SIGTERM)
            codes = group.end(grace_s)
            return 128 + stop[0], (f"stopped by signal {stop[0]}; worker exit codes {codes}"
                                   f"{group.never_joined()}")
        codes = [p.returncode if i in group.exited_at else None
                 for i, p in enumerate(group.procs)]
        failed = sorted((group.exited_at[i], i, c) for i, c in enumerate(codes)
                        if c not in (None, 0))
        if failed:
            _, i, code = failed[0]
            # The others learn of the loss through their collectives (peer timeout) or
            # save and exit themselves after a preemption; past grace_s they are killed.
            codes = group.end(grace_s)
            return _exit_code(code), (f"{group.names[i]} exited with code {_exit_code(code)}; "
                                      f"worker exit codes {codes}{group.never_joined()}")
        if all(c == 0 for c in codes):
            return 0, "ok"
        time.sleep(poll_s)
