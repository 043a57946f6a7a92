"""Issue 19: the cpu-natural preset's recipe and the per-variant table (values by hand)."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from dataclasses import replace

from inductionlab.studies.bi_induct import cpu_natural, evaluation_config, plan_budgets, train_config, variants_table
from test_train_helpers import make_corpus


def test_cpu_natural_is_the_papers_mix_at_the_laws_batch(tmp_path):
    from inductionlab.train.telemetry import predicted_emergence

    cfg = replace(cpu_natural(), shards=str(make_corpus(tmp_path)))
    cfg.validate()
    tc = train_config(cfg, "induction", 1, "run")
    assert (tc.global_batch, tc.seq_len, tc.steps, tc.tokens) == (4, 64, 46_875, 12_000_000)
    c = tc.curriculum
    assert (c.m0, c.anneal_tokens, c.span_source, c.span_length_range) == (0.5, 12_000_000, "natural", (6, 14))
    assert 2 * 14 + 1 <= 64 // 2                     # the snippet cap never binds (curriculum docstring, step 3)
    assert tc.lr == 3e-3 and tc.min_lr_ratio == 1.0  # constant after warm-up, as in Aoyama et al.'s small runs
    law = predicted_emergence(tc.global_batch, tc.seq_len)
    assert law["tokens"] == pytest.approx(5e5 * np.sqrt(4 * 64)) and law["tokens"] < tc.tokens
    budgets = plan_budgets(cfg, vocab_size=300)
    assert len(budgets) == 12 and len({str(b) for b in budgets.values()}) == 1       # 4 variants x 3 seeds, iso
    ev = evaluation_config(cfg, seed=1)
    assert ev.token_pool == "shards" and ev.recall.n_pairs == 8 and ev.induction.seq_len == 24 and ev.seed == 1
    assert ev.shards == cfg.shards
    assert 2 * max(cfg.calibration_lengths) + 1 <= 64   # [BOS] S S fits C


def test_variants_table_by_hand():
    t = pd.DataFrame({"variant": ["none"] * 3 + ["induction"] * 3, "seed": [0, 1, 2] * 2,
                      "emergence_tokens": [8e6, 9e6, None, 2e6, 3e6, 4e6],
                      "final_max_induction": [0.8, 0.8, 0.8, 0.9, 0.9, 0.9], "ppl": [10.0, 11.0, 12.0] * 2})
    rows = {r["variant"]: r for r in variants_table(t)}
    assert rows["none"]["never"] == 1 and rows["induction"]["never"] == 0
    # induction: mean 3e6, sd 1e6, t(2) = 4.302653 -> half 2.484e6
    assert rows["induction"]["emergence_tokens"] == "3000000 [515862, 5484138]"
    # none: two seeds emerged (8e6, 9e6): mean 8.5e6, sd 7.07e5, t(1) = 12.706 -> half 6.353e6
    assert rows["none"]["emergence_tokens"].startswith("8500000 [")
    assert rows["none"]["final_max_induction"] == "0.800 [0.800, 0.800]"
    assert rows["none"]["ppl"] == "11.000 [8.516, 13.484]"
