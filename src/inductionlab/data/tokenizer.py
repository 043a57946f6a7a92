"""Tokenizers for pretraining: a small byte-level BPE trained on the training split, or an
existing model's tokenizer.

The BPE is the GPT-2 recipe (Radford et al. 2019) through the ``tokenizers`` library: byte-level
pre-tokenisation (every byte is a token, so no text is ever unknown), BPE merges learned on the
training split only, one special token ``<|endoftext|>`` used as EOS between documents, no BOS.

A 4–8 k vocabulary keeps the embedding and LM-head small enough for CPU-scale models (see
``bench/bench_vocab_throughput.py``); an existing model's tokenizer (e.g. SmolLM2's 49 k) makes
checkpoints comparable with that model but slows tiny models several-fold.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

from ..documents import check_model_folder, read_json
from ..errors import InductionLabError

EOS_TOKEN = "<|endoftext|>"
_EOS_CANDIDATES = (EOS_TOKEN, "</s>", "<|im_end|>", "<eos>", "<|end_of_text|>")
_BOS_CANDIDATES = ("<s>", "<|begin_of_text|>", "<bos>", "<|im_start|>")


@dataclass
class TokenizerInfo:
    """A ``tokenizers.Tokenizer`` with the ids the data pipeline needs."""
    tokenizer: Tokenizer
    kind: str                 # "bpe" (trained here) or "pretrained"
    spec: str
    eos_id: int
    bos_id: int | None
    sep_id: int

    @property
    def vocab_size(self) -> int:
        """Largest token id + 1: the rows an embedding needs and the bound every shard id obeys.

        Not the number of entries: a tokenizer may leave ids unused (a word-level vocabulary of 6
        entries can hold id 70,000)."""
        ids = self.tokenizer.get_vocab(with_added_tokens=True).values()
        return max(ids, default=-1) + 1

    def describe(self) -> dict:
        return {"kind": self.kind, "spec": self.spec, "vocab_size": self.vocab_size,
                "eos_id": self.eos_id, "bos_id": self.bos_id, "sep_id": self.sep_id,
                "eos_token": self.tokenizer.id_to_token(self.eos_id),
                "sep_token": self.tokenizer.id_to_token(self.sep_id)}


def single_token_id(tok: Tokenizer, text: str) -> int | None:
    """The id of ``text`` if the tokenizer encodes it (without special tokens) as one token."""
    ids = tok.encode(text, add_special_tokens=False).ids
    return ids[0] if len(ids) == 1 else None


def default_sep_id(tok: Tokenizer) -> int:
    """SEP default (SPEC §6): the tokenizer's single newline token, else its single space token.

    Raises:
        InductionLabError: neither encodes to exactly one token.
    """
    for s in ("\n", " "):
        i = single_token_id(tok, s)
        if i is not None:
            return i
    raise InductionLabError("the tokenizer has no single-token newline or space; "
                            "pass an explicit SEP id (sep_id / --sep-id)")


def check_bpe_vocab_size(vocab_size: int) -> None:
    """Raise unless a byte-level BPE of ``vocab_size`` tokens can be trained.

    Raises:
        InductionLabError: below 257 (256 bytes + EOS) or at least 2**32.
    """
    if not 257 <= vocab_size < 2 ** 32:
        raise InductionLabError(f"--vocab-size must be in [257, 2**32), got {vocab_size}: it "
                                "holds the 256 byte tokens, <|endoftext|> and the merges")


def train_bpe(texts: Iterable[str], vocab_size: int = 4096, *, min_frequency: int = 2) -> TokenizerInfo:
    """Train a byte-level BPE on ``texts`` (the training split only).

    Args:
        texts: documents (strings); streamed once.
        vocab_size: target vocabulary including the 256 byte tokens and ``<|endoftext|>``;
            a small corpus can stop earlier (no pair left with ``min_frequency``), so read the
            actual size from the result.

    Raises:
        InductionLabError: ``vocab_size`` below 257 (256 bytes + EOS) or at least 2**32.
    """
    check_bpe_vocab_size(vocab_size)
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, min_frequency=min_frequency,
                                  special_tokens=[EOS_TOKEN], show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(texts, trainer=trainer)
    eos = tok.token_to_id(EOS_TOKEN)
    return TokenizerInfo(tok, "bpe", f"bpe-{vocab_size}", eos, None, default_sep_id(tok))


def _special_from_config(d: Path, tok: Tokenizer) -> tuple[int | None, int | None]:
    """eos / bos ids named in a tokenizer_config.json / special_tokens_map.json next to it."""
    eos = bos = None
    for name in ("tokenizer_config.json", "special_tokens_map.json"):
        f = d / name
        if not f.is_file():
            continue
        cfg = read_json(f, "tokenizer file")
        for key, slot in (("eos_token", "eos"), ("bos_token", "bos")):
            v = cfg.get(key)
            if isinstance(v, dict):
                v = v.get("content")
            if isinstance(v, str) and tok.token_to_id(v) is not None:
                if slot == "eos" and eos is None:
                    eos = tok.token_to_id(v)
                if slot == "bos" and bos is None:
                    bos = tok.token_to_id(v)
    return eos, bos


def _from_hf(hf, spec: str) -> TokenizerInfo:
    backend = getattr(hf, "backend_tokenizer", None)
    if backend is None:
        raise InductionLabError(f"tokenizer of {spec!r} is not a fast (tokenizers) tokenizer; "
                                "pass a tokenizer.json instead")
    tok = Tokenizer.from_str(backend.to_str())
    eos = hf.eos_token_id
    if eos is None:
        raise InductionLabError(f"tokenizer of {spec!r} has no EOS token; pass a tokenizer "
                                "that defines one")
    return TokenizerInfo(tok, "pretrained", spec, int(eos), hf.bos_token_id, default_sep_id(tok))


def load_tokenizer(spec: str | os.PathLike) -> TokenizerInfo:
    """Load an existing tokenizer: a ``tokenizer.json`` file, a directory holding one (special
    tokens from its ``tokenizer_config.json`` when present), or an inductionlab model spec
    (``inductionlab.models.load_model``; e.g. ``smollm2-135m``), a Hugging Face tokenizer
    directory, or a hub id already in the local cache (never downloaded).

    Raises:
        InductionLabError: unknown spec, or no EOS token can be identified.
    """
    from ..runtime import model_specs

    s = str(spec)
    p = Path(s).expanduser()
    if p.is_dir() or p.is_file():        # never a folder's own code (its tokenizer_config.json's auto_map)
        model_specs.refuse_custom_code(p if p.is_dir() else p.parent, "tokenizer")
    if p.is_dir() and (p / "tokenizer.json").is_file():
        p = p / "tokenizer.json"
    if p.is_file() and p.suffix == ".json":
        check_model_folder(p.parent, [p])
        try:
            tok = Tokenizer.from_file(str(p))
        except Exception as e:
            raise InductionLabError(f"{p}: not a tokenizers JSON file ({e})") from None
        eos, bos = _special_from_config(p.parent, tok)
        if eos is None:
            eos = next((tok.token_to_id(t) for t in _EOS_CANDIDATES
                        if tok.token_to_id(t) is not None), None)
        if bos is None:
            bos = next((tok.token_to_id(t) for t in _BOS_CANDIDATES
                        if tok.token_to_id(t) is not None), None)
        if eos is None:
            raise InductionLabError(f"{p}: cannot tell the EOS token; add a tokenizer_config.json "
                                    "with eos_token next to it")
        return TokenizerInfo(tok, "pretrained", s, eos, bos, default_sep_id(tok))
    if p.is_dir():
        check_model_folder(p)
        return _from_hf(_auto_tokenizer(str(p), s), s)
    if p.exists():
        raise InductionLabError(f"{p}: not a tokenizer.json or a directory holding one")
    if s.lower() in model_specs.EMBEDDED:         # the tokenizer from the GGUF's metadata; no weights loaded
        _, path, gguf, _ = model_specs.resolve(s)
        return _from_hf(_auto_tokenizer(str(Path(path).parent), s, gguf_file=gguf), s)
    model_specs.refuse_cached_custom_code(s, "tokenizer")
    return _from_hf(_auto_tokenizer(s, s), s)   # a hub id already in the local cache


def _auto_tokenizer(name: str, spec: str, **kw):
    """``AutoTokenizer.from_pretrained(name, local_files_only=True)``; never the network."""
    from transformers import AutoTokenizer
    try:
        return AutoTokenizer.from_pretrained(name, local_files_only=True, trust_remote_code=False, **kw)
    except Exception:  # noqa: BLE001 - transformers raises OSError/ValueError/... here
        pass
    raise InductionLabError(f"unknown tokenizer {spec!r}; use 'bpe', a tokenizer.json path, a "
                            "directory holding one, or a model spec such as smollm2-135m")
