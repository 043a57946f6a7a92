"""The main job through the Python API: config validation before any work, interrupt and resume."""

from __future__ import annotations

import json

import pytest

from conftest import make_tiny
from inductionlab.config import with_leaf
from inductionlab.core.models import LoadedModel, attention_shape
from inductionlab.errors import InductionLabError
from inductionlab.protocols.lag_probe import LagProbeConfig
from inductionlab.studies.analyze import AnalyzeConfig, analyze
from inductionlab.studies.configs import AblationConfig, HeadScoreConfig
from inductionlab.studies.spec import RunOptions

QUIET = RunOptions(progress=False)


@pytest.fixture
def tiny(word_tokenizer):
    model = make_tiny("llama", ctx=64)
    return LoadedModel(model, word_tokenizer, {"name": "tiny", "dtype": "float32", **attention_shape(model.config)})


def small(**kw):
    return AnalyzeConfig(ablation=AblationConfig(ks=(1, 2), n_draws=2, method="mean"),
                         scores=HeadScoreConfig(seq_len=8, batch_size=4), top=3,
                         lag=LagProbeConfig(n_permutations=3, list_length=24, cue_position=12, batch_size=2), **kw)


@pytest.mark.parametrize("bad,message", [
    ({"ablation.ks": (5, 5)}, "repeats a k"), ({"ablation.n_draws": -1}, "--n-draws -1"),
    ({"scores.seq_len": 0}, "score-seq-len"), ({"ablation.method": "knock"}, "unknown ablation method"),
    ({"ablation.ks": ()}, "give at least one k"),
])
def test_config_validates_itself(tiny, tmp_path, bad, message):
    cfg = small()
    for k, v in bad.items():
        cfg = with_leaf(cfg, tuple(k.split(".")), v)
    with pytest.raises(InductionLabError, match=message):
        cfg.validate()
    with pytest.raises(InductionLabError, match=message):          # the API calls the same check
        analyze(tiny, cfg, tmp_path / "run", QUIET)
    assert not list(tmp_path.iterdir())


def test_interrupt_and_resume_equals_uninterrupted(tiny, tmp_path):
    full = analyze(tiny, small(), tmp_path / "full", QUIET)
    seen = []

    def stop(key):
        seen.append(key)
        if len(seen) == 3:                     # scores, lag/intact, lag/induction-1
            raise KeyboardInterrupt

    out = tmp_path / "resumed"
    with pytest.raises(KeyboardInterrupt):
        analyze(tiny, small(), out, RunOptions(progress=False, on_checkpoint=stop))
    assert not (out / "results.json").exists()
    again = []
    res = analyze(tiny, small(), out, RunOptions(progress=False, on_checkpoint=again.append))
    assert seen == ["scores", "lag/intact", "lag/induction-1"] and not set(again) & set(seen)
    assert len(seen) + len(again) == 1 + 1 + 2 * (1 + 2)           # scores + intact + per k: induction, 2 draws
    a, b = (json.loads((d / "results.json").read_text()) for d in (tmp_path / "full", out))
    assert (a.pop("resumed"), b.pop("resumed")) == (False, True)
    a.pop("timings"), b.pop("timings")
    assert a == b
    assert res.lag.probs["intact"].tobytes() == full.lag.probs["intact"].tobytes()
    with pytest.raises(InductionLabError, match="different parameters"):
        analyze(tiny, small(seed=1), out, QUIET)
    analyze(tiny, small(seed=1), out, RunOptions(progress=False, overwrite=True))   # --overwrite: afresh
    assert json.loads((out / "results.json").read_text())["params"]["config"]["seed"] == 1
