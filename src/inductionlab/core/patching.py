"""Batched activation patching of the last tokens of a prompt: one forward scores many patch sets at once.

A *patch set* is a list of ``(layer, head, value)``: each named query head's output (the input of its layer's
output projection, the head's slice, ``[head_dim]``) set to ``value`` at one position of the prompt's last tokens.
Patching one head at a time and reading its effect on the next-token logits is the activation patching of
Todd et al. 2024 ("Function Vectors in Large Language Models", arXiv 2310.15213, code
``ericwtodd/function_vectors``: one forward per (prompt, head), an ``o_proj`` pre-hook) and of Feucht, Wallace
& Bau 2025 ("The Dual-Route Model of Induction", arXiv 2504.03022, ``scripts/causal_scores.py``: the same at the
second-to-last position); TransformerLens likewise keeps activation patching (its ``patching.py``, one forward
per patch) apart from its hook points. The protocols that read it: :mod:`inductionlab.protocols.function_vectors`
(the FV score), :mod:`inductionlab.protocols.dual_route` (the copying scores),
:mod:`inductionlab.protocols.function_probes` (HITS@k under last-position ablations).

**Exact fast path (decision).** A patch at the last ``S`` tokens leaves every earlier position of the run as it
was, so the prompt without its last ``S`` tokens runs once and keeps its KV cache; then one forward reads many
copies of the last ``S`` tokens against it, each copy at those tokens' positions and attending to the prefix and
its own tokens only (a 4-D mask, :func:`copies_mask`), one patch set per copy (copy 0 unpatched): copy r + 1 is
the run patched by set r, bit for bit in exact arithmetic. Chunks of patch sets in order of their lowest layer
start at that layer from the unpatched residual stream there (layers below it return the recorded state instead
of running). Cost per prompt: one prefix forward plus about one forward of ``S`` × (sets + 1) tokens, against one
full forward per set. ``bench/fv_speed.py`` checks it against a port of the authors' per-head loop. Chosen over
copying the cache once per set as batch rows: that copy cost as much as the forward (SmolLM2: 0.08 s per 65 rows).

Interventions under which everything runs (``under``: a sink cut, a base ablation) apply to every forward, the
prefix's included.
"""

from __future__ import annotations

import contextlib
import copy
from typing import Iterator, Sequence

import numpy as np
import torch

from ..errors import InductionLabError
from .instrument import HeadIntervention, instrument, unwrap_model
from .models import attention_shape, cache_keyword, forward, returned_cache
from .placement import execution_device
from .reuse import decoder_layers

#: A patch set: ``(layer, head, value [head_dim])`` triples, the heads' new outputs.
PatchSet = Sequence[tuple[int, int, torch.Tensor]]


def _under(model, under: Sequence[HeadIntervention]):
    return instrument(model, list(under), strict=False) if under else contextlib.nullcontext()


@contextlib.contextmanager
def _recording(layers) -> Iterator[dict]:
    """Record each decoder layer's output (the state entering the next layer) of the forwards in the block:
    ``{v: (state entering layer v, tuple output)}`` for v = 1 .. n_layers − 1."""
    states: dict = {}

    def hook(v):
        def f(module, args, output):
            h = output[0] if isinstance(output, tuple) else output
            states[v] = (h.detach().clone(), isinstance(output, tuple))
        return f
    handles = [layers[v - 1].register_forward_hook(hook(v)) for v in range(1, len(layers))]
    try:
        yield states
    finally:
        for h in handles:
            h.remove()


@contextlib.contextmanager
def _skipping(layers, b: int, state: torch.Tensor | None, tuple_out: bool) -> Iterator[None]:
    """Layers ``0..b-1`` return ``state`` (the residual stream entering layer ``b``) instead of running: every row
    of the batch holds it there, as no patch of the batch sits below ``b``. Their KV cache slots stay unwritten,
    which no later layer reads (the cache is a throw-away copy)."""
    if b == 0 or state is None:
        yield
        return
    out = (state,) if tuple_out else state
    saved = [layer.__dict__.get("forward") for layer in layers[:b]]
    for layer in layers[:b]:
        layer.forward = lambda *a, **k: out
    try:
        yield
    finally:
        for layer, f in zip(layers[:b], saved):
            if f is None:
                del layer.forward
            else:
                layer.forward = f


def copies_mask(model, cache, prefix: int, n: int, dtype: torch.dtype, device, suffix: int = 1):
    """The additive attention mask of ``n`` copies of a prompt's last ``suffix`` tokens read after its cached
    prefix of ``prefix`` tokens: token j of a copy sees the prefix and its own copy's tokens 0..j, not the other
    copies' (0 where a key is seen, the dtype's minimum where not).

    Args:
        model: the (bare) causal LM; its config's ``layer_types`` / ``sliding_window`` say whether some layers
            attend within a window.
        cache: the prefix's KV cache (a transformers ``Cache``; its sliding layers' key count is read).
        prefix, n, suffix: the prefix length, the number of copies and the tokens per copy.
        dtype, device: of the mask (the model's parameters').

    Returns: ``[1, 1, n·suffix, prefix + n·suffix]``; for a model with sliding-window layers a dict by layer type
    (``"full_attention"``, ``"sliding_attention"``), the sliding one over the keys that layer's cache keeps (the
    most recent), each within the window of the copy's token at position ``prefix + j`` (transformers' rule:
    key position > query position − window).

    Raises: InductionLabError for a model with layer types other than full and sliding attention."""
    s = suffix
    k = torch.arange(prefix + n * s, device=device)
    q = torch.arange(n * s, device=device)
    kc, kj = (k - prefix) // s, (k - prefix) % s
    ok = (k[None, :] < prefix) | ((kc[None, :] == (q // s)[:, None]) & (kj[None, :] <= (q % s)[:, None]))
    neg = torch.finfo(dtype).min

    def additive(allowed):
        return torch.zeros(allowed.shape, dtype=dtype, device=device).masked_fill(~allowed, neg)[None, None]
    cfg = model.config
    types = list(getattr(cfg, "layer_types", None) or ())
    window = getattr(cfg, "sliding_window", None)
    if "sliding_attention" in types and window:
        kept = cache.layers[types.index("sliding_attention")].keys.shape[-2]    # the sliding cache's recent keys
        kpos = torch.where(k < prefix, k, prefix + kj)
        near = (((prefix + q % s)[:, None] - kpos[None, :]) < window) & ok      # transformers: kv > q - window
        return {t: additive(near[:, prefix - kept:]) if t == "sliding_attention" else additive(ok) for t in set(types)}
    if set(types) - {"full_attention"}:
        raise InductionLabError(f"{type(model).__name__} has layer types {sorted(set(types))} the batched patching "
                                "fast path does not handle")
    return additive(ok)


def patched_suffix_logits(model, ids: Sequence[int], patches: Sequence[PatchSet], *, suffix: int = 2, at: int = 0,
                          rows: int = 64, under: Sequence[HeadIntervention] = (), skip: bool = True
                          ) -> tuple[torch.Tensor, torch.Tensor, np.ndarray]:
    """The logits of the last ``suffix`` positions of ``ids`` unpatched and under each patch set, by the exact fast
    path of the module docstring: each patch set writes its heads' outputs at suffix token ``at`` (0: position
    ``−suffix``); every other position keeps the unpatched run's values. The FV score reads one token per copy
    (:func:`patched_last_logits`), the dual-route copying scores two (patched at the first).

    Args:
        model: a causal LM (a LoadedModel's ``model`` or a wrapper :func:`~inductionlab.core.instrument.unwrap_model`
            unwraps); its attention must be instrumentable (:mod:`inductionlab.core.instrument`).
        ids: the prompt's token ids (more than ``suffix``).
        patches: patch sets, each a non-empty list of ``(layer, head, value [head_dim])``.
        suffix: the last tokens read per copy; at: the suffix token the patches write.
        rows: patch sets per forward.
        under: interventions applied in every forward (e.g. a base ablation).
        skip: start each chunk at its lowest patched layer (architectures of
            :func:`~inductionlab.core.reuse.decoder_layers`); False: every chunk runs all layers.

    Returns:
        ``(base, logits, changed)``: float32 ``[suffix, V]``, the unpatched copy of the first forward; float32
        ``[P, suffix, V]``, patch set i in row i; bool ``[P]``, whether any head of the set took another value
        than it had (a set that changed nothing is the unpatched run: its row is its forward's unpatched copy).

    Raises: InductionLabError for too short a prompt (``len(ids) <= suffix``), ``suffix < 1``, ``at`` outside the
        suffix, ``rows < 1``, an empty patch set; what :func:`copies_mask` refuses."""
    model = unwrap_model(model)
    S = int(suffix)
    if S < 1 or len(ids) <= S or not 0 <= at < S:
        raise InductionLabError(f"a prompt of {len(ids)} tokens with a suffix of {S} patched at suffix token {at}: "
                                "need 1 <= suffix < len(ids) and 0 <= at < suffix")
    if rows < 1:
        raise InductionLabError(f"rows must be >= 1, got {rows}")
    if any(not ps for ps in patches):
        raise InductionLabError("an empty patch set; give each at least one (layer, head, value)")
    layers = decoder_layers(model) if skip else None
    L = attention_shape(model.config)["n_layers"]
    below = min((iv.layer for iv in under), default=L)
    p = next(model.parameters())
    dev = execution_device(model)
    x = torch.tensor([list(ids)], device=dev)
    P0 = x.shape[1] - S
    order = sorted(range(len(patches)), key=lambda i: min(int(l) for l, _, _ in patches[i]))
    out = [None] * len(patches)
    changed = np.zeros(len(patches), dtype=bool)
    base = None
    states: dict = {}
    kv = cache_keyword(model)
    with torch.inference_mode():
        with _under(model, under):
            prefix = returned_cache(forward(model, x[:, :P0], keep=1, use_cache=True))
            if layers is not None:
                with _recording(layers) as states:
                    model(input_ids=x[:, P0:], **{kv: copy.deepcopy(prefix)}, use_cache=True)
        for start in range(0, len(order), rows):
            chunk = order[start:start + rows]
            n = len(chunk) + 1
            b = min(min(min(int(l) for l, _, _ in patches[i]) for i in chunk), below) if layers is not None else 0
            state, tuple_out = states.get(b, (None, False))
            ivs, owner = [], []
            for r, i in enumerate(chunk):                                # copy 0: unpatched
                for l, h, v in patches[i]:
                    ivs.append(HeadIntervention(int(l), int(h), "mean", value=v, positions=(P0 + (r + 1) * S + at,)))
                    owner.append(i)
            state = None if state is None else state.repeat(1, n, 1)
            kw = {"input_ids": x[:, P0:].repeat(1, n),
                  "position_ids": (P0 + torch.arange(S, device=dev)).repeat(n)[None],
                  "attention_mask": copies_mask(model, prefix, P0, n, p.dtype, dev, suffix=S)}
            with instrument(model, [*under, *ivs], strict=False) as inst, _skipping(layers, b, state, tuple_out):
                logits = model(**kw, **{kv: copy.deepcopy(prefix)}, use_cache=True).logits[0].float()
            logits = logits.reshape(n, S, -1)
            base = logits[0] if base is None else base
            for j, i in enumerate(owner):
                changed[i] |= inst.effect[len(under) + j]
            for r, i in enumerate(chunk):
                out[i] = logits[r + 1] if changed[i] else logits[0]
    return base, torch.stack(out), changed


def patched_last_logits(model, ids: Sequence[int], patches: Sequence[PatchSet], *, rows: int = 90,
                        under: Sequence[HeadIntervention] = (), skip: bool = True
                        ) -> tuple[torch.Tensor, torch.Tensor, np.ndarray]:
    """The last position's logits of ``ids`` unpatched and under each patch set: :func:`patched_suffix_logits`
    with one token per copy (Todd et al. 2024's last-token patch, the FV score's).

    One forward reads ``ids`` without its last token and keeps its KV cache. Then, per chunk of ``rows`` patch
    sets (taken in order of their lowest layer), one forward reads ``rows + 1`` copies of the last token against
    that cache, each copy at the last token's position and attending to the prefix and itself only; in copy i + 1
    the heads of patch set i have their output set to the given values (copy 0 unpatched).

    Args:
        ids: the prompt's token ids (at least 2).
        patches: patch sets, each a list of ``(layer, head, value [head_dim])``: the head's last-position output
            (the input of ``o_proj``) set to ``value``.
        rows, under, skip: as :func:`patched_suffix_logits`.

    Returns:
        ``(base, logits, changed)``: float32 ``[V]``, the unpatched copy of the first forward; float32 ``[P, V]``,
        patch set i in row i; bool ``[P]``, whether any head of the set took another value than it had.

    Raises: InductionLabError for fewer than 2 tokens, ``rows < 1``, an empty patch set."""
    if len(ids) < 2:
        raise InductionLabError("a prompt needs at least 2 tokens (a prefix and the last position)")
    base, logits, changed = patched_suffix_logits(model, ids, patches, suffix=1, rows=rows, under=under, skip=skip)
    return base[0], logits[:, 0], changed


__all__ = ["PatchSet", "copies_mask", "patched_suffix_logits", "patched_last_logits"]
