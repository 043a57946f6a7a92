"""Residual reuse across conditions (inductionlab.core.reuse): the run with reuse equals the run without,
bit for bit, on every tested architecture and ablation method, and the layers it says it skipped
were really skipped."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest
import torch

from conftest import ARCHS, tiny_config
from inductionlab.core.ablation import Condition
from inductionlab.protocols.runner import Trials, forward_logits, pad_left, residual_cache, run_conditions
from inductionlab.core.reuse import ResidualCache, decoder_layers


def tiny3(arch: str, attn: str = "sdpa"):
    """A tiny random model of ``arch`` with 3 layers (so levels 1 and 2 both exist)."""
    from transformers import AutoModelForCausalLM
    cfg = tiny_config(arch, attn)
    cfg.num_hidden_layers = 3
    if getattr(cfg, "layer_types", None):                       # gemma3: sliding, full, sliding
        cfg.layer_types = [cfg.layer_types[i % len(cfg.layer_types)] for i in range(3)]
    torch.manual_seed(0)
    return AutoModelForCausalLM.from_config(cfg, attn_implementation=attn).eval()


def trials(n: int = 7, T: int = 14) -> Trials:
    g = torch.Generator().manual_seed(1)
    return Trials({"ids": torch.randint(10, 700, (n, T), generator=g)})


def logits3(model, batch):
    """Float32 logits of the last 3 positions: every bit of the last hidden states shows."""
    return {"logits": forward_logits(model, batch["ids"], 3)}


def padded_and_decoded(model, batch):
    """A left-padded forward (mask and positions) and a cached decode step (never reused)."""
    seqs = [row[: len(row) - i % 3].tolist() for i, row in enumerate(batch["ids"])]
    b = pad_left(seqs, pad_id=0)
    padded = model(**b, logits_to_keep=1).logits[:, -1].float()
    out = model(input_ids=batch["ids"][:, :-1], use_cache=True)
    step = model(input_ids=batch["ids"][:, -1:], past_key_values=out.past_key_values, use_cache=True)
    return {"padded": padded, "step": step.logits[:, -1].float()}


CONDITIONS = [Condition("intact", "intact"),
              Condition("L2", "induction", 2, 0, [(2, 0), (2, 1)]),     # first at level 2: records levels 1, 2
              Condition("L1", "random", 2, 0, [(1, 1), (2, 0)]),        # skips layer 0
              Condition("L0", "random", 2, 1, [(0, 1), (2, 1)])]        # skips nothing
L2B = Condition("L2b", "random", 1, 2, [(2, 3)])


@pytest.mark.parametrize("method", ["zero", "mean", "sink"])
@pytest.mark.parametrize("arch", ARCHS)
def test_reuse_is_bit_identical(arch, method):
    model = tiny3(arch)
    loaded = SimpleNamespace(model=model, identity={})
    tr = trials()
    plain = run_conditions(loaded, CONDITIONS, tr, method=method, batch_size=3, measure_batch=logits3, reuse=False)
    cache = residual_cache(model, CONDITIONS)
    assert cache is not None and cache.levels == [1, 2]
    reused = run_conditions(loaded, CONDITIONS, tr, method=method, batch_size=3, measure_batch=logits3, reuse=cache)
    for c in CONDITIONS:
        assert np.array_equal(plain[c.name]["logits"], reused[c.name]["logits"]), c.name
    assert not np.array_equal(plain["L2"]["logits"], plain["intact"]["logits"])   # the ablation reached the model
    assert cache.skipped == 3 * 1                # 3 batches: L1 skips layer 0 (recorded by L2); the rest none
    # one condition per call (as a study runs them) with the cache shared: the same numbers again
    one = {c.name: run_conditions(loaded, [c], tr, method=method, batch_size=3, measure_batch=logits3,
                                  reuse=cache)[c.name] for c in CONDITIONS[1:]}
    for name, arrays in one.items():
        assert np.array_equal(plain[name]["logits"], arrays["logits"]), name
    assert cache.skipped == 3 * 1 + 3 * (2 + 1)  # now L2 skips 2 layers too


@pytest.mark.parametrize("arch", ["llama", "gpt2"])
def test_padded_and_cached_calls_are_served_correctly(arch):
    model = tiny3(arch)
    loaded = SimpleNamespace(model=model, identity={})
    plain = run_conditions(loaded, CONDITIONS, trials(), batch_size=4, measure_batch=padded_and_decoded, reuse=False)
    cache = residual_cache(model, CONDITIONS)
    reused = run_conditions(loaded, CONDITIONS, trials(), batch_size=4, measure_batch=padded_and_decoded, reuse=cache)
    for c in CONDITIONS:
        for key in ("padded", "step"):
            assert np.array_equal(plain[c.name][key], reused[c.name][key]), (c.name, key)
    assert cache.skipped == 2 * 1                # L1's padded call (2 batches); decoding is never served


def test_the_first_layers_really_are_skipped():
    model = tiny3("llama")
    calls = []
    model.model.layers[0].mlp.register_forward_pre_hook(lambda m, a: calls.append(0))   # inside the layer
    loaded = SimpleNamespace(model=model, identity={})
    run_conditions(loaded, CONDITIONS[:2] + [L2B], trials(4), batch_size=4, measure_batch=logits3)
    assert calls == [0, 0]                       # intact and L2 ran layer 0; L2b was fed L2's recorded state


def test_unsupported_architecture_runs_in_full():
    from transformers import MistralConfig, MistralForCausalLM
    torch.manual_seed(0)
    model = MistralForCausalLM(MistralConfig(vocab_size=800, hidden_size=64, intermediate_size=128, num_hidden_layers=3,
                                             num_attention_heads=4, num_key_value_heads=2)).eval()
    assert decoder_layers(model) is None and residual_cache(model, CONDITIONS) is None
    with pytest.raises(ValueError, match="residual reuse supports"):
        ResidualCache(model, [1])
    loaded = SimpleNamespace(model=model, identity={})
    a = run_conditions(loaded, CONDITIONS, trials(), batch_size=4, measure_batch=logits3)
    b = run_conditions(loaded, CONDITIONS, trials(), batch_size=4, measure_batch=logits3, reuse=False)
    assert all(np.array_equal(a[c.name]["logits"], b[c.name]["logits"]) for c in CONDITIONS)


def test_budget_and_other_trials():
    model = tiny3("qwen2")
    loaded = SimpleNamespace(model=model, identity={})
    cache = residual_cache(model, CONDITIONS, max_bytes=1)      # room for one state, then none
    run_conditions(loaded, CONDITIONS[:2], trials(), batch_size=4, measure_batch=logits3, reuse=cache)
    assert len(cache.states) == 1 and cache.skipped == 0          # the one state (level 1) serves no L2 call
    other = trials(4, 14)
    other.tensors["ids"][0, 3] += 1                             # a different batch never matches a recorded one
    cache = residual_cache(model, CONDITIONS)
    run_conditions(loaded, CONDITIONS[1:2], trials(4), batch_size=4, measure_batch=logits3, reuse=cache)
    plain = run_conditions(loaded, [L2B], other, batch_size=4, measure_batch=logits3, reuse=False)
    again = run_conditions(loaded, [L2B], other, batch_size=4, measure_batch=logits3, reuse=cache)
    assert cache.skipped == 0 and np.array_equal(plain["L2b"]["logits"], again["L2b"]["logits"])
    run_conditions(loaded, [L2B], trials(4), batch_size=4, measure_batch=logits3, reuse=cache)
    assert cache.skipped == 2                                    # the recorded batch itself is served


def test_instrumentation_that_reads_every_layer_is_never_served():
    from inductionlab.core.instrument import HeadIntervention, ablate, instrument
    model = tiny3("gpt_neox")
    ids = trials(2).tensors["ids"]
    cache = residual_cache(model, CONDITIONS[1:2])
    with torch.inference_mode():
        with ablate(model, [(2, 0)]), cache.use(2):
            model(input_ids=ids)                                 # records the state entering layer 2
        prev = torch.arange(-1, ids.shape[1] - 1)                # each query's previous token
        with instrument(model, [HeadIntervention(2, 0, "zero")], reductions={"prev": prev}) as inst, cache.use(2):
            model(input_ids=ids)
    assert len(cache.states) == 1 and cache.skipped == 0
    assert (inst.reduced["prev"][:2, ..., 1:] > 0).all()          # layers 0 and 1 ran and were read
