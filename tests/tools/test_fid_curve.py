"""tools/fid_curve.py: FID against wall time from evaluate.py's JSON lines (in-process)."""

import json

from PIL import Image

from conftest import run_in_process


def lines(path, pairs):
    path.write_text("".join(json.dumps({"step": s, "checkpoint": f"ckpt-{s}", "fid": f}) + "\n"
                            for s, f in pairs))
    return path


def test_draws_every_run_and_reports_its_points(tmp_path):
    a = lines(tmp_path / "a.jsonl", [(500, 40.0), (250, 90.0)])
    b = lines(tmp_path / "b.jsonl", [(1000, 20.0)])
    out = tmp_path / "curve.png"
    proc = run_in_process(["tools/fid_curve.py", f"--run=DCGAN={a}@0.2",
                           f"--run=R3GAN={b}@0.3", f"--output={out}"])
    assert proc.returncode == 0, proc.stderr[-2000:]
    line = json.loads(proc.stdout.strip().splitlines()[-1])
    assert line["runs"] == [{"label": "DCGAN", "points": [[250, 90.0], [500, 40.0]]},
                            {"label": "R3GAN", "points": [[1000, 20.0]]}]
    assert Image.open(out).size == (700, 420)
    assert out.stat().st_mode & 0o777 == 0o644  # A figure, not mkstemp's private 0600.


def test_bad_input_is_one_line(tmp_path):
    a = lines(tmp_path / "a.jsonl", [(1, 2.0)])
    for run, message in [(f"X={a}", "LABEL=FILE@SECONDS_PER_STEP"),
                         (f"X={a}@0", "LABEL=FILE@SECONDS_PER_STEP"),
                         (f"X={tmp_path}/none.jsonl@1", "not found")]:
        proc = run_in_process(["tools/fid_curve.py", f"--run={run}",
                               f"--output={tmp_path}/c.png"])
        assert proc.returncode == 2 and message in proc.stderr, proc.stderr
    (tmp_path / "bad.jsonl").write_text('{"step": 3}\n')
    proc = run_in_process(["tools/fid_curve.py", f"--run=X={tmp_path}/bad.jsonl@1",
                           f"--output={tmp_path}/c.png"])
    assert proc.returncode == 2 and "bad.jsonl:1" in proc.stderr
    assert not (tmp_path / "c.png").exists()
