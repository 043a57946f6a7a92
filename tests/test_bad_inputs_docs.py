"""Unbounded documents and sources (issue 28 §3): every JSON / YAML / TOML document the tool reads
goes through one bounded reader (:mod:`inductionlab.documents`: size, nesting depth, UTF-8, regular
files only); a model whose config asks for more than the machine holds is refused before it is built;
corpus source files are regular files read streaming under a cap the manifest records.

Each test builds its hostile input itself: a document nested 100,000 levels deep (a ``RecursionError``
before), a named pipe and a link to ``/dev/zero`` (a hang), a gzip bomb (a ``MemoryError``), a config
of ten million layers (a hang while transformers builds them)."""

from __future__ import annotations

import gzip
import json
import os
import re
import shutil
from pathlib import Path

import pytest

from _tiny import tiny_llama_dir
from test_bad_inputs import refused
from inductionlab.studies.engine import kept
from inductionlab.documents import DocumentError, read_document, read_json
from inductionlab.errors import InductionLabError

DEEP = 100_000
DEEP_JSON = "[" * DEEP + "]" * DEEP
DEEP_TEXT = {".json": '{"a": ' + DEEP_JSON + "}", ".yaml": "a: " + DEEP_JSON, ".toml": "a = " + DEEP_JSON,
             ".yml": "a:\n" + "".join("  " * i + f"k{i}:\n" for i in range(300)) + "  " * 300 + "1\n"}


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return tiny_llama_dir(tmp_path_factory.mktemp("tiny") / "llama", n_layers=2, n_heads=4)


# -- the reader itself ------------------------------------------------------------------------------------

@pytest.mark.parametrize("suffix", list(DEEP_TEXT))
def test_deeply_nested_document_is_one_line(tmp_path, suffix):
    f = tmp_path / f"doc{suffix}"
    f.write_text(DEEP_TEXT[suffix])
    with pytest.raises(DocumentError, match=r"nests .* deep, more than the 100") as e:
        read_document(f, "config file")
    assert "\n" not in str(e.value)


@pytest.mark.parametrize("suffix", [".json", ".yaml", ".toml"])
def test_document_not_utf8_too_large_or_not_a_file(tmp_path, suffix):
    f = tmp_path / f"doc{suffix}"
    f.write_bytes(b"a = 1\nb: \xff\xfe\n" if suffix != ".json" else b'{"a": "\xff"}')
    with pytest.raises(DocumentError, match=r"is not UTF-8 text \(byte \d+"):
        read_document(f, "config file")
    f.write_text('{"a": 1}' if suffix == ".json" else "a = 1\n" if suffix == ".toml" else "a: 1\n")
    with pytest.raises(DocumentError, match=r"more than the 3 bytes"):
        read_document(f, "config file", max_bytes=3)
    assert read_document(f, "config file") == {"a": 1}
    fifo = tmp_path / f"fifo{suffix}"
    os.mkfifo(fifo)
    with pytest.raises(DocumentError, match=r"is a named pipe, not a regular file"):
        read_document(fifo, "config file")          # returns at once: never opened for reading
    (tmp_path / f"zero{suffix}").symlink_to("/dev/zero")
    with pytest.raises(DocumentError, match=r"is a device, not a regular file"):
        read_document(tmp_path / f"zero{suffix}", "config file")


def test_strings_with_brackets_are_not_nesting(tmp_path):
    f = tmp_path / "a.json"
    f.write_text(json.dumps({"s": "[" * 500 + '\\"{' * 300, "t": [[1], {"u": "]]]"}]}))
    assert read_json(f)["t"] == [[1], {"u": "]]]"}]


# -- through the CLI: one line, exit 2, nothing written ----------------------------------------------------

ANALYZE = ["--n-permutations", "3", "--list-length", "30", "--cue-position", "15", "--ks", "1,2", "--n-draws", "2",
           "--score-seq-len", "8", "--score-batch-size", "2", "--top", "3", "--quiet", "--dtype", "float32"]


@pytest.mark.parametrize("suffix", [".json", ".yaml", ".toml"])
def test_config_file_nested_too_deep(tmp_path, model_dir, suffix):
    f = tmp_path / f"cfg{suffix}"
    f.write_text(DEEP_TEXT[suffix])
    refused(["analyze", "--model", model_dir, "--out", tmp_path / "out", "--config", f, *ANALYZE],
            r"config file .* nests \d+ levels deep", tmp_path)


def _model_copy(model_dir: Path, root: Path) -> Path:
    return Path(shutil.copytree(model_dir, root / "model"))


MODEL_FILES = {   # name -> (edit of a copy of the model folder, pattern)
    "config.json nested": (lambda d: (d / "config.json").write_text(
        json.dumps({**json.loads((d / "config.json").read_text()), "x": 0})[:-1] + ', "y": ' + DEEP_JSON + "}"),
        r"model file .*config\.json nests \d+ levels deep"),
    "tokenizer.json nested": (lambda d: (d / "tokenizer.json").write_text('{"x": ' + DEEP_JSON + "}"),
                              r"model file .*tokenizer\.json nests"),
    "tokenizer_config.json nested": (lambda d: (d / "tokenizer_config.json").write_text('{"x": ' + DEEP_JSON + "}"),
                                     r"tokenizer_config\.json nests"),
    "config.json not UTF-8": (lambda d: (d / "config.json").write_bytes(b'{"model_type": "ll\xffama"}'),
                              r"config\.json is not UTF-8"),
    "config.json a pipe": (lambda d: ((d / "config.json").unlink(), os.mkfifo(d / "config.json")),
                           r"config\.json is a named pipe"),
    "ten million layers": (lambda d: _edit_config(d, num_hidden_layers=10 ** 7), r"asks for 10,000,000 layers"),
    "hidden size of a million": (lambda d: _edit_config(d, hidden_size=2 ** 20, intermediate_size=2 ** 22,
                                                        head_dim=2 ** 18), r"at least [\d,]+ weights: .* GiB .* available"),
}


def _edit_config(d: Path, **kw) -> None:
    (d / "config.json").write_text(json.dumps({**json.loads((d / "config.json").read_text()), **kw}))


@pytest.mark.parametrize("case", list(MODEL_FILES))
def test_model_folder_documents_bounded(tmp_path, model_dir, case):
    d = _model_copy(model_dir, tmp_path)
    edit, pattern = MODEL_FILES[case]
    edit(d)
    refused(["analyze", "--model", d, "--out", tmp_path / "out", *ANALYZE], pattern, tmp_path)


def test_load_model_refuses_a_model_larger_than_memory(tmp_path, model_dir):
    from inductionlab.core.models import load_model

    d = _model_copy(model_dir, tmp_path)
    _edit_config(d, vocab_size=2 ** 40)
    with pytest.raises(InductionLabError, match=r"at least [\d,]+ weights: .* GiB in bfloat16, more than"):
        load_model(d, dtype="auto")


def test_tokenizer_folder_nested_too_deep(tmp_path, model_dir):
    d = _model_copy(model_dir, tmp_path)
    (d / "tokenizer.json").write_text('{"x": ' + DEEP_JSON + "}")
    txt = tmp_path / "src.txt"
    txt.write_text("hello world\n\nanother paragraph here\n")
    for tok in (d, d / "tokenizer.json"):
        refused(["corpus", "prepare", txt, "--out", tmp_path / "c", "--tokenizer", tok, "--heldout-fraction", "0"],
                r"tokenizer\.json nests", tmp_path)


def _fake_run(d: Path) -> Path:
    from test_cli_train_data import _fake_run as fake

    return fake(d)


@pytest.mark.parametrize("name", ["run.json", "telemetry.json"])
def test_training_run_documents_nested_too_deep(tmp_path, name):
    run = _fake_run(tmp_path / "run")
    f = run / "run.json" if name == "run.json" else next((run / "checkpoints").glob("step_*/telemetry.json"))
    f.write_text('{"x": ' + DEEP_JSON + "}")
    pattern = r"training run record .* damaged" if name == "run.json" else r"checkpoint telemetry .* damaged"
    msg = refused(["telemetry", run, "--out", tmp_path / "tel"], pattern, tmp_path)
    assert "nests" in msg


def test_checkpoint_meta_nested_too_deep(tmp_path):
    from inductionlab.train.checkpoint import CheckpointManager

    ck = tmp_path / "run" / "checkpoints" / "step_00000001"
    ck.mkdir(parents=True)
    (ck / "meta.json").write_text('{"x": ' + DEEP_JSON + "}")
    mgr = CheckpointManager(tmp_path / "run")
    with pytest.raises(InductionLabError, match=r"checkpoint .* is corrupt \(unreadable meta\.json\)"):
        mgr.verify(ck)
    assert [meta for _, _, meta in mgr.list()] == [{}]


def test_study_record_and_pieces_nested_too_deep(tmp_path, capsys):
    from inductionlab.runtime.runs import ResumableRun

    run = ResumableRun(tmp_path / "r", "toy", {"n": 2})
    run.open()
    assert kept(run, "p", lambda: {"v": 1}, json=True) == {"v": 1}
    run.path("p", "json").write_text('{"x": ' + DEEP_JSON + "}")
    assert kept(ResumableRun(tmp_path / "r", "toy", {"n": 2}), "p", lambda: {"v": 2}, json=True) == {"v": 2}
    assert "checkpoint piece" in capsys.readouterr().err
    (tmp_path / "r" / "study.json").write_text('{"params": ' + DEEP_JSON + "}")
    with pytest.raises(InductionLabError, match=r"study\.json is corrupt \(study record .* nests"):
        ResumableRun(tmp_path / "r", "toy", {"n": 2}).open()


def test_corpus_manifest_nested_too_deep(tmp_path):
    c = tmp_path / "c"
    c.mkdir()
    (c / "manifest.json").write_text('{"x": ' + DEEP_JSON + "}")
    refused(["corpus", "info", c], r"manifest\.json is corrupt \(.*nests", tmp_path)


# -- corpus sources: regular files only, streaming under a cap ------------------------------------------------

def _source_dir(tmp_path: Path) -> Path:
    src = tmp_path / "src"
    src.mkdir()
    (src / "a.txt").write_text("hello world\n\nanother paragraph here\n")
    return src


SOURCES = {   # name -> (make the hostile file in the source folder, pattern)
    "a named pipe": (lambda s: os.mkfifo(s / "pipe.txt"), r"pipe\.txt is a named pipe, not a regular file"),
    "a link to /dev/zero": (lambda s: (s / "zero.txt").symlink_to("/dev/zero"), r"zero\.txt is a device"),
    "a gzip bomb": (lambda s: (s / "bomb.txt.gz").write_bytes(gzip.compress(b"\0" * (3 * 2 ** 20))),
                    r"bomb\.txt\.gz holds more than 1,048,576 bytes once unzipped"),
    "a file over the cap": (lambda s: (s / "big.txt").write_bytes(b"word " * 2 ** 19), r"big\.txt holds more than"),
}


@pytest.mark.parametrize("case", list(SOURCES))
@pytest.mark.parametrize("whole", [False, True], ids=["in a folder", "named alone"])
def test_corpus_source_files_bounded(tmp_path, monkeypatch, case, whole):
    from inductionlab.data import corpus

    monkeypatch.setattr(corpus, "MAX_FILE_BYTES", 2 ** 20)
    src = _source_dir(tmp_path)
    make, pattern = SOURCES[case]
    make(src)
    target = src if not whole else next(p for p in src.iterdir() if p.name != "a.txt")
    refused(["corpus", "prepare", target, "--out", tmp_path / "c", "--vocab-size", "300"], pattern, tmp_path)


def test_manifest_records_the_file_cap(tmp_path):
    from inductionlab.data.corpus import MAX_FILE_BYTES, resolve_source

    assert resolve_source(_source_dir(tmp_path)).describe()["max_file_bytes"] == MAX_FILE_BYTES


def test_corpus_tokenizer_nested_too_deep(tmp_path):
    from test_train_helpers import make_corpus
    from inductionlab.data.shards import TokenShards

    c = make_corpus(tmp_path, n_lines=600)
    (c / "tokenizer.json").write_text('{"x": ' + DEEP_JSON + "}")
    with pytest.raises(DocumentError, match=r"corpus tokenizer .*tokenizer\.json nests"):
        TokenShards.open(c).tokenizer()


def test_yaml_alias_bomb_refused(tmp_path):
    """Nine levels of nine aliases: 387 million values once expanded, from a few hundred bytes."""
    lines = ['a0: &a0 ["x", "x", "x", "x", "x", "x", "x", "x", "x"]']
    lines += [f"a{i}: &a{i} [{', '.join([f'*a{i - 1}'] * 9)}]" for i in range(1, 10)]
    f = tmp_path / "bomb.yaml"
    f.write_text("\n".join(lines) + "\n")
    with pytest.raises(DocumentError, match=r"expands to more than 1,000,000 values"):
        read_document(f, "config file")


def test_hub_cache_snapshot_nested_too_deep(tmp_path, model_dir):
    """A hub id found in the local cache: its snapshot's config.json is checked like a folder's."""
    from test_train_helpers import run_cli

    repo = tmp_path / "hub" / "models--someone--tiny"
    snap = repo / "snapshots" / ("0" * 40)
    shutil.copytree(model_dir, snap)
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text("0" * 40)
    (snap / "config.json").write_text('{"model_type": "llama", "x": ' + DEEP_JSON + "}")
    r = run_cli(["analyze", "--model", "someone/tiny", "--out", tmp_path / "out", *ANALYZE],
                env={"HF_HUB_CACHE": str(tmp_path / "hub"), "HF_HUB_OFFLINE": "1"})
    assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr
    assert re.search(r"^error: model file .*snapshots/0+/config\.json nests \d+ levels deep", r.stderr), r.stderr
