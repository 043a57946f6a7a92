"""Run directories: the resumable-run helper (pieces computed once, params checked, overwrite)
and the up-front checks of --out."""

from __future__ import annotations

import json
import os

import numpy as np
import pytest

from inductionlab.studies.engine import kept
from inductionlab.errors import InductionLabError
from inductionlab.runtime.runs import ResumableRun, atomic_write_json


def test_pieces_are_computed_once_and_reloaded_identically(tmp_path):
    calls, saved = [], []

    def compute():
        calls.append(1)
        return {"p": np.array([0.25, 0.5], np.float32), "nan": np.array([np.nan])}

    run = ResumableRun(tmp_path / "r", "toy", {"n": 2}, on_checkpoint=saved.append)
    assert run.open() is False
    first = kept(run, "lag/intact", compute)
    assert json.loads((tmp_path / "r" / "study.json").read_text()) == {"kind": "toy", "params": {"n": 2}}
    again = ResumableRun(tmp_path / "r", "toy", {"n": 2})
    assert again.open() is True and again.done("lag/intact")
    second = kept(again, "lag/intact", compute)
    assert calls == [1] and saved == ["lag/intact"]
    assert second["p"].dtype == np.float32 and np.array_equal(second["p"], first["p"])
    assert np.isnan(second["nan"]).all()
    assert kept(again, "scores", lambda: {"x": (1, 2)}, json=True) == {"x": [1, 2]}      # what a reload returns
    assert kept(again, "scores", lambda: pytest.fail("recomputed"), json=True) == {"x": [1, 2]}
    assert not [p for p in (tmp_path / "r").rglob("*.tmp")]


def test_other_params_refused_only_with_finished_pieces(tmp_path):
    out = tmp_path / "r"
    ResumableRun(out, "toy", {"n": 2}).open()
    ResumableRun(out, "toy", {"n": 3}).open()          # no finished piece: not "a different run"
    assert json.loads((out / "study.json").read_text())["params"] == {"n": 3}
    kept(ResumableRun(out, "toy", {"n": 3}), "a", lambda: {"x": np.zeros(1)})
    with pytest.raises(InductionLabError, match=r"different parameters \(n\)"):
        ResumableRun(out, "toy", {"n": 4}).open()
    r = ResumableRun(out, "toy", {"n": 4}, overwrite=True)  # --overwrite: delete and start afresh
    assert r.open() is False and not r.done("a")


def test_foreign_or_corrupt_directories(tmp_path):
    out = tmp_path / "r"
    out.mkdir()
    (out / "notes.txt").write_text("mine")
    with pytest.raises(InductionLabError, match="already exists and is not a toy run"):
        ResumableRun(out, "toy", {}).open()
    with pytest.raises(InductionLabError, match="already exists and is not a resumable run"):
        ResumableRun.check_out(out)
    ResumableRun.check_out(out, overwrite=True)
    (out / "notes.txt").unlink()
    atomic_write_json(out / "study.json", {"kind": "toy"})
    with pytest.raises(InductionLabError, match="is corrupt"):
        ResumableRun(out, "toy", {}).open()
    (out / "checkpoints").mkdir()
    (out / "checkpoints" / "a.npz").write_bytes(b"not an npz")      # a damaged piece is computed again
    got = kept(ResumableRun(out, "toy", {}), "a", lambda: {"x": np.arange(3)})
    assert got["x"].tolist() == [0, 1, 2]
    assert np.load(out / "checkpoints" / "a.npz")["x"].tolist() == [0, 1, 2]


def test_check_out_paths(tmp_path):
    f = tmp_path / "file"
    f.write_text("x")
    with pytest.raises(InductionLabError, match="is a file"):
        ResumableRun.check_out(f)
    with pytest.raises(InductionLabError, match="lies under .*, which is a file"):
        ResumableRun.check_out(f / "sub" / "run")
    ResumableRun.check_out(tmp_path / "new" / "run")                  # not there yet: fine
    assert not (tmp_path / "new").exists()                            # and nothing created
    if os.geteuid() != 0:                                             # root writes anywhere
        ro = tmp_path / "ro"
        ro.mkdir(mode=0o555)
        with pytest.raises(InductionLabError, match="cannot write under"):
            ResumableRun.check_out(ro / "run")


def test_a_piece_of_string_columns_loads_back_as_computed(tmp_path):
    import pandas as pd

    df = pd.DataFrame({"condition": ["intact", "top-1"], "rank": [1, 3]})
    cols = lambda: {c: df[c].to_numpy() for c in df}          # noqa: E731  pandas gives an object column
    first = kept(ResumableRun(tmp_path / "o", "toy", {}), "p", cols)
    again = kept(ResumableRun(tmp_path / "o", "toy", {}), "p", lambda: pytest.fail("recomputed"))
    assert list(again["condition"]) == ["intact", "top-1"] == list(first["condition"])
    assert list(again["rank"]) == [1, 3]


def test_a_piece_of_other_objects_is_refused_before_writing(tmp_path):
    run = ResumableRun(tmp_path / "o", "toy", {})
    with pytest.raises(TypeError, match="dtype object"):
        kept(run, "p", lambda: {"x": np.array([{"a": 1}], dtype=object)})
    assert not run.path("p", "npz").exists()
