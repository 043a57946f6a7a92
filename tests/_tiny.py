"""Tiny models for the temporal-study tests: a word-level tokenizer over wordfreq's most frequent
English words, a random LlamaForCausalLM sized to it, and exact fake models for bookkeeping."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import torch

SPECIAL = ["[UNK]", "<s>", "</s>"]


def word_tokenizer(n_words: int = 700):
    """PreTrainedTokenizerFast: WordLevel over the top wordfreq words, lower-cased, whitespace and
    punctuation split (so ``"Study:"`` → ``study``, ``:``), with BOS ``<s>``."""
    from tokenizers import Tokenizer, models, normalizers, pre_tokenizers
    from transformers import PreTrainedTokenizerFast
    from wordfreq import top_n_list

    words = [w for w in top_n_list("en", 4 * n_words) if w.isascii() and w.isalpha()][:n_words]
    vocab = {t: i for i, t in enumerate(SPECIAL + [":"] + [w for w in dict.fromkeys(words + ["study", "recall"])])}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    tok.normalizer = normalizers.Lowercase()
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    return PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<s>", eos_token="</s>", unk_token="[UNK]")


def tiny_llama_dir(path: Path, n_layers: int = 4, n_heads: int = 4, seed: int = 0) -> Path:
    """Save a random LlamaForCausalLM (hidden 32, GQA 2 KV heads) and its tokenizer to ``path``."""
    from transformers import LlamaConfig, LlamaForCausalLM

    tok = word_tokenizer()
    torch.manual_seed(seed)
    cfg = LlamaConfig(vocab_size=len(tok), hidden_size=32, intermediate_size=64, num_hidden_layers=n_layers,
                      num_attention_heads=n_heads, num_key_value_heads=2, max_position_embeddings=512,
                      bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id, tie_word_embeddings=False)
    model = LlamaForCausalLM(cfg)
    model.save_pretrained(path)
    tok.save_pretrained(path)
    return path


class FakeRecallModel(torch.nn.Module):
    """An exact fake causal LM for serial-recall bookkeeping.

    ``mode="next"``: at every position it puts logit 0 on the item that follows the current token
    in the *last* study list (the ``list_length`` tokens that start ``skip`` tokens after the
    last ``marker`` token) — and on
    that list's first item when the current token is not in it (the recall cue) — and −100 on all
    other tokens, so it always outputs the next list item.
    ``mode="fixed"``: logit 0 on ``fixed_id`` and −100 elsewhere at every position.
    """

    def __init__(self, vocab_size: int, marker: int, list_length: int, mode: str = "next", fixed_id: int = 0,
                 skip: int = 0):
        super().__init__()
        self.dummy = torch.nn.Parameter(torch.zeros(1))
        self.config = SimpleNamespace(vocab_size=vocab_size, num_hidden_layers=1, num_attention_heads=1)
        self.marker, self.L, self.mode, self.fixed_id, self.skip = marker, list_length, mode, fixed_id, skip

    def forward(self, input_ids, logits_to_keep: int = 0, **kw):
        B, T = input_ids.shape
        logits = torch.full((B, T, self.config.vocab_size), -100.0)
        for b in range(B):
            row = input_ids[b].tolist()
            if self.mode == "fixed":
                logits[b, :, self.fixed_id] = 0.0
                continue
            start = max(i for i, t in enumerate(row) if t == self.marker) + 1 + self.skip
            study = row[start:start + self.L]
            for t, tok in enumerate(row):
                nxt = study[study.index(tok) + 1] if tok in study[:-1] else study[0]
                logits[b, t, nxt] = 0.0
        if logits_to_keep:
            logits = logits[:, -logits_to_keep:]
        return SimpleNamespace(logits=logits, past_key_values=None)
