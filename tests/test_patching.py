"""Position-restricted interventions and activation patching (SPEC §10): a head's output set at chosen
positions and rows to a given vector, its output in a source run, its mean over a token class, or its
output on random tokens; exact identities on tiny models (GQA Llama: 8 query heads, 2 KV heads)."""

from __future__ import annotations

import pytest
import torch

from conftest import make_tiny
from inductionlab.core.instrument import (HeadIntervention, StaleKVCache, ablate, head_output_means, head_outputs,
                                          instrument, source_values)
from inductionlab.errors import InductionLabError


@pytest.fixture(scope="module")
def model():
    return make_tiny("llama")


def _ids(seed: int, T: int = 12, B: int = 2) -> torch.Tensor:
    return torch.randint(5, 700, (B, T), generator=torch.Generator().manual_seed(seed))


def _logits(model, ids, **kw):
    with torch.inference_mode():
        return model(input_ids=ids, **kw).logits


@pytest.mark.parametrize("positions", ["all", "last", [3, 7], [-2]])
def test_patching_a_head_with_its_own_output_is_bit_identical(model, positions):
    ids = _ids(0)
    plain = _logits(model, ids)
    with ablate(model, [(1, 3), (0, 5)], "patch", source_ids=ids, positions=positions, strict=False) as inst:
        patched = _logits(model, ids)
    assert torch.equal(plain, patched) and not any(inst.effect.values())     # and strict would call it a no-op


def test_a_last_position_patch_leaves_every_earlier_position_bit_identical(model):
    ids, source = _ids(0), _ids(1)
    plain = _logits(model, ids)
    with ablate(model, [(0, 2)], "patch", source_ids=source, positions="last"):
        patched = _logits(model, ids)
    assert torch.equal(plain[:, :-1], patched[:, :-1])
    assert not torch.equal(plain[:, -1], patched[:, -1])


def test_only_the_named_query_head_changes_under_gqa(model):
    ids, source = _ids(0), _ids(1)
    heads = [(1, h) for h in range(8)]               # layer 1: query heads 0-3 share KV head 0, 4-7 KV head 1
    with torch.inference_mode():
        before = head_outputs(model, ids, heads)
        with instrument(model, [HeadIntervention(1, 2, "patch", value=head_outputs(model, source, [(1, 2)])[(1, 2)],
                                                 positions="all")], capture_heads=heads) as inst:
            model(input_ids=ids)
    after = inst.captured
    assert torch.equal(after[(1, 2)], head_outputs(model, source, [(1, 2)])[(1, 2)])
    assert all(torch.equal(after[h], before[h]) for h in heads if h != (1, 2))   # its KV-group peers too


def test_a_given_vector_at_named_positions_and_rows(model):
    ids = _ids(0, B=3)
    v = torch.full((64 // 8,), 0.5)
    with torch.inference_mode(), instrument(model, [HeadIntervention(0, 1, "mean", value=v, positions=[4, 9],
                                                                     rows=(1,))], capture_heads=[(0, 1)]) as inst:
        model(input_ids=ids)
    out, plain = inst.captured[(0, 1)], head_outputs(model, ids, [(0, 1)])[(0, 1)]
    edited = torch.zeros(3, 12, dtype=torch.bool)
    edited[1, [4, 9]] = True
    assert torch.equal(out[edited], v.expand(2, -1)) and torch.equal(out[~edited], plain[~edited])


def test_the_mean_over_a_token_class(model):
    ids = _ids(3, B=4)
    means = head_output_means(model, ids, positions="last")              # [L, H, D]: mean at each prompt's last
    outs = head_outputs(model, ids, [(1, 6)])[(1, 6)]
    assert torch.allclose(means[1, 6], outs[:, -1].float().mean(0), atol=1e-6)
    with pytest.raises(InductionLabError, match="positions 'first'"):
        head_output_means(model, ids, positions="first")


def test_resample_writes_the_heads_output_on_random_tokens(model):
    ids, rand = _ids(0), _ids(9)
    with torch.inference_mode(), ablate(model, [(1, 0)], "resample", source_ids=rand):
        a = model(input_ids=ids).logits
    with torch.inference_mode(), ablate(model, [(1, 0)], "patch", source_ids=rand):
        b = model(input_ids=ids).logits
    assert torch.equal(a, b) and not torch.equal(a, _logits(model, ids))
    with pytest.raises(InductionLabError, match="needs a source run"):
        with ablate(model, [(1, 0)], "resample"):
            pass


def test_source_values_name_the_same_positions_in_a_longer_source(model):
    """A source of another length: ``"last"`` and ``-2`` name the same relative positions in both runs."""
    outs = head_outputs(model, _ids(1, T=15), [(0, 0)])[(0, 0)]
    assert torch.equal(source_values(outs, "last")[:, 0], outs[:, -1])
    assert torch.equal(source_values(outs, [-2])[:, 0], outs[:, -2])
    ids = _ids(0)
    with ablate(model, [(0, 0)], "patch", source_ids=_ids(1, T=15), positions=[-2]):
        patched = _logits(model, ids)
    plain = _logits(model, ids)
    assert torch.equal(plain[:, :-2], patched[:, :-2]) and not torch.equal(plain[:, -2], patched[:, -2])


def test_cached_generation_equals_recomputation_without_a_cache(model):
    """Yin & Steinhardt's accuracy ablation: the head's output at the last position of each forward call.
    Under KV-cached greedy decoding that is the prompt's last token and every generated one; recomputed
    without a cache, the same positions named explicitly give the same tokens and logits."""
    prompt = _ids(0, T=10, B=1)
    v = head_output_means(model, _ids(5, B=4), positions="last")[1, 4]
    with torch.inference_mode(), instrument(model, [HeadIntervention(1, 4, "mean", value=v, positions="last")]):
        out = model(input_ids=prompt, use_cache=True)
        cache, seq, cached_logits = out.past_key_values, prompt, [out.logits[:, -1]]
        for _ in range(4):
            nxt = cached_logits[-1].argmax(-1, keepdim=True)
            seq = torch.cat([seq, nxt], 1)
            out = model(input_ids=nxt, past_key_values=cache, use_cache=True)
            cache = out.past_key_values
            cached_logits.append(out.logits[:, -1])
    T0 = prompt.shape[1]
    patched_at = list(range(T0 - 1, seq.shape[1]))
    with torch.inference_mode(), instrument(model, [HeadIntervention(1, 4, "mean", value=v, positions=patched_at)]):
        full = model(input_ids=seq).logits
    assert torch.allclose(torch.stack(cached_logits, 1)[0], full[0, T0 - 1:], atol=1e-5)


def test_a_plain_prefix_cache_serves_a_patch_past_it_and_nothing_else(model):
    """Activation patching at the last position from the corrupted run's cache (the fast path of the FV
    score): a cache computed without interventions is valid for edits at positions it does not hold."""
    ids = _ids(0, B=1)
    T = ids.shape[1]
    v = head_output_means(model, _ids(5, B=4), positions="last")[0, 3]
    with torch.inference_mode():
        prefix = model(input_ids=ids[:, :-1], use_cache=True).past_key_values
        with instrument(model, [HeadIntervention(0, 3, "mean", value=v, positions=[T - 1])]):
            fast = model(input_ids=ids[:, -1:], past_key_values=prefix).logits[:, -1]
            slow = model(input_ids=ids).logits[:, -1]
        assert torch.allclose(fast, slow, atol=1e-5)
        prefix = model(input_ids=ids[:, :-1], use_cache=True).past_key_values
        with pytest.raises(StaleKVCache), instrument(model, [HeadIntervention(0, 3, "mean", value=v,
                                                                                positions="last")]):
            model(input_ids=ids[:, -1:], past_key_values=prefix)


def test_bad_positions_and_rows_are_one_line(model):
    v = torch.zeros(8)
    for kw, msg in ((dict(positions="first"), "positions 'first'"), (dict(positions=[]), "positions is empty"),
                    (dict(rows=(-1,)), "rows"), (dict(positions=["a"]), "positions must be")):
        with pytest.raises(InductionLabError, match=msg):
            with instrument(model, [HeadIntervention(0, 0, "mean", value=v, **kw)]):
                pass
    with pytest.raises(InductionLabError, match="positions apply to output edits"):
        with instrument(model, [HeadIntervention(0, 0, "sink", positions="last")]):
            pass
    with pytest.raises(InductionLabError, match="outside the batch"):
        with instrument(model, [HeadIntervention(0, 0, "mean", value=v, rows=(5,))]):
            model(input_ids=_ids(0))


# ---- through the protocol runner: every protocol takes the positions and resample ---------------------

def _runner(model, method, positions="all", reuse=False, batch_size=2, trials=None):
    from types import SimpleNamespace

    from conftest import VOCAB
    from inductionlab.core.ablation import Condition
    from inductionlab.protocols.runner import Trials, run_conditions

    class Tok:                                      # ordinary ids: every id but 0..4
        all_special_ids = [0, 1, 2, 3, 4]

        def convert_ids_to_tokens(self, ids):
            return [f"t{i}" for i in ids]

    loaded = SimpleNamespace(model=model, tokenizer=Tok(), identity={})
    ids = torch.randint(5, VOCAB, (5, 12), generator=torch.Generator().manual_seed(4))
    conds = [Condition("intact", "intact"), Condition("L1", "induction", 2, heads=[(1, 0), (1, 5)])]

    def all_logits(m, batch):
        return {"logits": m(input_ids=batch["ids"]).logits}
    return run_conditions(loaded, conds, trials or Trials({"ids": ids}), method=method, batch_size=batch_size,
                          measure_batch=all_logits, positions=positions, reuse=reuse)


def test_the_runner_resamples_per_batch_the_same_for_every_condition_and_batching(model):
    a = _runner(model, "resample")
    b = _runner(model, "resample", reuse=True)
    assert not (a["L1"]["logits"] == a["intact"]["logits"]).all()
    assert (a["L1"]["logits"] == b["L1"]["logits"]).all()                  # residual reuse: bit-identical
    again = _runner(model, "resample")
    assert (again["L1"]["logits"] == a["L1"]["logits"]).all()              # seeded: the same random sources


def test_the_source_runs_kept_on_the_trials_serve_later_conditions_unchanged(model, monkeypatch):
    """A study runs one condition per call on the same trials: the first call keeps every head's outputs in each
    batch's source run, the next reuses them (no source forward) and gets what a fresh run gets."""
    from inductionlab.protocols import runner
    from inductionlab.protocols.runner import Trials
    ids = torch.randint(5, 800, (5, 12), generator=torch.Generator().manual_seed(4))
    trials = Trials({"ids": ids})
    first = _runner(model, "resample", trials=trials)
    assert len(trials.source_outputs) == 3                                   # 3 batches of 2, 2, 1
    source, calls = runner._source, []
    monkeypatch.setattr(runner, "_source", lambda *a, **k: calls.append(1) or source(*a, **k))
    again = _runner(model, "resample", trials=trials)
    assert not calls and (again["L1"]["logits"] == first["L1"]["logits"]).all()
    monkeypatch.setattr(runner, "SOURCE_CACHE_BYTES", 0)                      # over the bound: nothing kept
    fresh = Trials({"ids": ids})
    assert (_runner(model, "resample", trials=fresh)["L1"]["logits"] == first["L1"]["logits"]).all()
    assert calls and not fresh.source_outputs


def test_the_runner_ablates_only_the_last_position(model):
    out = _runner(model, "zero", positions="last")
    plain, abl = out["intact"]["logits"], out["L1"]["logits"]
    assert (plain[:, :-1] == abl[:, :-1]).all() and not (plain[:, -1] == abl[:, -1]).all()


def test_patch_needs_a_protocol_with_a_source_run(model):
    with pytest.raises(InductionLabError, match="needs trials with a source run"):
        _runner(model, "patch")
