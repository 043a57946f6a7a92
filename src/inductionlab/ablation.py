"""Head rankings and ablation conditions (SPEC §3, §4).

Rankings: global top-k by a score; per-layer top-p% (``ceil(p * heads_per_layer)``, at least
1: a decision of this project, SPEC §3); random k heads excluding the top N, seeded.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from .errors import InductionLabError
from .stimuli import seed_for

Head = tuple[int, int]


def top_k_heads(scores: np.ndarray, k: int) -> list[Head]:
    """The ``k`` heads with the highest score, best first. ``scores``: ``[n_layers, n_heads]``.

    Ties are broken by (layer, head) order (stable sort). Raises if k exceeds the head count."""
    scores = np.asarray(scores)
    total = scores.size
    if not 0 <= k <= total:
        raise InductionLabError(f"k={k} heads requested but the model has {total}; use k <= {total}")
    order = np.argsort(-scores.reshape(-1), kind="stable")[:k]
    H = scores.shape[1]
    return [(int(i // H), int(i % H)) for i in order]


def per_layer_top_p(scores: np.ndarray, p: float) -> list[Head]:
    """Per layer, the top ``ceil(p * heads_per_layer)`` heads (at least 1). ``p`` in (0, 1]."""
    if not 0 < p <= 1:
        raise InductionLabError(f"fraction p={p} must be in (0, 1]")
    scores = np.asarray(scores)
    n = max(1, math.ceil(p * scores.shape[1]))
    out = []
    for layer, row in enumerate(scores):
        for h in np.argsort(-row, kind="stable")[:n]:
            out.append((layer, int(h)))
    return out


def random_heads(shape: tuple[int, int], k: int, exclude=(), seed: int = 0) -> list[Head]:
    """``k`` distinct heads drawn uniformly from those not in ``exclude``; sorted; seeded.

    Raises:
        InductionLabError: fewer than ``k`` heads remain after the exclusion.
    """
    L, H = shape
    excl = set(map(tuple, exclude))
    pool = [(l, h) for l in range(L) for h in range(H) if (l, h) not in excl]
    if k > len(pool):
        raise InductionLabError(f"k={k} random heads requested but only {len(pool)} remain outside the "
                                f"{len(excl)} excluded heads; lower k or the exclusion size")
    rng = np.random.default_rng(seed)
    pick = rng.choice(len(pool), size=k, replace=False)
    return sorted(pool[i] for i in pick)


@dataclass
class Condition:
    """One ablation condition of a protocol."""
    name: str
    kind: str                # intact | induction | random
    k: int = 0
    draw: int = 0
    heads: list[Head] = field(default_factory=list)

    def to_dict(self) -> dict:
        return {"name": self.name, "kind": self.kind, "k": self.k, "draw": self.draw,
                "ablated_heads": [list(h) for h in self.heads]}


def default_exclude_top_n(n_heads_total: int) -> int:
    """SPEC §4 decision: N = min(300, total heads // 2) (the seed protocol used N = 300)."""
    return min(300, n_heads_total // 2)


def ablation_conditions(scores: np.ndarray, ks, *, n_draws: int = 3, exclude_top_n: int | None = None,
                        seed: int = 0, intact: bool = True) -> list[Condition]:
    """Intact, top-k by score, and ``n_draws`` random-k draws outside the top N, for each k.

    Random draw ``d`` for ``k`` uses seed ``seed_for(seed, k, d)``, so draws are reproducible
    and differ across draws and ks.

    Raises:
        InductionLabError: k larger than the model's heads, or than the heads left outside the top N.
    """
    scores = np.asarray(scores)
    total = scores.size
    N = default_exclude_top_n(total) if exclude_top_n is None else int(exclude_top_n)
    if not 0 <= N <= total:
        raise InductionLabError(f"exclude_top_n={N} must be between 0 and the model's {total} heads")
    excluded = top_k_heads(scores, N)
    out = [Condition("intact", "intact")] if intact else []
    for k in ks:
        k = int(k)
        out.append(Condition(f"induction-{k}", "induction", k, 0, top_k_heads(scores, k)))
        for d in range(n_draws):
            out.append(Condition(f"random-{k}-d{d}", "random", k, d,
                                 random_heads(scores.shape, k, excluded, seed_for(seed, k, d))))
    return out
