"""Issue 19: probes in the model's own tokens.

* the token pool of a corpus is exactly the ids its training split uses, minus the special ids;
* the trainer's telemetry draws from it (and records it);
* associative recall and copy accuracy: an oracle induction model scores 1.0, a uniform model
  its analytic loss log V;
* absolute ablation changes and their CIs, worked out by hand.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest
import torch

from inductionlab.errors import InductionLabError
from inductionlab.protocols.icl_score import associative_recall, induction_loss, recall_sequences
from inductionlab.measures.load_bearing_eval import absolute_change, drops_table
from test_train_helpers import make_corpus


@pytest.fixture(scope="module")
def corpus(tmp_path_factory) -> Path:
    return make_corpus(tmp_path_factory.mktemp("pool"))


def test_token_pool_is_the_training_split_minus_specials(corpus):
    from inductionlab.data.shards import TokenShards

    sh = TokenShards.open(corpus)
    used = set(int(t) for t in np.asarray(sh.train))               # independent: a Python set
    want = sorted(used - {sh.eos_id, sh.bos_id, sh.sep_id})
    pool = sh.token_pool()
    assert pool.dtype == np.int64 and pool.tolist() == want
    assert len(pool) < sh.vocab_size                               # the BPE has ids the text never uses
    assert sh.token_pool(exclude_ids=(want[0],)).tolist() == want[1:]
    # counting only a prefix: the ids of that prefix
    head = sorted(set(int(t) for t in np.asarray(sh.train[:100])) - {sh.eos_id, sh.bos_id, sh.sep_id})
    assert sh.token_pool(max_tokens=100).tolist() == head


def test_telemetry_draws_from_the_training_split(corpus, tmp_path):
    from inductionlab.data.shards import TokenShards
    from inductionlab.data.curriculum import CurriculumConfig
    from inductionlab.train import TrainConfig, train

    cfg = TrainConfig(curriculum=CurriculumConfig(span_length=8), data=str(corpus), out=str(tmp_path / "run"), preset="cpu-micro", seq_len=32,
                      tokens_per_update=128, micro_batch_size=4, tokens=128 * 4, log_checkpoints=2,
                      telemetry_seq_len=8, telemetry_batch=4, eval_tokens=256, progress=False, tensorboard=False)
    res = train(cfg)
    r = res.record["results"]
    assert 0 < r["telemetry_time_s"] <= r["checkpoint_time_s"]    # telemetry is timed inside the checkpoints
    tel = sorted((tmp_path / "run" / "checkpoints").glob("step_*/telemetry.json"))
    assert tel
    p = json.loads(tel[-1].read_text())["params"]["pool"]
    sh = TokenShards.open(corpus)
    assert p == {"source": "training split", "size": len(sh.token_pool())}


class _Oracle(torch.nn.Module):
    """Logits of a perfect induction model: at position t, all mass on the token that followed the
    last earlier occurrence of x_t (uniform when x_t has not occurred before)."""

    def __init__(self, vocab: int, uniform: bool = False):
        super().__init__()
        self.vocab, self.uniform = vocab, uniform
        self.w = torch.nn.Parameter(torch.zeros(1))

    def forward(self, input_ids, **_):
        B, T = input_ids.shape
        logits = torch.zeros(B, T, self.vocab)
        if not self.uniform:
            for b in range(B):
                x = input_ids[b].tolist()
                for t in range(T):
                    prev = [j for j in range(t) if x[j] == x[t]]
                    if prev and prev[-1] + 1 < T:
                        logits[b, t, x[prev[-1] + 1]] = 100.0
        return type("Out", (), {"logits": logits})()


def test_recall_sequences_repeat_every_pair_in_a_shuffled_order():
    pool = torch.arange(10, 60)
    S = recall_sequences(pool, 5, 6, seed=3, bos_id=1)
    assert S.shape == (5, 1 + 4 * 6) and (S[:, 0] == 1).all()
    for row in S[:, 1:].tolist():
        first, again = row[:12], row[12:]
        assert len(set(first)) == 12 and set(first) <= set(range(10, 60))
        pairs = {(first[i], first[i + 1]) for i in range(0, 12, 2)}
        assert {(again[i], again[i + 1]) for i in range(0, 12, 2)} == pairs
    assert any(r[13:25] != r[1:13] for r in S.tolist())            # shuffled, not a plain copy
    with pytest.raises(InductionLabError, match="exceeds"):
        recall_sequences(torch.arange(5), 2, 3, seed=0)            # 6 distinct tokens from 5
    with pytest.raises(InductionLabError, match="at least 2"):
        recall_sequences(pool, 2, 1, seed=0)


def test_oracle_scores_one_uniform_scores_log_v():
    V = 64
    pool = torch.arange(2, V)
    r = associative_recall(_Oracle(V), pool, n_pairs=5, n=6, seed=0, bos_id=0, batch_size=4)
    assert r["accuracy"] == 1.0 and r["per_sequence"]["accuracy"].tolist() == [1.0] * 6
    assert r["nll"] == pytest.approx(0.0, abs=1e-6)
    u = associative_recall(_Oracle(V, uniform=True), pool, n_pairs=5, n=6, seed=0, bos_id=0)
    assert u["nll"] == pytest.approx(math.log(V))
    il = induction_loss(_Oracle(V), sequences=torch.stack([pool[torch.randperm(len(pool))[:9]] for _ in range(4)]),
                        bos_id=0)
    assert il["copy_accuracy"] == 1.0                              # every repeated token predicted
    # the oracle cannot know the repeat's first token: its loss there is log V, the rest 0 -> second copy = log V / 9
    assert il["second_copy"] == pytest.approx(math.log(V) / 9)


def test_absolute_change_by_hand():
    r = absolute_change([1.0, 2.0, 3.0], [0.0, 2.0, 2.0])
    half = 1.959964 * np.std([-1.0, 0.0, -1.0], ddof=1) / math.sqrt(3)
    assert r["absolute"] == pytest.approx(-2 / 3)
    assert r["absolute_ci_high"] - r["absolute"] == pytest.approx(half, rel=1e-5)
    c = absolute_change([1.0, 2.0, 3.0], [0.0, 2.0, 2.0], baseline=[1.0, 1.0, 1.0])   # contrast vs a baseline
    assert c["absolute"] == pytest.approx(1 / 3)
    # random draws are pooled per unit before the contrast: draws [[1, 1], [3, 3]] -> baseline [2, 2]
    import pandas as pd
    rows = pd.DataFrame({"variant": ["intact"] * 2 + ["v"] * 6, "kind": ["intact"] * 2 + ["induction"] * 2 + ["random"] * 4,
                         "draw": [0, 0, 0, 0, 0, 0, 1, 1], "unit": [0, 1] * 4,
                         "value": [4.0, 4.0, 1.0, 2.0, 1.0, 1.0, 3.0, 3.0]})
    d = drops_table(rows).set_index(["kind", "draw"])
    assert d.loc[("induction", "0"), "absolute"] == pytest.approx(-2.5)
    assert d.loc[("random", "pooled"), "absolute"] == pytest.approx(-2.0)
    assert d.loc[("induction-random", "pooled"), "absolute"] == pytest.approx(-0.5)


def test_evaluate_token_pool_shards_needs_shards():
    from click.testing import CliRunner
    from inductionlab.cli import main

    r = CliRunner().invoke(main, ["evaluate", "--token-pool", "shards", "--out", "/tmp/never-written-pool"])
    assert r.exit_code == 2 and "add --shards" in r.output
    assert not Path("/tmp/never-written-pool").exists()
