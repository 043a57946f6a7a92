"""Claim R2's multi-token arm of ``inductionlab study routes`` (issue 34, deliverable 5): the lag probe again on
words of 2-4 tokens under every condition, R2w decided on the whole next word's p(+1)."""

from __future__ import annotations

import json
from dataclasses import replace

import numpy as np
import pytest
from conftest import make_tiny
from test_study_routes import piece_tokenizer, small  # noqa: F401  (the fixture and the tiny config)

from inductionlab.core.ablation import Condition
from inductionlab.errors import InductionLabError
from inductionlab.studies.spec import RunOptions


@pytest.fixture(scope="module")
def run(piece_tokenizer, tmp_path_factory):  # noqa: F811
    from inductionlab.core.models import LoadedModel, attention_shape
    from inductionlab.studies.routes.study import run_routes

    model = make_tiny("llama", ctx=256)
    lm = LoadedModel(model, piece_tokenizer, {"name": "tiny", "dtype": "float32", **attention_shape(model.config)})
    d = tmp_path_factory.mktemp("routes-words")
    cfg = replace(small(d, piece_tokenizer), r2_word_tokens="2-4")
    return run_routes(lm, cfg, d / "run", RunOptions(progress=False)), d / "run"


def test_the_multi_token_arm_runs_every_condition_and_decides_r2w(run):
    res, out = run
    rec = json.loads((out / "results.json").read_text())
    verd = {v["claim"]: v for v in rec["verdicts"]}
    assert set(verd) == {"R1", "R2", "R2w", "R3"}
    assert verd["R2w"]["evidence"] != "—" and "whole next word" in verd["R2w"]["rule"]
    assert "lag_words" in rec["cost"]["ratio_per_condition"]
    drops = res.drops
    assert {"lag_word_plus1", "lag_word_logp_plus1", "lag_first_plus1", "lag_first_enrichment"} <= set(drops.measure)
    # the measure: the lag probe's whole-word p(+1), pooled over cues, recomputed here by a separate intact run
    from inductionlab.protocols.lag_probe import run_lag_probe
    cfg = res.config.word_lag()
    assert cfg.token_lengths() == (2, 3, 4) and cfg.seed == res.config.seed
    lag = run_lag_probe(res.loaded, [Condition("intact", "intact")], cfg)
    cp = np.asarray(lag.cue_positions)
    has = cp + 1 <= cfg.list_length
    want = np.exp(lag.word_logp["intact"][:, has, cfg.word_lag_list().index(1)].astype(np.float64)).mean(1).mean()
    row = drops[drops.measure == "lag_word_plus1"].iloc[0]
    assert row["intact"] == pytest.approx(want, rel=1e-5) and 0 < want < 1


def test_r2w_needs_words_of_two_or_more_tokens(piece_tokenizer, tmp_path):  # noqa: F811
    with pytest.raises(InductionLabError, match="--r2-word-tokens 1"):
        replace(small(tmp_path, piece_tokenizer), r2_word_tokens="1").validate()


def test_r2w_is_decided_on_the_whole_word_and_left_out_when_not_run():
    from inductionlab.studies.routes.verdicts import decide

    n = 6
    conds = [Condition("intact", "intact"), Condition("induction-2", "induction", 2, heads=[(0, 0), (0, 1)]),
             Condition("concept_copying-2", "concept_copying", 2, heads=[(1, 0), (1, 1)]),
             Condition("induction-excl-concept_copying-2", "induction-excl-concept_copying", 2, heads=[(0, 2), (0, 3)]),
             Condition("random-all-2-d0", "random", 2, 0, heads=[(1, 2), (1, 3)])]
    jitter = np.linspace(-0.01, 0.01, n)
    base = {"copy_p_first_nonsense": 0.5 + jitter, "lag_plus1": 0.3 + jitter, "lag_enrichment": 1.0 + jitter,
            "icl_benefit": 0.2 + jitter}
    words = {"lag_word_plus1": 0.2 + jitter, "lag_first_enrichment": 0.5 + jitter}
    lower = {"concept_copying-2": {"lag_word_plus1": 0.05},
             "induction-excl-concept_copying-2": {"lag_word_plus1": 0.01}}

    def values(name, with_words=True):
        src = base | (words if with_words else {})
        return {m: v - lower.get(name, {}).get(m, 0.0) for m, v in src.items()}
    names = {"token": "induction", "concept": "concept_copying", "cmr": "cmr_like"}
    v = {x.claim: x for x in decide(conds, values, ("induction", "concept_copying"), names)}
    # concept heads lower the whole word by 0.05, the token heads excluding them by 0.01: +0.04 every trial
    assert v["R2w"].status == "reproduced" and v["R2w"].per_k["2"]["difference"] == pytest.approx(0.04)
    assert v["R2"].status == "not reproduced"                         # the single-token p(+1) did not move
    assert "R2w" not in {x.claim for x in decide(conds, lambda n: values(n, False), ("induction", "concept_copying"),
                                                  names)}
    words["lag_first_enrichment"] = 0 * jitter - 0.1                   # no contiguity on the multi-token list
    v = {x.claim: x for x in decide(conds, values, ("induction", "concept_copying"), names)}
    assert v["R2w"].status == "not testable" and "first-token" in v["R2w"].caveat
