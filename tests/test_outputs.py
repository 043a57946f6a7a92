"""Output paths checked before any work (issue 11 §3): an existing file, a path under a file, a
read-only place; a good path passes and the probe leaves nothing behind."""

from __future__ import annotations

import os

import pytest

from inductionlab.errors import InductionLabError
from inductionlab.runtime.outputs import check_output_dir, check_output_file


def _bad_paths(tmp_path):
    f = tmp_path / "a_file"
    f.write_text("x")
    ro = {"under a read-only file system": "/proc/inductionlab-test/out"}
    if os.geteuid() != 0:                      # root writes through folder permissions
        d = tmp_path / "ro"
        d.mkdir()
        d.chmod(0o555)
        ro["under a read-only folder"] = str(d / "out")
    return {"an existing file": (str(f), "is a file"), "under a file": (str(f / "out"), "which is a file"),
            **{k: (v, "cannot write") for k, v in ro.items()}}


def test_check_output_dir_refuses_each_kind(tmp_path):
    for case, (path, msg) in _bad_paths(tmp_path).items():
        with pytest.raises(InductionLabError) as e:
            check_output_dir(path, "--out")
        assert msg in str(e.value) and "--out" in str(e.value) and "\n" not in str(e.value), case


def test_check_output_file(tmp_path):
    (tmp_path / "d").mkdir()
    with pytest.raises(InductionLabError, match="--plot .* is a directory"):
        check_output_file(tmp_path / "d", "--plot")
    (tmp_path / "f").write_text("x")
    with pytest.raises(InductionLabError, match="which is a file"):
        check_output_file(tmp_path / "f" / "p.png", "--plot")
    with pytest.raises(InductionLabError, match="cannot write"):
        check_output_file("/proc/inductionlab-test.png", "--plot")


def test_good_paths_pass_and_leave_nothing(tmp_path):
    before = sorted(tmp_path.rglob("*"))
    assert check_output_dir(tmp_path / "new" / "deeper") == tmp_path / "new" / "deeper"
    check_output_file(tmp_path / "new" / "x.png")
    check_output_dir(tmp_path)                     # an existing directory
    assert sorted(tmp_path.rglob("*")) == before   # no directory created, no probe left
