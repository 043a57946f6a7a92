"""Bad inputs to the training and data commands (issue 11 §2, §3), one kind per test,
parametrised over the sub-commands that share the kind: ``error: <one line>``, exit 2, nothing
written. Plus the API side of the same checks (the config dataclasses validate themselves)."""

from __future__ import annotations

import gzip
import json
import math
import os

import numpy as np
import pytest
from click.testing import CliRunner

from inductionlab.cli import main
from inductionlab.data.curriculum import BiInductStream, CurriculumConfig
from inductionlab.data.shards import TokenShards, prepare_corpus
from inductionlab.errors import InductionLabError
from inductionlab.train import TrainConfig, model_config
from test_train_helpers import make_corpus, tiny_flags


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    return make_corpus(tmp_path_factory.mktemp("corpus"), n_lines=1500)


def _files(root):
    return sorted(p for p in root.rglob("*"))


def _refused(args, msg, tmp_path):
    """Run ``inductionlab ARGS``; assert exit 2, one ``error:`` line holding ``msg`` (or click's own
    usage error for a value its parameter type refuses), no new file under tmp_path."""
    before = _files(tmp_path)
    r = CliRunner().invoke(main, [str(a) for a in args])
    lines = [line for line in r.output.splitlines() if line.strip()]
    assert r.exit_code == 2, r.output
    if lines[0].startswith("Usage:"):                      # click's parameter check, also before any work
        lines = [lines[-1]]
        assert lines[0].startswith("Error: "), r.output
    assert len(lines) == 1 and lines[0].lower().startswith("error: ") and msg in lines[0], r.output
    assert _files(tmp_path) == before, "something was written"
    return lines[0]


def _fake_run(d):
    d.mkdir()
    b = {"tokens": 1024, "steps": 1}
    (d / "run.json").write_text(json.dumps({"budget": b, "config": {"induction_threshold": 0.4}}))
    ck = d / "checkpoints" / "step_00000000"
    ck.mkdir(parents=True)
    (ck / "telemetry.json").write_text(json.dumps({"step": 0, "tokens": 0, "heldout_loss": 1.0, "heldout_ppl": math.e,
                                                   "scores": {"induction": [[0.1]], "anti_induction": [[0.1]]}}))
    return d


def _command(name, tmp_path, corpus, out):
    """The argument list of sub-command ``name`` writing to ``out``."""
    txt = tmp_path / "src.txt"
    if not txt.exists():
        txt.write_text("hello world\n\nanother paragraph here\n")
    if name == "corpus prepare":
        return ["corpus", "prepare", txt, "--out", out, "--vocab-size", "300"]
    if name == "train":
        return ["train", *tiny_flags(corpus, out)]
    if name == "telemetry":
        run = tmp_path / "run" if (tmp_path / "run").exists() else _fake_run(tmp_path / "run")
        return ["telemetry", run, "--out", out]
    if name == "curriculum preview --plot":
        return ["curriculum", "preview", corpus, "--seq-len", "64", "--batch-size", "2", "--total-tokens", "4096",
                "--plot", out]
    raise AssertionError(name)


# -- output paths, checked before anything is loaded ---------------------------------------------

@pytest.mark.parametrize("command", ["corpus prepare", "train", "telemetry", "curriculum preview --plot"])
@pytest.mark.parametrize("case", ["existing file", "under a file", "read-only"])
def test_output_paths_checked_up_front(tmp_path, corpus, command, case):
    f = tmp_path / "a_file"
    f.write_text("x")
    is_plot = command.endswith("--plot")
    out = {"existing file": tmp_path if is_plot else f,           # a plot cannot go to a directory
           "under a file": f / "out",
           "read-only": "/proc/inductionlab-test/out"}[case]
    args = _command(command, tmp_path, corpus, out)
    msg = {"existing file": "is a directory" if is_plot else "is a file", "under a file": "which is a file",
           "read-only": "cannot write"}[case]
    _refused(args, msg, tmp_path)


# -- numeric ranges and NaN: the CLI refuses what the config dataclasses refuse -----------------

TRAIN_BAD = [
    ("--micro-batch-size", "0", "--micro-batch-size must be >= 1"),
    ("--log-every", "0", "--log-every must be >= 1"),
    ("--lr", "nan", "--lr must be a finite number"),
    ("--lr", "inf", "--lr must be a finite number"),
    ("--lr", "-1", "--lr and --eps must be > 0"),
    ("--telemetry-seq-len", "0", "--telemetry-seq-len must be >= 1"),
    ("--telemetry-batch", "0", "--telemetry-batch must be >= 1"),
    ("--keep-resumable", "0", "--keep-resumable must be >= 1"),
    ("--seed", "-1", "--seed must be >= 0"),
    ("--warmup-frac", "1", "0 <= --warmup-frac < 1"),
    ("--beta2", "1", "--beta1 and --beta2 must be in [0, 1)"),
    ("--grad-clip", "nan", "--grad-clip must be a finite number"),
    ("--induction-threshold", "2", "--induction-threshold is an attention probability"),
    ("--eval-tokens", "10", "--eval-tokens 10 is less than one window"),
    ("--m0", "nan", "--m0 must be a finite number"),
    ("--m0", "1.5", "m0 must be in [0, 1]"),
    ("--span-length", "0", "span length must be >= 1"),
    ("--span-range", "9,3", "span length must be >= 1 (range lo <= hi)"),
    ("--span-range", "abc", "is not LO,HI"),
    ("--anneal-tokens", "0", "anneal_tokens must be > 0"),
    ("--tokens", "100", "smaller than one update"),
    ("--dense-every", "-2", "--dense-every must be >= 0"),
]


@pytest.mark.parametrize("flag, value, msg", TRAIN_BAD, ids=[f"{f}={v}" for f, v, _ in TRAIN_BAD])
def test_train_numeric_ranges(tmp_path, corpus, flag, value, msg):
    own = {"span_length": None} if flag == "--span-range" else {}   # --span-length beside it is a conflict of its own
    _refused(["train", *tiny_flags(corpus, tmp_path / "out", **own), f"{flag}={value}"], msg, tmp_path)


PREVIEW_BAD = [
    ("--batch-size", "0", "--batch-size must be >= 1"),
    ("--seq-len", "0", "--seq-len must be >= 2"),
    ("--total-tokens", "0", "--total-tokens must be >= 1"),
    ("--windows", "-1", "--windows must be >= 0"),
    ("--step", "99999", "--step 99999 is past the last batch"),
    ("--m0", "nan", "--m0 must be a finite number"),
    ("--span-range", "9,3", "range lo <= hi"),
    ("--span-length", "0", "span length must be >= 1"),
    ("--anneal-tokens", "-5", "anneal_tokens must be > 0"),
    ("--sep-id", "-1", "sep_id must be a token id >= 0"),
]


@pytest.mark.parametrize("flag, value, msg", PREVIEW_BAD, ids=[f"{f}={v}" for f, v, _ in PREVIEW_BAD])
def test_preview_numeric_ranges(tmp_path, corpus, flag, value, msg):
    _refused(["curriculum", "preview", corpus, "--seq-len", "64", "--total-tokens", "20000", f"{flag}={value}",
              "--plot", tmp_path / "f.png"], msg, tmp_path)


PREPARE_BAD = [
    ("--vocab-size", "10", "--vocab-size must be in [257"),
    ("--heldout-fraction", "nan", "--heldout-fraction must be a finite number"),
    ("--heldout-fraction", "-0.1", "heldout_fraction must be in [0, 1)"),
    ("--chunk-chars", "0", "chunk_chars must be >= 1"),
    ("--max-documents", "0", "max_documents must be >= 1"),
    ("--seed", "-1", "seed must be >= 0"),
]


@pytest.mark.parametrize("flag, value, msg", PREPARE_BAD, ids=[f"{f}={v}" for f, v, _ in PREPARE_BAD])
def test_prepare_numeric_ranges(tmp_path, flag, value, msg):
    (tmp_path / "c.txt").write_text("hello world\n\nmore text\n")
    _refused(["corpus", "prepare", tmp_path / "c.txt", "--out", tmp_path / "out", f"{flag}={value}"], msg, tmp_path)


def test_telemetry_threshold_range(tmp_path):
    run = _fake_run(tmp_path / "run")
    _refused(["telemetry", run, "--threshold", "nan"], "--threshold must be a finite number", tmp_path)


@pytest.mark.parametrize("kw, msg", [
    (dict(micro_batch_size=0), "--micro-batch-size must be >= 1"),
    (dict(lr=float("nan")), "--lr must be a finite number"),
    (dict(telemetry_batch=0), "--telemetry-batch must be >= 1"),
    (dict(curriculum=CurriculumConfig(variant="induction", m0=float("nan"))), "m0 must be in [0, 1]"),
    (dict(curriculum="sideways"), "unknown curriculum variant"),
])
def test_api_validates_the_same(kw, msg):
    cfg = TrainConfig(data="d", out="o", preset="cpu-tiny", seq_len=64, tokens_per_update=1024, tokens=4096,
                      telemetry_seq_len=12, **kw)
    with pytest.raises(InductionLabError, match=msg.replace("[", r"\[").replace("(", r"\(")):
        cfg.validate()
    with pytest.raises(InductionLabError, match="m0 must be in"):
        CurriculumConfig(m0=float("nan")).validate()


# -- options that depend on each other, checked together before any file is written -------------

def test_telemetry_probe_must_fit_the_context(tmp_path, corpus):
    flags = [f for f in tiny_flags(corpus, tmp_path / "out") if not f.startswith("--telemetry-seq-len")]
    # the default telemetry probe is BOS-free here: 2 * 50 = 100 tokens > 64
    line = _refused(["train", *flags], "--telemetry-seq-len <= 32", tmp_path)
    assert "2*50 = 100 tokens does not fit --seq-len 64" in line
    _refused(["train", *tiny_flags(corpus, tmp_path / "out", span_length=40, curriculum="none")],
             "--span-length <= 31", tmp_path)
    cfg = TrainConfig(data="d", out="o", preset="cpu-tiny", seq_len=64, tokens_per_update=1024, tokens=4096,
                      telemetry_seq_len=32)
    cfg.validate()                                            # 64 tokens fit without BOS ...
    with pytest.raises(InductionLabError, match="1\\+2\\*32 = 65 tokens .* --telemetry-seq-len <= 31"):
        cfg.check_telemetry_fits(bos=True)                   # ... but not with one
    cfg.telemetry = False
    cfg.check_telemetry_fits(bos=True)


def test_run_dir_without_a_finished_piece_is_not_a_different_run(tmp_path, corpus):
    out = tmp_path / "out"
    out.mkdir()
    # what a refused earlier attempt could have left: a run record of another config, no checkpoint
    (out / "run.json").write_text(json.dumps({"identity": {"config": {"seq_len": 999}}, "status": "running"}))
    args = ["train", *tiny_flags(corpus, out, tokens=1024, log_checkpoints=0)]
    r = CliRunner().invoke(main, [str(a) for a in args])
    assert r.exit_code == 0, r.output
    rec = json.loads((out / "run.json").read_text())
    assert rec["status"] == "complete" and rec["config"]["seq_len"] == 64
    # with a published checkpoint the same directory is protected: a different config is refused
    args = ["train", *tiny_flags(corpus, out, tokens=1024, log_checkpoints=0, lr=0.002)]
    r = CliRunner().invoke(main, [str(a) for a in args])
    assert r.exit_code == 2 and "holds a different run (config.lr is 0.001 there vs 0.002 now)" in r.output
    # --overwrite deletes it and starts afresh
    r = CliRunner().invoke(main, [str(a) for a in args] + ["--overwrite"])
    assert r.exit_code == 0, r.output
    assert json.loads((out / "run.json").read_text())["config"]["lr"] == 0.002


# -- corrupt or mismatched inputs -----------------------------------------------------------------

def test_corrupt_sources_refused(tmp_path):
    (tmp_path / "bad.txt.gz").write_bytes(b"this is not gzip at all")
    _refused(["corpus", "prepare", tmp_path / "bad.txt.gz", "--out", tmp_path / "o"], "not a readable gzip file",
             tmp_path)
    (tmp_path / "cut.txt.gz").write_bytes(gzip.compress(b"hello world " * 1000)[:40])
    _refused(["corpus", "prepare", tmp_path / "cut.txt.gz", "--out", tmp_path / "o"], "not a readable gzip file",
             tmp_path)
    (tmp_path / "rand.txt").write_bytes(np.random.default_rng(0).integers(0, 256, 20000, dtype=np.uint8).tobytes())
    _refused(["corpus", "prepare", tmp_path / "rand.txt", "--out", tmp_path / "o"], "is not a UTF-8 text file",
             tmp_path)
    (tmp_path / "rand.jsonl").write_bytes(np.random.default_rng(1).integers(0, 256, 20000, dtype=np.uint8).tobytes())
    _refused(["corpus", "prepare", tmp_path / "rand.jsonl", "--out", tmp_path / "o"], "is not a UTF-8 text file",
             tmp_path)


def test_a_few_stray_bytes_pass(tmp_path):
    from inductionlab.data.corpus import read_text
    p = tmp_path / "latin.txt"
    p.write_bytes("café au lait ".encode("latin-1") * 10 + b"plain ascii text " * 50)
    text = read_text(p)
    assert text.count("\ufffd") == 10 and "plain ascii" in text


@pytest.mark.parametrize("command", ["corpus info", "train", "curriculum preview"])
def test_manifest_without_heldout_split(tmp_path, corpus, command):
    import shutil
    broken = tmp_path / "broken"
    shutil.copytree(corpus, broken)
    m = json.loads((broken / "manifest.json").read_text())
    del m["splits"]["heldout"]
    (broken / "manifest.json").write_text(json.dumps(m))
    args = {"corpus info": ["corpus", "info", broken],
            "train": ["train", *tiny_flags(broken, tmp_path / "out")],
            "curriculum preview": ["curriculum", "preview", broken, "--seq-len", "64"]}[command]
    _refused(args, "has no 'heldout' split", tmp_path)


@pytest.fixture
def out_of_vocab(tmp_path, corpus):
    """A copy of the corpus whose train split holds one id >= the vocabulary (300)."""
    import shutil
    bad = tmp_path / "oov"
    shutil.copytree(corpus, bad)
    ids = np.fromfile(bad / "train.bin", dtype=np.uint16)
    ids[1000] = 300
    ids.tofile(bad / "train.bin")
    return bad


@pytest.mark.parametrize("command", ["train", "curriculum preview"])
def test_token_ids_outside_the_vocabulary(tmp_path, out_of_vocab, command):
    args = {"train": ["train", *tiny_flags(out_of_vocab, tmp_path / "out")],
            "curriculum preview": ["curriculum", "preview", out_of_vocab, "--seq-len", "64"]}[command]
    _refused(args, "holds token id 300, outside the vocabulary [0, 300)", tmp_path)


def test_stream_refuses_ids_outside_the_vocabulary(out_of_vocab):
    s = TokenShards.open(out_of_vocab)
    with pytest.raises(InductionLabError, match="token id 300, outside the vocabulary"):
        BiInductStream.from_shards(s, CurriculumConfig("induction", span_length=4), batch_size=2, seq_len=32,
                                   total_tokens=640)
    with pytest.raises(InductionLabError, match="token id 300"):
        s.check_ids()


# -- sizes from the data: vocabulary = largest id + 1 ------------------------------------------------

def test_sparse_word_level_tokenizer(tmp_path):
    from tokenizers import Tokenizer, models, pre_tokenizers
    vocab = {"<|endoftext|>": 0, "[UNK]": 1, " ": 2, "hello": 3, "cat": 4, "world": 70_000}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Split(" ", behavior="isolated")
    tok.save(str(tmp_path / "tokenizer.json"))
    (tmp_path / "c.txt").write_text("\n\n".join(["hello world cat"] * 50))
    r = CliRunner().invoke(main, ["corpus", "prepare", str(tmp_path / "c.txt"), "--out", str(tmp_path / "s"),
                                  "--tokenizer", str(tmp_path / "tokenizer.json"), "--heldout-fraction", "0"])
    assert r.exit_code == 0, r.output
    s = TokenShards.open(tmp_path / "s")
    assert s.vocab_size == 70_001 and s.train.dtype == np.uint32       # 6 entries, largest id 70,000
    assert int(s.train.max()) == 70_000 and s.manifest["dtype"] == "uint32"
    assert model_config("cpu-tiny", s.vocab_size).vocab_size == 70_001  # the embedding holds id 70,000
    s.check_ids()


def test_overwrite_means_start_afresh_in_telemetry_and_prepare(tmp_path):
    run = _fake_run(tmp_path / "run")
    out = tmp_path / "t"
    out.mkdir()
    (out / "old.txt").write_text("x")
    _refused(["telemetry", run, "--out", out], "use a new --out or --overwrite", tmp_path)
    r = CliRunner().invoke(main, ["telemetry", str(run), "--out", str(out), "--overwrite"])
    assert r.exit_code == 0, r.output
    assert not (out / "old.txt").exists() and (out / "results.json").is_file()
    (tmp_path / "c.txt").write_text("\n\n".join(f"paragraph {i} with some words" for i in range(60)))
    _refused(["corpus", "prepare", tmp_path / "c.txt", "--out", out, "--vocab-size", "300"],
             "pass a new --out or --overwrite", tmp_path)
    r = CliRunner().invoke(main, ["corpus", "prepare", str(tmp_path / "c.txt"), "--out", str(out), "--vocab-size",
                                  "300", "--heldout-fraction", "0", "--overwrite"])
    assert r.exit_code == 0, r.output
    assert sorted(p.name for p in out.iterdir()) == sorted(["heldout.bin", "manifest.json", "tokenizer.json",
                                                            "tokenizer_config.json", "train.bin"])
