"""Executes the code cells of experiments/fit_notebook.ipynb, top to bottom, in a fresh
interpreter (no Jupyter needed), with few steps."""

import json
import os

import pytest

from conftest import REPO, run_cmd

pytestmark = pytest.mark.slow


def test_fit_notebook_runs(tmp_path):
    with open(os.path.join(REPO, "experiments", "fit_notebook.ipynb")) as f:
        nb = json.load(f)
    code = "\n\n".join("".join(c["source"]) for c in nb["cells"] if c["cell_type"] == "code")
    script = tmp_path / "notebook.py"
    script.write_text(f"import os\nos.chdir({str(tmp_path)!r})\n{code}\n")
    proc = run_cmd([str(script)], env={"NOTEBOOK_STEPS": "6"})
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "replicas: 2" in proc.stdout
    assert "generator steps: 6" in proc.stdout
    assert "samples (64, 8, 8, 1)" in proc.stdout
    assert (tmp_path / "notebook_samples.png").stat().st_size > 100
    # The user's keras.layers.BatchNormalization (2 in G, 1 in D) became cross-replica.
    assert "['SyncBatchNormalization', 'SyncBatchNormalization']" in proc.stdout
    assert "val_d_loss [" in proc.stdout
    assert (tmp_path / "log.csv").read_text().count("\n") == 3  # Header + 2 epochs.
    assert (tmp_path / "gan_epoch2.keras").stat().st_size > 1000
    assert "reloaded step 6 same samples: True" in proc.stdout
    assert "evaluate: {'d_loss':" in proc.stdout
    assert "continued to step 8" in proc.stdout
