"""Test setup: logical CPU devices before TensorFlow initializes, subprocess helpers.

In-process tests share ONE 2-replica MirroredStrategy: strategies created one after
another in a process share collective keys and abort each other (tensorflow#61314), so
other replica counts run in subprocesses (the real binary).
"""

import concurrent.futures
import contextlib
import fcntl
import hashlib
import io
import os
import shutil
import subprocess
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import pytest  # noqa: E402
import tensorflow as tf  # noqa: E402

from tf_gan_scale import distribute  # noqa: E402

NUM_CPU_DEVICES = 2
distribute.configure_cpu_devices(NUM_CPU_DEVICES)

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# A tiny DCGAN on the embedded digits with batch norm in BOTH networks: seconds per run.
# One step per call (auto would pick 5 for a 10-step run but 1 for a 6-step one: the
# weights agree only to float32 rounding across the two, and tests compare runs bit for
# bit); test_cli.py runs auto.
TINY = ["--config=experiments/digits.py", "--config.train.global_batch_size=32",
        "--config.train.steps_per_execution=1",
        "--config.model.d_norm=batch", "--config.model.g_channels=(32,16,8)",
        "--config.model.d_channels=(8,16)", "--config.model.latent_dim=16",
        "--config.train.log_every=5", "--config.train.sample_every=5",
        "--config.train.checkpoint_every=5"]


# The heaviest files first (measured: docs/testing.md), so that with two xdist workers
# and whole files per worker (--dist loadfile) no long file starts last and runs alone
# at the end while the other core idles. Files not listed keep pytest's order after them.
HEAVY_FIRST = ["test_equivalence.py", "test_parallel_step.py", "test_fault_tolerance.py",
               "test_cli.py", "test_keras_model.py", "test_parallel_clients.py",
               "test_conditional_tools.py", "test_evaluate_tool.py", "test_keras_io.py",
               "test_parallel_run.py", "test_precision.py", "test_gan.py", "test_recipes.py",
               "test_multi_worker.py", "test_parallel_placement.py"]


# ---- warm process starts (tests/helpers/warm_start.py) -------------------------------------
# Each pytest process that runs tests (each xdist worker) starts one zygote that has
# imported TensorFlow, and `sys.executable` becomes a shim that asks it for a fresh
# forked process: every `[sys.executable, ...]` a test (or a launcher, or a tool it
# runs) starts then costs ~0.1 CPU-s instead of ~6. TF_GAN_SCALE_COLD_STARTS=1 turns
# it off (every process a cold interpreter, as before).
REAL_PYTHON = sys.executable
_ZYGOTE = {}


def _runs_tests(config):
    return hasattr(config, "workerinput") or not getattr(config.option, "numprocesses", None)


def pytest_sessionstart(session):
    if os.environ.get("TF_GAN_SCALE_COLD_STARTS") or not _runs_tests(session.config):
        return
    import shlex
    import tempfile
    home = tempfile.mkdtemp(prefix="tfgs-warm-")
    sock, shim = os.path.join(home, "sock"), os.path.join(home, "python")
    script = os.path.join(REPO, "tests", "helpers", "warm_start.py")
    with open(shim, "w") as f:
        f.write("#!/bin/sh\nexec " + " ".join(shlex.quote(a) for a in (
            REAL_PYTHON, "-S", "-E", script, "client", sock, REAL_PYTHON)) + ' "$@"\n')
    os.chmod(shim, 0o755)
    procs = []
    for i in range(2):  # warm_start.ZYGOTES: workers of one cluster alternate.
        env = {k: v for k, v in os.environ.items() if k != "PYTHONHASHSEED"}
        with open(os.path.join(home, f"zygote{i}.log"), "w") as log:
            procs.append(subprocess.Popen(
                [REAL_PYTHON, script, "serve", f"{sock}{i}"], cwd=REPO, env=env,
                stdin=subprocess.DEVNULL, stdout=log, stderr=log))
    _ZYGOTE.update(procs=procs, home=home)
    os.environ["TF_GAN_SCALE_WARM_PYTHON"] = shim  # Children's sys.executable too.
    # tools/cpu_timing.py adds the CPU of what they forked to each test's child CPU.
    os.environ["TF_GAN_SCALE_WARM_ZYGOTE_PIDS"] = ",".join(str(p.pid) for p in procs)
    sys.executable = shim


def pytest_sessionfinish(session):
    procs = _ZYGOTE.pop("procs", None)
    if not procs:
        return
    sys.executable = REAL_PYTHON
    for proc in procs:
        proc.terminate()
    for proc in procs:
        try:
            proc.wait(30)  # Reaped: its children's CPU joins this process's RUSAGE_CHILDREN.
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
    shutil.rmtree(_ZYGOTE.pop("home"), ignore_errors=True)


def pytest_collection_modifyitems(config, items):
    rank = {name: i for i, name in enumerate(HEAVY_FIRST)}
    # sorted() is stable: within a file, and among unlisted files, the order stays.
    items[:] = sorted(items, key=lambda item: rank.get(item.path.name, len(rank)))


# ---- the tiers' promise: a default-tier test starts no Python process ---------------------
# docs/testing.md: `-m "not slow"` skips every test that starts its own processes, except
# the default tier's few on purpose (listed here). A test that starts `python ...` while it
# runs (fixture setup is not counted: the shared tiny run and the equivalence references
# are fixtures) and is neither slow nor listed fails, naming the command.
DEFAULT_TIER_PROCESSES = (
    "integration/test_equivalence.py",   # the one real multi-process equivalence run
    "test_cli.py::test_train_resume_sample",  # exact resume end to end: 4 warm starts
    # Processes that import no TensorFlow (~0.1 s each):
    "helpers/test_warm_start.py",        # the warm-start shim itself
    "test_layering.py",                  # fresh interpreters: what an import loads
    "cluster/test_launch_local.py::test_the_worker_that_failed_first_is_reported_though_its_peer",
    "cluster/test_startup.py::test_the_launcher_names_the_worker_that_never_joined",
)  # (the launcher with fake workers: tiny scripts that sleep and exit)


def _python_argv(args):
    argv = [args] if isinstance(args, (str, bytes, os.PathLike)) else list(args)
    return argv if argv and os.path.basename(str(argv[0])).startswith("python") else None


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item):
    if item.get_closest_marker("slow") or any(
            item.nodeid.startswith("tests/" + a) or item.nodeid.startswith(a)
            for a in DEFAULT_TIER_PROCESSES):
        return (yield)
    started, real_init = [], subprocess.Popen.__init__

    def init(self, args, *a, **k):
        argv = _python_argv(args)
        if argv:
            started.append(" ".join(map(str, argv[1:4])))
        real_init(self, args, *a, **k)

    subprocess.Popen.__init__ = init
    try:
        result = yield
    finally:
        subprocess.Popen.__init__ = real_init
    if started:
        pytest.fail(f"{item.nodeid} starts a Python process ({started[0]} ...) but is not "
                    "marked slow (docs/testing.md: tiers); mark it or add it to "
                    "conftest.DEFAULT_TIER_PROCESSES", pytrace=False)
    return result


def run_cmd(args, timeout=300, env=None):
    """Runs `python ARGS` in the repo root; returns CompletedProcess (text)."""
    full_env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2", **(env or {}))
    return subprocess.run([sys.executable] + list(args), cwd=REPO, capture_output=True,
                          text=True, timeout=timeout, env=full_env)


def run_cmds(arg_lists, timeout=300, env=None, workers=2):
    """run_cmd for each of `arg_lists`, `workers` at a time; results in order. For
    commands that fail early (bad input): each spends its seconds starting Python and
    importing TensorFlow, mostly on one core, so two share the 2 cores well."""
    with concurrent.futures.ThreadPoolExecutor(workers) as pool:
        return list(pool.map(lambda args: run_cmd(args, timeout, env), arg_lists))


def run_in_process(args, env=None):
    """run_cmd's twin in THIS process (tf_gan_scale.cli.run_main): `args` as run_cmd's
    (["-m", MODULE, ...] or [SCRIPT, ...]); a CompletedProcess with the exit status and
    what the entry point printed. For cases that fail before any TensorFlow strategy or
    device setup (bad flags, configs, paths): each saves a process start (~5 CPU-s).
    Cases that need their own devices, strategy or cluster stay in run_cmd."""
    from tf_gan_scale import cli
    args = [str(a) for a in args]
    entry, argv = (args[1], args[2:]) if args[0] == "-m" else (args[0], args[1:])
    if entry == "tf_gan_scale.main" and not any(
            a.startswith(("--strategy", "--mesh", "--placement")) for a in argv):
        # Not --strategy=auto: over this process's 2 logical CPUs that is a
        # MirroredStrategy, whose collectives share instance keys with the suite's own
        # strategies in this process; a clash (a shape mismatch) aborts every later
        # collective of the process (issue 49's first CI run: test_sync_batch_norm).
        argv = ["--strategy=one_device", *argv]
    out, err = io.StringIO(), io.StringIO()
    saved_env, cwd = dict(os.environ), os.getcwd()
    os.environ.update(env or {})
    os.chdir(REPO)  # Paths in args are relative to the repo root, as in run_cmd.
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            code = cli.run_main(entry, argv)
    finally:
        os.chdir(cwd)
        os.environ.clear()
        os.environ.update(saved_env)
    return subprocess.CompletedProcess(args, code, out.getvalue(), err.getvalue())


TINY_RUN_STEPS = 10


@pytest.fixture(scope="session")
def tiny_run(tmp_path_factory, worker_id):
    """Workdir of THE tiny run: the binary with TINY for TINY_RUN_STEPS steps (checkpoints
    and sample grids at 5 and 10), trained once per test session and shared by every test
    that only needs "a trained run". The xdist workers share it through a directory of
    the session and a file lock: the first to arrive trains, the others wait and read.
    Read-only: a test that runs anything that could write into it takes copy_run()."""
    root = tmp_path_factory.getbasetemp()
    if worker_id != "master":  # popen-gwN's parent: one per session, shared by workers.
        root = root.parent
    workdir, done = root / "tiny_run", root / "tiny_run.done"
    with open(root / "tiny_run.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # Released when the file closes.
        if not done.exists():
            shutil.rmtree(workdir, ignore_errors=True)
            proc = run_cmd(["-m", "tf_gan_scale.main", f"--workdir={workdir}", *TINY,
                            f"--config.train.num_steps={TINY_RUN_STEPS}"])
            assert proc.returncode == 0, proc.stderr[-3000:]
            done.write_text("")  # Only a finished run is shared.
    return workdir


def tree_digest(root):
    """{relative path: sha256} of every file under root: a workdir's state, to show that
    a command left it exactly as it was."""
    digest = {}
    for dirpath, _, names in os.walk(root):
        for name in names:
            path = os.path.join(dirpath, name)
            with open(path, "rb") as f:
                digest[os.path.relpath(path, root)] = hashlib.sha256(f.read()).hexdigest()
    return digest


def copy_run(run, dest):
    """A copy of a trained workdir (e.g. tiny_run) at `dest`, for tests that write."""
    shutil.copytree(run, dest)
    return dest


@pytest.fixture(scope="session")
def mirrored2():
    # One instance per process: each new MirroredStrategy restarts the collective keys,
    # and its all-reduces then collide with the previous instance's (tensorflow#61314).
    return tf.distribute.MirroredStrategy([f"/cpu:{i}" for i in range(2)])


@pytest.fixture(scope="session")
def one_device():
    # One per process, as mirrored2: `shared` keeps its GANs per strategy object.
    return tf.distribute.OneDeviceStrategy("/cpu:0")


_SHARED = {}  # (builder, strategy id, arguments) -> (strategy, GAN, initial values)


def _gan_state(model):
    """Every variable of a GAN that training changes: G's and D's weights (moving
    statistics, dropout counters, an EMA copy, LeCam's anchors), both optimizers'
    (step counter, slots) and the loss trackers'."""
    out, seen = [], set()
    for v in [*model.variables, *model.g_optimizer.variables, *model.d_optimizer.variables,
              *(v for m in model.metrics for v in m.variables)]:
        if id(v) not in seen:
            seen.add(id(v))
            out.append(v)
    return out


def shared(build, strategy, **kwargs):
    """build(strategy, **kwargs), a compiled GAN, built once per test process and reused:
    each call returns the same GAN with every variable set back to its value as built,
    so a test sees the model `build` gives without tracing its step again (a trace of a
    tiny DCGAN step costs ~5-10 CPU-s, its steps milliseconds). For tests that neither
    change the model's settings (compile, attributes) nor patch what its step traces;
    the others call `build` itself. tests/gan/test_keras_model.py checks that training from
    the reset state twice gives the same weights."""
    key = (build.__module__, build.__qualname__, id(strategy), tuple(sorted(kwargs.items())))
    if key not in _SHARED:  # The strategy is kept alive with it: its id stays its own.
        model = build(strategy, **kwargs)
        _SHARED[key] = (strategy, model, [v.numpy() for v in _gan_state(model)])
    _, model, initial = _SHARED[key]
    for v, value in zip(_gan_state(model), initial, strict=True):
        v.assign(value)
    model.stop_training = False
    return model
