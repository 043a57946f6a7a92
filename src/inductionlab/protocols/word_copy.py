"""The word-list copy probe (SPEC §10, issue 26): does the model copy a multi-token item verbatim, and does it
copy real words, word-like nonsense and random ids alike?

One trial is a numbered list of ``n_items`` items shown once, a blank line, then the same list again up to the
last item's number (assembled from token ids, never by re-tokenising text)::

    <BOS>1.␣w1\\n2.␣w2\\n … 10.␣w10\\n
    \\n
    1.␣w1\\n2.␣w2\\n … 10.          ← scored: the first token of w10

Item kinds (Feucht, Wallace & Bau 2025, "The Dual-Route Model of Induction", arXiv 2504.03022: words vs
random-token entities; the middle kind is this project's). Every list ``t`` gives one trial of each kind, with
the same item lengths in tokens, so the kinds differ in what the items are made of, not in their length:

* ``word`` — real English words (wordfreq's most frequent, alphabetic ASCII) that encode, with a leading space,
  to one of ``lengths`` tokens under the model's own tokenizer;
* ``nonsense`` — word-like strings of ordinary ids: a first token drawn from the first tokens of the word pool
  (so it starts like a word, leading space included) and the rest from the pool's non-first tokens (word
  pieces), redrawn when the result is a word of the pool;
* ``random`` — uniformly random ordinary ids (not special, not a token of the list's template).

Per trial (:func:`measure_batch`): ``p_first``, the probability of the last item's first token at the scored
position; ``top1``, whether it is the arg-max; with ``generate``, the greedy continuation (``max(lengths) + 1``
tokens with a KV cache, the ablation applied to every position of every step). :func:`copy_outcomes` then reads the
continuations with the tokenizer:

* **verbatim** — the first ``len(item)`` generated ids are the item's ids;
* **paraphrase** (a simple, documented definition; decision) — not verbatim, and the first alphabetic run of the
  decoded continuation (``[A-Za-z]+`` after leading spaces) is a real word — wordfreq Zipf frequency ≥
  :data:`REAL_WORD_ZIPF` — that is neither the item's own text nor a prefix of it (a truncated copy is not a
  paraphrase), case ignored. A synonym, a re-spelling or a neighbouring list word all count; for nonsense and
  random items a paraphrase is any real word produced in the item's place.

Trials of different lengths are left-padded (:meth:`~inductionlab.protocols.runner.Trials.padded`); the order is
all lists of kind ``word``, then ``nonsense``, then ``random`` (``kind`` and ``list_index`` travel with them).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from functools import partial

import numpy as np
import torch

from ..core.models import LoadedModel
from ..core.stimuli import ordinary_token_ids, seed_for
from ..errors import InductionLabError
from .configs import WordCopyConfig
from .runner import Probe, Trials, auto_batch_size, forward_logits, greedy_tokens, trim_padding

KINDS = ("word", "nonsense", "random")
REAL_WORD_ZIPF = 2.0      # decision: a "real word" for paraphrases (Zipf 2 = about once per 10^7 words)
_STREAM = 13              # seed stream of the lists (apart from the lag probe's and serial recall's)
_TRIES = 1000             # draws of a nonsense item before giving up (all combinations are words)


@dataclass(frozen=True)
class Template:
    """The token ids of a list's template: ``markers[i]`` = ``"{i+1}."``, ``newline`` = ``"\\n"``, ``bos``."""
    markers: list[list[int]]
    newline: list[int]
    bos: list[int]

    @property
    def ids(self) -> set[int]:
        return {i for m in self.markers for i in m} | set(self.newline) | set(self.bos)


def make_template(tokenizer, n_items: int, bos: bool = True) -> Template:
    """The template pieces encoded once (no special tokens). Raises InductionLabError: ``bos`` without a BOS."""
    enc = lambda t: tokenizer.encode(t, add_special_tokens=False)   # noqa: E731
    head = []
    if bos:
        if tokenizer.bos_token_id is None:
            raise InductionLabError("the tokenizer has no BOS token; the copy probe prepends one")
        head = [int(tokenizer.bos_token_id)]
    return Template([enc(f"{i}.") for i in range(1, n_items + 1)], enc("\n"), head)


def copy_prompt(items, template: Template) -> list[int]:
    """Token ids of one trial: the numbered list of ``items`` (each a sequence of ids), a blank line, then the list
    again up to the last item's marker. The model's next token after these ids should be ``items[-1][0]``.

    Raises ValueError: fewer markers than items."""
    if len(template.markers) < len(items):
        raise ValueError(f"{len(items)} items but {len(template.markers)} markers")
    ids = list(template.bos)
    for marker, item in zip(template.markers, items):
        ids += marker + list(item) + template.newline
    ids += template.newline
    for marker, item in zip(template.markers[:len(items) - 1], items[:-1]):
        ids += marker + list(item) + template.newline
    return ids + template.markers[len(items) - 1]


def word_pool(tokenizer, lengths, n_candidates: int) -> dict[int, list[tuple[tuple[int, ...], str]]]:
    """``{length: [(ids, word), ...]}``: wordfreq's ``n_candidates`` most frequent English words (alphabetic ASCII,
    at least 2 letters) that encode with a leading space to ``length`` tokens, distinct id tuples, frequency order."""
    from wordfreq import top_n_list

    want = set(int(n) for n in lengths)
    special = set(getattr(tokenizer, "all_special_ids", []) or [])
    out: dict[int, list] = {n: [] for n in sorted(want)}
    seen = set()
    for w in top_n_list("en", int(n_candidates)):
        if not (w.isascii() and w.isalpha() and len(w) >= 2):
            continue
        ids = tuple(tokenizer.encode(" " + w, add_special_tokens=False))
        if len(ids) in want and ids not in seen and not special & set(ids):
            seen.add(ids)
            out[len(ids)].append((ids, w))
    return out


@dataclass
class CopyLists:
    """Every list of a run: ``items[kind][t]`` the ``n_items`` id tuples of list ``t``; ``words[t]`` the real
    words of list ``t`` (text)."""
    items: dict[str, list[list[tuple[int, ...]]]]
    words: list[list[str]]


def build_lists(tokenizer, cfg: WordCopyConfig, template: Template, vocab_size: int) -> CopyLists:
    """The lists of every kind (module docstring). List ``t`` draws from ``seed_for(cfg.seed, 13, t)``: its item
    lengths (uniform over ``cfg.lengths``), its words, its nonsense and random items of the same lengths.

    Raises:
        InductionLabError: a length with fewer words than a list needs (the message gives the fix)."""
    pool = word_pool(tokenizer, cfg.lengths, cfg.word_pool)
    short = {n: len(v) for n, v in pool.items() if len(v) < cfg.n_items}
    if short:
        raise InductionLabError(f"--copy-lengths: only {short} words of those token lengths among wordfreq's top "
                                f"{cfg.word_pool} under this tokenizer, {cfg.n_items} needed per list; give other "
                                "--copy-lengths or fewer --copy-items")
    known = {ids for v in pool.values() for ids, _ in v}
    firsts = sorted({ids[0] for ids in known})
    rests = sorted({i for ids in known for i in ids[1:]})
    banned = template.ids | set(getattr(tokenizer, "all_special_ids", []) or [])
    ordinary = [int(i) for i in ordinary_token_ids(vocab_size, banned, tokenizer)]
    lengths = sorted(pool)
    if max(lengths) > 1 and not rests:
        raise InductionLabError("no word pieces found for nonsense items; give --copy-lengths 1 or another tokenizer")
    items = {k: [] for k in KINDS}
    words = []
    for t in range(cfg.n_lists):
        rng = np.random.default_rng(seed_for(cfg.seed, _STREAM, t))
        lens = [lengths[i] for i in rng.integers(len(lengths), size=cfg.n_items)]
        chosen, texts = [], []
        for n in lens:                                   # distinct words within a list
            while True:
                ids, w = pool[n][int(rng.integers(len(pool[n])))]
                if ids not in chosen:
                    break
            chosen.append(ids)
            texts.append(w)
        nonsense = []
        for n in lens:
            for _ in range(_TRIES):
                ids = (firsts[int(rng.integers(len(firsts)))],) + tuple(rests[int(j)] for j in
                                                                       rng.integers(len(rests), size=n - 1))
                if ids not in known and ids not in nonsense:
                    break
            else:
                raise InductionLabError(f"no nonsense item of {n} token(s) that is not a word of the pool (every "
                                        "piece combination is a word); give --copy-lengths of 2 or more tokens")
            nonsense.append(ids)
        rand = [tuple(ordinary[int(j)] for j in rng.integers(len(ordinary), size=n)) for n in lens]
        items["word"].append(chosen)
        items["nonsense"].append(nonsense)
        items["random"].append(rand)
        words.append(texts)
    return CopyLists(items, words)


def build_trials(loaded: LoadedModel, cfg: WordCopyConfig) -> Trials:
    """All trials: ``ids`` / ``attention_mask`` / ``position_ids`` ``[n, T]`` (left-padded), ``target`` ``[n,
    max(lengths)]`` (the last item's ids, 0-padded), ``target_len`` ``[n]``, ``kind`` ``[n]`` (index into
    :data:`KINDS`), ``list_index`` ``[n]``; kinds in blocks of ``n_lists``. Words: every real word used.

    Raises:
        InductionLabError: see :func:`build_lists`; a trial longer than the model's context."""
    cfg.validate()
    tok = loaded.tokenizer
    template = make_template(tok, cfg.n_items)
    vocab = (loaded.identity or {}).get("vocab_size") or len(tok)
    lists = build_lists(tok, cfg, template, vocab)
    seqs, target, tlen, kind, index = [], [], [], [], []
    width = max(cfg.lengths)
    for k, name in enumerate(KINDS):
        for t, items in enumerate(lists.items[name]):
            seqs.append(copy_prompt(items, template))
            last = list(items[-1])
            target.append(last + [0] * (width - len(last)))
            tlen.append(len(last))
            kind.append(k)
            index.append(t)
    ctx = (loaded.identity or {}).get("max_position_embeddings")
    longest = max(len(s) for s in seqs) + (width + 1 if cfg.generate else 0)
    if ctx and longest > ctx:
        raise InductionLabError(f"a copy-probe trial of {longest} tokens exceeds the model's context of {ctx}; "
                                "use fewer --copy-items or shorter --copy-lengths")
    from .function_probes import default_pad_id
    L = lambda v: torch.tensor(v, dtype=torch.long)   # noqa: E731
    tr = Trials.padded(seqs, default_pad_id(tok), target=L(target), target_len=L(tlen), kind=L(kind),
                       list_index=L(index))
    tr.words = sorted({w for ws in lists.words for w in ws})
    return tr


def measure_batch(model, batch: dict[str, torch.Tensor], cfg: WordCopyConfig) -> dict[str, torch.Tensor]:
    """One batch → ``p_first`` float64 ``[b]`` (probability of the last item's first token), ``top1`` bool ``[b]``,
    and with ``cfg.generate`` ``generated`` long ``[b, max(lengths) + 1]`` (greedy tokens,
    :func:`~inductionlab.protocols.runner.greedy_tokens`: one prompt forward with a KV cache, then a single-token
    forward per token, under the condition's ablation); ``target``, ``target_len``, ``kind``, ``list_index`` echoed."""
    batch = trim_padding(batch)
    ids, mask, pos = batch["ids"], batch["attention_mask"], batch["position_ids"]
    if cfg.generate:
        logits, generated = greedy_tokens(model, ids, max(cfg.lengths) + 1, attention_mask=mask, position_ids=pos)
    else:
        logits = forward_logits(model, ids, 1, attention_mask=mask, position_ids=pos)[:, -1]     # [b, V]
    first = batch["target"][:, 0]
    p = torch.softmax(logits, -1).gather(1, first[:, None])[:, 0].double()
    out = {"p_first": p, "top1": logits.argmax(-1) == first,
           **{k: batch[k].cpu() for k in ("target", "target_len", "kind", "list_index")}}
    if cfg.generate:
        out["generated"] = generated
    return out


def batch_size(loaded, trials: Trials, cfg: WordCopyConfig) -> int | None:
    """Prompts per forward: ``cfg.batch_size``; else from free GPU memory at the longest prompt (8 on a CPU)."""
    if cfg.batch_size or not len(trials):
        return cfg.batch_size
    return auto_batch_size(loaded, trials.tensors["ids"].shape[1] + max(cfg.lengths) + 1)


def probe(cfg: WordCopyConfig) -> Probe:
    """The copy probe bound to ``cfg`` (:func:`build_trials`, :func:`measure_batch`, :func:`batch_size`).

    Raises InductionLabError: ``cfg`` invalid."""
    cfg.validate()
    return Probe("word-list copy", partial(build_trials, cfg=cfg), partial(measure_batch, cfg=cfg),
                 partial(batch_size, cfg=cfg), cfg.method, cfg.reuse_residual, cfg.positions)


_WORD = re.compile(r"\s*([A-Za-z]+)")


def copy_outcomes(tokenizer, generated, target, target_len) -> dict[str, np.ndarray]:
    """``verbatim`` and ``paraphrase`` bool ``[n]`` from greedy continuations (module docstring).

    Args:
        generated: ``[n, G]`` greedy ids; target: ``[n, W]`` the item's ids (padded); target_len: ``[n]``."""
    from wordfreq import zipf_frequency

    generated, target, target_len = np.asarray(generated), np.asarray(target), np.asarray(target_len)
    n = len(target_len)
    verbatim = np.array([np.array_equal(generated[i, :target_len[i]], target[i, :target_len[i]]) for i in range(n)],
                        dtype=bool)
    para = np.zeros(n, dtype=bool)
    for i in np.flatnonzero(~verbatim):
        m = _WORD.match(tokenizer.decode([int(x) for x in generated[i]]))
        item = tokenizer.decode([int(x) for x in target[i, :target_len[i]]]).strip().lower()
        if m is None:
            continue
        w = m.group(1).lower()
        para[i] = zipf_frequency(w, "en") >= REAL_WORD_ZIPF and w != item and not item.startswith(w)
    return {"verbatim": verbatim, "paraphrase": para}


def kind_measures(arrays: dict[str, np.ndarray], tokenizer=None) -> dict[str, dict[str, np.ndarray]]:
    """Per kind, per-list measures ``[n_lists]`` (float64) of one condition's arrays: ``p_first``, ``top1`` and,
    where generated (and ``tokenizer`` given), ``verbatim`` and ``paraphrase``; lists in ``list_index`` order."""
    kind, idx = np.asarray(arrays["kind"]), np.asarray(arrays["list_index"])
    extra = copy_outcomes(tokenizer, arrays["generated"], arrays["target"], arrays["target_len"]) \
        if "generated" in arrays and tokenizer is not None else {}
    out = {}
    for k, name in enumerate(KINDS):
        sel = np.flatnonzero(kind == k)
        sel = sel[np.argsort(idx[sel], kind="stable")]
        out[name] = {m: np.asarray(v)[sel].astype(np.float64) for m, v in
                     {"p_first": arrays["p_first"], "top1": arrays["top1"], **extra}.items()}
    return out


__all__ = ["KINDS", "REAL_WORD_ZIPF", "Template", "make_template", "copy_prompt", "word_pool", "CopyLists",
           "build_lists", "build_trials", "measure_batch", "batch_size", "probe", "copy_outcomes", "kind_measures",
           "WordCopyConfig"]
