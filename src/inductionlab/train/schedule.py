"""Learning-rate schedule: linear warm-up then cosine decay (SPEC §7).

lr(s) for optimizer step s (0-based, the learning rate used *for* update s) with W warm-up steps
out of S total, peak η and floor r·η:

* s < W:   η · (s + 1) / W                                    (linear warm-up, reaches η at s = W-1)
* s >= W:  r·η + (η − r·η) · ½ · (1 + cos(π · (s − W) / max(1, S − W − 1)))   (cosine to r·η at s = S-1)

W = ceil(warmup_frac · S). Source: the Chinchilla / Llama recipe (warm-up then cosine to 10% of peak).
"""

from __future__ import annotations

import math

import torch


def warmup_steps(total_steps: int, warmup_frac: float) -> int:
    return math.ceil(warmup_frac * total_steps)


def lr_factor(step: int, total_steps: int, warmup_frac: float = 0.03, min_lr_ratio: float = 0.1) -> float:
    """Multiplier of the peak learning rate at optimizer step ``step`` (see module docstring)."""
    w = warmup_steps(total_steps, warmup_frac)
    if step < w:
        return (step + 1) / w
    span = max(1, total_steps - w - 1)
    progress = min(1.0, (step - w) / span)
    return min_lr_ratio + (1.0 - min_lr_ratio) * 0.5 * (1.0 + math.cos(math.pi * progress))


def build_scheduler(optimizer: torch.optim.Optimizer, total_steps: int, warmup_frac: float = 0.03,
                    min_lr_ratio: float = 0.1) -> torch.optim.lr_scheduler.LambdaLR:
    """A :class:`torch.optim.lr_scheduler.LambdaLR` over :func:`lr_factor`; call ``.step()`` after each update."""
    return torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda s: lr_factor(s, total_steps, warmup_frac, min_lr_ratio))
