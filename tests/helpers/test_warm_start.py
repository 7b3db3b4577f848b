"""tests/helpers/warm_start.py: a process the suite starts warm behaves as a cold one.

Every test that starts `[sys.executable, ...]` relies on it: the exit status, output,
argv, working directory, environment and stdin of the command, signals sent to the pid
the test holds, and a fresh TensorFlow runtime. Each case runs the same command with the
warm shim (sys.executable) and the real interpreter and compares. The commands import
no TensorFlow but one (~0.1 s each): cheap enough for the default tier.
"""

import json
import os
import signal
import subprocess
import sys
import time

import pytest

from conftest import REAL_PYTHON

warm_only = pytest.mark.skipif(sys.executable == REAL_PYTHON,
                               reason="warm starts are off (TF_GAN_SCALE_COLD_STARTS)")

COMMAND = r"""
import os, sys
print(sys.argv, __name__, os.getcwd() == os.environ["WANT_CWD"], os.environ["X"],
      sys.stdin.read(), flush=True)
print("to stderr", file=sys.stderr)
if sys.argv[1] == "message":
    sys.exit("a message")
if sys.argv[1] == "raise":
    raise ValueError("boom")
if sys.argv[1] == "absl":  # app.run as our binaries and tools call it.
    from absl import app
    app.run(lambda argv: sys.exit(4))
sys.exit(int(sys.argv[1]))
"""


def both(args, tmp_path, **kw):
    """(warm, cold) CompletedProcess of `python ARGS` in tmp_path."""
    env = {**os.environ, "X": "x", "WANT_CWD": str(tmp_path), **kw.pop("env", {})}
    return [subprocess.run([python, *args], cwd=tmp_path, env=env, input="in", text=True,
                           capture_output=True, timeout=120, **kw)
            for python in (sys.executable, REAL_PYTHON)]


@pytest.mark.parametrize("arg", ["0", "3", "message", "raise", "absl"])
def test_exit_status_output_argv_cwd_env_and_stdin_are_a_cold_process(arg, tmp_path):
    warm, cold = both(["-c", COMMAND, arg, "a b"], tmp_path)
    assert warm.stdout == cold.stdout == f"['-c', '{arg}', 'a b'] __main__ True x in\n"
    assert warm.returncode == cold.returncode == {"0": 0, "3": 3, "absl": 4}.get(arg, 1)
    if arg == "raise":  # The traceback's last line; its frames name the same <string>.
        assert warm.stderr.splitlines()[-1] == cold.stderr.splitlines()[-1] == "ValueError: boom"
    else:  # Nothing else: no line of TensorFlow's, though the zygote imported it.
        assert warm.stderr == cold.stderr == "to stderr\n" + (
            "a message\n" if arg == "message" else "")


def test_a_script_and_a_module_run_as_main(tmp_path):
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "helper.py").write_text("VALUE = 7\n")
    (tmp_path / "pkg" / "mod.py").write_text(
        "import sys, helper\nprint(__name__, helper.VALUE, sys.argv[1:])\n")
    (tmp_path / "script.py").write_text(
        "import sys, os\nprint(__name__, __file__ == os.path.abspath('script.py'), sys.argv,"
        " sys.path[0] == os.path.dirname(__file__))\n")
    for args, expected in ((["script.py", "1"], "__main__ True ['script.py', '1'] True\n"),
                           (["-u", "-m", "mod", "2"], "__main__ 7 ['2']\n"),
                           (["-c", "import sys; print(repr(sys.path[0]))"], "''\n")):
        warm, cold = both(args, tmp_path, env={"PYTHONPATH": str(tmp_path / "pkg")})
        assert warm.stdout == cold.stdout == expected, (args, warm.stderr)
        assert warm.returncode == cold.returncode == 0
    warm, cold = both(["missing.py"], tmp_path)
    assert warm.returncode == cold.returncode == 2
    assert "can't open file" in warm.stderr and "can't open file" in cold.stderr


HANDLER = r"""
import os, signal, sys, time
if sys.argv[1] == "handle":
    signal.signal(signal.SIGUSR1, lambda *a: print("usr1", flush=True))
    signal.signal(signal.SIGTERM, lambda *a: (print("saved", flush=True), os._exit(143)))
open(sys.argv[2], "w").write(str(os.getpid()))
time.sleep(60)
"""


def started(python, mode, pid_file, tmp_path):
    proc = subprocess.Popen([python, "-c", HANDLER, mode, str(pid_file)], cwd=tmp_path,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.time() + 60
    while not (pid_file.exists() and pid_file.read_text()) and time.time() < deadline:
        time.sleep(0.05)
    return proc, int(pid_file.read_text())


@pytest.mark.parametrize("mode", ["handle", "default", "interrupt"])
def test_signals_to_the_pid_the_test_holds_reach_the_process(mode, tmp_path):
    # Sent the moment the process says it is ready (its handlers are in place); with
    # handlers, SIGUSR1 (handled, the process goes on), then SIGTERM.
    results = []
    for i, python in enumerate((sys.executable, REAL_PYTHON)):
        proc, _ = started(python, "default" if mode == "interrupt" else mode,
                          tmp_path / f"pid{i}", tmp_path)
        if mode == "handle":  # Relayed, handled, and the process goes on.
            proc.send_signal(signal.SIGUSR1)
            assert proc.stdout.readline() == "usr1\n"
        proc.send_signal(signal.SIGINT if mode == "interrupt" else signal.SIGTERM)
        out, err = proc.communicate(timeout=30)
        results.append((proc.returncode, out, err.splitlines()[-1:]))
    assert results[0] == results[1] == {
        "handle": (143, "saved\n", []), "default": (-15, "", []),
        "interrupt": (-2, "", ["KeyboardInterrupt"])}[mode], results


@warm_only
def test_sigkill_of_the_pid_the_test_holds_kills_the_process(tmp_path):
    proc, child = started(sys.executable, "default", tmp_path / "pid", tmp_path)
    assert child != proc.pid  # Warm: the pid the test holds stands in for the child.
    proc.kill()
    proc.wait(30)
    def alive():
        try:
            with open(f"/proc/{child}/stat") as f:  # A zombie is dead, not yet reaped.
                return f.read().rsplit(")", 1)[1].split()[0] != "Z"
        except FileNotFoundError:
            return False

    deadline = time.time() + 10
    while alive() and time.time() < deadline:
        time.sleep(0.05)
    assert not alive(), "the child outlived SIGKILL"


@warm_only
def test_a_warm_process_gets_a_fresh_runtime_and_cluster_neighbours_differ(tmp_path):
    # Devices are configurable (no runtime before the fork); numpy's global generator is
    # seeded afresh in every process (a fork copies its state); workers 0 and 1 of a
    # cluster come from zygotes with different hash secrets, as two cold processes would.
    code = ("import numpy as np, tensorflow as tf; tf.config.set_logical_device_configuration("
            "tf.config.list_physical_devices('CPU')[0], [tf.config.LogicalDeviceConfiguration()]"
            " * 3); print(len(tf.config.list_logical_devices('CPU')), hash('tf_gan_scale'),"
            " np.random.randint(2**62))")
    outs = []
    for index in (0, 0, 1):
        tf_config = json.dumps({"cluster": {"worker": ["a:1", "b:2"]},
                                "task": {"type": "worker", "index": index}})
        proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                              env={**os.environ, "TF_CONFIG": tf_config}, timeout=120)
        assert proc.returncode == 0, proc.stderr[-2000:]
        outs.append(proc.stdout.split())
    assert [out[0] for out in outs] == ["3"] * 3
    assert outs[0][1] == outs[1][1]  # Both from worker 0's zygote (so: warm, not cold),
    assert outs[0][2] != outs[1][2]  # yet two numpy streams.
    assert outs[0][1] != outs[2][1]  # Worker 0 and worker 1: two hash secrets.
