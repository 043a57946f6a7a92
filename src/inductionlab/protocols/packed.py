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
