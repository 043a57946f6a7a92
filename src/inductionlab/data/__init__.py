"""Pretraining data: corpus sources and the MD5 held-out split (:mod:`.corpus`), tokenizers
(:mod:`.tokenizer`), memory-mapped token shards with a manifest (:mod:`.shards`), semi-synthetic
bigram text (:mod:`.synth_bigram`) and the Bi-Induct curriculum that rewrites a token stream
(:mod:`.curriculum`, SPEC §6).

Imports ``runtime`` and the package's face, nothing that loads a model (a checkpoint's tokenizer is
found through :mod:`inductionlab.runtime.model_specs`). A new corpus source is a reader in ``corpus``;
a new curriculum variant is its name in
``curriculum.VARIANTS`` and its snippet rule there.
"""

from .corpus import demo_install_command, is_heldout, md5_unit, resolve_source
from .shards import TokenShards, prepare_corpus

__all__ = ["TokenShards", "prepare_corpus", "resolve_source", "is_heldout", "md5_unit",
           "demo_install_command"]
