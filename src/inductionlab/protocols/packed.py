"""The lag probe's all-cue packed forward (issue 17): every chosen cue of a list read in one forward.

The list part of a lag-probe trial (``[BOS] w1 … wL``) is the same whatever the cue, so it runs once
and every chosen list position i is cued by the seed trial's own cue tokens ``sep w_i sep`` appended
after it. One packed forward reads ``[list ; cue_1 ; cue_2 ; …]`` with a 4-D additive attention mask
(list tokens: causal over the list; cue tokens: the whole list and their own cue, causally; a
sliding-window layer also applies its window, on position ids) and explicit position ids (each cue's
tokens take the positions they have in the single-cue trial), so cue i reads what the single-cue
trial with ``cue_position=i`` reads (equal within 1e-5 in fp32: tests/test_lag_probe_cues.py). The
logits are read at each cue's last token only (:func:`~inductionlab.protocols.runner.forward_logits`
with an index ``keep``).

Cues go in chunks whose tokens do not outnumber the list's (:func:`cue_chunk`), so a forward holds at
most twice the seed trial's tokens. Chosen over a KV cache of the list reused by the cue tokens: that
forward was 10% faster (SmolLM2, fp32, one thread: 3.5 s against 4.0 s per trial) but a cached call
cannot take the residual reuse across conditions (:mod:`inductionlab.core.reuse`, 20% of the lag-probe
phase), and the packed forward is one ordinary call of the model.
"""

from __future__ import annotations

import inspect
import sys

import torch

from ..errors import InductionLabError
from .runner import forward_logits


def check_packed_support(model) -> None:
    """Refuse an architecture that cannot take the all-cue forward: it must build its masks with
    transformers' ``masking_utils`` (which passes a prepared 4-D mask through as it is), take
    ``position_ids``, and have no chunked attention.

    Raises:
        InductionLabError: one line naming the model class and the fix (``--cues seed``)."""
    mod = sys.modules.get(type(getattr(model, "base_model", model)).__module__)
    cfg = getattr(model, "config", None)
    ok = (mod is not None and hasattr(mod, "create_causal_mask") and cfg is not None
          and "position_ids" in inspect.signature(model.forward).parameters
          and getattr(cfg, "attention_chunk_size", None) is None)
    if not ok:
        raise InductionLabError(f"{type(model).__name__} cannot take the all-cue lag probe's custom attention mask; "
                                "use --cues seed (one cue per forward)")


def cue_chunk(list_tokens: int, cue_tokens: int, chunk: int | None = None) -> int:
    """Cues per packed forward: ``chunk``, or as many as keep the cue tokens (``cue_tokens`` each) at
    most the list's ``list_tokens`` (at least one)."""
    return chunk or max(1, list_tokens // cue_tokens)


def packed_cue_batch(model, ids: torch.Tensor, list_ids: torch.Tensor, start: int, cues: list[int]):
    """The all-cue forward's inputs for one chunk of cues.

    Args:
        ids: ``[b, T]`` seed trials; ``ids[:, :start]`` is the list part (prefix + words and
            separators) and ``ids[:, start:]`` the seed cue's tokens ``sep w sep``.
        list_ids: ``[b, L]`` the word at each list position.
        cues: 1-based list positions to cue.

    Returns:
        ``(kwargs, readout)``: model keyword arguments ``input_ids`` ``[b, start + n·c]`` (the list,
        then each cue's ``sep w_i sep``), ``attention_mask`` additive in the model dtype
        ``[1, 1, T', T']``, the same for every row (a dict by layer type where the model has sliding-window layers) and
        ``position_ids`` ``[b, T']``; ``readout`` LongTensor ``[n]``: index of each cue's last token.

    Raises:
        InductionLabError: the model has layer types other than full and sliding-window attention.
    """
    b, T = ids.shape
    c = T - start
    s = (c - 1) // 2
    dev = ids.device
    sep = ids[:, start:start + s]
    idx = torch.as_tensor(cues, device=dev) - 1
    words = list_ids[:, idx]                                                   # [b, n]
    n = len(cues)
    block = torch.cat([sep[:, None, :].expand(b, n, s), words[:, :, None], sep[:, None, :].expand(b, n, s)], 2)
    input_ids = torch.cat([ids[:, :start], block.reshape(b, n * c)], 1)
    Tp = input_ids.shape[1]
    pos = torch.cat([torch.arange(start, device=dev), (start + torch.arange(c, device=dev)).repeat(n)])
    group = torch.cat([torch.full((start,), -1, device=dev), torch.arange(n, device=dev).repeat_interleave(c)])
    q, k = torch.arange(Tp, device=dev)[:, None], torch.arange(Tp, device=dev)[None, :]
    allowed = (k <= q) & ((group[None, :] == -1) | (group[None, :] == group[:, None]))
    dtype = next(model.parameters()).dtype
    neg = torch.finfo(dtype).min

    def additive(ok):
        return torch.zeros(Tp, Tp, dtype=dtype, device=dev).masked_fill(~ok, neg)[None, None]   # broadcast over b

    mask = additive(allowed)
    cfg = model.config
    types = set(getattr(cfg, "layer_types", None) or ())
    window = getattr(cfg, "sliding_window", None)
    if "sliding_attention" in types and window:
        near = (pos[:, None] - pos[None, :]) < window                          # transformers: kv > q - window
        mask = {t: (additive(allowed & near) if t == "sliding_attention" else mask) for t in types}
    elif types - {"full_attention"}:
        raise InductionLabError(f"{type(model).__name__} has layer types {sorted(types)} the all-cue lag probe "
                                "does not handle; use --cues seed")
    readout = start + torch.arange(n, device=dev) * c + c - 1
    return {"input_ids": input_ids, "attention_mask": mask, "position_ids": pos[None].expand(b, Tp)}, readout


def cue_logits(model, ids: torch.Tensor, list_ids: torch.Tensor, start: int, cues: list[int]) -> torch.Tensor:
    """Float32 next-token logits ``[b, n, V]`` after each of the ``n`` ``cues`` (1-based list positions)
    from one packed forward (:func:`packed_cue_batch`; arguments as there), the LM head run at the
    cues' last tokens only."""
    kw, readout = packed_cue_batch(model, ids, list_ids, start, cues)
    return forward_logits(model, kw.pop("input_ids"), readout, **kw)


# ---------------------------------------------------------------------------------------------
# Words of several tokens: each cue, then one teacher-forced copy of a list word per scored lag


def _additive(allowed: torch.Tensor, dtype) -> torch.Tensor:
    return torch.zeros(allowed.shape, dtype=dtype, device=allowed.device).masked_fill(~allowed, torch.finfo(dtype).min)


def packed_word_batch(model, ids: torch.Tensor, word_ids: torch.Tensor, word_len: torch.Tensor, sep: list[int],
                      cues: list[int], lags: list[int]):
    """The packed forward's inputs for lists of multi-token words: after the list, per cue c a **cue block**
    ``sep w_c sep`` (left-padded to the longest word) and, per scored lag k, a **branch** holding all but the last
    token of the word at list position ``c + k`` (right-padded), which attends to the list, its cue block and itself
    (teacher forcing): the branch's tokens read what a single-cue trial continued by that word reads.

    Args:
        ids: ``[b, S]`` the list part (prefix, words and separators), the same length in every row.
        word_ids: ``[b, L, M]`` each list position's tokens, padded after ``word_len`` with any id.
        word_len: ``[b, L]`` each list position's number of tokens.
        sep: the separator's ids (``[]`` for a space list).
        cues: 1-based list positions; lags: the scored lags (a target outside the list gets the cue's own word;
            the caller discards it).

    Returns:
        ``(kwargs, readout)``: ``input_ids`` ``[b, T']``, ``attention_mask`` additive ``[b, 1, T', T']`` (a dict by
        layer type with sliding-window layers), ``position_ids`` ``[b, T']``; ``readout`` LongTensor
        ``[n·(1 + K·(M−1))]``: per cue its last token, then per lag the branch's ``M − 1`` tokens (the same
        positions in every row; a padded one is read and discarded).

    Raises:
        InductionLabError: the model has layer types other than full and sliding-window attention."""
    b, S = ids.shape
    L, M = word_ids.shape[1], word_ids.shape[2]
    s, n, K = len(sep), len(cues), len(lags)
    C, B = 2 * s + M, M - 1
    W = C + K * B
    dev = ids.device
    wl = word_len.tolist()
    wi = word_ids.tolist()
    rows, posr, realr = [], [], []
    for r in range(b):
        row, pos, real = [], [], []
        for c in cues:
            w = wi[r][c - 1][:wl[r][c - 1]]
            pad = M - len(w)
            tokens = [w[0]] * pad + list(sep) + w + list(sep)
            row += tokens
            real += [False] * pad + [True] * (C - pad)
            pos += [S] * pad + list(range(S, S + C - pad))
            after = S + C - pad
            for k in lags:
                j = c + k if 1 <= c + k <= L else c
                t = wi[r][j - 1][:wl[r][j - 1]][:-1]
                row += t + [w[0]] * (B - len(t))
                real += [True] * len(t) + [False] * (B - len(t))
                pos += list(range(after, after + B))
        rows.append(row), posr.append(pos), realr.append(real)
    input_ids = torch.cat([ids, torch.tensor(rows, dtype=ids.dtype, device=dev).reshape(b, n * W)], 1)
    Tp = S + n * W
    pos = torch.cat([torch.arange(S, device=dev).expand(b, S), torch.tensor(posr, device=dev).reshape(b, n * W)], 1)
    real = torch.cat([torch.ones(b, S, dtype=torch.bool, device=dev),
                      torch.tensor(realr, dtype=torch.bool, device=dev).reshape(b, n * W)], 1)
    # segment of each token: -1 list, else a cue block (2g) or a branch (2·(g·K + k) + 1), g the cue's index
    off = torch.arange(W, device=dev)
    within = torch.where(off < C, torch.zeros_like(off), 1 + (off - C) // max(B, 1))   # 0 cue block, 1 + k branch
    g = torch.arange(n, device=dev).repeat_interleave(W)
    w_ = within.repeat(n)
    block = torch.cat([torch.full((S,), -1, device=dev), g])
    branch = torch.cat([torch.full((S,), -1, device=dev), torch.where(w_ > 0, g * K + w_ - 1, -1)])
    q, k = torch.arange(Tp, device=dev)[:, None], torch.arange(Tp, device=dev)[None, :]
    static = (k <= q) & ((block[None, :] == -1) | ((block[None, :] == block[:, None]) & (branch[None, :] == -1))
                         | ((branch[None, :] != -1) & (branch[None, :] == branch[:, None])))
    allowed = (static[None] & real[:, None, :]) | torch.eye(Tp, dtype=torch.bool, device=dev)[None]   # [b, T', T']
    dtype = next(model.parameters()).dtype
    mask = _additive(allowed, dtype)[:, None]
    cfg = model.config
    types = set(getattr(cfg, "layer_types", None) or ())
    window = getattr(cfg, "sliding_window", None)
    if "sliding_attention" in types and window:
        near = (pos[:, :, None] - pos[:, None, :]) < window
        mask = {t: (_additive(allowed & near, dtype)[:, None] if t == "sliding_attention" else mask) for t in types}
    elif types - {"full_attention"}:
        raise InductionLabError(f"{type(model).__name__} has layer types {sorted(types)} the multi-token lag probe "
                                "does not handle; use --word-tokens 1 --cues seed")
    base = S + torch.arange(n, device=dev)[:, None] * W
    reads = torch.cat([base + C - 1, base + C + torch.arange(K * B, device=dev)[None, :]], 1)    # [n, 1 + K·B]
    return {"input_ids": input_ids, "attention_mask": mask, "position_ids": pos}, reads.reshape(-1)


def word_cue_logits(model, ids, word_ids, word_len, sep, cues, lags) -> torch.Tensor:
    """Float32 logits ``[b, n, 1 + K·(M−1), V]`` of :func:`packed_word_batch` (arguments as there): per cue, after
    its last token, then at each scored lag's branch tokens."""
    kw, readout = packed_word_batch(model, ids, word_ids, word_len, sep, cues, lags)
    out = forward_logits(model, kw.pop("input_ids"), readout, **kw)
    return out.reshape(ids.shape[0], len(cues), -1, out.shape[-1])
