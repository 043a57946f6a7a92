"""The main job through the Python API: config validation before any work, interrupt and resume."""

from __future__ import annotations

import json

import pytest

from conftest import make_tiny
from inductionlab.studies.analyze import AnalyzeConfig, analyze
from inductionlab.errors import InductionLabError
from inductionlab.protocols.lag_probe import LagProbeConfig
from inductionlab.core.models import LoadedModel, attention_shape


@pytest.fixture
def tiny(word_tokenizer):
    model = make_tiny("llama", ctx=64)
    return LoadedModel(model, word_tokenizer, {"name": "tiny", "dtype": "float32", **attention_shape(model.config)})


def small(**kw):
    return AnalyzeConfig(ks=(1, 2), n_draws=2, score_seq_len=8, score_batch_size=4, top=3, method="mean",
                         lag=LagProbeConfig(n_permutations=3, list_length=24, cue_position=12, batch_size=2), **kw)


@pytest.mark.parametrize("bad,message", [
    (dict(ks=(5, 5)), "repeats a k"), (dict(n_draws=-1), "--n-draws -1"), (dict(score_seq_len=0), "score-seq-len"),
    (dict(method="knock"), "unknown ablation method"), (dict(ks=()), "give at least one k"),
])
def test_config_validates_itself(tiny, tmp_path, bad, message):
    cfg = small()
    for k, v in bad.items():
        setattr(cfg, k, v)
    with pytest.raises(InductionLabError, match=message):
        cfg.validate()
    with pytest.raises(InductionLabError, match=message):          # the API calls the same check
        analyze(tiny, cfg, tmp_path / "run", progress=False)
    assert not list(tmp_path.iterdir())


def test_interrupt_and_resume_equals_uninterrupted(tiny, tmp_path):
    full = analyze(tiny, small(), tmp_path / "full", progress=False)
    seen = []

    def stop(key):
        seen.append(key)
        if len(seen) == 3:                     # scores, lag/intact, lag/induction-1
            raise KeyboardInterrupt

    out = tmp_path / "resumed"
    with pytest.raises(KeyboardInterrupt):
        analyze(tiny, small(), out, progress=False, on_checkpoint=stop)
    assert not (out / "results.json").exists()
    again = []
    res = analyze(tiny, small(), out, progress=False, on_checkpoint=again.append)
    assert seen == ["scores", "lag/intact", "lag/induction-1"] and not set(again) & set(seen)
    assert len(seen) + len(again) == 1 + 1 + 2 * (1 + 2)           # scores + intact + per k: induction, 2 draws
    a, b = (json.loads((d / "results.json").read_text()) for d in (tmp_path / "full", out))
    a.pop("timings"), b.pop("timings")
    assert a == b
    assert res.lag.probs["intact"].tobytes() == full.lag.probs["intact"].tobytes()
    with pytest.raises(InductionLabError, match="different parameters"):
        analyze(tiny, small(seed=1), out, progress=False)
    analyze(tiny, small(seed=1), out, progress=False, overwrite=True)   # --overwrite: afresh
    assert json.loads((out / "results.json").read_text())["params"]["seed"] == 1
