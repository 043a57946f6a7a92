"""Function-style ICL probes: HITS@1 / HITS@3 on the first answer token (Todd et al. 2024).

Prompts come from :mod:`inductionlab.protocols.icl_tasks`. For each prompt the model reads the prompt's
``input_ids`` and we take the logits at the last token only. The target's rank is
``1 + #{v : logit_v > logit_target}`` (ties counted in the target's favour); HITS@k = 1 if the
rank is <= k. Prompts are run in left-padded batches with ``position_ids`` derived from the
attention mask (:func:`inductionlab.protocols.runner.pad_left`), sorted by length to limit padding.

A protocol of :func:`inductionlab.protocols.runner.run_conditions`: :func:`build_trials` (the prompts,
sorted by length and left-padded into one :class:`~inductionlab.protocols.runner.Trials`) and
:func:`measure_batch` (rank and probability of each target; each batch cut to its own padding,
so it is the batch a per-batch :func:`~inductionlab.protocols.runner.pad_left` makes); :func:`probe_rows`
puts the measures back in prompt order. Under ablation: ``run_conditions(loaded, conditions,
build_trials(prompts, pad_id), method=..., measure_batch=measure_batch)``.

Summaries: per task × shots × control the mean HITS@k with a 95% CI over prompts (normal
approximation, mean ± 1.96·sd/√n); the macro average over tasks is the mean of per-task means,
its CI from the per-task standard errors (``1.96·sqrt(Σ se_t²) / n_tasks``; tasks independent).
"""

from __future__ import annotations

from typing import Sequence

import numpy as np
import pandas as pd
import torch

from ..core.models import LoadedModel
from ..core.patching import patched_last_logits
from ..measures.stats import Z95
from .icl_tasks import Prompt
from .runner import Trials, forward_logits, model_inputs, run_conditions, trim_padding

KS = (1, 3)


def default_pad_id(tokenizer) -> int:
    """The id left padding uses: the tokenizer's pad token, else its EOS, else 0 (pads are masked)."""
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


def build_trials(prompts: Sequence[Prompt], pad_id: int = 0) -> Trials:
    """The prompts as trials, sorted by length (shortest first) and left-padded
    (:meth:`~inductionlab.protocols.runner.Trials.padded`: ``ids`` / ``attention_mask`` / ``position_ids``
    ``[n, T_max]``), with ``targets`` (the first answer token) and ``order`` (each trial's index in
    ``prompts``), LongTensors ``[n]``."""
    prompts = list(prompts)
    order = sorted(range(len(prompts)), key=lambda i: len(prompts[i].input_ids))
    return Trials.padded([prompts[i].input_ids for i in order], pad_id,
                         targets=torch.tensor([prompts[i].target_id for i in order], dtype=torch.long),
                         order=torch.tensor(order, dtype=torch.long))


def measure_batch(model, batch: dict[str, torch.Tensor], cfg=None) -> dict[str, torch.Tensor]:
    """One batch of :func:`build_trials`: the logits at each prompt's last token (one forward,
    ``logits_to_keep=1`` where the architecture has it) → ``rank`` (LongTensor ``[b]``, 1 = top),
    ``p_target`` (float64 ``[b]``), and ``target_id`` / ``order`` passed through."""
    batch = trim_padding(batch)
    kw = model_inputs(batch)
    logits = forward_logits(model, kw.pop("input_ids"), 1, **kw)[:, -1]
    tgt = batch["targets"]
    return {"rank": target_ranks(logits, tgt), "p_target": torch.softmax(logits, -1).gather(1, tgt[:, None]).squeeze(1)
            .double(), "target_id": tgt, "order": batch["order"]}


def probe_rows(prompts: Sequence[Prompt], arrays: dict) -> pd.DataFrame:
    """The tidy rows of :func:`run_probes` from one condition's arrays of :func:`measure_batch`
    (trial order; put back in the order of ``prompts`` by ``order`` when present)."""
    prompts = list(prompts)
    arrays = dict(arrays)
    if "order" in arrays:
        order = np.asarray(arrays.pop("order"), np.int64)
        for k, v in arrays.items():
            back = np.empty_like(v)
            back[order] = v
            arrays[k] = back
    df = pd.DataFrame({"task": [p.task for p in prompts], "shots": [p.shots for p in prompts],
                       "control": [p.control for p in prompts], "index": [p.index for p in prompts],
                       "target_id": [p.target_id for p in prompts],
                       "rank": np.asarray(arrays.get("rank", np.zeros(0)), np.int64),
                       "p_target": np.asarray(arrays.get("p_target", np.zeros(0)), np.float64)})
    for k in KS:
        df[f"hits{k}"] = (df["rank"] <= k).astype(np.float64)
    return df


def run_probes(model, prompts: Sequence[Prompt], *, tokenizer=None, pad_id: int | None = None,
               batch_size: int = 16, progress=None) -> pd.DataFrame:
    """Score every prompt on the intact model: one tidy row per prompt (the intact condition of
    :func:`~inductionlab.protocols.runner.run_conditions` over :func:`build_trials`; ablated conditions:
    the module docstring).

    Args:
        prompts: from :func:`inductionlab.protocols.icl_tasks.make_prompts`.
        tokenizer / pad_id: the pad id (default: tokenizer's pad, else EOS, else 0; pads are masked).
        batch_size: prompts per forward pass (consecutive in length order).
        progress: optional callable(n_done_in_batch).

    Returns: DataFrame with ``task, shots, control, index, target_id, rank, hits1, hits3,
    p_target`` (probability of the target, float), in the order of ``prompts``.
    """
    from ..core.ablation import Condition

    prompts = list(prompts)
    pid = default_pad_id(tokenizer) if pad_id is None else int(pad_id)
    arrays = run_conditions(LoadedModel(model, tokenizer=None), [Condition("intact", "intact")],
                            build_trials(prompts, pid), batch_size=batch_size, measure_batch=measure_batch,
                            progress=progress, reuse=False)["intact"]
    return probe_rows(prompts, arrays)


def summarize_hits(rows: pd.DataFrame, by: Sequence[str] = ("shots", "control")) -> pd.DataFrame:
    """Per task × ``by`` and macro-averaged HITS@1 / HITS@3 with 95% CIs over prompts.

    Args:
        rows: output of :func:`run_probes` / :func:`probe_rows` (extra grouping columns such as ``condition`` may be
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


def last_position_conditions(model, prompts: Sequence[Prompt], conditions, values: dict[str, torch.Tensor], *,
                             rows: int = 90, progress=None) -> pd.DataFrame:
    """HITS@k of ``prompts`` intact and under every condition and method at once, when the ablation edits the
    last position only (Yin & Steinhardt 2025's accuracy ablation): per prompt, one prefix forward and the last
    token's copies of :func:`~inductionlab.core.patching.patched_last_logits`, one copy per
    (method, condition), the condition's heads' last-position outputs set to ``values[method]``. Equal to
    :func:`~inductionlab.protocols.runner.run_conditions` with ``positions="last"`` (within float rounding:
    tests/test_function_probes.py) at about 1 + (conditions × methods) / prompt length forwards per prompt,
    not one per condition.

    Args:
        prompts: from :func:`inductionlab.protocols.icl_tasks.make_prompts`.
        conditions: :class:`~inductionlab.core.ablation.Condition` list (an ``intact`` one reads the unpatched copy).
        values: method -> ``[n_layers, n_heads, head_dim]``: the heads' new output (each head's mean at the last
            position of reference prompts for ``mean``; zeros for ``zero``).
        progress: optional callable(1) per prompt.

    Returns: one row per (condition, method, prompt): ``condition, method``, then the columns of
    :func:`probe_rows` (the intact condition repeated under each method).

    Raises: InductionLabError as ``patched_last_logits``."""
    arms = [(c, m) for m in values for c in conditions if c.heads]
    slot = {(c.name, m): 1 + j for j, (c, m) in enumerate(arms)}          # copy 0: intact
    out = []
    for i, p in enumerate(prompts):
        patches = [[(l, h, values[m][l, h]) for l, h in c.heads] for c, m in arms]
        base, logits, _ = patched_last_logits(model, p.input_ids, patches, rows=rows)
        tgt = torch.tensor([p.target_id] * (len(arms) + 1))
        allv = torch.cat([base[None], logits])
        rank = target_ranks(allv, tgt).tolist()
        prob = torch.softmax(allv.double(), -1)[:, p.target_id].tolist()
        for c in conditions:
            for m in values:
                j = slot.get((c.name, m), 0)
                out.append({"condition": c.name, "method": m, "task": p.task, "shots": p.shots, "control": p.control,
                            "index": p.index, "target_id": p.target_id, "rank": rank[j], "p_target": prob[j]})
        if progress:
            progress(1)
    df = pd.DataFrame(out)
    for k in KS:
        df[f"hits{k}"] = (df["rank"] <= k).astype(np.float64)
    return df


__all__ = ["default_pad_id", "target_ranks", "build_trials", "measure_batch", "probe_rows", "run_probes", "summarize_hits",
           "last_position_conditions"]
