"""Pieces bound to their run: every piece records the run's identity (kind and params, the model's identity
with its tokenizer hash included) and its schema; a piece of another run, of an older layout or of another
shape is recomputed with a ``note:`` on stderr, never used; a manifest of another shape is refused with one
line; a model folder whose tokenizer was replaced is another model."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner

from inductionlab.studies.engine import kept
from inductionlab.cli import main
from inductionlab.errors import InductionLabError
from inductionlab.runtime.runs import PIECE_SCHEMA, ResumableRun, run_identity

# -- the API: ResumableRun, the one reader of pieces ---------------------------------------------------------------


def _run(out: Path, **params) -> ResumableRun:
    run = ResumableRun(out, "toy", params or {"seed": 0})
    run.open()
    return run


def test_piece_of_another_run_is_recomputed(tmp_path, capsys):
    theirs, mine = _run(tmp_path / "b", seed=1), _run(tmp_path / "a", seed=0)
    kept(theirs, "lag/intact", lambda: {"x": np.full(3, 1.0)})
    kept(theirs, "scores", lambda: {"s": 1}, json=True)
    mine.dir.mkdir(exist_ok=True)
    shutil.copytree(theirs.dir, mine.dir, dirs_exist_ok=True)           # valid files, wrong numbers
    assert kept(mine, "lag/intact", lambda: {"x": np.zeros(3)})["x"].tolist() == [0, 0, 0]
    assert kept(mine, "scores", lambda: {"s": 0}, json=True) == {"s": 0}
    err = capsys.readouterr().err
    assert err.count("was written by another run") == 2 and err.count("computing it again") == 2, err
    again = _run(tmp_path / "a", seed=0)                                  # now its own: loaded, no note
    assert kept(again, "lag/intact", lambda: pytest.fail("recomputed"))["x"].tolist() == [0, 0, 0]
    assert kept(again, "scores", lambda: pytest.fail("recomputed"), json=True) == {"s": 0}
    assert capsys.readouterr().err == ""


@pytest.mark.parametrize("kind", ["no record (older layout)", "another schema", "record of another type"])
def test_stale_pieces_are_recomputed(tmp_path, capsys, kind):
    run = _run(tmp_path / "a")
    npz, js = run.path("p", "npz"), run.path("q", "json")
    npz.parent.mkdir(parents=True, exist_ok=True)
    record = {"no record (older layout)": {},
              "another schema": {"__run__": np.asarray(run.identity), "__schema__": np.asarray(PIECE_SCHEMA + 1)},
              "record of another type": {"__run__": np.arange(2), "__schema__": np.asarray("one")}}[kind]
    np.savez(npz, x=np.full(2, 9.0), **record)
    doc = {"no record (older layout)": {"s": 9},
           "another schema": {"run": run.identity, "schema": PIECE_SCHEMA + 1, "value": {"s": 9}},
           "record of another type": {"run": [1], "schema": {}, "value": {"s": 9}}}[kind]
    js.write_text(json.dumps(doc))
    assert kept(run, "p", lambda: {"x": np.zeros(2)})["x"].tolist() == [0, 0]
    assert kept(run, "q", lambda: {"s": 0}, json=True) == {"s": 0}
    err = capsys.readouterr().err
    assert err.count("note: checkpoint piece") == 2 and "Traceback" not in err, err


@pytest.mark.parametrize("value", [[], {"scores": 3}, {"scores": {"a": [[1, 2], [3]]}}, "text", None])
def test_piece_of_another_shape_is_recomputed(tmp_path, capsys, value):
    """A piece of this run (its record right) whose value has another shape: the caller's check raises,
    the piece is recomputed; never a KeyError / TypeError / AttributeError traceback."""
    from inductionlab.studies.engine import _phase_piece

    run = _run(tmp_path / "a")

    def check(v):
        if len({len(r) for r in v["scores"]["a"]}) != 1:
            raise ValueError("ragged rows")

    run.path("scores", "json").parent.mkdir(parents=True, exist_ok=True)
    run.path("scores", "json").write_text(json.dumps({"run": run.identity, "schema": PIECE_SCHEMA, "value": value}))
    good = {"scores": {"a": [[1, 2]]}}
    assert kept(run, "scores", lambda: good, check=check, json=True) == good
    buf = __import__("io").BytesIO()
    np.savez(buf, x=np.zeros(2), __run__=np.asarray(run.identity), __schema__=np.asarray(PIECE_SCHEMA))
    run.path("lag/intact", "npz").parent.mkdir(parents=True, exist_ok=True)
    run.path("lag/intact", "npz").write_bytes(buf.getvalue())          # no "words": not a phase piece
    got = kept(run, "lag/intact", lambda: {"x": np.ones(2), "words": np.asarray(["a", "b"])}, check=_phase_piece)
    assert got["x"].tolist() == [1, 1]
    err = capsys.readouterr().err
    assert err.count("is damaged or of another shape") == 2 and "Traceback" not in err, err


MANIFESTS = {"a list": "[]", "a string": '"study"', "null": "null", "no params": '{"kind": "toy"}',
             "params a number": '{"kind": "toy", "params": 5}', "kind a number": '{"kind": 1, "params": {}}',
             "truncated": '{"kind": "to', "not UTF-8": b'{"kind": "\xff"}', "nested": "[" * 100_000}


@pytest.mark.parametrize("name", list(MANIFESTS))
def test_malformed_manifest_is_one_line(tmp_path, name):
    out = tmp_path / "a"
    out.mkdir()
    text = MANIFESTS[name]
    (out / "study.json").write_bytes(text if isinstance(text, bytes) else text.encode())
    with pytest.raises(InductionLabError, match=r"study.json is corrupt \(.*\); use a new --out") as e:
        ResumableRun(out, "toy", {"seed": 0}).open()
    assert "\n" not in str(e.value) and len(str(e.value)) < 400


def test_manifest_of_another_kind(tmp_path):
    other = _run(tmp_path / "a")
    kept(other, "p", lambda: {"x": np.zeros(1)})
    with pytest.raises(InductionLabError, match="holds a toy run, not a other run"):
        ResumableRun(tmp_path / "a", "other", {"seed": 0}).open()


def test_run_identity_is_canonical():
    assert run_identity("k", {"a": 1, "b": [1, 2]}) == run_identity("k", {"b": (1, 2), "a": 1})
    assert run_identity("k", {"a": 1}) != run_identity("k", {"a": 2}) != run_identity("j", {"a": 2})


# -- through the CLI, with a tiny random model ------------------------------------------------------------------


def _swap_words(model: Path) -> None:
    """Replace the folder's tokenizer by one with the same size and another word list (two ids swapped)."""
    from tokenizers import Tokenizer, models, normalizers, pre_tokenizers
    from transformers import AutoTokenizer, PreTrainedTokenizerFast

    vocab = AutoTokenizer.from_pretrained(model).get_vocab()
    vocab["the"], vocab["of"] = vocab["of"], vocab["the"]
    tok = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    tok.normalizer, tok.pre_tokenizer = normalizers.Lowercase(), pre_tokenizers.Whitespace()
    PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<s>", eos_token="</s>",
                            unk_token="[UNK]").save_pretrained(model)


def test_tokenizer_hash(tmp_path):
    from transformers import AutoTokenizer

    from _tiny import word_tokenizer
    from inductionlab.core.models import tokenizer_sha256

    tok = word_tokenizer()
    tok.save_pretrained(tmp_path / "t")
    assert tokenizer_sha256(AutoTokenizer.from_pretrained(tmp_path / "t")) == tokenizer_sha256(tok)   # stable
    _swap_words(tmp_path / "t")
    assert tokenizer_sha256(AutoTokenizer.from_pretrained(tmp_path / "t")) != tokenizer_sha256(tok)
    assert tokenizer_sha256(object()) is None


def _pieces(out: Path) -> dict:
    got = {}
    for p in sorted((out / "checkpoints").rglob("*.npz")):
        with np.load(p) as z:
            got[str(p.relative_to(out))] = {k: z[k] for k in z.files}
    return got


def test_resume_refuses_or_recomputes_what_is_not_its_own(tmp_path):
    """The issue's cases end to end: a lag piece from a run with another ``--seed`` and a scores piece of
    another shape are recomputed with a note (the pieces end as a fresh run's); a model folder whose
    tokenizer was replaced (same weights) is another model: refused, one line."""
    from _tiny import tiny_llama_dir
    from test_bad_inputs import _args, refused

    model = tiny_llama_dir(tmp_path / "m", n_layers=2, n_heads=4)
    a, b = tmp_path / "a", tmp_path / "b"
    cli = CliRunner()
    for out, seed in ((a, "0"), (b, "7")):
        r = cli.invoke(main, _args("analyze", model, out) + ["--seed", seed])
        assert r.exit_code == 0, r.output
    want = _pieces(a)
    shutil.copy(b / "checkpoints" / "lag" / "intact.npz", a / "checkpoints" / "lag" / "intact.npz")
    scores = a / "checkpoints" / "scores.json"
    doc = json.loads(scores.read_text())
    scores.write_text(json.dumps({**doc, "value": {**doc["value"], "scores": [1, 2]}}))
    (a / "results.json").unlink()
    r = cli.invoke(main, _args("analyze", model, a) + ["--seed", "0"])
    assert r.exit_code == 0 and "Traceback" not in r.output, r.output
    assert f"checkpoint piece {a / 'checkpoints' / 'lag' / 'intact.npz'} was written by another run" in r.stderr
    assert f"checkpoint piece {scores} is damaged or of another shape" in r.stderr
    got = _pieces(a)
    assert got.keys() == want.keys()
    for k in want:
        for name in want[k]:
            np.testing.assert_array_equal(got[k][name], want[k][name], err_msg=f"{k}:{name}")
    _swap_words(model)
    refused(_args("analyze", model, a) + ["--seed", "0"], r"another model \(model.tokenizer_sha256\)", tmp_path)


# -- training checkpoints ---------------------------------------------------------------------------------------


def test_checkpoint_of_another_training_run_is_refused(tmp_path):
    """A checkpoint's meta.json records its run's identity: one copied from another run is refused on resume
    (one of an older layout, without the record, still resumes); a trainer state of another shape is one line."""
    import torch

    from inductionlab.train.checkpoint import CheckpointManager
    from test_run_confinement import _ckpts

    run = tmp_path / "run"
    _ckpts(run, steps=(0,), ident="run-a")
    assert CheckpointManager(run, run="run-a").latest_resumable()[0] == 0
    with pytest.raises(InductionLabError, match="was written by another training run"):
        CheckpointManager(run, run="run-b").latest_resumable()
    m = CheckpointManager(run, run="run-b")
    meta_p = m.path(0) / "meta.json"
    meta = json.loads(meta_p.read_text())
    meta_p.write_text(json.dumps({k: v for k, v in meta.items() if k != "run"}))
    assert m.latest_resumable()[0] == 0                                   # older layout: no record, resumes
    for bad in ({}, [1, 2], {"step": "0", "scheduler": {}, "rng": {}}):
        torch.save(bad, m.path(0) / "trainer_state.pt")
        with pytest.raises(InductionLabError, match="trainer_state.pt is not a trainer state"):
            m.load_trainer_state(m.path(0))
    for bad in ('[]', '{"sha256": [1]}', '{"sha256": {"a": 3}}', "{" * 50_000):
        meta_p.write_text(bad)
        with pytest.raises(InductionLabError, match="is corrupt"):
            m.verify(m.path(0))


def test_run_of_an_older_layout_says_so(tmp_path):
    """A run directory whose params lack a key this version records (the tokenizer hash): refused, saying the
    key is not recorded there rather than only 'another model'."""
    old = ResumableRun(tmp_path / "a", "toy", {"model": {"sha256": "x"}})
    old.open()
    kept(old, "p", lambda: {"x": np.zeros(1)})
    with pytest.raises(InductionLabError, match=r"another model \(model.tokenizer_sha256: not recorded there, "
                                                r"an older inductionlab wrote it\)"):
        ResumableRun(tmp_path / "a", "toy", {"model": {"sha256": "x", "tokenizer_sha256": "y"}}).open()
