"""tools/launch_local.py with real worker processes (small Python commands, no TensorFlow):
TF_CONFIG per worker, log prefixes, fail-all-on-one, group restarts, signal forwarding.
Those start processes (slow); bad input runs in this process (conftest.run_in_process)."""

import json
import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest

from conftest import REPO, run_in_process
from tf_gan_scale.cluster import launch

LAUNCH = [sys.executable, "tools/launch_local.py"]


def write_worker(tmp_path, body):
    """A worker script; it sees INDEX (its task index) and OUT (tmp_path)."""
    path = tmp_path / "worker.py"
    path.write_text("import json, os, signal, sys, time\n"
                    "INDEX = json.loads(os.environ['TF_CONFIG'])['task']['index']\n"
                    f"OUT = {str(tmp_path)!r}\n" + textwrap.dedent(body))
    return [sys.executable, str(path)]


def run_launcher(args, timeout=60):
    return subprocess.run(LAUNCH + args, cwd=REPO, capture_output=True, text=True,
                          timeout=timeout)


@pytest.mark.slow
def test_each_worker_gets_its_tf_config_and_a_log_prefix(tmp_path):
    cmd = write_worker(tmp_path, """
        print("hello", os.environ["TF_CONFIG"], sys.argv[1:], flush=True)
    """)
    proc = run_launcher(["--num_workers=3", "--devices_per_worker=2", "--", *cmd])
    assert proc.returncode == 0, proc.stdout + proc.stderr
    lines = [ln for ln in proc.stdout.splitlines() if " hello " in ln]
    assert len(lines) == 3
    configs = {}
    for line in lines:
        prefix, rest = line.split(" hello ", 1)
        tf_config, argv = rest.rsplit(" [", 1)
        cfg = json.loads(tf_config)
        assert prefix == f"[worker {cfg['task']['index']}]"
        assert argv == "'--num_cpu_devices=2']"  # K CPU replicas per worker, on CPU.
        configs[cfg["task"]["index"]] = cfg
    assert sorted(configs) == [0, 1, 2]
    hosts = configs[0]["cluster"]["worker"]
    assert all(c["cluster"]["worker"] == hosts for c in configs.values())
    assert len(set(hosts)) == 3 and all(h.startswith("127.0.0.1:") for h in hosts)


def test_gpu_slices_per_worker():
    cmds = launch.worker_commands(["x"], 2, 2, num_gpus=4, ports=[1, 2])
    assert [env["CUDA_VISIBLE_DEVICES"] for _, env in cmds] == ["0,1", "2,3"]
    assert [argv for argv, _ in cmds] == [["x"], ["x"]]
    with pytest.raises(ValueError, match="needs 6 GPUs; this machine has 4"):
        launch.worker_commands(["x"], 3, 2, num_gpus=4, ports=[1, 2, 3])


@pytest.mark.slow
def test_one_failing_worker_ends_all_and_the_launcher_fails(tmp_path):
    cmd = write_worker(tmp_path, """
        if INDEX == 1:
            sys.exit(3)
        open(os.path.join(OUT, "pid0"), "w").write(str(os.getpid()))
        time.sleep(600)  # Would hang forever without the launcher.
    """)
    t0 = time.monotonic()
    proc = run_launcher(["--num_workers=2", "--grace_s=2", "--", *cmd])
    assert proc.returncode == 3, proc.stdout + proc.stderr
    assert time.monotonic() - t0 < 30
    assert "worker 1 exited with code 3; worker exit codes [137, 3]" in proc.stdout
    pid0 = int((tmp_path / "pid0").read_text())
    assert not os.path.exists(f"/proc/{pid0}") or "Z" in open(f"/proc/{pid0}/stat").read()


@pytest.mark.slow
def test_group_restarts_up_to_max_restarts(tmp_path):
    # Every worker fails in attempts 1 and 2 and succeeds in attempt 3.
    cmd = write_worker(tmp_path, """
        marker = os.path.join(OUT, f"runs{INDEX}")
        runs = len(open(marker).read()) if os.path.exists(marker) else 0
        open(marker, "a").write("x")
        sys.exit(0 if runs >= 2 else 5)
    """)
    proc = run_launcher(["--num_workers=2", "--max_restarts=1", "--", *cmd])
    assert proc.returncode == 5
    assert proc.stdout.count("starting 2 workers") == 2
    proc = run_launcher(["--num_workers=2", "--max_restarts=1", "--", *cmd])
    assert proc.returncode == 0, proc.stdout
    assert "attempt 1/2" in proc.stdout and "all workers finished" in proc.stdout
    assert (tmp_path / "runs0").read_text() == "xxx"


@pytest.mark.slow
def test_sigterm_is_forwarded_to_every_worker_and_not_restarted(tmp_path):
    cmd = write_worker(tmp_path, """
        def on_term(signum, frame):
            open(os.path.join(OUT, f"term{INDEX}"), "w").write("saved")
            sys.exit(143)
        signal.signal(signal.SIGTERM, on_term)
        open(os.path.join(OUT, f"ready{INDEX}"), "w").close()
        time.sleep(600)
    """)
    proc = subprocess.Popen(LAUNCH + ["--num_workers=2", "--max_restarts=3", "--", *cmd],
                            cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 30
        while not all((tmp_path / f"ready{i}").exists() for i in range(2)):
            assert time.monotonic() < deadline and proc.poll() is None
            time.sleep(0.1)
        proc.send_signal(signal.SIGTERM)
        out, _ = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 128 + signal.SIGTERM
    assert [(tmp_path / f"term{i}").read_text() for i in range(2)] == ["saved", "saved"]
    assert out.count("starting 2 workers") == 1  # A stop request is not a failure.


@pytest.mark.parametrize("args, message", [
    (["--num_workers=2"], "no command: put it after `--`"),
    (["--", "true"], "--num_workers is required"),
    (["--num_workers=0", "--", "true"], "--num_workers must be >= 1; Received: 0"),
    (["--num_workers=2", "--max_restarts=-1", "--", "true"], "--max_restarts must be >= 0"),
    (["--num_workers=2", "--devices_per_worker=0", "--", "true"],
     "--devices_per_worker must be >= 1"),
])
def test_bad_input_is_one_line(args, message):
    proc = run_in_process(["tools/launch_local.py", *args])
    assert proc.returncode == 2
    assert proc.stderr.count("\n") == 1 and message in proc.stderr, proc.stderr


@pytest.mark.slow
def test_bad_input_of_the_real_launcher_is_one_line():
    proc = run_launcher(["--num_workers=0", "--", "true"])
    assert proc.returncode == 2
    assert proc.stderr.count("\n") == 1 and "--num_workers must be >= 1" in proc.stderr, \
        proc.stderr


def test_the_worker_that_failed_first_is_reported_though_its_peer_exits_in_the_same_poll(
        tmp_path):
    """A killed worker's peer sees its collective reset and fails within a fraction of a
    second: both are found exited at one poll. The launcher reports the first to exit
    (here worker 1; worker 0 exits 0.3 s after it), not the lower index. Python workers
    without TensorFlow: ~1 s."""
    import io
    cmd = write_worker(tmp_path, """
        done = os.path.join(OUT, "worker1_exits")
        if INDEX == 1:
            open(done, "w").close()
            sys.exit(137)
        while not os.path.exists(done):
            time.sleep(0.01)
        time.sleep(0.3)
        sys.exit(1)
    """)
    out = io.StringIO()
    # One poll every 3 s: both have exited by the first that sees either.
    assert launch.launch(cmd, 2, grace_s=5, poll_s=3, out=out) == 137, out.getvalue()
    assert "worker 1 exited with code 137; worker exit codes [1, 137]" in out.getvalue()
