"""Head rankings and ablation conditions (SPEC §3, §4, §8).

Rankings: global top-k by a score; per-layer top-p% (``ceil(p * heads_per_layer)``, at least
1: a decision of this project, SPEC §3); random k heads excluding the top N, seeded; random
heads matched per layer to a chosen set (the control of a per-layer selection), seeded per draw.
Heads are ``(layer, head)`` integer pairs, query-head indexing; a head outside the model or
not an integer raises an error naming the valid range.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from ..checks import check_type
from ..errors import InductionLabError
from .stimuli import seed_for

Head = tuple[int, int]


def _heads(heads, shape: tuple[int, int], what: str) -> list[Head]:
    """``heads`` as a list of ``(layer, head)`` ints, each checked against ``shape``."""
    L, H = shape
    out = []
    for x in heads:
        try:
            l, h = x
        except (TypeError, ValueError):
            raise InductionLabError(f"{what}: {x!r} is not a (layer, head) pair") from None
        for v, name, n in ((l, "layer", L), (h, "head", H)):
            if isinstance(v, (bool, np.bool_)) or not isinstance(v, (int, np.integer)):
                raise InductionLabError(f"{what}: head {tuple(x)!r}: {name} must be an integer in 0-{n - 1}")
        if not (0 <= l < L and 0 <= h < H):
            raise InductionLabError(f"{what}: head ({l}, {h}) out of range: the model has {L} layers (0-{L - 1}) "
                                    f"x {H} query heads (0-{H - 1})")
        out.append((int(l), int(h)))
    return out


def _int(name: str, value, minimum: int) -> int:
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, np.integer)) or value < minimum:
        raise InductionLabError(f"{name}={value!r} must be an integer >= {minimum}")
    return int(value)


def _scores(scores) -> np.ndarray:
    if scores is None or isinstance(scores, (str, bytes, dict)):
        raise TypeError(f"scores must be a [n_layers, n_heads] array (e.g. compute_head_scores(...)['induction']), "
                        f"got {type(scores).__name__}")
    scores = np.asarray(scores, dtype=float)
    if scores.ndim != 2 or scores.size == 0:
        raise InductionLabError(f"scores must be a [n_layers, n_heads] array, got shape {scores.shape}")
    if not np.isfinite(scores).all():
        raise InductionLabError("scores contain NaN or inf (were they computed on empty sequences?); "
                                "recompute them with seq_len >= 2")
    return scores


def top_k_heads(scores: np.ndarray, k: int) -> list[Head]:
    """The ``k`` heads with the highest score, best first. ``scores``: ``[n_layers, n_heads]``.

    Ties are broken by (layer, head) order (stable sort). Raises if k exceeds the head count or
    a score is not finite."""
    scores = _scores(scores)
    total = scores.size
    if isinstance(k, (bool, np.bool_)) or not isinstance(k, (int, np.integer)) or not 0 <= k <= total:
        raise InductionLabError(f"k={k} heads requested but the model has {total}; use k <= {total}")
    order = np.argsort(-scores.reshape(-1), kind="stable")[:k]
    H = scores.shape[1]
    return [(int(i // H), int(i % H)) for i in order]


def per_layer_top_p(scores: np.ndarray, p: float) -> list[Head]:
    """Per layer, the top ``ceil(p * heads_per_layer)`` heads (at least 1). ``p`` in (0, 1]."""
    if not 0 < p <= 1:
        raise InductionLabError(f"fraction p={p} must be in (0, 1]")
    scores = _scores(scores)
    n = max(1, math.ceil(p * scores.shape[1]))
    out = []
    for layer, row in enumerate(scores):
        for h in np.argsort(-row, kind="stable")[:n]:
            out.append((layer, int(h)))
    return out


def _first_allowed(order, banned: set, n: int, to_head) -> list:
    """The first ``n`` items of ``order`` (mapped by ``to_head``) that are not in ``banned``."""
    out = []
    for i in order:
        if len(out) == n:
            break
        x = to_head(int(i))
        if x not in banned:
            out.append(x)
    return out


def random_heads(shape: tuple[int, int], k: int, exclude=(), seed: int = 0) -> list[Head]:
    """``k`` distinct heads drawn uniformly from those not in ``exclude``; sorted; seeded.

    The draw walks a seeded permutation of **all** ``n_layers * n_heads`` heads and keeps the first
    ``k`` that are not excluded. The permutation does not depend on ``exclude``, so when a head moves
    across the exclusion's boundary (two score tables that differ by rounding, e.g. fp32 and bf16)
    a draw changes only where that head would have been drawn (SPEC §10).

    Args:
        shape: ``(n_layers, n_heads)``.
        k: heads to draw (>= 0).
        exclude: ``(layer, head)`` pairs never drawn.
        seed: the permutation's seed (``ablation_conditions`` uses ``seed_for(seed, k, draw)``).

    Raises:
        InductionLabError: fewer than ``k`` heads remain after the exclusion, or an excluded head
            out of range.
    """
    L, H = shape
    k = _int("k", k, 0)
    excl = set(_heads(exclude, shape, "random_heads exclude"))
    left = L * H - len(excl)
    if k > left:
        raise InductionLabError(f"k={k} random heads requested but only {left} remain outside the "
                                f"{len(excl)} excluded heads; lower k or the exclusion size")
    order = np.random.default_rng(seed).permutation(L * H)
    return sorted(_first_allowed(order, excl, k, lambda i: (i // H, i % H)))


def matched_random_heads(shape: tuple[int, int], chosen, *, exclude=(), seed: int = 0, draw: int = 0) -> list[Head]:
    """Random heads with the same number **per layer** as ``chosen`` (the control of a
    per-layer selection such as :func:`per_layer_top_p`, SPEC §3/§8); sorted.

    In each layer, as many heads as ``chosen`` has there are drawn uniformly without replacement
    from that layer's heads outside ``chosen`` and ``exclude``: the first ones of a seeded
    permutation of the layer's heads. Seeded per ``(seed, draw)``: the same pair gives the same
    heads, different draws differ. Every layer's permutation is drawn whatever ``chosen`` and
    ``exclude`` hold, so a head entering or leaving them changes the draw only in its layer and
    only where it would have been drawn (as :func:`random_heads`).

    Args:
        shape: ``(n_layers, n_heads)``.
        chosen: ``(layer, head)`` pairs (distinct).
        exclude: more heads never to draw.

    Raises:
        InductionLabError: a head out of range or not an integer, a head chosen twice, or a
            layer with fewer heads left than ``chosen`` has there.
    """
    L, H = shape
    chosen = _heads(chosen, shape, "matched_random_heads chosen")
    if len(set(chosen)) != len(chosen):
        raise InductionLabError("matched_random_heads: chosen lists a head twice; give each head once")
    banned = set(chosen) | set(_heads(exclude, shape, "matched_random_heads exclude"))
    rng = np.random.default_rng(seed_for(seed, draw))
    out = []
    for layer in range(L):
        order = rng.permutation(H)                      # drawn for every layer: layers stay independent
        n = sum(1 for l, _ in chosen if l == layer)
        if n == 0:
            continue
        left = sum(1 for h in range(H) if (layer, h) not in banned)
        if n > left:
            raise InductionLabError(f"layer {layer}: {n} matched random heads needed but only {left} of {H} "
                                    "remain outside the chosen and excluded heads; choose fewer heads per layer "
                                    "or exclude fewer")
        out += _first_allowed(order, banned, n, lambda h, layer=layer: (layer, h))
    return sorted(out)


@dataclass
class Condition:
    """One ablation condition of a protocol: ``name`` (the pieces' and tables' key), ``kind`` (``intact`` |
    ``induction`` | ``random`` | ``single``), ``k`` (heads ablated), ``draw`` (the random draw's index) and
    ``heads`` (``(layer, head)`` pairs, query-head indexing; empty only for ``intact``).

    Raises:
        TypeError: ``k`` or ``draw`` not an integer (a head list given in ``draw``'s place: pass it as
            ``heads=``), ``heads`` not a list of pairs."""
    name: str
    kind: str                # intact | induction | random | single
    k: int = 0
    draw: int = 0
    heads: list[Head] = field(default_factory=list)

    def __post_init__(self):
        for f in ("k", "draw"):
            v = getattr(self, f)
            if isinstance(v, (bool, np.bool_)) or not isinstance(v, (int, np.integer)):
                raise TypeError(f"Condition {self.name!r}: {f} must be an integer, got {type(v).__name__} {v!r}; "
                                "pass the heads by keyword: Condition(name, kind, k, heads=[(layer, head), ...])")
        if isinstance(self.heads, (str, bytes)) or not hasattr(self.heads, "__iter__"):
            raise TypeError(f"Condition {self.name!r}: heads must be a list of (layer, head) pairs, got "
                            f"{type(self.heads).__name__}")

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
        InductionLabError: a k that is not an integer >= 1, a k listed twice (each k is one set of
            conditions: a repeated k would pool one random draw twice), ``n_draws`` < 0, or k
            larger than the model's heads or than the heads left outside the top N.
    """
    scores = _scores(scores)
    total = scores.size
    ks = [_int("k", k, 1) for k in (ks if not isinstance(ks, (int, np.integer)) else [ks])]
    dup = sorted({k for k in ks if ks.count(k) > 1})
    if dup:
        raise InductionLabError(f"ks lists k={dup[0]} more than once; give each k once")
    if not ks:
        raise InductionLabError("ks is empty; give at least one number of heads to ablate")
    n_draws = _int("n_draws", n_draws, 0)
    N = default_exclude_top_n(total) if exclude_top_n is None else exclude_top_n
    if isinstance(N, (bool, np.bool_)) or not isinstance(N, (int, np.integer)) or not 0 <= N <= total:
        raise InductionLabError(f"exclude_top_n={N} must be between 0 and the model's {total} heads")
    excluded = top_k_heads(scores, N)
    out = [Condition("intact", "intact")] if intact else []
    for k in ks:
        out.append(Condition(f"induction-{k}", "induction", k, 0, top_k_heads(scores, k)))
        for d in range(n_draws):
            out.append(Condition(f"random-{k}-d{d}", "random", k, d,
                                 random_heads(scores.shape, k, excluded, seed_for(seed, k, d))))
    return out


def check_conditions(conditions, what: str) -> None:
    """``conditions`` is a non-empty sequence of :class:`Condition`.

    Raises:
        TypeError: not a sequence (None, a single Condition) or an item that is not a Condition.
        InductionLabError: empty (nothing would run: almost surely a bug)."""
    if isinstance(conditions, Condition) or isinstance(conditions, (str, bytes, dict)) \
            or not hasattr(conditions, "__len__"):
        raise TypeError(f"{what}: conditions must be a list of Condition (e.g. from ablation_conditions()), got "
                        f"{type(conditions).__name__}")
    if not len(conditions):
        raise InductionLabError(f"{what}: conditions is empty, so nothing would run; pass at least one, e.g. "
                                "[Condition('intact', 'intact', 0, 0, [])] or ablation_conditions(scores, ks)")
    for c in conditions:
        check_type(c, Condition, f"{what}: each condition")
        if c.kind != "intact" and not len(c.heads):
            raise InductionLabError(f"{what}: condition {c.name!r} ({c.kind}) ablates no head, so it would equal the "
                                    "intact model; give its heads (Condition(name, kind, k, heads=[...]) or "
                                    "ablation_conditions(scores, ks))")
