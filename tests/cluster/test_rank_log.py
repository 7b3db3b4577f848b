"""Per-rank logs (cluster/rank_log.py): task names from the environment, the prefix on
every line, the file under WORKDIR/logs only once opened, and the launcher's one prefix.
In this process, but for the launcher (a few tiny processes, no TensorFlow in them)."""

import io
import json
import logging
import sys
import warnings

import pytest
from absl import logging as absl_logging

from tf_gan_scale.cluster import env as cluster_env
from tf_gan_scale.cluster import launch, rank_log


def tf_config(index, task="worker", chief=False):
    cluster = {"worker": ["h:1", "h:2"], **({"chief": ["h:0"]} if chief else {})}
    return {"TF_CONFIG": json.dumps({"cluster": cluster, "task": {"type": task, "index": index}})}


@pytest.mark.parametrize("env, mesh, name", [
    ({}, False, None),
    ({"TF_CONFIG": json.dumps({"cluster": {"worker": ["h:1"]},
                               "task": {"type": "worker", "index": 0}})}, False, None),
    (tf_config(1), False, "worker 1"),
    (tf_config(0, "chief", chief=True), False, "chief 0"),
    ({"SLURM_PROCID": "3", "SLURM_STEP_NODELIST": "n[1-2]", "SLURM_STEP_TASKS_PER_NODE": "2(x2)"},
     False, "worker 3"),
    (cluster_env.client_env(["h:1", "h:2"], 1), True, "client 1"),
    (tf_config(1, chief=True), True, "client 2"),  # Chief first: client 0.
    ({}, True, None),
])
def test_task_names(env, mesh, name):
    assert cluster_env.task_name(env, mesh=mesh) == name


@pytest.fixture
def binary_logging():
    """Logging as in the binary: absl's handler on the root logger (app.run puts it
    there; under pytest the root has pytest's), verbosity INFO."""
    handler, verbosity = absl_logging.get_absl_handler(), absl_logging.get_verbosity()
    added = handler not in logging.root.handlers
    if added:
        logging.root.addHandler(handler)
    absl_logging.set_verbosity(absl_logging.INFO)
    yield
    absl_logging.set_verbosity(verbosity)
    if added:
        logging.root.removeHandler(handler)


def test_every_line_carries_the_task_and_the_file_starts_only_when_opened(
        tmp_path, capsys, binary_logging):
    workdir = tmp_path / "run"
    with rank_log.started("worker 1"):
        absl_logging.info("waiting for the cluster")
        absl_logging.warning("two\nlines")
        with warnings.catch_warnings():
            warnings.simplefilter("always")
            warnings.warn("a Python warning")
        assert not workdir.exists()  # Bad input can still fail here: nothing written.
        assert rank_log.current() is None
        path = rank_log.open_file(workdir)
        assert path == str(workdir / "logs" / "worker_1.log") == rank_log.current()
        absl_logging.info("step 10: d_loss=1")
        rank_log.error("multi-worker run aborted")
        assert rank_log.peer_file("worker", 0) == str(workdir / "logs" / "worker_0.log")
        assert rank_log.peer_file("chief", 0) == str(workdir / "logs" / "chief_0.log")
    absl_logging.info("after")  # Logging is as it was outside.
    lines = (workdir / "logs" / "worker_1.log").read_text().splitlines()
    assert len(lines) == 7 and all(ln.startswith("[worker 1] ") for ln in lines), lines
    assert "waiting for the cluster" in lines[0] and lines[2] == "[worker 1] lines"
    assert "a Python warning" in lines[3] and "step 10: d_loss=1" in lines[-2]
    assert lines[-1] == "[worker 1] error: multi-worker run aborted"
    err = [ln for ln in capsys.readouterr().err.splitlines()  # absl's note, once a process:
           if not ln.startswith("WARNING: Logging before flag parsing")]
    # stderr has the same lines, prefixed (the warning: Python's own two lines).
    assert [ln for ln in err if "after" not in ln and "warnings.warn" not in ln] == [
        ln for ln in lines if "warnings.warn" not in ln], err
    assert [ln for ln in err if "after" in ln] and not any(
        ln.startswith("[") for ln in err if "after" in ln)
    assert not any(isinstance(h, logging.Handler) and type(h).__name__ == "_KeepThenWrite"
                   for h in logging.root.handlers)


def test_a_client_names_its_peers_as_clients(tmp_path):
    with rank_log.started("client 0"):
        rank_log.open_file(tmp_path)
        # DTensor's job name for every client is "worker" (DTENSOR_JOB_NAME).
        assert rank_log.peer_file("worker", 1) == str(tmp_path / "logs" / "client_1.log")


def test_one_process_has_no_prefix_and_no_file(tmp_path, capsys):
    with rank_log.started(None):
        assert rank_log.open_file(tmp_path) is None
        assert rank_log.peer_file("worker", 1) is None
        rank_log.error("non-finite loss")
    assert capsys.readouterr().err == "error: non-finite loss\n"
    assert list(tmp_path.iterdir()) == []


@pytest.mark.slow
def test_the_launcher_prefixes_each_line_once(tmp_path):
    # A line that carries its task's prefix already (the binary's own) is passed on as is.
    code = ("import json, os; i = json.loads(os.environ['TF_CONFIG'])['task']['index']; "
            "print(f'[worker {i}] mine'); print('plain', flush=True)")
    out = io.StringIO()
    assert launch.launch([sys.executable, "-c", code], 2, num_gpus=0, out=out) == 0
    lines = out.getvalue().splitlines()
    for i in (0, 1):
        assert lines.count(f"[worker {i}] mine") == 1 and lines.count(f"[worker {i}] plain") == 1
    assert not any("] [" in ln for ln in lines), lines


@pytest.mark.parametrize("before", [True, False])
def test_warnings_capture_is_put_back(before):
    # The binary also runs in-process (cli.run_main): a caller's capture stays as it was.
    logging.captureWarnings(before)
    try:
        with rank_log.started("worker 0"):
            assert logging._warnings_showwarning is not None
        assert (logging._warnings_showwarning is not None) == before
    finally:
        logging.captureWarnings(False)


@pytest.mark.slow
def test_a_command_with_its_own_mesh_is_prefixed_as_a_client_once(tmp_path):
    # Launched without --mesh but carrying one, each process is DTensor client i (from its
    # TF_CONFIG) and prefixes "[client i] " itself: the launcher must not add "[worker i] ".
    code = ("import json, os; i = json.loads(os.environ['TF_CONFIG'])['task']['index']; "
            "print(f'[client {i}] mine'); print('plain', flush=True)")
    out = io.StringIO()
    assert launch.launch([sys.executable, "-c", code, "--mesh=batch:2,model:1"], 2,
                         num_gpus=0, out=out) == 0
    lines = out.getvalue().splitlines()
    for i in (0, 1):
        assert lines.count(f"[client {i}] mine") == 1 and lines.count(f"[client {i}] plain") == 1
    assert not any("] [" in ln or ln.startswith("[worker") for ln in lines), lines
