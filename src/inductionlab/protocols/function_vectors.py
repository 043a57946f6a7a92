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

**Patching** by the exact batched fast path of :mod:`inductionlab.core.patching`
(:func:`~inductionlab.core.patching.patched_last_logits`): per prompt, one prefix forward with its KV cache, then
one forward of one copy of the last token per head (copy r + 1: head r patched, copy 0 unpatched), against Todd's
one full forward per (prompt, head). ``bench/fv_speed.py`` checks it against a port of the authors' loop.

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
from dataclasses import dataclass, field
from typing import Iterator, Mapping, Sequence

import numpy as np
import pandas as pd
import torch

from ..core.anatomy import OUTPUT_PROJECTIONS, attention_module, decoder_layer, output_projection
from ..core.instrument import HeadIntervention, instrument, unwrap_model
from ..core.models import attention_shape, forward
from ..core.patching import patched_last_logits
from ..core.placement import execution_device
from ..errors import InductionLabError
from ..measures.stats import Z95
from .icl_tasks import Prompt, Task, make_prompts


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
# The model's attention modules (looked up in :mod:`inductionlab.core.anatomy`, re-exported here)


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
            logits = forward(model, ids, keep=1, use_cache=False).logits[:, -1]
            p[i] = float(_probs(logits, pr.target_id)[0])
            last = torch.stack([inst.captured[lh][0, -1] for lh in heads]).double().cpu()
            total += last.reshape(L, H, -1)
    return total / len(prompts), p


def indirect_effects(model, prompt: Prompt, means: torch.Tensor, *, heads: Sequence[tuple[int, int]] | None = None,
                     rows: int = 90, under: Sequence[HeadIntervention] = (), skip: bool = True) -> tuple[float, np.ndarray]:
    """P(y₁ | prompt) and each head's CIE on it: P(y₁ | prompt, the head's last-position output ←
    ``means[l, h]``) − P(y₁ | prompt), by :func:`~inductionlab.core.patching.patched_last_logits` (one patch set
    per head), against the unpatched copy of the first forward; a patch that wrote the value the head already had gives exactly 0 (not
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
           "decoder_layer", "head_writes", "clean_means", "indirect_effects", "FVScores", "fv_scores",
           "function_vector", "added_to_residual"]
