"""Shared fixtures: tiny random models built from configs, and a word-level tokenizer.

The architectures cover the traps named in ANCHORS.md: GQA (Llama 8 query / 2 KV heads,
Qwen2), head_dim ≠ hidden / heads with sliding-window layers (Gemma 3 text), absolute
positions and fused QKV (GPT-2), parallel attention with partial rotary (GPT-NeoX).
"""

from __future__ import annotations

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import pytest  # noqa: E402
import torch  # noqa: E402

VOCAB = 800  # tiny models' vocabulary; the word tokenizer uses ids 0..VOCAB-1


def tiny_config(arch: str, attn: str = "sdpa", vocab_size: int = VOCAB, ctx: int = 2048):
    from transformers import (Gemma3TextConfig, GPT2Config, GPTNeoXConfig, LlamaConfig, Qwen2Config)
    common = dict(vocab_size=vocab_size)
    if arch == "llama":
        cfg = LlamaConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=8,
                          num_key_value_heads=2, max_position_embeddings=ctx, **common)
    elif arch == "qwen2":
        cfg = Qwen2Config(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                          num_key_value_heads=2, max_position_embeddings=ctx, **common)
    elif arch == "gemma3":
        cfg = Gemma3TextConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                               num_key_value_heads=1, head_dim=32, sliding_window=4,
                               layer_types=["sliding_attention", "full_attention"],
                               max_position_embeddings=ctx, **common)
    elif arch == "gpt2":
        cfg = GPT2Config(n_embd=64, n_layer=2, n_head=4, n_positions=ctx, **common)
    elif arch == "gpt_neox":
        cfg = GPTNeoXConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                            max_position_embeddings=ctx, **common)
    else:
        raise ValueError(arch)
    cfg._attn_implementation = attn
    return cfg


def make_tiny(arch: str, attn: str = "sdpa", seed: int = 0, **kw):
    from transformers import AutoModelForCausalLM
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(tiny_config(arch, attn, **kw), attn_implementation=attn)
    return model.eval()


ARCHS = ["llama", "qwen2", "gemma3", "gpt2", "gpt_neox"]


@pytest.fixture(scope="session")
def word_tokenizer():
    """Word-level tokenizer over wordfreq's most frequent words: every word is one token."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast
    from wordfreq import top_n_list

    words = [w for w in top_n_list("en", 3000) if w.isascii() and w.isalpha() and len(w) >= 2]
    specials = ["<unk>", "<bos>", "<eos>", ",", "."]
    vocab = {t: i for i, t in enumerate(specials + words[: VOCAB - len(specials)])}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Sequence([pre_tokenizers.WhitespaceSplit(), pre_tokenizers.Punctuation()])
    return PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<bos>", eos_token="<eos>", unk_token="<unk>")


@pytest.fixture
def tiny_loaded(word_tokenizer):
    """A LoadedModel around a tiny GQA Llama and the word tokenizer."""
    from inductionlab.core.models import LoadedModel, attention_shape
    model = make_tiny("llama")
    return LoadedModel(model, word_tokenizer, {"name": "tiny-llama", **attention_shape(model.config)})


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory, word_tokenizer):
    """A model directory for CLI tests: a tiny Llama (context 64) saved with ``save_pretrained``,
    with the word-level tokenizer."""
    d = tmp_path_factory.mktemp("tiny-llama")
    make_tiny("llama", ctx=64).save_pretrained(d)
    word_tokenizer.save_pretrained(d)
    return d
