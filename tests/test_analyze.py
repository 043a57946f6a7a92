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
    _check_patterns(tmp_path / "full", full)
    seen = []

    def stop(key):
        seen.append(key)
        if len(seen) == 3:                     # scores, attention_patterns, lag/intact
            raise KeyboardInterrupt

    out = tmp_path / "resumed"
    with pytest.raises(KeyboardInterrupt):
        analyze(tiny, small(), out, RunOptions(progress=False, on_checkpoint=stop))
    assert not (out / "results.json").exists()
    again = []
    res = analyze(tiny, small(), out, RunOptions(progress=False, on_checkpoint=again.append))
    assert seen == ["scores", "attention_patterns", "lag/intact"] and not set(again) & set(seen)
    assert len(seen) + len(again) == 1 + 1 + 1 + 2 * (1 + 2)   # scores + patterns + intact + per k: induction, 2 draws
    a, b = (json.loads((d / "results.json").read_text()) for d in (tmp_path / "full", out))
    assert (a.pop("resumed"), b.pop("resumed")) == (False, True)
    a.pop("timings"), b.pop("timings")
    assert a == b
    assert res.lag.probs["intact"].tobytes() == full.lag.probs["intact"].tobytes()
    with pytest.raises(InductionLabError, match="different parameters"):
        analyze(tiny, small(seed=1), out, QUIET)
    analyze(tiny, small(seed=1), out, RunOptions(progress=False, overwrite=True))   # --overwrite: afresh
    assert json.loads((out / "results.json").read_text())["params"]["config"]["seed"] == 1


def _check_patterns(d, res):
    """attention_patterns.png / .npz: the top 4 induction heads by the written scores, then one random head
    outside them, on [BOS] S S of the scores' T = 8 (17 tokens): probabilities, causal; in the report."""
    import numpy as np
    import pandas as pd

    assert (d / "attention_patterns.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    z = np.load(d / "attention_patterns.npz")
    scores = pd.read_csv(d / "head_scores.csv").sort_values("induction", ascending=False, kind="stable")
    top = [tuple(r) for r in scores[["layer", "head"]].to_numpy()[:4]]
    heads = [tuple(h) for h in z["heads"].tolist()]
    assert heads[:4] == top and heads[4] not in top and list(z["kind"]) == ["induction"] * 4 + ["random"]
    ids = z["input_ids"]
    assert z["patterns"].shape == (5, 17, 17) and ids[0] == 1 and (ids[1:9] == ids[9:]).all()
    np.testing.assert_allclose(z["patterns"].sum(-1), 1.0, atol=1e-5)
    assert np.triu(z["patterns"], 1).max() == 0.0
    rec = json.loads((d / "results.json").read_text())
    assert [(h["layer"], h["head"]) for h in rec["attention_patterns"]["heads"]] == heads
    assert "attention_patterns_s" in rec["timings"] and "attention_patterns.png" in (d / "report.md").read_text()
