"""Iso-FLOPs accounting (SPEC §7): parameters, tokens and training FLOPs of a run, and the check
that runs compared in one study share their budget.

Counting convention (PaLM, Chowdhery et al. 2022, App. B — the "model FLOPs" of MFU):

    FLOPs per training token = 6 · N_matmul + 12 · n_layers · n_heads · head_dim · T

* ``N_matmul`` = every weight that takes part in a matrix multiply: all parameters except the
  input embedding (a table look-up) and the RMSNorm gains (element-wise); the untied LM head is
  counted. 6 = 2 (multiply-add) × 3 (forward + backward for activations + backward for weights).
* the attention term counts Q·Kᵀ and P·V over the full T × T score matrix (causal masking not
  subtracted), forward + backward, with T = the training context length, n_heads query heads.

Parameter totals follow Kaplan et al. (2020): ``n_params_non_embedding`` excludes both the input
embedding and the LM head.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Iterable

from transformers import LlamaConfig

from ..errors import InductionLabError
from ..runtime.run_dir import TrainRun


@dataclass(frozen=True)
class Budget:
    """Compute budget of one run. FLOPs are floating-point operations (not per second)."""

    n_params: int                   # all parameters
    n_params_non_embedding: int     # without input embedding and LM head (Kaplan)
    n_params_matmul: int            # N of 6·N·D: without input embedding and norm gains (PaLM)
    seq_len: int                    # T, tokens per sequence
    global_batch: int               # sequences per optimizer update
    tokens_per_update: int
    steps: int                      # optimizer updates
    tokens: int                     # D = steps · tokens_per_update
    flops_dense: float              # 6 · N_matmul · D
    flops_attention: float          # 12 · n_layers · n_heads · head_dim · T · D
    flops: float                    # their sum

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def param_counts(config: LlamaConfig) -> dict[str, int]:
    """Parameter counts of a Llama model from its config (no model is built).

    Returns a dict with ``total``, ``non_embedding``, ``matmul``, ``embedding`` and ``lm_head``.
    """
    d, v, f = config.hidden_size, config.vocab_size, config.intermediate_size
    hq = config.num_attention_heads
    hkv = config.num_key_value_heads or hq
    hd = getattr(config, "head_dim", None) or d // hq
    attn = d * hq * hd + 2 * d * hkv * hd + hq * hd * d      # q, k, v, o (no biases)
    mlp = 3 * d * f                                          # gate, up, down (SwiGLU)
    norms = 2 * d                                            # input + post-attention RMSNorm gains
    per_layer = attn + mlp + norms
    embedding = v * d
    lm_head = 0 if config.tie_word_embeddings else v * d
    layers = config.num_hidden_layers
    total = embedding + lm_head + layers * per_layer + d     # + final norm
    return {"total": total, "non_embedding": layers * per_layer + d, "embedding": embedding,
            "lm_head": lm_head, "matmul": layers * (attn + mlp) + (lm_head or v * d)}


def flops_per_token(config: LlamaConfig, seq_len: int) -> tuple[float, float]:
    """(dense, attention) training FLOPs per token; see the module docstring."""
    n = param_counts(config)["matmul"]
    hq = config.num_attention_heads
    hd = getattr(config, "head_dim", None) or config.hidden_size // hq
    return 6.0 * n, 12.0 * config.num_hidden_layers * hq * hd * seq_len


def budget(config: LlamaConfig, *, seq_len: int, tokens_per_update: int, steps: int) -> Budget:
    """The :class:`Budget` of ``steps`` updates of ``tokens_per_update`` tokens at context ``seq_len``."""
    pc = param_counts(config)
    tokens = steps * tokens_per_update
    dense, attn = flops_per_token(config, seq_len)
    return Budget(n_params=pc["total"], n_params_non_embedding=pc["non_embedding"],
                  n_params_matmul=pc["matmul"], seq_len=seq_len, global_batch=tokens_per_update // seq_len,
                  tokens_per_update=tokens_per_update, steps=steps, tokens=tokens,
                  flops_dense=dense * tokens, flops_attention=attn * tokens, flops=(dense + attn) * tokens)


# The fields that must agree for two runs to be compared at matched compute.
ISO_KEYS = ("n_params", "seq_len", "global_batch", "tokens_per_update", "steps", "tokens", "flops")


def check_iso_flops(budgets: dict[str, dict[str, Any]]) -> None:
    """Refuse to compare runs whose budgets differ.

    Args:
        budgets: run name -> budget dict (as written in each run's ``run.json`` under ``budget``).

    Raises:
        InductionLabError: two runs differ in any of :data:`ISO_KEYS`.
    """
    items = list(budgets.items())
    if not items:
        return
    ref_name, ref = items[0]
    for name, b in items[1:]:
        for k in ISO_KEYS:
            if b.get(k) != ref.get(k):
                raise InductionLabError(
                    f"runs {ref_name} and {name} are not matched-compute: {k} is {ref.get(k)} vs {b.get(k)}; "
                    "compare only runs trained with the same budget, steps and batch shape")


def read_budgets(run_dirs: Iterable[str | Path]) -> dict[str, dict[str, Any]]:
    """Budgets of several run directories, keyed by directory name (raises on a missing run.json):
    :attr:`~inductionlab.runtime.run_dir.TrainRun.budget`."""
    return {Path(rd).name: TrainRun.open(rd).budget for rd in run_dirs}


def read_run_record(run_dir: str | Path) -> dict[str, Any]:
    """A training run's ``run.json``, checked to hold a ``budget`` and a ``config`` object
    (:meth:`inductionlab.runtime.run_dir.TrainRun.open`).

    Raises:
        InductionLabError: no run.json (not a training run), or one that is unreadable, not JSON
            or without those keys (damaged)."""
    return TrainRun.open(run_dir).record
