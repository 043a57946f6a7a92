"""Every model-dependent check before the first write, and the leftover kinds of issue 36 fixed by kind.

Each refusal: exit 2, one ``error:`` line, nothing written (an ``--out`` that did not exist still does not; an
existing unrelated folder stays byte-identical). Kinds: a head-score sequence beyond the model's context, an
all-zero model, ``--partial`` on an ``--out`` without a run (the engine opens the run only after every check);
the demo corpus missing (refused before the model loads); an option value passed to a library
(``--attn-implementation``, ``--device-map``); a damaged JSON file of a saved dataset and a manifest field of an
unexpected type (the one bounded JSON reader); command-line text that is not UTF-8. Beside them: demo-corpus
windows skip a work the tokenizer makes too short, the main job's selection is the same in float32 and bfloat16
(``stable-draws``), and 0.1's first API keywords still work with a DeprecationWarning.
"""

from __future__ import annotations

import hashlib
import json
import shutil
import warnings
from pathlib import Path

import numpy as np
import pytest
import torch

from _tiny import tiny_llama_dir
from inductionlab.errors import InductionLabError
from test_bad_inputs import refused
from test_train_helpers import make_corpus

MISSING_MODEL = "/nonexistent/model"
ANALYZE_FAST = ["--n-permutations", "3", "--list-length", "30", "--cue-position", "15", "--ks", "1,2", "--n-draws", "2",
                "--score-batch-size", "2", "--top", "3", "--quiet", "--dtype", "float32"]


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    """A tiny random Llama (2 layers x 4 heads, context 512) and its word tokenizer."""
    return tiny_llama_dir(tmp_path_factory.mktemp("tiny") / "llama", n_layers=2, n_heads=4)


@pytest.fixture(scope="module")
def zero_dir(model_dir, tmp_path_factory):
    """The same model with every weight zero (a degenerate checkpoint)."""
    from transformers import LlamaForCausalLM

    out = tmp_path_factory.mktemp("zero") / "llama"
    m = LlamaForCausalLM.from_pretrained(model_dir)
    with torch.no_grad():
        for p in m.parameters():
            p.zero_()
    m.save_pretrained(out)
    for f in model_dir.glob("*tok*"):
        shutil.copy(f, out)
    return out


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    return make_corpus(tmp_path_factory.mktemp("corpus"), n_lines=600)



@pytest.fixture()
def text(tmp_path):
    t = tmp_path / "text.txt"
    t.write_text(" ".join(["the cat sat on the mat and the dog ran away"] * 400))
    return t


def _digest(root: Path) -> dict:
    return {str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest() if p.is_file() else "dir"
            for p in sorted(root.rglob("*"))}


def _refused_both(args, pattern, tmp_path, victim):
    """``args`` + ``--out`` refused with ``pattern`` for an absent --out (stays absent) and an empty folder (a run
    may open there: stays empty); refused in one line (whichever check comes first) for an existing unrelated folder,
    which stays byte-identical."""
    before = _digest(victim)
    refused([*args, "--out", tmp_path / "absent"], pattern, tmp_path)
    assert not (tmp_path / "absent").exists()
    empty = tmp_path / "empty"
    empty.mkdir(exist_ok=True)
    refused([*args, "--out", empty], pattern, tmp_path)
    assert list(empty.iterdir()) == []
    refused([*args, "--out", victim], ".", tmp_path)
    assert _digest(victim) == before


# -- every model-dependent check before the first write -------------------------------------------------------

@pytest.mark.parametrize("command", ["analyze", "study head-types", "study routes"])
def test_head_score_sequence_beyond_the_context(command, model_dir, tmp_path, victim, text):
    args = {"analyze": ["analyze", "--model", model_dir, *ANALYZE_FAST],
            "study head-types": ["study", "head-types", model_dir, "--icl-text", text, "--quiet"],
            "study routes": ["study", "routes", model_dir, "--rankings", "induction", "--icl-text", text,
                             "--quiet"]}[command]
    _refused_both([*args, "--score-seq-len", "400"],
                  r"--score-seq-len 400: a head-score sequence \[BOS\] S S of 801 tokens exceeds the model's context "
                  r"of 512; use --score-seq-len <= 255", tmp_path, victim)


def test_all_zero_model(zero_dir, tmp_path, victim):
    _refused_both(["analyze", "--model", zero_dir, *ANALYZE_FAST, "--score-seq-len", "8"],
                  r"every one of its \d+ weight matrices is zero", tmp_path, victim)


def test_partial_without_a_run(corpus, tmp_path):
    refused(["study", "bi-induct", "--shards", corpus, "--partial", "--out", tmp_path / "absent"],
            "--partial takes the runs .* holds no study-bi-induct run; start it without --partial", tmp_path)
    assert not (tmp_path / "absent").exists()
    empty = tmp_path / "empty"
    empty.mkdir()
    refused(["study", "bi-induct", "--shards", corpus, "--partial", "--out", empty], "holds no study-bi-induct run",
            tmp_path)
    assert list(empty.iterdir()) == []


# -- the demo corpus: missing on a fresh clone, works too short for a tokenizer -------------------------------

@pytest.mark.parametrize("command", [["study", "head-types"], ["study", "routes", "--rankings", "induction"]])
def test_missing_demo_corpus_refused_before_the_model(command, tmp_path, victim, monkeypatch):
    from inductionlab.data import corpus as corpus_module

    monkeypatch.setattr(corpus_module, "demo_corpus_dir", lambda: tmp_path / "no-cache")
    _refused_both([*command, MISSING_MODEL], r"--icl-text demo: demo corpus not installed .*make corpus", tmp_path,
                  victim)


class _CharTokenizer:
    """One token per character (id 1 + its code mod 200), except in text of the letter ``sparse``: one token per
    50 characters there (a tokenizer of a larger vocabulary on that work)."""
    bos_token_id = 0

    def __init__(self, sparse: str):
        self.sparse = sparse

    def encode(self, text, add_special_tokens=False):
        step = 50 if text[:1] == self.sparse else 1
        return [1 + (ord(c) % 200) for c in text[::step]]


def _reference_windows(tok, works, length, n, seed):
    """The construction without skips, written out (the module's before the fix)."""
    rng = np.random.default_rng(seed)
    rows = []
    for i in rng.choice(len(works), size=n, replace=n > len(works)):
        text = works[int(i)]
        start = int(rng.integers(len(text) // 10, max(len(text) // 10 + 1, len(text) - 20 * length)))
        ids = tok.encode(text[start:start + 12 * length])[1:]
        rows.append([0] + ids[:length - 1])
    return rows


def _works(k, length=20):
    """``k`` works, work i the letter i repeated (so each window says which work it came from)."""
    return ["abcdefghijklmnopqrstuvwxyz"[i] * (30 * length) for i in range(k)]


def test_demo_windows_unchanged_without_a_short_work():
    from inductionlab.protocols.token_loss import _demo_windows

    works = _works(6)
    tok = _CharTokenizer(sparse="none")
    got = _demo_windows(tok, works, 20, 4, seed=3)
    assert got.tolist() == _reference_windows(tok, works, 20, 4, seed=3)


def test_demo_windows_skip_a_work_too_short_for_the_tokenizer():
    from inductionlab.protocols.token_loss import _demo_windows

    works = _works(6)
    drawn = [int(i) for i in np.random.default_rng(3).choice(6, size=4, replace=False)]
    short = works[drawn[0]][0]                                   # the first drawn work is the short one
    tok = _CharTokenizer(sparse=short)
    got = _demo_windows(tok, works, 20, 4, seed=3)
    assert got.shape == (4, 20) and (got[:, 0] == 0).all()
    letters = {chr(int(r[1]) - 1) for r in got}                  # each window's work (its letter; codes < 200)
    assert all(len(set(r[1:].tolist())) == 1 for r in got)       # a window holds one work
    assert short not in letters and len(letters) == 4 and {works[i][0] for i in drawn[1:]} <= letters
    with pytest.raises(InductionLabError, match="only 5 of the demo corpus's 6 long works fill a window of 20 "
                                                "tokens with this tokenizer, fewer than the 6 windows needed"):
        _demo_windows(tok, works, 20, 6, seed=3)


# -- an option value passed straight to a library --------------------------------------------------------------

@pytest.mark.parametrize("value, pattern", [
    ("bogus", r"--attn-implementation 'bogus': use one of sdpa, eager"),
    ("flash_attention_2", r"--attn-implementation flash_attention_2 needs a CUDA GPU and the flash_attn package"),
])
def test_train_attn_implementation(value, pattern, corpus, tmp_path, victim):
    if value.startswith("flash") and torch.cuda.is_available():
        pytest.skip("CUDA here: the flash kernel's package decides")
    _refused_both(["train", "--data", corpus, "--tokens", "655360", "--attn-implementation", value], pattern,
                  tmp_path, victim)


@pytest.mark.parametrize("value, pattern", [
    ("cuda:0", r"--device-map cuda:0 requested but torch sees no CUDA device"),
    ("bogus", r"--device-map 'bogus': use auto, balanced"),
])
def test_device_map_checked_up_front(value, pattern, model_dir, tmp_path, victim):
    if value.startswith("cuda") and torch.cuda.is_available():
        pytest.skip("CUDA here")
    _refused_both(["analyze", "--model", model_dir, *ANALYZE_FAST, "--device-map", value], pattern, tmp_path, victim)


# -- one bounded reader for every JSON a run reads ---------------------------------------------------------------

@pytest.mark.parametrize("name", ["state.json", "dataset_info.json"])
def test_saved_dataset_with_a_damaged_json_file(name, tmp_path, victim):
    import datasets

    src = tmp_path / "ds"
    datasets.Dataset.from_dict({"text": ["one two three four"] * 50}).save_to_disk(str(src))
    (src / name).write_text('{"_data_files": [')                       # cut mid-document
    _refused_both(["corpus", "prepare", src], rf"{name}: saved dataset file is not valid JSON \(.* at line 1", tmp_path,
                  victim)


@pytest.mark.parametrize("field, value, pattern", [
    ("dtype", "object", "token dtype 'object' is no integer type"),
    ("dtype", "float64", "token dtype 'float64' is no integer type"),
    ("dtype", ["uint16"], "is corrupt"),
    ("tokens", "many", r"splits.train.tokens is 'many', not a count"),
    ("tokens", -5, r"splits.train.tokens is -5, not a count"),
    ("vocab_size", 3.5, r"vocab_size is 3.5, not a count"),
])
def test_corpus_manifest_field_of_an_unexpected_type(field, value, pattern, corpus, tmp_path):
    bad = tmp_path / "corpus"
    shutil.copytree(corpus, bad)
    m = json.loads((bad / "manifest.json").read_text())
    if field == "dtype":
        m["dtype"] = value
    elif field == "tokens":
        m["splits"]["train"]["tokens"] = value
    else:
        m["tokenizer"][field] = value
    (bad / "manifest.json").write_text(json.dumps(m))
    refused(["corpus", "info", bad], pattern, tmp_path)


def test_damaged_json_is_one_line_and_still_a_decode_error(tmp_path):
    from inductionlab.documents import DocumentError, read_json

    p = tmp_path / "x.json"
    p.write_text('{"a": 1,\n "b": }')
    with pytest.raises(DocumentError, match=r"x.json: record is not valid JSON \(Expecting value at line 2, "
                                            r"column 7\); repair or recreate it") as e:
        read_json(p, "record")
    assert isinstance(e.value, json.JSONDecodeError) and "\n" not in str(e.value)


# -- command-line text that is not UTF-8 ------------------------------------------------------------------------

@pytest.mark.parametrize("option", ["--instruction", "--separator"])
def test_text_that_is_not_utf8(option, model_dir, tmp_path, victim):
    bad = "list" + b"\xff".decode("utf-8", "surrogateescape")       # what UTF-8 mode makes of the byte 0xff
    _refused_both(["analyze", "--model", model_dir, *ANALYZE_FAST, option, bad],
                  rf"{option}: the text is not valid UTF-8 \(byte 0xff at character 4\)", tmp_path, victim)


# -- the main job's draws in float32 and bfloat16 ------------------------------------------------------------------

def test_stable_draws(model_dir, tmp_path):
    """stable-draws: the main job's head scores and every condition's heads (top-k and the random draws outside the
    top N) are the same whether the model runs in float32 or bfloat16 (its float32 weights are not bfloat16
    numbers: the scores are bit-identical only when the selection's scores are computed from the float32 weights,
    not from the bfloat16 ones widened)."""
    from inductionlab import AnalyzeConfig, analyze, load_model
    from inductionlab.protocols.configs import LagProbeConfig
    from inductionlab.studies.configs import AblationConfig, HeadScoreConfig
    from inductionlab.studies.spec import RunOptions

    cfg = AnalyzeConfig(scores=HeadScoreConfig(seq_len=12, batch_size=4), ablation=AblationConfig(ks=(1, 2), n_draws=3),
                        lag=LagProbeConfig(n_permutations=2, list_length=30, cue_position=15, cues="seed"), top=3)
    got = {}
    for dtype in ("float32", "bfloat16"):
        lm = load_model(str(model_dir), dtype=dtype)
        assert next(lm.model.parameters()).dtype == getattr(torch, dtype)
        res = analyze(lm, cfg, tmp_path / dtype, RunOptions(progress=False))
        got[dtype] = (res.scores.scores, {c.name: [tuple(h) for h in c.heads] for c in res.lag.conditions})
    (s32, c32), (s16, c16) = got["float32"], got["bfloat16"]
    assert c16 == c32
    assert len([n for n in c32 if n.startswith("random")]) == 6
    for name in s32:
        np.testing.assert_array_equal(s16[name], s32[name])


def test_float32_model_leaves_the_model_untouched(model_dir):
    """A bfloat16 load: the source loaded again in float32 (equal to a float32 load's weights); a bare module: a
    widened copy; the model itself unchanged either way; a float32 model: itself."""
    from inductionlab import load_model
    from inductionlab.core.models import float32_model

    lm = load_model(str(model_dir), dtype="bfloat16")
    lm32 = load_model(str(model_dir), dtype="float32")
    before = {k: v.clone() for k, v in lm.model.state_dict().items()}
    with float32_model(lm) as m:
        assert m is not lm.model
        ref = lm32.model.state_dict()
        assert all(torch.equal(v, ref[k]) for k, v in m.state_dict().items())       # not the rounded weights
    with float32_model(lm.model) as m:
        assert all(p.dtype == torch.float32 for p in m.parameters())
        assert all(torch.equal(v, before[k].float()) for k, v in m.state_dict().items() if v.is_floating_point())
    after = lm.model.state_dict()
    assert all(after[k].dtype == v.dtype and torch.equal(after[k], v) for k, v in before.items())
    with float32_model(lm32) as m:
        assert m is lm32.model


# -- 0.1's first API keywords, deprecated for one minor version -----------------------------------------------------

def test_old_analyze_config_keywords():
    from inductionlab import AnalyzeConfig
    from inductionlab.studies.configs import AblationConfig, HeadScoreConfig

    with pytest.warns(DeprecationWarning, match=r"AnalyzeConfig\(ks=...\) is deprecated and will be removed in 0.2; "
                                                r"use AnalyzeConfig\(ablation=AblationConfig\(ks=...\)\)"):
        old = AnalyzeConfig(ks=(1, 2), n_draws=3, score_seq_len=12, method="mean")
    new = AnalyzeConfig(ablation=AblationConfig(ks=(1, 2), n_draws=3, method="mean"),
                        scores=HeadScoreConfig(seq_len=12))
    assert old == new
    with pytest.raises(TypeError, match="unexpected keyword argument 'kz'"):
        AnalyzeConfig(kz=(1,))


def test_old_analyze_run_keywords(model_dir, tmp_path):
    from inductionlab import AnalyzeConfig, analyze, load_model
    from inductionlab.protocols.configs import LagProbeConfig
    from inductionlab.studies.configs import AblationConfig, HeadScoreConfig
    from inductionlab.studies.spec import RunOptions

    lm = load_model(str(model_dir), dtype="float32")
    cfg = AnalyzeConfig(scores=HeadScoreConfig(seq_len=8, batch_size=2), ablation=AblationConfig(ks=(1,), n_draws=1),
                        lag=LagProbeConfig(n_permutations=2, list_length=30, cue_position=15, cues="seed"), top=2)
    with pytest.warns(DeprecationWarning, match=r"analyze\(..., progress=...\) is deprecated .* 0.2: pass "
                                                r"opts=RunOptions\(progress=...\)"):
        res = analyze(lm, cfg, tmp_path / "run", progress=False)
    assert (tmp_path / "run" / "results.json").is_file() and res.record["kind"] == "analyze"
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        analyze(lm, cfg, tmp_path / "run", RunOptions(progress=False))          # the new form: no warning, resumes
    with pytest.raises(TypeError, match="unexpected keyword argument 'progres'"):
        analyze(lm, cfg, tmp_path / "run", progres=False)
    with pytest.raises(TypeError, match="not both"):
        analyze(lm, cfg, tmp_path / "run", RunOptions(), progress=False)
