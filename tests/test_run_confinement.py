"""Nothing outside a run directory: every path a run writes, reads back or deletes stays inside it.

Each case builds a victim folder outside the run, links to it (or names it with ``../``) from inside the
run, and checks that the run is refused with one line naming the path while every victim file keeps its
checksum (and no file appears or disappears there)."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch

from inductionlab.studies.engine import kept
from inductionlab.errors import InductionLabError
from inductionlab.runtime.outputs import check_no_links_out, inside, links_leaving
from inductionlab.runtime.run_dir import TrainRun
from inductionlab.runtime.runs import ResumableRun
from inductionlab.train.checkpoint import CheckpointManager


def _victim(root: Path) -> Path:
    """A folder of the user's, outside every run: a piece-like file, a step-like folder with a meta.json."""
    v = root / "victim"
    (v / "lag").mkdir(parents=True)
    (v / "lag" / "intact.npz").write_bytes(b"precious npz")
    (v / "notes.txt").write_text("precious notes\n")
    (v / "step_00000009").mkdir()
    (v / "step_00000009" / "meta.json").write_text('{"step": 9, "resumable": true, "sha256": {}}')
    (v / "step_00000009" / "trainer_state.pt").write_bytes(b"precious state")
    return v


def _sums(root: Path) -> dict[str, str]:
    return {str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(root.rglob("*")) if p.is_file()}


@pytest.fixture
def victim(tmp_path):
    v = _victim(tmp_path)
    before = _sums(v)
    yield v
    assert _sums(v) == before, "a file outside the run directory was written, created or deleted"


# -- the one check ------------------------------------------------------------------------------------------------

def test_inside_refuses_names_and_links_that_leave(tmp_path, victim):
    run = tmp_path / "run"
    (run / "checkpoints").mkdir(parents=True)
    assert inside(run, "checkpoints/a.npz") == run / "checkpoints" / "a.npz"
    assert inside(run, run / "checkpoints" / "b.json") == run / "checkpoints" / "b.json"
    for name in ("../victim/notes.txt", "checkpoints/../../victim", str(victim / "notes.txt")):
        with pytest.raises(InductionLabError, match="leaves the run directory"):
            inside(run, name)
    (run / "checkpoints" / "lag").symlink_to(victim / "lag")                 # a folder link out
    (run / "checkpoints" / "n.json").symlink_to(victim / "notes.txt")        # a file link out
    (run / "loop").symlink_to(run / "loop")                                  # a loop: cannot be checked
    (run / "in").symlink_to(run / "checkpoints")                             # a link that stays inside
    for name in ("checkpoints/lag/intact.npz", "checkpoints/n.json", "loop/x"):
        with pytest.raises(InductionLabError, match="symbolic link .*(outside the run directory|a loop)"):
            inside(run, name)
    assert inside(run, "in/a.npz") == run / "in" / "a.npz"
    assert sorted(p.name for p in links_leaving(run)) == ["lag", "loop", "n.json"]
    with pytest.raises(InductionLabError, match=r"run/loop is a symbolic link to .*, a loop .* \(and 2 more\)"):
        check_no_links_out(run)


# -- resumable runs (analyze, every study) ---------------------------------------------------------------------------

@pytest.mark.parametrize("where", ["checkpoints", "checkpoints/lag", "checkpoints/scores.json", "study.json"])
def test_resumable_run_never_writes_through_a_link_out(tmp_path, victim, where):
    """A fresh run whose ``checkpoints`` links elsewhere, a half-finished one whose ``checkpoints/lag`` (or a
    piece, or its manifest) does: refused on open, naming the link; nothing written there."""
    out = tmp_path / "run"
    first = ResumableRun(out, "toy", {"n": 1})
    if where != "checkpoints":                                               # half-finished: a piece is there
        first.open()
        kept(first, "lag/other", lambda: {"x": np.arange(3)})
    link = out / where
    if link.exists():
        shutil.rmtree(link) if link.is_dir() else link.unlink()
    link.parent.mkdir(parents=True, exist_ok=True)
    link.symlink_to(victim / ("notes.txt" if where.endswith("json") else "lag"))
    run = ResumableRun(out, "toy", {"n": 1})
    with pytest.raises(InductionLabError, match=f"{link} is a symbolic link to .*victim.*outside the run directory"):
        run.open()
    use = {"checkpoints": lambda: kept(run, "lag/intact", lambda: {"x": np.arange(3)}),
           "checkpoints/lag": lambda: kept(run, "lag/intact", lambda: {"x": np.arange(3)}),
           "checkpoints/scores.json": lambda: kept(run, "scores", lambda: {"s": 1}, json=True),
           "study.json": lambda: inside(out, "study.json")}[where]
    with pytest.raises(InductionLabError, match="outside the run directory"):   # also per path, when used directly
        use()


def test_overwrite_never_follows_a_link_out(tmp_path, victim):
    out = tmp_path / "run"
    run = ResumableRun(out, "toy", {"n": 1})
    run.open()
    (out / "checkpoints").mkdir()
    (out / "checkpoints" / "lag").symlink_to(victim / "lag")
    (out / "mine").symlink_to(victim)
    again = ResumableRun(out, "toy", {"n": 2}, overwrite=True)                # deletes the links, not their targets
    assert again.open() is False and not (out / "mine").exists()
    linked = tmp_path / "linked-out"
    linked.symlink_to(victim, target_is_directory=True)
    with pytest.raises(InductionLabError, match="symbolic link .*--overwrite never deletes through a link"):
        ResumableRun(linked, "toy", {"n": 1}, overwrite=True).open()
    with pytest.raises(InductionLabError, match="--overwrite never deletes through a link"):
        ResumableRun.check_out(linked, overwrite=True)              # refused up front, before a model loads
    (out / "checkpoints").mkdir()
    (out / "checkpoints" / "lag").symlink_to(victim / "lag")
    with pytest.raises(InductionLabError, match="lag is a symbolic link to .*outside the run directory"):
        ResumableRun.check_out(out)
    ResumableRun.check_out(out, overwrite=True)                     # the link would be removed, not followed


def test_analyze_with_checkpoints_linked_out_is_refused(tmp_path, victim):
    """The issue's case: ``--out/checkpoints`` links to a folder elsewhere; a fresh ``analyze`` is refused
    with one line before it writes anything there."""
    from _tiny import tiny_llama_dir
    from test_bad_inputs import _args, refused

    model = tiny_llama_dir(tmp_path / "m", n_layers=2, n_heads=4)
    out = tmp_path / "out"
    out.mkdir()
    (out / "checkpoints").symlink_to(victim)
    refused(_args("analyze", model, out), r"checkpoints is a symbolic link to .*victim.*outside the run directory",
            tmp_path)


# -- training runs -----------------------------------------------------------------------------------------------

def _tiny_model():
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    return LlamaForCausalLM(LlamaConfig(vocab_size=16, hidden_size=8, intermediate_size=16, num_hidden_layers=1,
                                        num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=32))


def _ckpts(run: Path, steps=(0, 1), ident: str = "run-a") -> CheckpointManager:
    m, model = CheckpointManager(run, keep_resumable=1, run=ident), _tiny_model()
    for s in steps:
        m.save(s, model=model, state_dict=None, tokenizer=None, trainer_state={"step": s}, meta={"kind": "schedule"})
    return m


def test_a_relative_run_directory(tmp_path, monkeypatch):
    """Paths of a run given relative to the working directory (the usual ``--out runs/x``) stay the run's."""
    monkeypatch.chdir(tmp_path)
    m = _ckpts(Path("runs/x"))
    assert [c.path for c in TrainRun("runs/x").checkpoints()] == [Path("runs/x/checkpoints/step_00000000"),
                                                                  Path("runs/x/checkpoints/step_00000001")]
    assert m.latest_resumable()[1] == Path("runs/x/checkpoints/step_00000001")
    run = ResumableRun("runs/y", "toy", {})
    run.open()
    assert run.path("lag/a", "npz") == Path("runs/y/checkpoints/lag/a.npz")
    kept(run, "lag/a", lambda: {"x": np.zeros(1)})
    assert (tmp_path / "runs" / "y" / "checkpoints" / "lag" / "a.npz").is_file()


def test_newest_checkpoint_linked_out_is_refused_by_resume_save_and_prune(tmp_path, victim):
    run = tmp_path / "run"
    m = _ckpts(run)
    newest = m.path(1)
    shutil.rmtree(newest)
    newest.symlink_to(victim / "step_00000009")
    for call in (m.latest_resumable, m.list, lambda: m.save(2, model=_tiny_model(), state_dict=None, tokenizer=None,
                                                              trainer_state={"step": 2}, meta={"kind": "rolling"}),
                 lambda: TrainRun(run).checkpoints(complete=False)):
        with pytest.raises(InductionLabError, match=f"{newest} is a symbolic link to .*outside the run directory"):
            call()
    assert not m.path(2).exists()


def test_checkpoints_folder_linked_out_is_refused(tmp_path, victim):
    run = tmp_path / "run"
    run.mkdir()
    (run / "checkpoints").symlink_to(victim)
    m = CheckpointManager(run)
    with pytest.raises(InductionLabError, match="checkpoints is a symbolic link"):
        m.save(0, model=_tiny_model(), state_dict=None, tokenizer=None, trainer_state=None, meta={})
    with pytest.raises(InductionLabError, match="checkpoints is a symbolic link"):
        m.latest_resumable()
    with pytest.raises(InductionLabError, match="checkpoints is a symbolic link"):
        m.clean_partials()


@pytest.mark.parametrize("name", ["../../../victim/notes.txt", "/etc/hostname", "sub/../../step_00000000/meta.json"])
def test_meta_json_naming_files_outside_is_refused(tmp_path, victim, name):
    run = tmp_path / "run"
    m = _ckpts(run, steps=(0,))
    meta_p = m.path(0) / "meta.json"
    meta = json.loads(meta_p.read_text())
    meta["sha256"][name] = "0" * 64
    meta_p.write_text(json.dumps(meta))
    with pytest.raises(InductionLabError, match=f"corrupt \\(meta.json names {name!r}, outside the checkpoint\\)"):
        m.latest_resumable()


def test_file_in_checkpoint_linked_out_is_refused(tmp_path, victim):
    run = tmp_path / "run"
    m = _ckpts(run, steps=(0,))
    state = m.path(0) / "trainer_state.pt"
    state.unlink()
    state.symlink_to(victim / "step_00000009" / "trainer_state.pt")
    with pytest.raises(InductionLabError, match="trainer_state.pt', outside the checkpoint"):
        m.latest_resumable()


def test_pruning_removes_links_never_their_targets(tmp_path, victim):
    """A rolling checkpoint that is a link (inside the run): pruning deletes the link, never its target."""
    run = tmp_path / "run"
    m = _ckpts(run, steps=(0,))
    model = _tiny_model()
    m.save(1, model=model, state_dict=None, tokenizer=None, trainer_state={"step": 1}, meta={"kind": "rolling"})
    kept = shutil.move(m.path(1), run / "kept")
    m.path(1).symlink_to(kept)
    before = _sums(Path(kept))
    m.save(2, model=model, state_dict=None, tokenizer=None, trainer_state={"step": 2}, meta={"kind": "schedule"})
    assert [s for s, _, _ in m.list()] == [0, 2] and not m.path(1).is_symlink()
    assert [s for s, _, meta in m.list() if meta["resumable"]] == [2]
    assert _sums(Path(kept)) == before


def test_train_resume_through_a_linked_checkpoint_is_refused(tmp_path, victim):
    """The issue's case through the CLI: a half-finished training run whose newest checkpoint folder links
    elsewhere is refused with one line; neither the victim nor the run changes."""
    from test_bad_inputs import refused
    from test_train_helpers import tiny_flags, tiny_trained_run

    data, out = tiny_trained_run(tmp_path)
    flags = tiny_flags(data, out, preset="cpu-micro", tokens=2048, log_checkpoints=0)
    rec = json.loads((out / "run.json").read_text())
    (out / "run.json").write_text(json.dumps({**rec, "status": "running"}))   # as if killed at the end
    newest = TrainRun(out).checkpoints()[-1].path
    moved = victim / "moved"
    shutil.move(newest, moved)
    newest.symlink_to(moved)
    before = _sums(moved)
    refused(["train", *flags], f"{newest} is a symbolic link to .*outside the run directory", tmp_path)
    assert _sums(moved) == before
    os.unlink(newest)
    shutil.rmtree(moved)


def test_overwrite_refuses_the_current_folder_those_above_it_and_home(tmp_path, monkeypatch):
    """``--out .`` / ``--out ..`` / the home folder with ``--overwrite`` would delete the user's own folders:
    one line, nothing deleted; a run folder below the current one is still overwritable."""
    from inductionlab.runtime.runs import ResumableRun, remove_run_dir

    work = tmp_path / "a" / "b"
    work.mkdir(parents=True)
    (tmp_path / "a" / "keep.txt").write_text("x")
    (work / "keep.txt").write_text("x")
    home = tmp_path / "home"
    home.mkdir()
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.chdir(work)
    for out, what in ((".", "the current folder"), ("..", "a folder above the current one"),
                      (str(tmp_path), "a folder above the current one"), (str(home), "your home folder")):
        with pytest.raises(InductionLabError, match=f"is {what}; --overwrite would delete it"):
            ResumableRun.check_out(out, overwrite=True)
        with pytest.raises(InductionLabError, match="--overwrite would delete it"):
            remove_run_dir(out)
    with pytest.raises(InductionLabError, match="is the file system's root; --overwrite would delete it"):
        remove_run_dir("/")                       # (check_out may first say / is not writable, as a user)
    assert (tmp_path / "a" / "keep.txt").exists() and (work / "keep.txt").exists()
    (work / "run").mkdir()
    ResumableRun.check_out("run", overwrite=True)
    remove_run_dir("run")
    assert not (work / "run").exists()
