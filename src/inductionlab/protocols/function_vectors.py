"""Function-vector heads: each query head's average indirect effect (AIE) on in-context learning, and
the function vector (Todd et al. 2024, "Function Vectors in Large Language Models", arXiv 2310.15213,
code ``ericwtodd/function_vectors``; as used by Yin & Steinhardt 2025, arXiv 2502.14010). SPEC §10.

**Definition.** For a task t (:mod:`inductionlab.protocols.icl_tasks`), a clean prompt p (k demonstrations
and a query) and its corrupted twin p̃ (the same demonstrations and query, labels deranged: the task's
label-permutation control), y₁ the correct answer's first token::

    ā_h^t      = mean over the clean prompts of t of head h's output at the last position
                 (the input of o_proj, the head's slice; Todd's "query-predictive" token class)
    CIE(h, p̃)  = P(y₁ | p̃, a_h[last] ← ā_h^t) − P(y₁ | p̃)
    AIE(h)     = mean over tasks and prompts of CIE(h, p̃)

[k = 10 shots, 25 prompts per task (Todd; Yin uses 100); the same prompts give the means and the
effects, as in Todd's script.] Probabilities are softmax probabilities of the last-position logits, in
float64. Rankings: signed (heads that raise P(y₁) first) and absolute (|AIE|; FV heads split into
heads that raise and heads that lower the answer, arXiv 2606.07560).

**Exact fast path (decision).** The patch touches one query at the last position, so every earlier
position of the patched run is the corrupted run's. We run p̃ without its last token once and keep its KV
cache; then one forward reads many copies of the last token against it, each copy at the last token's
position and attending to the prefix and itself only (a 4-D mask), one head patched per copy (copy 0
unpatched): copy r is head r's patched run. Chunks of heads in layer order start at their lowest layer from
the unpatched residual stream there. Cost per prompt: one prefix forward plus about one forward of N_heads
tokens, against Todd's one full forward per (prompt, head). ``bench/fv_speed.py`` checks it against a port
of the authors' per-head loop (an ``o_proj`` pre-hook, one forward per head). Chosen over copying the cache
once per head as batch rows: that copy cost as much as the forward (SmolLM2: 0.08 s per 65 rows).

**Function vector** (Todd's ``compute_function_vector``): the sum over the top heads (default 10 by
signed AIE) of each head's task mean pushed through its layer's output projection — the head's own
write into the residual stream, ``W_O[:, slice_h] · ā_h`` (the projection's bias, if any, left out: it
is no head's). Todd's check that the heads carry the task: zero-shot HITS@1 with the vector added to
the residual stream at the last position after a middle layer [``n_layers // 3``], against the
zero-shot prompt alone and a vector made the same way from random heads.

Interventions under which everything runs (``under``: e.g. a sink cut or another ablation) apply to
every forward: the clean means, the corrupted run and the patched one.
"""

from __future__ import annotations

import contextlib
import copy
from dataclasses import dataclass, field
from typing import Iterator, Mapping, Sequence

import numpy as np
import pandas as pd
import torch

from ..core.instrument import HeadIntervention, instrument, unwrap_model
from ..core.models import attention_shape, cache_keyword, returned_cache
from ..core.placement import execution_device
from ..errors import InductionLabError
from ..measures.stats import Z95
from .icl_tasks import Prompt, Task, make_prompts

#: Output projections of attention modules, by attribute name (Llama/Qwen2/Gemma: o_proj; GPT-NeoX:
#: dense; GPT-2: c_proj; OPT/BART-style: out_proj).
OUTPUT_PROJECTIONS = ("o_proj", "dense", "c_proj", "out_proj")


@dataclass(frozen=True)
class TaskPrompts:
    """The clean prompts of one task and their corrupted twins (same index: same demonstrations and query,
    labels deranged)."""
    task: str
    clean: tuple[Prompt, ...]
    corrupted: tuple[Prompt, ...]


def task_prompts(tasks: Mapping[str, Task], tokenizer, *, shots: int = 10, n_prompts: int = 25, seed: int = 0,
                 bos_id: int | None = None) -> dict[str, TaskPrompts]:
    """Clean and corrupted prompts per task (:func:`~inductionlab.protocols.icl_tasks.make_prompts` at
    ``shots`` with the permutation control).

    Raises:
        InductionLabError: ``shots < 2`` (no derangement, so no corrupted prompt), or a task without enough
            well-defined items."""
    if int(shots) < 2:
        raise InductionLabError(f"the FV score needs at least 2 shots (the corrupted prompt deranges the "
                                f"demonstrations' labels), got {shots}")
    out = {}
    for name, task in tasks.items():
        ps = make_prompts(task, tokenizer, shots=(int(shots),), n_prompts=n_prompts, seed=seed, permuted=True,
                          bos_id=bos_id)
        clean = tuple(p for p in ps if p.control == "intact")
        corrupted = tuple(p for p in ps if p.control == "permuted")
        assert [p.index for p in clean] == [p.index for p in corrupted]
        out[name] = TaskPrompts(name, clean, corrupted)
    return out


# ---------------------------------------------------------------------------------------------
# The model's attention modules


def attention_module(model, layer: int) -> torch.nn.Module:
    """The attention module of ``layer`` (the one carrying ``layer_idx``).

    Raises: InductionLabError when the model has none with that index."""
    model = unwrap_model(model)
    for name, m in model.named_modules():
        if name.endswith(("attn", "attention", "self_attn")) and getattr(m, "layer_idx", None) == layer:
            return m
    raise InductionLabError(f"{type(model).__name__}: no attention module with layer_idx {layer}")


def output_projection(model, layer: int) -> torch.nn.Module:
    """The output projection of ``layer``'s attention (its input: the query heads' outputs side by side,
    ``[..., n_heads · head_dim]``)."""
    attn = attention_module(model, layer)
    for name in OUTPUT_PROJECTIONS:
        if isinstance(getattr(attn, name, None), torch.nn.Module):
            return getattr(attn, name)
    raise InductionLabError(f"{type(attn).__name__}: no output projection named one of {', '.join(OUTPUT_PROJECTIONS)}")


def decoder_layer(model, layer: int) -> torch.nn.Module:
    """The decoder block holding ``layer``'s attention (its output: the residual stream after ``layer``)."""
    model = unwrap_model(model)
    attn = attention_module(model, layer)
    names = {id(m): n for n, m in model.named_modules()}
    parent = names[id(attn)].rsplit(".", 1)[0]
    return model.get_submodule(parent)


def head_writes(model, layer: int, values: torch.Tensor) -> torch.Tensor:
    """What each head of ``layer`` writes into the residual stream when its output is ``values``:
    ``W_O[:, slice_h] · values[h]`` (the projection's bias left out).

    Args: values ``[n_heads, head_dim]``. Returns float32 ``[n_heads, hidden_size]``."""
    proj = output_projection(model, layer)
    H, D = values.shape
    p = next(proj.parameters())
    x = torch.zeros(H, H * D, dtype=p.dtype, device=execution_device(proj))
    for h in range(H):
        x[h, h * D:(h + 1) * D] = values[h].to(p.dtype)
    with torch.inference_mode():
        return (proj(x) - proj(torch.zeros_like(x[:1]))).float()


# ---------------------------------------------------------------------------------------------
# Means, baselines and indirect effects


def _under(model, under: Sequence[HeadIntervention]):
    return instrument(model, list(under), strict=False) if under else contextlib.nullcontext()


def _last_only(model, **kw):
    """``model(**kw)`` with the LM head on the last position only where the architecture takes
    ``logits_to_keep`` (the prefix's logits are never read)."""
    try:
        return model(**kw, logits_to_keep=1)
    except TypeError:
        return model(**kw)


def _probs(logits: torch.Tensor, targets: torch.Tensor | int) -> torch.Tensor:
    """P(target) from last-position logits ``[B, V]`` (softmax in float64)."""
    t = torch.as_tensor(targets, device=logits.device).reshape(-1, 1).expand(logits.shape[0], 1)
    return torch.softmax(logits.double(), -1).gather(1, t).squeeze(1)


def clean_means(model, prompts: Sequence[Prompt], *, under: Sequence[HeadIntervention] = ()) -> tuple[torch.Tensor, np.ndarray]:
    """Every query head's mean output at the last position over ``prompts`` (one forward per prompt, no
    padding), and P(y₁) on each.

    Returns: ``(means, p_target)``: float64 ``[n_layers, n_heads, head_dim]`` (summed in float64, so n equal
    outputs give exactly their value) and float64 ``[n]``.

    Raises: InductionLabError for no prompts."""
    model = unwrap_model(model)
    if not prompts:
        raise InductionLabError("no clean prompts to average over")
    s = attention_shape(model.config)
    L, H = s["n_layers"], s["n_heads"]
    heads = [(l, h) for l in range(L) for h in range(H)]
    dev = execution_device(model)
    total = torch.zeros(L, H, s["head_dim"], dtype=torch.float64)
    p = np.empty(len(prompts))
    with torch.inference_mode(), instrument(model, list(under), capture_heads=heads, strict=False) as inst:
        for i, pr in enumerate(prompts):
            ids = torch.tensor([pr.input_ids], device=dev)
            logits = _last_only(model, input_ids=ids, use_cache=False).logits[:, -1]
            p[i] = float(_probs(logits, pr.target_id)[0])
            last = torch.stack([inst.captured[lh][0, -1] for lh in heads]).double().cpu()
            total += last.reshape(L, H, -1)
    return total / len(prompts), p


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


def _copies_mask(model, cache, prefix: int, n: int, dtype, device, suffix: int = 1):
    """The additive attention mask of ``n`` copies of the last ``suffix`` tokens read after a cached prefix of
    ``prefix`` tokens: token j of a copy sees the prefix and its own copy's tokens 0..j, not the other copies:
    ``[1, 1, n·suffix, prefix + n·suffix]``; a dict by layer type where the model has sliding-window layers, whose
    cache keeps only the most recent keys (their mask covers those, each within the window of the copy's token
    at position ``prefix + j``). The FV score reads one token per copy, the dual-route scores two."""
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


def patched_suffix_logits(model, ids: Sequence[int], patches: Sequence[Sequence[tuple[int, int, torch.Tensor]]], *,
                          suffix: int = 2, at: int = 0, rows: int = 64, under: Sequence[HeadIntervention] = (),
                          skip: bool = True) -> tuple[torch.Tensor, torch.Tensor, np.ndarray]:
    """The logits of the last ``suffix`` positions of ``ids`` unpatched and under each patch set, by the fast path
    of :func:`patched_last_logits`, with ``suffix`` tokens per copy: each patch set writes its heads' outputs at suffix token ``at`` (0: position
    ``−suffix``), every other position keeps the unpatched run's values.

    Args:
        ids: the prompt's token ids (more than ``suffix``).
        patches: patch sets, each a list of ``(layer, head, value [head_dim])``.
        rows: patch sets per forward; under: interventions applied in every forward.

    Returns:
        ``(base, logits, changed)``: float32 ``[suffix, V]`` unpatched; float32 ``[P, suffix, V]``; bool ``[P]``
        (a set that changed no head's value is the unpatched run: its row is the unpatched copy).

    Raises: InductionLabError for too short a prompt, ``rows < 1``, ``at`` outside the suffix, an empty patch set."""
    from ..core.reuse import decoder_layers

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
            prefix = returned_cache(_last_only(model, input_ids=x[:, :P0], use_cache=True))
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
                  "attention_mask": _copies_mask(model, prefix, P0, n, p.dtype, dev, suffix=S)}
            with instrument(model, [*under, *ivs], strict=False) as inst, _skipping(layers, b, state, tuple_out):
                logits = model(**kw, **{kv: copy.deepcopy(prefix)}, use_cache=True).logits[0].float()
            logits = logits.reshape(n, S, -1)
            base = logits[0] if base is None else base
            for j, i in enumerate(owner):
                changed[i] |= inst.effect[len(under) + j]
            for r, i in enumerate(chunk):
                out[i] = logits[r + 1] if changed[i] else logits[0]
    return base, torch.stack(out), changed


def patched_last_logits(model, ids: Sequence[int], patches: Sequence[Sequence[tuple[int, int, torch.Tensor]]], *,
                        rows: int = 90, under: Sequence[HeadIntervention] = (), skip: bool = True
                        ) -> tuple[torch.Tensor, torch.Tensor, np.ndarray]:
    """The last position's logits of ``ids`` unpatched and under each patch set, by the exact fast path of the
    module docstring.

    One forward reads ``ids`` without its last token and keeps its KV cache. Then, per chunk of ``rows`` patch
    sets (taken in order of their lowest layer), one forward reads ``rows + 1`` copies of the last token against
    that cache, each copy at the last token's position and attending to the prefix and itself only (a 4-D
    mask); in copy i + 1 the heads of patch set i have their output set to the given values (copy 0 unpatched),
    so copy i + 1 is the run patched by set i, bit for bit in exact arithmetic. A chunk whose heads all sit in
    layers ≥ b starts at layer b from the unpatched last token's residual stream there (``skip``; architectures
    of :func:`~inductionlab.core.reuse.decoder_layers`).

    Args:
        ids: the prompt's token ids (at least 2).
        patches: patch sets, each a list of ``(layer, head, value [head_dim])``: the head's last-position output
            (the input of ``o_proj``) set to ``value``.
        rows: patch sets per forward; under: interventions applied in every forward (e.g. a base ablation).

    Returns:
        ``(base, logits, changed)``: float32 ``[V]``, the unpatched copy of the first forward; float32 ``[P, V]``,
        patch set i in row i; bool ``[P]``, whether any head of the set took another value than it had (a set that
        changed nothing is the unpatched run: its row is its forward's unpatched copy).

    Raises: InductionLabError for fewer than 2 tokens, ``rows < 1``, an empty patch set."""
    if len(ids) < 2:
        raise InductionLabError("a prompt needs at least 2 tokens (a prefix and the last position)")
    base, logits, changed = patched_suffix_logits(model, ids, patches, suffix=1, rows=rows, under=under, skip=skip)
    return base[0], logits[:, 0], changed


def indirect_effects(model, prompt: Prompt, means: torch.Tensor, *, heads: Sequence[tuple[int, int]] | None = None,
                     rows: int = 90, under: Sequence[HeadIntervention] = (), skip: bool = True) -> tuple[float, np.ndarray]:
    """P(y₁ | prompt) and each head's CIE on it: P(y₁ | prompt, the head's last-position output ←
    ``means[l, h]``) − P(y₁ | prompt), by :func:`patched_last_logits` (one patch set per head), against the
    unpatched copy of the first forward; a patch that wrote the value the head already had gives exactly 0 (not
    the ~1e-10 by which two equal rows of one matmul, or two forwards starting at different layers, can differ).

    Args:
        prompt: one (corrupted) prompt; ``prompt.target_id`` is y₁.
        means: ``[n_layers, n_heads, head_dim]`` (:func:`clean_means`).
        heads: the heads patched (default: all); rows: heads per forward.

    Returns: ``(p_base, cie)``: float (probability) and float64 ``[n_layers, n_heads]`` (probability
    difference; NaN for heads not patched).

    Raises: InductionLabError for a prompt of fewer than 2 tokens or ``rows < 1``."""
    model = unwrap_model(model)
    s = attention_shape(model.config)
    L, H = s["n_layers"], s["n_heads"]
    heads = [(l, h) for l in range(L) for h in range(H)] if heads is None else [(int(l), int(h)) for l, h in heads]
    base, logits, changed = patched_last_logits(model, prompt.input_ids, [[(l, h, means[l, h])] for l, h in heads],
                                                rows=rows, under=under, skip=skip)
    p_base = float(_probs(base[None], prompt.target_id)[0])
    p = _probs(logits, prompt.target_id).cpu().numpy()
    cie = np.full((L, H), np.nan)
    for (l, h), v, c in zip(heads, p, changed):
        cie[l, h] = v - p_base if c else 0.0
    return p_base, cie


@dataclass
class FVScores:
    """Per-prompt indirect effects of every head, for a set of tasks.

    Attributes:
        tasks: task names, in order.
        p_clean: float64 ``[n_tasks, n_prompts]``: P(y₁) on the clean prompts.
        p_base: float64 ``[n_tasks, n_prompts]``: P(y₁) on the corrupted prompts.
        cie: float64 ``[n_tasks, n_prompts, n_layers, n_heads]``: the CIE (probability difference) of setting
            the head's last-position output on the corrupted prompt to its clean task mean.
        means: float64 ``[n_tasks, n_layers, n_heads, head_dim]``: the clean task means ā_h^t.
        params: what produced them (shots, prompts, seed, ...).
    """
    tasks: list[str]
    p_clean: np.ndarray
    p_base: np.ndarray
    cie: np.ndarray
    means: torch.Tensor
    params: dict = field(default_factory=dict)

    def aie(self) -> np.ndarray:
        """AIE per head, the mean CIE over tasks and prompts: float64 ``[n_layers, n_heads]``."""
        return self.cie.mean(axis=(0, 1))

    def table(self) -> pd.DataFrame:
        """``layer, head, task, aie, ci_low, ci_high, n`` per head and task (95% normal CI over prompts),
        and per head the row ``task == "all"`` (mean of the task means; CI from their standard errors,
        tasks independent: ``1.96·sqrt(Σ se_t²) / n_tasks``), sorted by layer, head, task order."""
        cie = self.cie                                         # [t, n, L, H]
        n = cie.shape[1]
        m = cie.mean(1)                                        # [t, L, H]
        se = cie.std(1, ddof=1) / np.sqrt(n) if n > 1 else np.full_like(m, np.nan)
        T, L, H = m.shape
        rows = []
        for l in range(L):
            for h in range(H):
                for t, name in enumerate(self.tasks):
                    rows.append((l, h, name, m[t, l, h], m[t, l, h] - Z95 * se[t, l, h], m[t, l, h] + Z95 * se[t, l, h], n))
                a = m[:, l, h].mean()
                half = Z95 * np.sqrt((se[:, l, h] ** 2).sum()) / T
                rows.append((l, h, "all", a, a - half, a + half, n * T))
        return pd.DataFrame(rows, columns=["layer", "head", "task", "aie", "ci_low", "ci_high", "n"])

    def ranking(self, signed: bool = True) -> list[tuple[int, int]]:
        """Heads by AIE, largest first (``signed=False``: by |AIE|); ties in (layer, head) order."""
        a = self.aie()
        a = a if signed else np.abs(a)
        L, H = a.shape
        order = sorted(range(L * H), key=lambda i: (-a.flat[i], i))
        return [(i // H, i % H) for i in order]


def fv_scores(model, prompts: Mapping[str, TaskPrompts], *, rows: int = 64, under: Sequence[HeadIntervention] = (),
              progress=None, params: dict | None = None) -> FVScores:
    """The FV score of every head on ``prompts`` (:func:`task_prompts`): clean means per task
    (:func:`clean_means`), then :func:`indirect_effects` on each corrupted prompt.

    Args:
        progress: optional callable(n) called with the number of prompts done (clean and corrupted).

    Raises: InductionLabError for no tasks, or tasks with different numbers of prompts."""
    if not prompts:
        raise InductionLabError("no tasks to score heads on")
    sizes = {len(tp.corrupted) for tp in prompts.values()}
    if len(sizes) != 1:
        raise InductionLabError(f"tasks have different numbers of prompts ({sorted(sizes)}); give each the same")
    tasks = list(prompts)
    means, pc, pb, pp = [], [], [], []
    for name in tasks:
        tp = prompts[name]
        m, p = clean_means(model, tp.clean, under=under)
        if progress:
            progress(len(tp.clean))
        means.append(m)
        pc.append(p)
        base, patched = [], []
        for pr in tp.corrupted:
            b, q = indirect_effects(model, pr, m, rows=rows, under=under)
            base.append(b)
            patched.append(q)
            if progress:
                progress(1)
        pb.append(base)
        pp.append(patched)
    return FVScores(tasks, np.asarray(pc), np.asarray(pb), np.asarray(pp), torch.stack(means), dict(params or {}))


# ---------------------------------------------------------------------------------------------
# The function vector and its zero-shot check


def function_vector(model, means: torch.Tensor, heads: Sequence[tuple[int, int]]) -> torch.Tensor:
    """Σ over ``heads`` of the head's write of its mean (:func:`head_writes`): float32 ``[hidden_size]``.

    Args: means ``[n_layers, n_heads, head_dim]`` (one task's :attr:`FVScores.means`)."""
    model = unwrap_model(model)
    s = attention_shape(model.config)
    fv = torch.zeros(s["hidden_size"])
    by_layer: dict[int, list[int]] = {}
    for l, h in heads:
        by_layer.setdefault(int(l), []).append(int(h))
    for l, hs in by_layer.items():
        w = head_writes(model, l, means[l]).cpu()
        fv += w[hs].sum(0)
    return fv


@contextlib.contextmanager
def added_to_residual(model, layer: int, vector: torch.Tensor | None) -> Iterator[None]:
    """Add ``vector`` ``[hidden_size]`` to the residual stream after decoder layer ``layer``, at the last
    position of each forward (left-padded batches: each row's last token). ``None``: no change."""
    if vector is None:
        yield
        return
    block = decoder_layer(model, layer)

    def hook(module, args, output):
        hs = output[0] if isinstance(output, tuple) else output
        hs = hs.clone()
        hs[:, -1] += vector.to(hs.device, hs.dtype)
        return (hs, *output[1:]) if isinstance(output, tuple) else hs

    handle = block.register_forward_hook(hook)
    try:
        yield
    finally:
        handle.remove()


__all__ = ["OUTPUT_PROJECTIONS", "TaskPrompts", "task_prompts", "attention_module", "output_projection",
           "decoder_layer", "head_writes", "clean_means", "patched_last_logits", "indirect_effects", "FVScores", "fv_scores",
           "function_vector", "added_to_residual"]
