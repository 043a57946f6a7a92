"""Pretraining data: corpus sources and the MD5 held-out split (:mod:`.corpus`), tokenizers
(:mod:`.tokenizer`), and memory-mapped token shards with a manifest (:mod:`.shards`)."""

from .corpus import demo_install_command, is_heldout, md5_unit, resolve_source
from .shards import TokenShards, prepare_corpus

__all__ = ["TokenShards", "prepare_corpus", "resolve_source", "is_heldout", "md5_unit",
           "demo_install_command"]
