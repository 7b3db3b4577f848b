"""pytest plugin: per-test wall, own CPU and child-process CPU (docs/testing.md).

    CPU_TIMING_DIR=DIR PYTHONPATH=tools PYTEST_ADDOPTS="-p cpu_timing" python -m pytest -q

Writes to $CPU_TIMING_DIR/<pid>.jsonl (one file per xdist worker)."""
import json, os, resource, time
import pytest

_DIR = os.environ.get("CPU_TIMING_DIR", "/tmp/cpu_timing")


def _cpu(who):
    r = resource.getrusage(who)
    cpu = r.ru_utime + r.ru_stime
    zygotes = os.environ.get("TF_GAN_SCALE_WARM_ZYGOTE_PIDS")  # tests/helpers/warm_start.py
    for pid in (zygotes.split(",") if who == resource.RUSAGE_CHILDREN and zygotes else ()):
        try:  # The processes it forked for this test run under it, not under pytest:
            with open(f"/proc/{pid}/stat") as f:  # its waited-for children's CPU.
                fields = f.read().rsplit(")", 1)[1].split()
            cpu += (int(fields[13]) + int(fields[14])) / os.sysconf("SC_CLK_TCK")
        except OSError:
            pass
    return cpu


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
    t0, s0, c0 = time.time(), _cpu(resource.RUSAGE_SELF), _cpu(resource.RUSAGE_CHILDREN)
    yield
    rec = dict(id=item.nodeid, wall=time.time() - t0,
               self_cpu=_cpu(resource.RUSAGE_SELF) - s0,
               child_cpu=_cpu(resource.RUSAGE_CHILDREN) - c0, pid=os.getpid())
    os.makedirs(_DIR, exist_ok=True)
    with open(os.path.join(_DIR, f"{os.getpid()}.jsonl"), "a") as f:
        f.write(json.dumps(rec) + "\n")
