"""Function-style ICL probes: HITS@1 / HITS@3 on the first answer token (Todd et al. 2024).

Prompts come from :mod:`inductionlab.icl_tasks`. For each prompt the model reads the prompt's
``input_ids`` and we take the logits at the last token only. The target's rank is
``1 + #{v : logit_v > logit_target}`` (ties counted in the target's favour); HITS@k = 1 if the
rank is <= k. Prompts are run in left-padded batches with ``position_ids`` derived from the
attention mask (:func:`inductionlab.protocol.pad_left`), sorted by length to limit padding.

Summaries: per task × shots × control the mean HITS@k with a 95% CI over prompts (normal
approximation, mean ± 1.96·sd/√n); the macro average over tasks is the mean of per-task means,
its CI from the per-task standard errors (``1.96·sqrt(Σ se_t²) / n_tasks``; tasks independent).
"""

from __future__ import annotations

from typing import Iterable, Sequence

import numpy as np
import pandas as pd
import torch

from .protocol import last_token_logits
from .icl_tasks import Prompt
from .protocol import ablation_context
from .stats import Z95

KS = (1, 3)


def _pad_id(tokenizer) -> int:
    for attr in ("pad_token_id", "eos_token_id"):
        v = getattr(tokenizer, attr, None) if tokenizer is not None else None
        if v is not None:
            return int(v)
    return 0


def target_ranks(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Rank of each target (1 = top): ``1 + #{v : logits[b, v] > logits[b, target_b]}``.

    Args: logits ``[B, V]``, targets LongTensor ``[B]``. Returns LongTensor ``[B]``."""
    t = logits.gather(1, targets[:, None])
    return (logits > t).sum(1) + 1


def run_probes(model, prompts: Sequence[Prompt], *, tokenizer=None, pad_id: int | None = None,
               batch_size: int = 16, heads: Iterable[tuple[int, int]] | None = None, method: str = "zero",
               reference_ids: torch.Tensor | None = None, progress=None) -> pd.DataFrame:
    """Score every prompt: one tidy row per prompt.

    Args:
        prompts: from :func:`inductionlab.icl_tasks.make_prompts`.
        tokenizer / pad_id: the pad id (default: tokenizer's pad, else EOS, else 0; pads are masked).
        heads, method, reference_ids: when ``heads`` is given, the forwards run under
            :func:`inductionlab.instrument.ablate` (``zero`` | ``mean`` | ``sink``).
        progress: optional callable(n_done_in_batch).

    Returns: DataFrame with ``task, shots, control, index, target_id, rank, hits1, hits3,
    p_target`` (probability of the target, float), in the order of ``prompts``.
    """
    prompts = list(prompts)
    pid = _pad_id(tokenizer) if pad_id is None else int(pad_id)
    order = sorted(range(len(prompts)), key=lambda i: len(prompts[i].input_ids))
    ranks = np.zeros(len(prompts), np.int64)
    probs = np.zeros(len(prompts), np.float64)
    with torch.inference_mode(), ablation_context(model, heads, method, reference_ids):
        for s in range(0, len(order), batch_size):
            idx = order[s:s + batch_size]
            logits = last_token_logits(model, [prompts[i].input_ids for i in idx], pid)
            tgt = torch.tensor([prompts[i].target_id for i in idx], device=logits.device)
            ranks[idx] = target_ranks(logits, tgt).cpu().numpy()
            probs[idx] = torch.softmax(logits, -1).gather(1, tgt[:, None]).squeeze(1).double().cpu().numpy()
            if progress is not None:
                progress(len(idx))
    df = pd.DataFrame({"task": [p.task for p in prompts], "shots": [p.shots for p in prompts],
                       "control": [p.control for p in prompts], "index": [p.index for p in prompts],
                       "target_id": [p.target_id for p in prompts], "rank": ranks, "p_target": probs})
    for k in KS:
        df[f"hits{k}"] = (df["rank"] <= k).astype(np.float64)
    return df


def summarize_hits(rows: pd.DataFrame, by: Sequence[str] = ("shots", "control")) -> pd.DataFrame:
    """Per task × ``by`` and macro-averaged HITS@1 / HITS@3 with 95% CIs over prompts.

    Args:
        rows: output of :func:`run_probes` (extra grouping columns such as ``condition`` may be
            named in ``by``).

    Returns: DataFrame ``task, *by, n, hits1, hits1_ci_low, hits1_ci_high, hits3, ...``; the
    macro rows have ``task == "macro"`` and ``n`` = number of tasks.
    """
    by = list(by)
    out = []
    for keys, g in rows.groupby(["task", *by], sort=False):
        row = dict(zip(["task", *by], keys))
        row["n"] = len(g)
        for k in KS:
            v = g[f"hits{k}"].to_numpy(np.float64)
            m = v.mean()
            half = Z95 * v.std(ddof=1) / np.sqrt(len(v)) if len(v) > 1 else np.nan
            row[f"hits{k}"], row[f"hits{k}_ci_low"], row[f"hits{k}_ci_high"] = m, m - half, m + half
            row[f"_se{k}"] = half / Z95
        out.append(row)
    per = pd.DataFrame(out)
    macro = []
    for keys, g in per.groupby(by, sort=False):
        keys = keys if isinstance(keys, tuple) else (keys,)
        row = {"task": "macro", **dict(zip(by, keys)), "n": len(g)}
        for k in KS:
            m = g[f"hits{k}"].mean()
            half = Z95 * np.sqrt((g[f"_se{k}"] ** 2).sum()) / len(g)
            row[f"hits{k}"], row[f"hits{k}_ci_low"], row[f"hits{k}_ci_high"] = m, m - half, m + half
        macro.append(row)
    res = pd.concat([per, pd.DataFrame(macro)], ignore_index=True)
    return res.drop(columns=[c for c in res if c.startswith("_se")])


__all__ = ["target_ranks", "run_probes", "summarize_hits"]
