"""Telemetry: copy-offset score and held-out loss on models with analytic answers, summaries and
emergence step on a hand-built table, and the `inductionlab telemetry` command."""

from __future__ import annotations

import json
import math

import numpy as np
import pandas as pd
import pytest
import torch
from click.testing import CliRunner
from transformers import LlamaForCausalLM

from inductionlab.cli import main
from inductionlab.train.config import model_config
from inductionlab.train.flops import budget
from inductionlab.train.telemetry import (Telemetry, copy_offset_targets, copy_offset_scores, emergence_step,
                                          format_emergence, heldout_loss, measure, predicted_emergence,
                                          run_summary, summarize)
from inductionlab.errors import InductionLabError


def uniform_model(vocab=60, ctx=64):
    """q and k projections zero -> every score 0 -> causal attention uniform: query q puts 1/(q+1) on each key."""
    torch.manual_seed(0)
    m = LlamaForCausalLM(model_config("cpu-tiny", vocab, max_position_embeddings=ctx)).eval()
    for layer in m.model.layers:
        layer.self_attn.q_proj.weight.data.zero_()
        layer.self_attn.k_proj.weight.data.zero_()
    return m


def test_copy_offset_targets_hand_worked():
    # [BOS] S0 S1 S2 SEP X0 X1 X2 with L = 3: queries X0 (5), X1 (6) -> keys S1 (2), S2 (3)
    assert copy_offset_targets(3, bos=True).tolist() == [-1, -1, -1, -1, -1, 2, 3, -1]
    assert copy_offset_targets(3, bos=False).tolist() == [-1, -1, -1, -1, 1, 2, -1]


def test_copy_offset_score_of_uniform_attention():
    m = uniform_model()
    pool = torch.arange(2, 60)
    s = copy_offset_scores(m, span_length=5, pool=pool, sep_id=1, bos_id=0, batch_size=3)
    # queries q = 7, 8, 9, 10 (BOS + 5 + SEP, then X0..X3) each put 1/(q+1) on their target
    want = np.mean([1 / (q + 1) for q in (7, 8, 9, 10)])
    for name in ("copy_offset", "copy_offset_control"):
        assert s[name].shape == (2, 4)
        np.testing.assert_allclose(s[name], want, rtol=1e-5)


def test_heldout_loss_of_zero_logits_is_log_vocab():
    m = uniform_model(vocab=60)
    m.lm_head.weight.data.zero_()                  # logits 0 -> p = 1/60 for every token
    toks = np.random.default_rng(0).integers(0, 60, 500)
    assert heldout_loss(m, toks, seq_len=16, n_tokens=200) == pytest.approx(math.log(60), rel=1e-6)
    t = measure(m, vocab_size=60, special_ids=(0,), bos_id=None, sep_id=1, span_length=5, seq_len=10,
                batch_size=2, heldout=toks, eval_seq_len=16, eval_tokens=200)
    assert t["heldout_ppl"] == pytest.approx(60, rel=1e-5)
    # induction on [S S] with T = 10, no BOS: query i in 10..19 -> key i - 9, probability 1/(i+1)
    np.testing.assert_allclose(t["scores"]["induction"], np.mean([1 / (i + 1) for i in range(10, 20)]), rtol=1e-5)


def _table():
    rows = []
    grids = {0: [[0.0, 0.1], [0.2, 0.1]], 10: [[0.1, 0.3], [0.5, 0.1]], 100: [[0.2, 0.6], [0.45, 0.05]]}
    for step, g in grids.items():
        for layer, row in enumerate(g):
            for head, v in enumerate(row):
                rows.append({"step": step, "tokens": step * 100, "score": "induction", "layer": layer, "head": head,
                             "value": v})
    return pd.DataFrame(rows)


def test_summaries_and_emergence_hand_worked():
    s = summarize(_table(), thresholds=(0.15, 0.4)).set_index("step")
    assert s.loc[10, "max"] == 0.5 and (s.loc[10, "max_layer"], s.loc[10, "max_head"]) == (1, 0)
    assert s.loc[10, "top2pct_mean"] == 0.5                 # ceil(2% of 4 heads) = 1 head
    assert s.loc[10, "n_above_0.15"] == 2 and s.loc[100, "n_above_0.4"] == 2
    assert s.loc[100, "concentration"] == pytest.approx(0.6 / 1.3)
    assert s.loc[0, "concentration"] == pytest.approx(0.2 / 0.4)
    summ = summarize(_table())
    assert emergence_step(summ, 0.4) == 10 and emergence_step(summ, 0.55) == 100 and emergence_step(summ, 0.9) is None


def test_run_summary_hand_worked():
    heads = pd.concat([_table(), _table().assign(score="anti_induction", value=lambda d: d["value"] / 10)])
    evals = pd.DataFrame({"step": [100, 0, 10], "tokens": [10000, 0, 1000], "heldout_loss": [1.0, 3.0, 2.0],
                          "heldout_ppl": [math.e, math.e ** 3, math.e ** 2]})
    r = run_summary(heads, evals, 0.4)
    # first step with max induction > 0.4: step 10 (max 0.5), 1000 tokens; final (step 100): max 0.6 at L0H1
    assert (r["emergence_step"], r["emergence_tokens"], r["induction_threshold"]) == (10, 1000, 0.4)
    assert r["final"]["induction"] == {"max": 0.6, "top2pct_mean": 0.6, "max_layer_head": [0, 1]}
    assert r["final_max_induction"] == 0.6 and r["final_max_anti_induction"] == pytest.approx(0.06)
    assert r["final_heldout_ppl"] == pytest.approx(math.e)            # the last step's, not the last row's
    assert run_summary(heads, evals, 0.55)["emergence_step"] == 100
    assert run_summary(heads, evals.assign(heldout_ppl=float("nan")), 0.9)["final_heldout_ppl"] is None


def test_predicted_emergence_is_the_published_law():
    # N = 5e5 * sqrt(B * C): B = 4, C = 64 -> 5e5 * 16 = 8e6 tokens = 8e6 / 256 = 31,250 updates
    law = predicted_emergence(4, 64)
    assert law["tokens"] == pytest.approx(8e6) and law["updates"] == pytest.approx(31_250)
    assert "2511.16893" in law["law"] and (law["batch_sequences"], law["context"]) == (4, 64)
    # B * C = 2048 (cpu-control): 5e5 * 45.2548 = 2.263e7 tokens; fewer tokens per update -> more updates
    assert predicted_emergence(32, 64)["tokens"] == pytest.approx(2.2627e7, rel=1e-4)
    assert predicted_emergence(32, 64)["updates"] < law["updates"] < predicted_emergence(1, 64)["updates"]
    with pytest.raises(InductionLabError, match="B >= 1"):
        predicted_emergence(0, 64)
    assert format_emergence(1000, 10, law) == ("emergence 1,000 tokens (step 10); law predicts ≈ 8e+06 tokens "
                                               "(31,250 updates)")
    assert format_emergence(None, None, None) == "emergence none"


def test_run_summary_reports_the_law_beside_the_measured_emergence():
    heads = pd.concat([_table(), _table().assign(score="anti_induction")])
    evals = pd.DataFrame({"step": [0], "tokens": [0], "heldout_loss": [1.0], "heldout_ppl": [math.e]})
    r = run_summary(heads, evals, 0.4, batch_sequences=4, context=64)
    assert r["emergence_tokens"] == 1000 and r["predicted_emergence"]["tokens"] == pytest.approx(8e6)
    assert "predicted_emergence" not in run_summary(heads, evals, 0.4)


def test_telemetry_component_measures_at_scheduled_steps():
    from inductionlab.train import TrainConfig
    cfg = TrainConfig(telemetry_seq_len=10, telemetry_batch=2, eval_tokens=0, tokens_per_update=64, seq_len=32)
    data = type("D", (), {"vocab_size": 60, "special_ids": (0,), "bos_id": None, "sep_id": 1, "heldout": None})()
    cfg.curriculum.span_length = 5
    tel = Telemetry(cfg, data, schedule={0, 4, 16})
    assert [s for s in range(20) if tel.should_measure(s)] == [0, 4, 16]
    t = tel.measure(uniform_model(), 4)
    assert (t["step"], t["tokens"], t["heldout_loss"]) == (4, 256, None)
    np.testing.assert_allclose(t["scores"]["induction"], np.mean([1 / (i + 1) for i in range(10, 20)]), rtol=1e-5)
    cfg.telemetry = False
    assert not tel.should_measure(4)


def _fake_run(d, steps, scale, curriculum):
    c = model_config("cpu-tiny", 300, max_position_embeddings=64)
    b = budget(c, seq_len=64, tokens_per_update=1024, steps=steps).to_dict()
    d.mkdir()
    (d / "run.json").write_text(json.dumps({"budget": b, "config": {"induction_threshold": 0.4,
                                                                     "curriculum": curriculum}}))
    for s in (0, 2, steps):
        ck = d / "checkpoints" / f"step_{s:08d}"
        ck.mkdir(parents=True)
        grid = (np.full((2, 4), 0.05) + np.eye(2, 4) * scale * s / steps).tolist()
        (ck / "telemetry.json").write_text(json.dumps({
            "step": s, "tokens": s * 1024, "heldout_loss": 5.0 - s / steps, "heldout_ppl": math.exp(5.0 - s / steps),
            "scores": {"induction": grid, "anti_induction": np.full((2, 4), 0.02).tolist(),
                       "copy_offset": grid, "copy_offset_control": np.full((2, 4), 0.03).tolist()}}))


def test_telemetry_command(tmp_path):
    _fake_run(tmp_path / "base", 8, 0.2, "none")
    _fake_run(tmp_path / "bi", 8, 0.8, "induction")
    r = CliRunner().invoke(main, ["telemetry", str(tmp_path / "base"), str(tmp_path / "bi"), "--out",
                                  str(tmp_path / "cmp")])
    assert r.exit_code == 0, r.output
    rec = json.loads((tmp_path / "cmp" / "results.json").read_text())
    assert rec["kind"] == "telemetry" and rec["model"]["source"] == "checkpoints of the training runs"
    rep = rec["results"]
    # bi: max induction 0.05 + 0.8 * 2/8 = 0.25 at step 2, 0.85 at step 8 -> emerges (> 0.4) at step 8
    assert rep["bi"]["emergence_step"] == 8 and rep["base"]["emergence_step"] is None
    assert rep["bi"]["final"]["induction"]["max"] == pytest.approx(0.85)
    # the law beside it: B = 1024 / 64 = 16 sequences, C = 64 -> 5e5 * 32 = 1.6e7 tokens, 15,625 updates
    assert rep["bi"]["predicted_emergence"]["tokens"] == pytest.approx(1.6e7)
    assert "bi: emergence 8,192 tokens (step 8); law predicts ≈ 1.6e+07 tokens (15,625 updates)" in r.output
    assert "base: emergence none; law predicts ≈ 1.6e+07 tokens" in r.output
    for f in ("curves.png", "base_heatmaps.png", "bi_heatmaps.png", "bi_summary.csv"):
        assert (tmp_path / "cmp" / f).stat().st_size > 0
    _fake_run(tmp_path / "longer", 9, 0.8, "induction")
    r = CliRunner().invoke(main, ["telemetry", str(tmp_path / "base"), str(tmp_path / "longer"), "--out",
                                  str(tmp_path / "bad")])
    assert r.exit_code == 2 and "not matched-compute" in r.output and not (tmp_path / "bad").exists()
