"""The cluster a process is part of, read from its environment: TF_CONFIG, a Slurm job
step, DTENSOR_* variables. Plain Python: it imports no TensorFlow, so launchers, Slurm
and Kubernetes entry points stay light.

TF_CONFIG (tf.distribute's, set by Kubernetes manifests and tools/launch_local.py):
    {"cluster": {"worker": ["host:port", ...]}, "task": {"type": "worker", "index": I}}

Slurm (in the job step; TensorFlow's own SlurmClusterResolver runs `nvidia-smi` and
divides by the GPU count, so it fails on CPU-only nodes, tensorflow#56894):
    SLURM_STEP_NODELIST   node[01-02]     hosts of this step (else SLURM_JOB_NODELIST)
    SLURM_STEP_TASKS_PER_NODE 2(x2)       tasks on each host (else SLURM_TASKS_PER_NODE)
    SLURM_PROCID          0..N-1          this task's rank = worker index
    TF_GAN_SCALE_PORT     8888            first port; the k-th task on a host uses PORT + k
Tasks are laid out on hosts in block order (srun's default distribution): the first
host's tasks are workers 0..t0-1, and so on.

DTensor clients (a mesh over several processes):
    DTENSOR_JOBS=host:port,...  DTENSOR_CLIENT_ID=I  DTENSOR_NUM_CLIENTS=N  DTENSOR_JOB_NAME
"""

import json
import os
import re

from tf_gan_scale import errors

DEFAULT_PORT = 8888
JOB = "worker"  # DTensor's job name for the clients (DTENSOR_JOB_NAME).


# ---- TF_CONFIG -------------------------------------------------------------------------

def tf_config(cluster_hosts, index):
    """TF_CONFIG JSON for task `index` of a worker-only cluster ["host:port", ...]."""
    return json.dumps({"cluster": {"worker": list(cluster_hosts)},
                       "task": {"type": "worker", "index": int(index)}})


def check_tf_config(env=None):
    """Validates TF_CONFIG for multi-worker runs; returns the parsed dict (or None)."""
    raw = (os.environ if env is None else env).get("TF_CONFIG")
    if not raw:
        return None
    try:
        cfg = json.loads(raw)
        cluster, task = cfg["cluster"], cfg["task"]
        members = cluster[task["type"]]
        if not 0 <= int(task["index"]) < len(members):
            raise IndexError(task["index"])
    except (ValueError, KeyError, TypeError, IndexError) as e:
        raise errors.ConfigError(
            f"bad TF_CONFIG {raw!r} ({type(e).__name__}: {e}); expected "
            f'{{"cluster": {{"worker": ["host:port", ...]}}, '
            f'"task": {{"type": "worker", "index": I}}}}') from None
    return cfg


def _tf_config_tasks(env):
    """Number of tasks in TF_CONFIG's cluster (0 when TF_CONFIG is unset)."""
    cfg = check_tf_config(env)
    return sum(len(members) for members in cfg["cluster"].values()) if cfg else 0


# ---- Slurm -------------------------------------------------------------------------------

def expand_hostlist(hostlist):
    """Slurm's compressed host list -> hosts, in order: 'n[1-2],m5,o[08-09,11]' ->
    ['n1', 'n2', 'm5', 'o08', 'o09', 'o11'] (zero padding kept). ValueError if bad."""
    hosts = []
    # Parts are separated by commas outside brackets: "o[3-4,6]" is one part.
    for part in re.split(r",(?![^\[]*\])", hostlist):
        m = re.fullmatch(r"([^\[\],]*)(?:\[([^\[\]]+)\])?", part)
        if m is None or not part:
            raise ValueError(f"invalid hostlist {hostlist!r} at {part!r}")
        prefix, ranges = m.group(1), m.group(2)
        if ranges is None:
            hosts.append(prefix)
            continue
        for r in ranges.split(","):
            lo, _, hi = r.partition("-")
            if not lo.isdigit() or not (hi or lo).isdigit():
                raise ValueError(f"invalid hostlist {hostlist!r} at {r!r}")
            hosts += [prefix + str(i).zfill(len(lo)) for i in range(int(lo), int(hi or lo) + 1)]
    return hosts


def expand_tasks_per_node(tasks_per_node):
    """Slurm's tasks per node -> one count per host: '3(x2),2,1' -> [3, 3, 2, 1].
    ValueError if bad."""
    out = []
    for part in str(tasks_per_node).split(","):
        m = re.fullmatch(r"(\d+)(?:\(x(\d+)\))?", part.strip())
        if m is None:
            raise ValueError(f"invalid tasks-per-node list {tasks_per_node!r} at {part!r}")
        out += [int(m.group(1))] * int(m.group(2) or 1)
    return out


def _slurm_var(env, *names):
    for name in names:
        if env.get(name):
            return env[name]
    raise errors.ConfigError(f"--cluster_resolver=slurm: {names[0]} is not set; run inside "
                             f"a Slurm job step (srun), or use --cluster_resolver=tf_config")


def slurm_cluster(env):
    """(cluster dict {"worker": ["host:port", ...]}, task index) from Slurm variables."""
    nodelist = _slurm_var(env, "SLURM_STEP_NODELIST", "SLURM_JOB_NODELIST", "SLURM_NODELIST")
    per_node = _slurm_var(env, "SLURM_STEP_TASKS_PER_NODE", "SLURM_TASKS_PER_NODE")
    try:
        hosts = expand_hostlist(nodelist)
        counts = expand_tasks_per_node(per_node)
        rank = int(_slurm_var(env, "SLURM_PROCID"))
        port = int(env.get("TF_GAN_SCALE_PORT", DEFAULT_PORT))
    except ValueError as e:
        raise errors.ConfigError(f"--cluster_resolver=slurm: bad Slurm variables ({e}); "
                                 f"expected e.g. SLURM_STEP_NODELIST='node[01-02]', "
                                 f"SLURM_STEP_TASKS_PER_NODE='2(x2)', SLURM_PROCID=0") from None
    if len(hosts) != len(counts):
        raise errors.ConfigError(
            f"--cluster_resolver=slurm: {len(hosts)} hosts in {nodelist!r} but "
            f"{len(counts)} entries in tasks-per-node {per_node!r}")
    workers = [f"{host}:{port + k}" for host, n in zip(hosts, counts) for k in range(n)]
    if not 0 <= rank < len(workers):
        raise errors.ConfigError(f"--cluster_resolver=slurm: SLURM_PROCID={rank} but the "
                                 f"step has {len(workers)} tasks (valid: 0..{len(workers) - 1})")
    return {"worker": workers}, rank


def _slurm_step_tasks(env):
    """Number of tasks of the Slurm job step this process is one of (0 outside a step).

    Only the STEP variables count: the batch script itself (sbatch, no srun) also has
    SLURM_PROCID=0 and the job's SLURM_TASKS_PER_NODE, but it is a single process.
    """
    per_node = env.get("SLURM_STEP_TASKS_PER_NODE")
    if not env.get("SLURM_PROCID") or not per_node:
        return 0
    try:
        return sum(expand_tasks_per_node(per_node))
    except ValueError:
        raise errors.ConfigError(f"bad SLURM_STEP_TASKS_PER_NODE={per_node!r}; expected "
                                 f"e.g. '2(x2)' or '1,2'") from None


def cluster_from_env(env=None):
    """The multi-worker cluster the environment describes.

    Returns:
        (num_tasks, resolver name): (N, "tf_config") when TF_CONFIG's cluster has N > 1
        tasks, else (N, "slurm") when this is one of N > 1 tasks of a Slurm job step
        (SLURM_PROCID and SLURM_STEP_TASKS_PER_NODE), else (1, None).
    """
    env = os.environ if env is None else env
    num = _tf_config_tasks(env)
    if num > 1:
        return num, "tf_config"
    num = _slurm_step_tasks(env)
    if num > 1:
        return num, "slurm"
    return 1, None


def task_name(env=None, *, mesh=False):
    """This process's name in its cluster, as its log lines and log file carry it
    (cluster/rank_log.py): "worker 3" or "chief 0" (TF_CONFIG's task), "worker R" (Slurm
    rank R), "client I" (DTensor client I, `mesh`: its DTENSOR_* variables or what
    client_env_from derives); None for a single process. tools/launch_local.py names the
    processes it starts by the same rule."""
    env = os.environ if env is None else env
    if mesh:
        clients = dict(env) if env.get("DTENSOR_JOBS") else client_env_from(env)
        jobs = [h for h in clients.get("DTENSOR_JOBS", "").split(",") if h.strip()]
        return f"client {int(clients.get('DTENSOR_CLIENT_ID', 0))}" if len(jobs) > 1 else None
    num, source = cluster_from_env(env)
    if source == "tf_config":
        task = json.loads(env["TF_CONFIG"])["task"]
        return f"{task['type']} {int(task['index'])}"
    if source == "slurm":
        return f"worker {slurm_cluster(env)[1]}"
    return None


def parameter_servers(env=None):
    """The number of `ps` tasks in TF_CONFIG's cluster (0 without TF_CONFIG)."""
    cfg = check_tf_config(os.environ if env is None else env)
    return len(cfg["cluster"].get("ps", ())) if cfg else 0


# ---- DTensor clients -------------------------------------------------------------------

def client_env(hosts, index):
    """The DTENSOR_* variables of client `index` of the clients at `hosts` ["host:port"]."""
    return {"DTENSOR_JOBS": ",".join(hosts), "DTENSOR_CLIENT_ID": str(int(index)),
            "DTENSOR_NUM_CLIENTS": str(len(hosts)), "DTENSOR_JOB_NAME": JOB}


def _check_dtensor_env(env):
    jobs = [h for h in env["DTENSOR_JOBS"].split(",") if h.strip()]
    # DTensor takes a missing client id for 0: every process would be the chief.
    raw_id = env.get("DTENSOR_CLIENT_ID", "0" if len(jobs) == 1 else None)
    raw_n = env.get("DTENSOR_NUM_CLIENTS")
    try:
        cid, n = int(raw_id), int(raw_n) if raw_n else len(jobs)
        ok = all(":" in h for h in jobs) and n == len(jobs) and 0 <= cid < n
    except (TypeError, ValueError):
        ok = False
    if not ok:
        raise errors.ConfigError(
            f"bad DTensor cluster: DTENSOR_JOBS={env['DTENSOR_JOBS']!r}, DTENSOR_CLIENT_ID="
            f"{raw_id!r}, DTENSOR_NUM_CLIENTS={raw_n!r}; valid: DTENSOR_JOBS=host:port,"
            f"host:port,... with DTENSOR_CLIENT_ID in 0..N-1 and DTENSOR_NUM_CLIENTS=N "
            f"(its number of entries) or unset")


def client_env_from(env=None):
    """The DTENSOR_* variables this process lacks to join its mesh ({} for one process).

    DTENSOR_JOBS set: checked and kept ({}). Else a cluster of more than one task in
    TF_CONFIG (tasks in order: chief, then workers; this task's position is its client
    id) or a Slurm job step (`slurm_cluster`: the task's rank) becomes one client per
    task at that task's address. ConfigError (one line) for a bad description.
    """
    env = os.environ if env is None else env
    if env.get("DTENSOR_JOBS"):
        _check_dtensor_env(env)
        return {}
    num, source = cluster_from_env(env)
    if source == "tf_config":
        cfg = json.loads(env["TF_CONFIG"])
        order = [(kind, i) for kind in ("chief", "worker")
                 for i in range(len(cfg["cluster"].get(kind, ())))]
        me = (cfg["task"]["type"], int(cfg["task"]["index"]))
        if me not in order or len(order) != num:
            raise errors.ConfigError(
                f"--mesh with TF_CONFIG {env['TF_CONFIG']!r}: only chief and worker tasks "
                f"can be DTensor clients; valid: a cluster of chief / worker tasks")
        return client_env([cfg["cluster"][k][i] for k, i in order], order.index(me))
    if source == "slurm":
        cluster, rank = slurm_cluster(env)
        return client_env(cluster["worker"], rank)
    return {}
