"""Run config, presets, LR schedule, FLOP accounting and checkpoint schedule, against hand counts."""

from __future__ import annotations

import math

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM

from inductionlab.errors import InductionLabError
from inductionlab.train import TrainConfig, budget, check_iso_flops, config_from_dict, load_config, lr_factor
from inductionlab.train.checkpoint import checkpoint_schedule
from inductionlab.train.config import model_config
from inductionlab.train.flops import flops_per_token, param_counts
from inductionlab.train.schedule import build_scheduler


def test_schedule_matches_formula_at_chosen_steps():
    # S = 100, warm-up ceil(0.03 * 100) = 3 steps, cosine from step 3 to step 99 (96 intervals), floor 0.1.
    f = lambda s: lr_factor(s, 100, 0.03, 0.1)  # noqa: E731
    assert f(0) == pytest.approx(1 / 3) and f(1) == pytest.approx(2 / 3) and f(2) == pytest.approx(1.0)
    assert f(3) == pytest.approx(1.0)
    assert f(51) == pytest.approx(0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * 0.5)))   # halfway: 0.55
    assert f(27) == pytest.approx(0.1 + 0.45 * (1 + math.cos(math.pi * 24 / 96)))
    assert f(99) == pytest.approx(0.1)                                                # final LR = 10% of peak
    # the torch scheduler applies the same numbers to the optimizer
    p = torch.nn.Parameter(torch.zeros(1))
    opt = torch.optim.AdamW([p], lr=1e-3)
    sch = build_scheduler(opt, 100, 0.03, 0.1)
    seen = []
    for _ in range(100):
        seen.append(opt.param_groups[0]["lr"])
        opt.step()
        sch.step()
    assert seen[0] == pytest.approx(1e-3 / 3) and seen[51] == pytest.approx(0.55e-3) and seen[99] == pytest.approx(1e-4)


def test_flops_match_hand_count():
    c = LlamaConfig(vocab_size=10, hidden_size=8, intermediate_size=16, num_hidden_layers=2, num_attention_heads=2,
                    num_key_value_heads=1, head_dim=4, tie_word_embeddings=False)
    # per layer: q 8*8 + k 8*4 + v 8*4 + o 8*8 = 192; MLP 3*8*16 = 384; two norms 16 -> 592
    pc = param_counts(c)
    assert pc["total"] == 80 + 80 + 2 * 592 + 8 == 1352
    assert pc["non_embedding"] == 2 * 592 + 8
    assert pc["matmul"] == 2 * (192 + 384) + 80
    assert pc["total"] == sum(p.numel() for p in LlamaForCausalLM(c).parameters())
    dense, attn = flops_per_token(c, seq_len=16)
    assert dense == 6 * 1232 and attn == 12 * 2 * 2 * 4 * 16
    b = budget(c, seq_len=16, tokens_per_update=32, steps=3)
    assert b.tokens == 96 and b.global_batch == 2
    assert b.flops == (6 * 1232 + 3072) * 96 == 1_004_544


@pytest.mark.parametrize("preset,layers,hidden,mlp,heads,kv", [("0.13b", 12, 768, 3072, 12, 3),
                                                              ("1b", 30, 1536, 6144, 24, 6)])
def test_paper_presets(preset, layers, hidden, mlp, heads, kv):
    c = model_config(preset, 49152)
    assert (c.num_hidden_layers, c.hidden_size, c.intermediate_size, c.num_attention_heads,
            c.num_key_value_heads) == (layers, hidden, mlp, heads, kv)
    assert c.rope_parameters["rope_theta"] == 10000.0 and not c.tie_word_embeddings and c.hidden_act == "silu"
    with torch.device("meta"):
        n = sum(p.numel() for p in LlamaForCausalLM(c).parameters())
    assert param_counts(c)["total"] == n


def test_checkpoint_schedule():
    # geomspace(1, 100, 5) = 1, 3.16, 10, 31.6, 100
    assert checkpoint_schedule(100, 5) == [0, 1, 3, 10, 32, 100]
    assert checkpoint_schedule(100, 5, dense_start=40, dense_end=60, dense_every=10) == [0, 1, 3, 10, 32, 40, 50, 60, 100]
    assert checkpoint_schedule(1, 12) == [0, 1]


def test_config_files_and_typos(tmp_path):
    (tmp_path / "a.yaml").write_text("preset: cpu-tiny\nschedule:\n  lr: 3e-4\n  warmup_frac: 0.05\ntokens: 1e6\n")
    cfg = load_config(tmp_path / "a.yaml")
    assert (cfg.preset, cfg.lr, cfg.warmup_frac, cfg.tokens, cfg.beta2) == ("cpu-tiny", 3e-4, 0.05, 1_000_000, 0.999)
    (tmp_path / "b.toml").write_text('preset = "cpu-small"\nseq_len = 128\n[curriculum_opts]\ncurriculum = "anti"\n')
    cfg = load_config(tmp_path / "b.toml")
    assert (cfg.preset, cfg.seq_len, cfg.curriculum.variant) == ("cpu-small", 128, "anti")
    (tmp_path / "c.yaml").write_text("warmup_fracc: 0.1\n")
    with pytest.raises(InductionLabError, match="unknown config key 'warmup_fracc'; did you mean 'warmup_frac'"):
        load_config(tmp_path / "c.yaml")
    with pytest.raises(InductionLabError, match="config key .seq_len. .long. is not a valid integer"):
        config_from_dict({"seq_len": "long"})


def test_bad_budgets_and_values():
    base = dict(data="d", out="o", preset="cpu-tiny", seq_len=64, tokens_per_update=1024, micro_batch_size=8,
                telemetry_seq_len=12)
    with pytest.raises(InductionLabError, match="smaller than one update"):
        TrainConfig(**base, tokens=1000).validate()
    with pytest.raises(InductionLabError, match="does not split"):
        TrainConfig(**{**base, "micro_batch_size": 3}, tokens=4096).validate()
    with pytest.raises(InductionLabError, match="multiple of"):
        TrainConfig(**{**base, "tokens_per_update": 1000}, tokens=4096).validate()
    with pytest.raises(InductionLabError, match="unknown model preset"):
        TrainConfig(**{**base, "preset": "7b"}, tokens=4096).validate()
    TrainConfig(**base, tokens=4096).validate(world_size=2)     # 16 sequences = 2 ranks x 1 x 8


def test_iso_flops_check_refuses_different_budgets():
    c = model_config("cpu-tiny", 300, max_position_embeddings=64)
    a = budget(c, seq_len=64, tokens_per_update=1024, steps=10).to_dict()
    check_iso_flops({"base": a, "bi": dict(a)})
    b = budget(c, seq_len=64, tokens_per_update=1024, steps=11).to_dict()
    with pytest.raises(InductionLabError, match="not matched-compute: steps is 10 vs 11"):
        check_iso_flops({"base": a, "bi": b})


def test_curriculum_is_nested(tmp_path):
    from inductionlab.data.curriculum import CurriculumConfig
    (tmp_path / "n.yaml").write_text("curriculum:\n  variant: balanced\n  span_length: 8\n  span_length_range: [4, 12]\n"
                                     "  m0: 0.25\n")
    c = load_config(tmp_path / "n.yaml").curriculum
    assert c == CurriculumConfig(variant="balanced", span_length=8, span_length_range=(4, 12), m0=0.25)
    assert config_from_dict({"curriculum": "anti"}).curriculum.variant == "anti"          # shorthand
    assert config_from_dict({"curriculum.m0": "0.1"}).curriculum.m0 == 0.1                 # dotted key
    assert TrainConfig(curriculum="induction").curriculum == CurriculumConfig(variant="induction")
    # a key of a sub-config given at the top is refused with its dotted name
    for key, new in (("span_length", "curriculum.span_length"), ("m0", "curriculum.m0"),
                     ("anneal_tokens", "curriculum.anneal_tokens")):
        with pytest.raises(InductionLabError, match=f"unknown config key '{key}'; did you mean '{new}'"):
            config_from_dict({key: 1})
    with pytest.raises(InductionLabError, match="unknown config key 'curriculum.spanlength'; did you mean "
                                                "'curriculum.span_length'"):
        config_from_dict({"curriculum": {"spanlength": 3}})
    with pytest.raises(InductionLabError, match="'curriculum.span_length_range' .a,b. is not LO,HI"):
        config_from_dict({"curriculum": {"span_length_range": "a,b"}})


def test_help_from_field_metadata_and_same_curriculum_flags():
    import dataclasses

    from inductionlab.cli.data import curriculum_preview
    from inductionlab.cli.train import train_cmd
    from inductionlab.data.curriculum import CurriculumConfig
    for cls in (TrainConfig, CurriculumConfig):
        for f in dataclasses.fields(cls):
            assert f.metadata.get("help"), f"{cls.__name__}.{f.name} has no help"
    flags = {c.name: {p.name: tuple(p.opts) for p in c.params} for c in (train_cmd, curriculum_preview)}
    cur = {k: v for k, v in flags["train"].items() if k.startswith("c__curriculum__")}
    assert len(cur) == 7 and cur == {k.replace("c__", "c__curriculum__"): v for k, v in flags["preview"].items()
                                     if k.startswith("c__")}
    assert cur["c__curriculum__variant"] == ("--curriculum", "--variant")
    helps = {p.name: p.help for p in train_cmd.params}
    assert helps["c__lr"].startswith("Peak learning rate") and helps["c__curriculum__m0"].startswith(
        "Initial synthetic-token")
