"""Tokenised corpus shards: written once by :func:`prepare_corpus`, memory-mapped for training.

A prepared corpus is a directory::

    manifest.json          source, corpus hash, tokenizer, token counts per split, split rule
    train.bin              1-D token ids, uint16 (vocab < 65536) or uint32, documents each followed by EOS
    heldout.bin            the same for the held-out split
    tokenizer.json         the tokenizer (``tokenizers`` JSON), plus tokenizer_config.json so
                           ``AutoTokenizer.from_pretrained(dir)`` knows EOS

Documents are assigned to a split by the MD5 rule of :mod:`inductionlab.data.corpus`, and the
order of documents inside each split is a permutation drawn from ``seed`` (so a corpus stored
book by book does not train book by book). The directory is written in a staging directory and
renamed into place only when complete.
"""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Iterator

import numpy as np

from ..config import opt
from ..documents import MODEL_FILE_MAX_BYTES, check_json, read_json
from ..errors import InductionLabError
from ..runtime.outputs import check_output_dir
from ..runtime.runs import atomic_write_json, own_entries, sha256_file, staged_run_dir, versions
from .corpus import auto_heldout_fraction, md5_unit, resolve_source
from .tokenizer import TokenizerInfo, check_bpe_vocab_size, load_tokenizer, train_bpe

FORMAT = "inductionlab-token-shards/1"
SPLITS = ("train", "heldout")


def token_dtype(vocab_size: int) -> np.dtype:
    """uint16 when every id fits (``vocab_size`` = largest id + 1 <= 65536), else uint32."""
    return np.dtype(np.uint16 if vocab_size < 65536 else np.uint32)


def _manifest_int(value, name: str) -> int:
    """A manifest's integer field (not a bool, a float with a fraction, a string, or negative).

    Raises: ValueError naming the field."""
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ValueError(f"{name} is {value!r}, not a count >= 0")
    return value


@dataclass
class TokenShards:
    """A prepared corpus directory, memory-mapped.

    Attributes:
        train, heldout: 1-D read-only memmaps of token ids (``dtype`` uint16 or uint32),
            every document followed by ``eos_id``.
        manifest: the parsed ``manifest.json``.
        vocab_size: the tokenizer's largest id + 1 (ids are < vocab_size).
        tokenizer_path: ``tokenizer.json``, loadable with
            ``transformers.PreTrainedTokenizerFast(tokenizer_file=...)``.
        bos_id, eos_id, sep_id: special ids; ``sep_id`` is the Bi-Induct separator default
            (the single newline token, else the single space token; SPEC §6).
    """
    path: Path
    manifest: dict
    train: np.ndarray
    heldout: np.ndarray
    vocab_size: int
    tokenizer_path: Path
    eos_id: int
    bos_id: int | None
    sep_id: int
    _tok: object = field(default=None, repr=False)

    @classmethod
    def open(cls, path: str | os.PathLike) -> "TokenShards":  # noqa: C901 (one check per manifest field)
        """Open a directory written by :func:`prepare_corpus`.

        Raises:
            InductionLabError: missing or unreadable manifest, unknown format, missing token
                file, or a token file whose size disagrees with the manifest's token count.
        """
        path = Path(path)
        mf = path / "manifest.json"
        if not mf.is_file():
            raise InductionLabError(f"{path} is not a prepared corpus (no manifest.json); "
                                    "run: inductionlab corpus prepare SOURCE --out DIR")
        try:
            manifest = read_json(mf, "corpus manifest")       # the one bounded reader
            fmt = manifest["format"]
            tok = manifest["tokenizer"]
            counts = manifest["splits"]
            dtype = np.dtype(manifest["dtype"])
            vocab_size, eos_id, sep_id = (_manifest_int(tok[k], k) for k in ("vocab_size", "eos_id", "sep_id"))
            bos_id = None if tok.get("bos_id") is None else _manifest_int(tok["bos_id"], "bos_id")
        except (json.JSONDecodeError, KeyError, TypeError, ValueError, AttributeError) as e:
            first = str(e).splitlines()[0] if str(e) else repr(e)
            raise InductionLabError(f"{mf} is corrupt ({type(e).__name__}: {first}); prepare the corpus "
                                    "again") from None
        if dtype.kind not in "ui" or dtype.itemsize > 8:
            raise InductionLabError(f"{mf} is corrupt (token dtype {dtype.name!r} is no integer type); prepare the "
                                    "corpus again")
        missing = [s for s in SPLITS if not isinstance(counts, dict) or not isinstance(counts.get(s), dict)
                   or "tokens" not in counts[s]]
        if missing:
            raise InductionLabError(f"{mf} has no {' or '.join(map(repr, missing))} split; the manifest is "
                                    "damaged: prepare the corpus again")
        for split in SPLITS:
            try:
                _manifest_int(counts[split]["tokens"], f"splits.{split}.tokens")
            except (TypeError, ValueError) as e:
                raise InductionLabError(f"{mf} is corrupt ({e}); prepare the corpus again") from None
        if fmt != FORMAT:
            raise InductionLabError(f"{mf}: format {fmt!r} is not {FORMAT!r}; prepare the corpus "
                                    "again with this inductionlab")
        arrays = {}
        for split in SPLITS:
            f = path / f"{split}.bin"
            n = int(counts[split]["tokens"])
            if not f.is_file():
                raise InductionLabError(f"{f} missing; prepare the corpus again")
            size = f.stat().st_size
            if size != n * dtype.itemsize:
                raise InductionLabError(f"{f} has {size} bytes, manifest says {n} tokens of "
                                        f"{dtype.name}; the file is truncated or corrupt, prepare "
                                        "the corpus again")
            arrays[split] = (np.memmap(f, dtype=dtype, mode="r", shape=(n,)) if n
                             else np.zeros(0, dtype=dtype))
        tp = path / "tokenizer.json"
        if not tp.is_file():
            raise InductionLabError(f"{tp} missing; prepare the corpus again")
        return cls(path, manifest, arrays["train"], arrays["heldout"], vocab_size, tp,
                   eos_id, bos_id, sep_id)

    def tokenizer(self):
        """The ``tokenizers.Tokenizer`` (loaded once)."""
        if self._tok is None:
            from tokenizers import Tokenizer
            check_json(self.tokenizer_path, "corpus tokenizer", max_bytes=MODEL_FILE_MAX_BYTES)
            self._tok = Tokenizer.from_file(str(self.tokenizer_path))
        return self._tok

    def hf_tokenizer(self):
        """A ``transformers.PreTrainedTokenizerFast`` with EOS (and BOS, if any) set."""
        from transformers import PreTrainedTokenizerFast
        tok = self.tokenizer()
        kw = {"eos_token": tok.id_to_token(self.eos_id)}
        if self.bos_id is not None:
            kw["bos_token"] = tok.id_to_token(self.bos_id)
        return PreTrainedTokenizerFast(tokenizer_file=str(self.tokenizer_path), **kw)

    def token_pool(self, exclude_ids=(), max_tokens: int = 1 << 26) -> np.ndarray:
        """The ids that occur in the training split (its first ``max_tokens`` tokens), minus EOS,
        BOS, SEP and ``exclude_ids``: where random probe sequences are drawn from for a model
        trained on this corpus, so that no probe token has an embedding training never updated.

        Decision (issue 19): drawing from the whole vocabulary understated the telemetry of
        models trained on a synth-bigram corpus (347 of 512 ids in use) 2–3×.

        Returns: sorted int64 ``[V']``.

        Raises: InductionLabError when fewer than 2 ordinary ids occur (an empty training split)."""
        counts = np.zeros(self.vocab_size, dtype=np.int64)
        chunk = 1 << 22
        n = min(len(self.train), int(max_tokens))
        for s in range(0, n, chunk):
            part = np.asarray(self.train[s:min(n, s + chunk)], dtype=np.int64)
            counts += np.bincount(part, minlength=self.vocab_size)[:self.vocab_size]
        drop = [i for i in (self.eos_id, self.bos_id, self.sep_id, *exclude_ids) if i is not None]
        counts[[int(i) for i in drop if 0 <= int(i) < self.vocab_size]] = 0
        pool = np.flatnonzero(counts).astype(np.int64)
        if len(pool) < 2:
            raise InductionLabError(f"{self.path}: the training split holds {len(pool)} ordinary token ids; "
                                    "a probe needs at least 2 (prepare the corpus again from more text)")
        return pool

    def decode(self, ids) -> str:
        return self.tokenizer().decode([int(i) for i in ids], skip_special_tokens=False)

    def check_ids(self, vocab_size: int | None = None) -> None:
        """Raise when a token id of either split is >= ``vocab_size`` (default: the manifest's).

        Raises:
            InductionLabError: an id out of range (damaged shard or another tokenizer's ids).
        """
        from .curriculum import check_token_ids
        for split in SPLITS:
            check_token_ids(getattr(self, split), vocab_size or self.vocab_size, f"{self.path / (split + '.bin')}")

    def verify(self) -> None:
        """Check the token files' and the tokenizer's sha256 against the manifest.

        Raises:
            InductionLabError: a file's hash differs, or the manifest records no sha256 for it
                (a damaged or edited manifest: nothing to verify against).
        """
        mf = self.path / "manifest.json"
        files = [(self.path / f"{split}.bin", self.manifest["splits"][split].get("sha256"), f"splits.{split}.sha256")
                 for split in SPLITS]
        tok = self.manifest.get("tokenizer") or {}
        files.append((self.tokenizer_path, tok.get("sha256"), "tokenizer.sha256"))
        for f, want, where in files:
            if not (isinstance(want, str) and len(want) == 64):
                raise InductionLabError(f"{mf} records no checksum of {f.name} ({where} is {want!r}): the manifest is "
                                        "damaged and the corpus cannot be verified; prepare the corpus again")
            got = sha256_file(f)
            if got != want.lower():
                raise InductionLabError(f"{f} sha256 {got[:12]}... != manifest {want[:12]}...; prepare the corpus again")


def _limited(docs: Iterator[str], max_documents: int | None) -> Iterator[str]:
    for i, d in enumerate(docs):
        if max_documents is not None and i >= max_documents:
            return
        yield d


@dataclass
class CorpusConfig:
    """How :func:`prepare_corpus` tokenises a corpus (``inductionlab corpus prepare SOURCE``): the options of
    the command, generated from these fields."""
    tokenizer: str = opt("bpe", "'bpe' (train a byte-level BPE on the training split), a tokenizer.json, a directory "
                                "holding one, or a model spec such as smollm2-135m.")
    vocab_size: int = opt(4096, "BPE vocabulary size.")
    heldout_fraction: float | None = opt(None, "Fraction of documents held out by MD5.",
                                         none="auto, 0.2%..5%: clip(200,000 / characters, 0.002, 0.05)")
    seed: int = opt(0, "Seed of the document order.")
    text_field: str = opt("text", "JSONL/Parquet/dataset field.")
    max_documents: int | None = opt(None, "Use only the first N documents.")
    chunk_chars: int = opt(4000, "Plain text: group paragraphs into documents of at least this many characters.")
    shuffle: bool = opt(True, "Keep source document order (the flag sets shuffle false).", flag="--no-shuffle")


def prepare_corpus(source: str | os.PathLike, out_dir: str | os.PathLike, cfg: CorpusConfig | None = None, *,
                   overwrite: bool = False, **options) -> TokenShards:
    """Tokenise a corpus once into memory-mappable shards with a manifest.

    Args:
        source: ``"demo"``, a .txt/.jsonl/.parquet file (optionally .gz for text/JSONL), an
            on-disk Hugging Face dataset, or a directory of such files
            (:func:`inductionlab.data.corpus.resolve_source`).
        out_dir: directory to create (must be new or empty unless ``overwrite``).
        cfg: :class:`CorpusConfig` (default: its defaults); ``options``: its fields by name, over ``cfg``
            (``prepare_corpus(src, out, vocab_size=512)``):
        tokenizer: ``"bpe"`` to train a byte-level BPE of ``vocab_size`` on the training split,
            or an existing tokenizer (tokenizer.json, a directory holding one, a model spec).
        heldout_fraction: expected fraction of documents held out by the MD5 rule; ``None`` =
            ``clip(200_000 / total characters, 0.002, 0.05)`` (0.2 % is the paper's value).
        seed: seeds the permutation of document order within each split.
        max_documents: use only the first N documents of the source.
        chunk_chars: plain-text paragraphs are grouped into documents of at least this many
            characters.
        shuffle: permute document order with ``seed`` (memory ~ corpus tokens); False streams
            documents in source order.

    Returns:
        The opened :class:`TokenShards`.

    Raises:
        InductionLabError: empty corpus, bad fraction, empty split, bad source or tokenizer.
        TypeError: an option that is no field of :class:`CorpusConfig`.
    """
    c = replace(cfg or CorpusConfig(), **options)
    tokenizer, vocab_size, heldout_fraction, seed = c.tokenizer, c.vocab_size, c.heldout_fraction, c.seed
    text_field, max_documents, chunk_chars, shuffle = c.text_field, c.max_documents, c.chunk_chars, c.shuffle
    if heldout_fraction is not None and not 0.0 <= heldout_fraction < 1.0:
        raise InductionLabError(f"heldout_fraction must be in [0, 1), got {heldout_fraction}")
    if max_documents is not None and max_documents < 1:
        raise InductionLabError(f"max_documents must be >= 1, got {max_documents}")
    if seed < 0:
        raise InductionLabError(f"seed must be >= 0, got {seed}")
    if tokenizer == "bpe":
        check_bpe_vocab_size(vocab_size)
    out_dir = check_output_dir(out_dir, inputs=[x for x in (source, tokenizer) if isinstance(x, (str, os.PathLike))])
    if own_entries(out_dir) and not overwrite:
        raise InductionLabError(f"output directory {out_dir} already exists and is not empty; "
                                "pass a new --out or --overwrite")
    src = resolve_source(source, text_field=text_field, chunk_chars=chunk_chars)

    def docs() -> Iterator[str]:
        return _limited(src.documents(), max_documents)

    # Pass 1: hash every document, count characters.
    units, chars = [], []
    corpus_hash = hashlib.sha256()
    for d in docs():
        h = hashlib.md5(d.encode("utf-8"))
        corpus_hash.update(h.digest())
        units.append(int(h.hexdigest(), 16) / float(2 ** 128))
        chars.append(len(d))
    if not units:
        raise InductionLabError(f"corpus {source!s} has no non-empty document; check the path "
                                "and --text-field")
    total_chars = int(sum(chars))
    fraction = auto_heldout_fraction(total_chars) if heldout_fraction is None else heldout_fraction
    held = np.asarray(units) < fraction
    n_held = int(held.sum())
    if n_held == len(units):
        raise InductionLabError(f"all {len(units)} documents fell in the held-out split "
                                f"(fraction {fraction}); lower --heldout-fraction")
    if fraction > 0 and n_held == 0:
        raise InductionLabError(f"the held-out split is empty ({len(units)} documents, fraction "
                                f"{fraction:.4g}); raise --heldout-fraction, add documents, or "
                                "pass 0 for no held-out split")

    # Pass 2: the tokenizer (a BPE sees the training split only).
    if tokenizer == "bpe":
        info: TokenizerInfo = train_bpe((d for d, h in zip(docs(), held) if not h), vocab_size)
    else:
        info = load_tokenizer(tokenizer)
    tok = info.tokenizer
    vocab = info.vocab_size
    dtype = token_dtype(vocab)

    # Pass 3: tokenise; each document followed by EOS.
    out_dir = Path(out_dir)
    with staged_run_dir(out_dir, overwrite=overwrite) as stage:
        per_split: dict[str, list[np.ndarray]] = {s: [] for s in SPLITS}
        counts = {s: {"documents": 0, "tokens": 0, "characters": 0} for s in SPLITS}
        files = {s: open(stage / f"{s}.bin", "wb") for s in SPLITS}
        eos = np.array([info.eos_id], dtype=dtype)
        try:
            batch: list[tuple[str, bool]] = []

            def flush() -> None:
                enc = tok.encode_batch([d for d, _ in batch], add_special_tokens=False)
                for (d, h), e in zip(batch, enc):
                    split = "heldout" if h else "train"
                    ids = np.concatenate([np.asarray(e.ids, dtype=dtype), eos])
                    counts[split]["documents"] += 1
                    counts[split]["tokens"] += int(ids.size)
                    counts[split]["characters"] += len(d)
                    if shuffle:
                        per_split[split].append(ids)
                    else:
                        files[split].write(ids.tobytes())
                batch.clear()

            for d, h in zip(docs(), held):
                batch.append((d, bool(h)))
                if len(batch) >= 256:
                    flush()
            if batch:
                flush()
            if shuffle:
                rng = np.random.default_rng(seed)
                for s in SPLITS:
                    for i in rng.permutation(len(per_split[s])):
                        files[s].write(per_split[s][i].tobytes())
        finally:
            for f in files.values():
                f.close()
        for s in SPLITS:
            counts[s]["sha256"] = sha256_file(stage / f"{s}.bin")
        _save_tokenizer(info, stage)
        manifest = {
            "format": FORMAT,
            "source": src.describe(),
            "corpus_sha256": corpus_hash.hexdigest(),
            "documents": len(units),
            "characters": total_chars,
            "max_documents": max_documents,
            "heldout_fraction": fraction,
            "heldout_fraction_requested": "auto" if heldout_fraction is None else heldout_fraction,
            "split_rule": "heldout iff int(md5(utf8(document)), 16) / 2**128 < heldout_fraction",
            "seed": seed,
            "shuffle": shuffle,
            "dtype": dtype.name,
            "tokenizer": {**info.describe(), "file": "tokenizer.json",
                          "vocab_size_requested": vocab_size if tokenizer == "bpe" else None,
                          "sha256": sha256_file(stage / "tokenizer.json")},
            "splits": counts,
            "versions": versions(),
        }
        atomic_write_json(stage / "manifest.json", manifest)
    return TokenShards.open(out_dir)


def _save_tokenizer(info: TokenizerInfo, d: Path) -> None:
    """tokenizer.json plus tokenizer_config.json (EOS/BOS) via transformers' save_pretrained."""
    from transformers import PreTrainedTokenizerFast
    tok = info.tokenizer
    kw = {"eos_token": tok.id_to_token(info.eos_id)}
    if info.bos_id is not None:
        kw["bos_token"] = tok.id_to_token(info.bos_id)
    hf = PreTrainedTokenizerFast(tokenizer_object=tok, **kw)
    hf.save_pretrained(str(d))
    if not (d / "tokenizer.json").is_file():  # pragma: no cover - transformers always writes it
        tok.save(str(d / "tokenizer.json"))


__all__ = ["TokenShards", "prepare_corpus", "token_dtype", "md5_unit", "FORMAT"]
