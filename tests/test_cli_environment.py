"""The command line's environment (issue 28 §7): an ASCII locale with ``PYTHONUTF8=0`` and non-ASCII
paths and text (before: tokenizers refused the undecodable path with a ``UnicodeEncodeError``
traceback), and standard streams that cannot be written (``/dev/full``: before, a traceback and exit
status 1 in place of the command's own)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

SRC = str(Path(__file__).resolve().parents[1] / "src")


def _cli(args, *, ascii_locale=False, stdout=subprocess.PIPE, stderr=subprocess.PIPE):
    """``inductionlab ARGS`` as a program (``python -m inductionlab.cli``), in a fresh process."""
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": SRC + os.pathsep + os.environ.get("PYTHONPATH", "")}
    if ascii_locale:
        env = {k: v for k, v in env.items() if not k.startswith(("LC_", "LANG", "PYTHONIOENCODING"))}
        env.update(LC_ALL="C", LANG="C", PYTHONUTF8="0")
    return subprocess.run([sys.executable, "-m", "inductionlab.cli", *map(str, args)], env=env, stdout=stdout,
                          stderr=stderr, timeout=300)


def _source(tmp_path: Path) -> Path:
    d = tmp_path / "quellé"
    d.mkdir()
    f = d / "tëxt.txt"
    f.write_text("\n\n".join(f"Ünïcode paragraph {i} with the same few words, déjà vu, naïve café." for i in range(60)),
                 encoding="utf-8")
    return f


def test_ascii_locale_with_non_ascii_paths_and_text(tmp_path):
    src, out = _source(tmp_path), tmp_path / "öut"
    r = _cli(["corpus", "prepare", src, "--out", out, "--vocab-size", "300", "--heldout-fraction", "0"],
             ascii_locale=True)
    assert r.returncode == 0, r.stderr.decode("utf-8", "replace")
    manifest = json.loads((out / "manifest.json").read_text(encoding="utf-8"))
    assert manifest["source"]["files"] == [str(src)]
    r = _cli(["corpus", "info", tmp_path / "nöne"], ascii_locale=True)
    err = r.stderr.decode("utf-8")
    assert r.returncode == 2 and err.count("\n") == 1 and "nöne" in err and "Traceback" not in err, err


def test_ascii_locale_config_file_with_non_ascii_text(tmp_path):
    cfg = tmp_path / "réglages.yaml"
    cfg.write_text("instruction: \"Étudiez la liste :\"\nunknown_clé: 1\n", encoding="utf-8")
    r = _cli(["analyze", "--model", tmp_path / "no-model", "--config", cfg, "--out", tmp_path / "out"],
             ascii_locale=True)
    err = r.stderr.decode("utf-8")
    assert r.returncode == 2 and err.startswith("error:") and err.count("\n") == 1 and "Traceback" not in err, err
    assert not (tmp_path / "out").exists()


@pytest.mark.skipif(not os.path.exists("/dev/full"), reason="needs /dev/full")
def test_exit_status_kept_when_streams_cannot_be_written(tmp_path):
    with open("/dev/full", "w") as full:
        assert _cli(["corpus", "info", tmp_path / "none"], stderr=full).returncode == 2
        assert _cli(["--help"], stdout=full).returncode == 0
        src, out = _source(tmp_path), tmp_path / "out"
        r = _cli(["corpus", "prepare", src, "--out", out, "--vocab-size", "300", "--heldout-fraction", "0"],
                 stdout=full, stderr=full)
        assert r.returncode == 0 and (out / "manifest.json").is_file()
