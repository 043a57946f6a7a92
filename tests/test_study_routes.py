"""``inductionlab study routes`` (SPEC §10, issue 26) and its word-list copy probe: the prompt layout and target
positions on word-level tokenizers, the probe's value on a model whose logits are written out (an idealised copier),
verbatim and paraphrase counting, a tiny end-to-end run with a crafted scores file, and the refusals."""

from __future__ import annotations

import json
import math

import numpy as np
import pandas as pd
import pytest
import torch
from click.testing import CliRunner

from conftest import VOCAB, make_tiny
from inductionlab.cli import main
from inductionlab.core.ablation import Condition
from inductionlab.errors import InductionLabError
from inductionlab.protocols import word_copy
from inductionlab.protocols.configs import LagProbeConfig, SerialRecallConfig, WordCopyConfig
from inductionlab.protocols.word_copy import Template, copy_prompt, make_template
from inductionlab.studies.configs import HeadScoreConfig
from inductionlab.protocols.configs import TokenLossConfig
from inductionlab.studies.routes.config import RoutesConfig, RoutesSelectionConfig
from inductionlab.studies.spec import RunOptions

SUFFIXES = ["##s", "##ing", "##ed", "##er", "##ly", "##es", "##ion", "##al", "##ness", "##ment", "##ful", "##less",
            "##ity", "##ive", "##ous", "##able", "##ize", "##est", "##ers", "##ings"]


@pytest.fixture(scope="module")
def piece_tokenizer():
    """A WordPiece tokenizer over common words and 20 suffixes: "workers" is ``work ##ers`` (2 tokens), numbers
    0-10 and "." are tokens, so ``"10."`` is ``10 .``; ids below the tiny models' vocabulary."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast
    from wordfreq import top_n_list

    specials = ["<unk>", "<bos>", "<eos>", "[PAD]", ".", "10"] + [str(i) for i in range(10)]
    words = [w for w in top_n_list("en", 3000) if w.isascii() and w.isalpha() and len(w) >= 2]
    vocab = specials + SUFFIXES
    vocab += words[:VOCAB - len(vocab)]
    tok = Tokenizer(models.WordPiece({t: i for i, t in enumerate(vocab)}, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Sequence([pre_tokenizers.WhitespaceSplit(), pre_tokenizers.Punctuation()])
    tok.decoder = decoders.WordPiece()
    return PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<bos>", eos_token="<eos>", unk_token="<unk>",
                                   pad_token="[PAD]")


# ---- the prompt layout -------------------------------------------------------------------------------------

def test_the_copy_prompt_is_the_list_then_the_list_again_up_to_the_last_number(word_tokenizer):
    ids = lambda *ws: [word_tokenizer.convert_tokens_to_ids(w) for w in ws]   # noqa: E731
    t = make_template(word_tokenizer, 3)
    unk, dot = word_tokenizer.unk_token_id, word_tokenizer.convert_tokens_to_ids(".")
    assert t.markers == [[unk, dot]] * 3 and t.newline == [] and t.bos == [word_tokenizer.bos_token_id]
    a, b, c = ids("the", "cat"), ids("of",), ids("and", "to", "in")       # items of 2, 1 and 3 tokens
    m1, m2, m3, nl = ids("one"), ids("two"), ids("three"), ids("new")    # distinct markers, a visible newline
    prompt = copy_prompt([a, b, c], Template([m1, m2, m3], nl, [1]))
    expected = ([1] + m1 + a + nl + m2 + b + nl + m3 + c + nl        # the list once
                + nl                                               # a blank line
                + m1 + a + nl + m2 + b + nl + m3)                  # again, up to the last item's number
    assert prompt == expected
    # the scored next token is the last item's first: it sat right after the third marker of the first copy
    first_copy_c = 1 + len(m1 + a + nl + m2 + b + nl + m3)
    assert prompt[first_copy_c] == c[0] and prompt[first_copy_c - 1] == m3[0] and prompt[-1] == m3[0]


def test_trials_hold_the_three_kinds_with_the_same_lengths_and_their_targets(piece_tokenizer):
    from inductionlab.core.models import LoadedModel

    cfg = WordCopyConfig(n_lists=3, n_items=4, lengths=(2, 3), word_pool=10_000, seed=5)
    lm = LoadedModel(None, piece_tokenizer, {"vocab_size": VOCAB})
    tr = word_copy.build_trials(lm, cfg)
    t = tr.tensors
    assert t["kind"].tolist() == [0, 0, 0, 1, 1, 1, 2, 2, 2] and t["list_index"].tolist() == [0, 1, 2] * 3
    lists = word_copy.build_lists(piece_tokenizer, cfg, make_template(piece_tokenizer, 4), VOCAB)
    dot, ten = piece_tokenizer.convert_tokens_to_ids("."), piece_tokenizer.convert_tokens_to_ids("4")
    words = {ids for v in word_copy.word_pool(piece_tokenizer, (2, 3), cfg.word_pool).values() for ids, _ in v}
    for i in range(9):
        kind, lst = word_copy.KINDS[i // 3], i % 3
        items = lists.items[kind][lst]
        real = t["ids"][i][t["attention_mask"][i] == 1].tolist()
        assert real == copy_prompt(items, make_template(piece_tokenizer, 4))
        assert real[-2:] == [ten, dot]                                   # ends on "4."
        n = int(t["target_len"][i])
        assert t["target"][i, :n].tolist() == list(items[-1])            # the target is the last item
        assert [len(x) for x in items] == [len(x) for x in lists.items["word"][lst]]   # same lengths in every kind
        assert all(len(x) in (2, 3) for x in items)
        assert all((x in words) == (kind == "word") for x in items)      # nonsense items are no pool word
    assert all(piece_tokenizer.decode(list(x)).isalpha() for x in lists.items["nonsense"][0])   # word-like pieces


# ---- the probe's value on a model whose logits are written out ---------------------------------------------

class InductionCopier(torch.nn.Module):
    """Logits 0 everywhere but ``BOOST`` on the token that followed the earlier position whose preceding tokens
    match the end of the sequence longest (ties: the latest; left padding skipped through the attention mask): an
    idealised induction copier, which through the unique marker "10 ." copies the 10th item exactly."""
    BOOST = 5.0

    def __init__(self, vocab: int):
        super().__init__()
        self.vocab = vocab

    def forward(self, input_ids, attention_mask=None, position_ids=None, logits_to_keep=0, **kw):
        B, T = input_ids.shape
        out = torch.zeros(B, T, self.vocab)
        for b in range(B):
            real = input_ids[b][attention_mask[b] == 1].tolist() if attention_mask is not None else input_ids[b].tolist()
            best, at = 0, None
            for j in range(len(real) - 1):            # match of real[..j] against real[..-1]
                n = 0
                while n <= j and real[j - n] == real[len(real) - 1 - n]:
                    n += 1
                if n and n >= best:
                    best, at = n, j
            if at is not None:
                out[b, -1, real[at + 1]] = self.BOOST
        keep = logits_to_keep if isinstance(logits_to_keep, int) and logits_to_keep > 0 else T
        return type("Out", (), {"logits": out[:, -keep:]})()


def test_a_perfect_copier_scores_exp5_over_the_partition_and_copies_every_item_verbatim(piece_tokenizer):
    from inductionlab.core.models import LoadedModel

    cfg = WordCopyConfig(n_lists=2, n_items=10, lengths=(2, 3), word_pool=10_000, batch_size=4)
    lm = LoadedModel(InductionCopier(VOCAB), piece_tokenizer, {"vocab_size": VOCAB})
    arrays = word_copy.probe(cfg).run(lm, [Condition("intact", "intact")])["intact"]
    p = math.exp(5) / (math.exp(5) + VOCAB - 1)                          # one boosted logit among VOCAB
    np.testing.assert_allclose(arrays["p_first"], p, rtol=1e-6)
    assert arrays["top1"].all()
    per = word_copy.kind_measures(arrays, piece_tokenizer)
    for kind in word_copy.KINDS:
        assert per[kind]["verbatim"].tolist() == [1.0, 1.0] and per[kind]["paraphrase"].tolist() == [0.0, 0.0]


def test_paraphrase_is_a_different_real_word_and_a_truncated_copy_is_not(piece_tokenizer):
    enc = lambda s: piece_tokenizer.encode(s, add_special_tokens=False)   # noqa: E731
    item = enc(" workers")
    assert len(item) == 2
    gens = [item + enc(" the"), enc(" people and"), enc(" work the"), enc(". of the"), enc(" workers people")[:1] + enc(" of")]
    width = max(len(g) for g in gens)
    gen = np.array([g + [0] * (width - len(g)) for g in gens])
    out = word_copy.copy_outcomes(piece_tokenizer, gen, np.array([item] * 5), np.array([2] * 5))
    assert out["verbatim"].tolist() == [True, False, False, False, False]
    # " people": a real word, not the item -> paraphrase; " work": a prefix of "workers" (a truncated copy);
    # ". of": no word first; " work of": a prefix again
    assert out["paraphrase"].tolist() == [False, True, False, False, False]


# ---- greedy continuations with a KV cache ---------------------------------------------------------------

@pytest.mark.parametrize("arch", ["llama", "gemma3", "gpt2"])
@pytest.mark.parametrize("heads", [None, [(0, 1), (1, 3)]])
def test_cached_greedy_tokens_equal_full_forwards_on_left_padded_prompts_under_ablation(arch, heads):
    """The KV-cached greedy decode gives the tokens (and first logits) of one full forward per token — on
    left-padded rows of different lengths, on a sliding-window model, intact and with two heads zero-ablated."""
    import contextlib

    from inductionlab.core.instrument import ablate
    from inductionlab.protocols.runner import greedy_tokens, pad_left

    model = make_tiny(arch, ctx=128, seed=3)
    g = torch.Generator().manual_seed(0)
    seqs = [torch.randint(5, VOCAB, (n,), generator=g).tolist() for n in (9, 14, 6)]
    p = pad_left(seqs, 0)
    ids, mask, pos = p["input_ids"], p["attention_mask"], p["position_ids"]
    n = 6
    ctx = (lambda: ablate(model, heads)) if heads else contextlib.nullcontext
    with torch.inference_mode():
        with ctx():
            first, toks = greedy_tokens(model, ids, n, attention_mask=mask, position_ids=pos)
        with ctx():                                          # the oracle: a full forward per token
            x, m, q, want, logits0 = ids, mask, pos, [], None
            for _ in range(n):
                logits = model(input_ids=x, attention_mask=m, position_ids=q).logits[:, -1].float()
                logits0 = logits if logits0 is None else logits0
                want.append(logits.argmax(-1))
                x = torch.cat([x, want[-1][:, None]], 1)
                m = torch.cat([m, torch.ones_like(m[:, :1])], 1)
                q = torch.cat([q, q[:, -1:] + 1], 1)
    assert toks.shape == (3, n) and toks.tolist() == torch.stack(want, 1).tolist()
    torch.testing.assert_close(first, logits0, rtol=0, atol=1e-5)
    if heads:                                                # the ablation acted on the decode
        with torch.inference_mode():
            assert not torch.equal(greedy_tokens(model, ids, n, attention_mask=mask, position_ids=pos)[0], first)


# ---- the study ---------------------------------------------------------------------------------------------

def _scores_file(path, columns: dict[str, np.ndarray]):
    L, H = next(iter(columns.values())).shape
    rows = [{"layer": l, "head": h, **{c: float(v[l, h]) for c, v in columns.items()}} for l in range(L) for h in range(H)]
    pd.DataFrame(rows).to_csv(path, index=False)
    return path


def _concept_and_fv():
    concept = np.zeros((2, 8))
    concept[0, 0], concept[0, 1] = 2.0, 1.0             # concept top 2: L0H0, L0H1
    fv = np.arange(16, dtype=float).reshape(2, 8)       # fv top 2: L1H7, L1H6
    return concept, fv


def small(tmp_path, piece_tokenizer, **sel) -> RoutesConfig:
    concept, fv = _concept_and_fv()
    f = _scores_file(tmp_path / "head_scores.csv", {"concept_copying": concept, "fv": fv})
    text = tmp_path / "text.txt"
    text.write_text(" ".join(piece_tokenizer.convert_ids_to_tokens(list(range(40, 200))) * 3))
    s = {"rankings": ("induction", "concept_copying", "fv"), "scores_file": str(f), "ks": (2,), "n_draws": 1, **sel}
    return RoutesConfig(scores=HeadScoreConfig(seq_len=8, batch_size=2), selection=RoutesSelectionConfig(**s),
                        lag=LagProbeConfig(list_length=16, cue_position=8, n_permutations=3, cues="all:4"),
                        recall=SerialRecallConfig(n_trials=2, list_length=4, n_shots=1, generate=False),
                        copy=WordCopyConfig(n_lists=2, n_items=4, lengths=(2, 3), word_pool=10_000),
                        icl=TokenLossConfig(text=str(text), late=30, early=5, pilot=3, half_width=50.0, method="zero",
                                            sensitivity=None))          # auto: n from a 3-window pilot


@pytest.fixture(scope="module")
def study(piece_tokenizer, tmp_path_factory):
    from inductionlab.core.models import LoadedModel, attention_shape
    from inductionlab.studies.routes.study import run_routes

    model = make_tiny("llama", ctx=256)
    lm = LoadedModel(model, piece_tokenizer, {"name": "tiny", "dtype": "float32", **attention_shape(model.config)})
    d = tmp_path_factory.mktemp("routes")
    out = d / "run"
    return run_routes(lm, small(d, piece_tokenizer), out, RunOptions(progress=False)), out


def test_a_tiny_run_writes_the_tables_and_decides_each_claim(study):
    res, out = study
    for f in ("results.json", "drops.csv", "conditions.csv", "copy_outputs.csv", "drops_by_ranking.png", "report.md"):
        assert (out / f).is_file(), f
    rec = json.loads((out / "results.json").read_text())
    names = [c["name"] for c in rec["conditions"]]
    assert names == ["intact", "induction-2", "concept_copying-2", "fv-2", "induction-excl-concept_copying-2",
                     "random-all-2-d0"]
    heads = {c["name"]: [tuple(h) for h in c["ablated_heads"]] for c in rec["conditions"]}
    assert heads["concept_copying-2"] == [(0, 0), (0, 1)] and heads["fv-2"] == [(1, 7), (1, 6)]
    assert not {(0, 0), (0, 1)} & set(heads["induction-excl-concept_copying-2"])
    verd = {v["claim"]: v for v in rec["verdicts"]}
    assert set(verd) == {"R1", "R2", "R3"}
    assert verd["R1"]["evidence"] != "—" and verd["R2"]["evidence"] != "—"      # decided on numbers
    assert all(v["verdict"] in ("reproduced", "not reproduced", "not testable") for v in verd.values())
    assert verd["R3"]["verdict"] == "not testable" and "not tested" in verd["R3"]["caveat"]
    assert "cmr_like" in verd["R3"]["caveat"]
    drops = pd.read_csv(out / "drops.csv")
    assert set(drops.arm) == {"induction-2", "concept_copying-2", "fv-2", "induction-excl-concept_copying-2",
                              "random-all-2"}                          # the random draws pooled, named as they are
    assert {"lag_plus1", "lag_enrichment", "temporal_factor", "recall_accuracy", "copy_p_first_nonsense",
            "copy_paraphrase_word", "icl_benefit"} <= set(drops.measure)
    one = drops[(drops.arm == "induction-2") & (drops.measure == "copy_p_first_word")].iloc[0]
    assert one["drop"] == pytest.approx(one["intact"] - one["value"])          # drop = intact − ablated
    assert len(pd.read_csv(out / "copy_outputs.csv")) == 6 * 3 * 2              # conditions x kinds x lists
    cost = rec["cost"]
    assert set(cost["ratio_per_condition"]) == {"lag", "recall", "copy", "icl"}
    tl = rec["token_loss"]                       # issue 34: the pilot sized the windows, recorded with its reason
    size = tl["sizing"]["sample_size"]
    assert tl["sizing"]["pilot"]["n"] == 3 and tl["sizing"]["pilot_condition"] == "induction-2"
    pilot = tl["sizing"]["pilot"]
    from scipy.stats import chi2
    up = math.sqrt(2 / chi2.ppf(0.2, 2))           # 3 pilot windows: each σ at its 80% upper confidence limit
    claim_n = max(2, math.ceil((1.959963984540054 * pilot["sigma"]["paired_slope"] * up / 50.0) ** 2))
    m, s = pilot["mean"]["intact_slope"], pilot["sigma"]["intact_slope"]
    low = max(m - 0.8416212335729143 * s / math.sqrt(3), m / 2)      # the mean at its one-sided 80% lower limit
    gate_n = math.ceil(((1.959963984540054 + 0.8416212335729143) * s * up / low) ** 2) if m > 0 else 0
    assert size["sigma"] == pytest.approx(pilot["sigma"]["paired_slope"] * up) and size["needed"] == max(claim_n, gate_n)
    assert size["n"] == tl["n_windows"] == min(size["needed"], 480 // 36)
    assert size["available"] == 480 // 36 and tl["window_tokens"] == 37 and tl["measured_tokens"] == [4, 36]
    assert (out / "checkpoints" / "icl_pilot.npz").is_file() and (out / "checkpoints" / "icl_sample_size.json").is_file()
    assert "Pilot: 3 windows" in (out / "report.md").read_text()
    assert "[`view.html`](view.html), written by `inductionlab view RUN_DIR`" in (out / "report.md").read_text()
    assert all(v > 0 for v in cost["bare_forward_s"].values()) and all(v > 0 for v in cost["ratio_per_condition"].values())


def test_a_second_run_resumes_from_the_pieces(study, piece_tokenizer):
    from inductionlab.studies.routes.study import run_routes

    res, out = study
    again = run_routes(res.loaded, res.config, out, RunOptions(progress=False))
    assert again.record["resumed"] is True
    pd.testing.assert_frame_equal(again.drops, res.drops)
    assert again.record["cost"] == res.record["cost"]                 # the cost piece is loaded, not re-timed


def test_a_ranking_missing_from_the_scores_file_is_one_line_before_any_forward(piece_tokenizer, tmp_path):
    from inductionlab.core.models import LoadedModel
    from inductionlab.studies.routes.study import run_routes

    cfg = small(tmp_path, piece_tokenizer, rankings=("induction", "cmr_like"))
    lm = LoadedModel(None, piece_tokenizer, {})                     # no model: the refusal comes first
    with pytest.raises(InductionLabError) as e:
        run_routes(lm, cfg, tmp_path / "out", RunOptions(progress=False))
    msg = str(e.value)
    assert "\n" not in msg and "cmr_like" in msg and str(tmp_path / "head_scores.csv") in msg
    assert "concept_copying, fv" in msg and not (tmp_path / "out").exists()
    with pytest.raises(InductionLabError, match="--scores-file"):
        small(tmp_path, piece_tokenizer, scores_file=None).validate()


def test_the_generated_command_has_its_options():
    r = CliRunner().invoke(main, ["study", "routes", "--help"])
    assert r.exit_code == 0, r.output
    for flag in ("--rankings", "--scores-file", "--ks", "--fractions", "--copy-lists", "--copy-lengths",
                 "--token-ranking", "--concept-ranking", "--cmr-ranking", "--icl-text"):
        assert flag in r.output, flag


def test_the_claims_follow_the_paired_difference_against_their_comparison():
    """decide() on made-up per-trial values: R1 reads copy P(nonsense), random − token; R2 lag p(+1),
    token-excluding-concept − concept; the floors and a missing ranking."""
    from inductionlab.studies.routes.verdicts import decide

    n = 6
    conds = [Condition("intact", "intact"), Condition("induction-2", "induction", 2, heads=[(0, 0), (0, 1)]),
             Condition("concept_copying-2", "concept_copying", 2, heads=[(1, 0), (1, 1)]),
             Condition("induction-excl-concept_copying-2", "induction-excl-concept_copying", 2, heads=[(0, 2), (0, 3)]),
             Condition("random-all-2-d0", "random", 2, 0, heads=[(1, 2), (1, 3)]),
             Condition("random-all-2-d1", "random", 2, 1, heads=[(1, 4), (1, 5)])]
    jitter = np.linspace(-0.01, 0.01, n)
    base = {"copy_p_first_nonsense": 0.5 + jitter, "lag_plus1": 0.3 + jitter, "lag_enrichment": 1.0 + jitter,
            "icl_benefit": 0.2 + jitter}
    lower = {"induction-2": {"copy_p_first_nonsense": 0.2}, "concept_copying-2": {"lag_plus1": 0.1},
             "random-all-2-d0": {"copy_p_first_nonsense": 0.1}, "random-all-2-d1": {"copy_p_first_nonsense": 0.35}}

    def values(name):
        return {m: v - lower.get(name, {}).get(m, 0.0) for m, v in base.items()}
    names = {"token": "induction", "concept": "concept_copying", "cmr": "cmr_like"}
    v = {x.claim: x for x in decide(conds, values, ("induction", "concept_copying"), names)}
    # R1: random pooled lowers by (0.1 + 0.35) / 2 = 0.225, token heads by 0.2: difference -0.025 -> not reproduced
    assert v["R1"].status == "not reproduced" and v["R1"].per_k["2"]["difference"] == pytest.approx(-0.025)
    # R2: concept lowers p(+1) by 0.1, token-excluding-concept by 0: difference +0.1 every trial -> reproduced
    assert v["R2"].status == "reproduced" and v["R2"].per_k["2"]["difference"] == pytest.approx(0.1)
    assert v["R3"].status == "not testable" and "not tested" in v["R3"].caveat
    lower["induction-2"]["copy_p_first_nonsense"] = 0.3                          # now 0.075 more than random
    assert decide(conds, values, ("induction",), names)[0].status == "reproduced"
    base["copy_p_first_nonsense"] = 0.04 + 0 * jitter                            # intact below 0.05: nothing to lower
    assert decide(conds, values, ("induction",), names)[0].status == "not testable"
