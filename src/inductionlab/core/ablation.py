"""Head rankings and ablation conditions (SPEC §3, §4, §8, §10).

Rankings: global top-k by a score; per-layer top-p% (``ceil(p * heads_per_layer)``, at least
1: a decision of this project, SPEC §3); a fraction f of all N heads (``max(1, int(f * N))``),
optionally after excluding another ranking's top ``int(0.02 * N)`` (:func:`select_heads`,
:func:`selection_conditions`: Yin & Steinhardt 2025's selection); random k heads excluding a set
(the top N, or none), seeded; random heads matched per layer to a chosen set (the control of a
per-layer selection), seeded per draw. Random draws walk a seeded permutation of all heads and
skip the excluded ones, so a head that crosses an exclusion boundary by rounding changes a draw
only where it would have been drawn.
Heads are ``(layer, head)`` integer pairs, query-head indexing; a head outside the model or
not an integer raises an error naming the valid range.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from ..checks import check_type
from ..errors import InductionLabError
from ..names import RANDOM_CONTROLS
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


def per_layer_top_p(scores: np.ndarray, p: float, exclude=()) -> list[Head]:
    """Per layer, the top ``ceil(p * heads_per_layer)`` heads (at least 1). ``p`` in (0, 1].
    ``exclude``: heads never chosen (another ranking's top heads); the count stays the one of all the
    layer's heads.

    Raises:
        InductionLabError: ``p`` outside (0, 1], a layer with fewer heads left than the count."""
    if not 0 < p <= 1:
        raise InductionLabError(f"fraction p={p} must be in (0, 1]")
    scores = _scores(scores)
    n = max(1, math.ceil(p * scores.shape[1]))
    banned = set(_heads(exclude, scores.shape, "per_layer_top_p exclude"))
    out = []
    for layer, row in enumerate(scores):
        chosen = _first_allowed(np.argsort(-row, kind="stable"), banned, n, lambda h, layer=layer: (layer, h))
        if len(chosen) < n:
            raise InductionLabError(f"layer {layer}: {n} heads per layer requested but only {len(chosen)} remain after "
                                    "the exclusion; lower the fraction or exclude fewer heads")
        out += chosen
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


RANDOM_DRAWS = "seeded permutation of all heads, excluded heads skipped"
"""How :func:`random_heads` draws, recorded in every study's params: a run directory whose random
heads were drawn another way (before this scheme) is refused on resume instead of mixing two draws."""


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
    ``induction`` | ``random`` | ``single`` | a ranking's label from :func:`selection_conditions`), ``k``
    (heads ablated), ``draw`` (the random draw's index) and ``heads`` (``(layer, head)`` pairs, query-head
    indexing; empty only for ``intact``).

    Raises:
        TypeError: ``k`` or ``draw`` not an integer (a head list given in ``draw``'s place: pass it as
            ``heads=``), ``heads`` not a list of pairs."""
    name: str
    kind: str                # intact | induction | random | single | a ranking's label (selection_conditions)
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


def _fraction(value, name: str, *, zero: bool = False) -> float:
    """A number in (0, 1] (``zero``: [0, 1))."""
    bad = isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, float, np.integer, np.floating))
    ok = not bad and (0 <= value < 1 if zero else 0 < value <= 1)
    if not ok:
        raise InductionLabError(f"{name}={value!r} must be a number in {'[0, 1)' if zero else '(0, 1]'} "
                                f"(a fraction of all heads, e.g. {'0.02' if zero else '0.05'})")
    return float(value)


def heads_for_fraction(n_total: int, fraction: float) -> int:
    """How many heads a fraction of all ``n_total`` heads selects: ``max(1, int(fraction * n_total))``,
    ``int`` of the float product as Python computes it (Yin & Steinhardt's ``get_heads_to_ablate``).

    Raises:
        InductionLabError: ``fraction`` outside (0, 1]."""
    return max(1, int(_fraction(fraction, "fraction") * _int("n_total", n_total, 1)))


def excluded_count(n_total: int, fraction: float) -> int:
    """How many of another ranking's top heads an exclusion of ``fraction`` of all ``n_total`` heads removes:
    ``max(1, int(fraction * n_total))`` (Yin & Steinhardt's ``int(f * N)``, at least one head: under 50 heads the
    default 0.02 would exclude none, and every exclusive selection would equal the plain one); 0 for ``fraction``
    0 (no exclusion).

    Raises:
        InductionLabError: ``fraction`` outside [0, 1)."""
    f = _fraction(fraction, "exclude_fraction", zero=True)
    return 0 if f == 0 else max(1, int(f * _int("n_total", n_total, 1)))


def select_heads(scores, *, fraction: float | None = None, k: int | None = None, exclude_scores=None,
                 exclude_fraction: float = 0.02) -> list[Head]:
    """The top heads of one score's global ranking, best first, optionally excluding another
    ranking's top heads first (Yin & Steinhardt 2025, arXiv 2502.14010; ``kayoyin/icl-heads``
    ``src/utils/ablate_utils.py::get_heads_to_ablate``).

    Exactly one of ``fraction`` (``max(1, int(fraction * N))`` of all N heads, see
    :func:`heads_for_fraction`) and ``k``. With ``exclude_scores``, the top
    ``max(1, int(exclude_fraction * N))`` heads of that ranking (:func:`excluded_count`; the authors' code has no
    minimum, so under 50 heads its default 0.02 excludes none) are removed before taking the top; the count stays the
    one computed from all N heads. Ties are broken by (layer, head) order, as :func:`top_k_heads`.

    Args:
        scores: ``[n_layers, n_heads]``, higher = more of the mechanism.
        exclude_scores: ``[n_layers, n_heads]``, the other ranking (e.g. the induction score).
        exclude_fraction: in [0, 1); the other ranking's top fraction removed [0.02, Yin].

    Raises:
        InductionLabError: neither or both of ``fraction`` / ``k``, a fraction outside (0, 1], k
            not in 1..N, tables of different shapes, non-finite scores, or an exclusion leaving
            fewer heads than requested.
    """
    scores = _scores(scores)
    total = scores.size
    if (fraction is None) == (k is None):
        raise InductionLabError("select_heads: give exactly one of fraction= (e.g. 0.05) and k= (e.g. 10)")
    n = heads_for_fraction(total, fraction) if k is None else _int("k", k, 1)
    if n > total:
        raise InductionLabError(f"k={n} heads requested but the model has {total}; use k <= {total}")
    excluded: set[Head] = set()
    if exclude_scores is not None:
        other = _scores(exclude_scores)
        if other.shape != scores.shape:
            raise InductionLabError(f"exclude_scores has shape {other.shape} but scores {scores.shape}; give two "
                                    "tables of the same model")
        excluded = set(top_k_heads(other, excluded_count(total, exclude_fraction)))
    if n > total - len(excluded):
        raise InductionLabError(f"{n} heads requested but only {total - len(excluded)} of {total} remain after "
                                f"excluding the other ranking's top {len(excluded)}; lower the fraction or k, or "
                                "exclude_fraction")
    return [h for h in top_k_heads(scores, total) if h not in excluded][:n]



def selection_conditions(scores, *, fractions=None, ks=None, exclude_scores=None, exclude_label: str | None = None,
                         exclude_fraction: float = 0.02, n_draws: int = 3, random: str = "all",
                         exclude_top_n: int | None = None, seed: int = 0, label: str = "fv",
                         intact: bool = True) -> list[Condition]:
    """Intact, then per size the top heads of a score's ranking (:func:`select_heads`), the same with
    another ranking's top heads excluded, and ``n_draws`` random draws of the same count (Yin &
    Steinhardt 2025, arXiv 2502.14010, ``get_heads_to_ablate``: its fractions, exclusion and random
    control; SPEC §10).

    Sizes: ``fractions`` (each ``max(1, int(f * N))`` of all N heads) or ``ks``, not both. Names and
    kinds, with ``<size>`` = ``<100 f>pct`` (``5pct``, ``0.5pct``) or ``k`` (``10``):

    * ``<label>-<size>`` — the top heads by ``scores``; kind ``label``;
    * ``<label>-excl-<exclude_label>-<size>`` — only with ``exclude_scores``: the top heads after
      removing ``exclude_scores``' top ``max(1, int(exclude_fraction * N))`` (:func:`excluded_count`); kind ``<label>-excl-<exclude_label>``;
    * ``random-<size>-d<d>`` (``random="all"``: uniform over all heads, so a draw may hold top heads,
      as Yin's and Ji-An's controls) or ``random-outside-<size>-d<d>`` (``random="outside-top-n"``:
      outside the top ``exclude_top_n`` by ``scores``, default min(300, N // 2), as
      :func:`ablation_conditions`); kind ``random``.

    Every condition's ``k`` is its head count, so the random draws pool per count
    (:func:`~inductionlab.measures.stats.draws_by_k`). Draw ``d`` of count ``n`` uses
    ``random_heads(..., seed=seed_for(seed, n, d))``, the seeds of :func:`ablation_conditions`: with
    ``random="outside-top-n"`` and the same scores, a k's draws equal its ``random-<k>-d<d>`` heads.
    The exclusion applies to the selection only, not to the random draws (as in the authors' code).

    Args:
        scores: ``[n_layers, n_heads]`` (e.g. FV scores).
        exclude_scores: ``[n_layers, n_heads]`` of the other ranking (e.g. induction scores), named
            ``exclude_label`` in the conditions (required with it).
        label: the ranking's name in the conditions (``fv``, ``induction``, ...).

    Raises:
        InductionLabError: neither or both of ``fractions`` / ``ks``, a fraction outside (0, 1] or a
            k outside 1..N, two sizes that give the same count (their random draws would pool
            together), ``exclude_scores`` without ``exclude_label``, an unknown ``random``,
            ``exclude_top_n`` with ``random="all"``, ``n_draws`` < 0, or too few heads left after an
            exclusion (see :func:`select_heads`, :func:`random_heads`).
    """
    scores = _scores(scores)
    total = scores.shape[0] * scores.shape[1]
    if (fractions is None) == (ks is None):
        raise InductionLabError("selection_conditions: give exactly one of fractions= (e.g. (0.01, 0.05)) and "
                                "ks= (e.g. (5, 10))")
    one = fractions if fractions is not None else ks
    sizes = list(one) if isinstance(one, (list, tuple, np.ndarray)) else [one]
    if not sizes:
        raise InductionLabError("selection_conditions: no size given; pass at least one fraction or k")
    if random not in RANDOM_CONTROLS:
        raise InductionLabError(f"random={random!r}: use one of {', '.join(RANDOM_CONTROLS)}")
    if random == "all" and exclude_top_n is not None:
        raise InductionLabError("exclude_top_n is for random='outside-top-n'; drop it or set that control")
    if exclude_scores is not None and not exclude_label:
        raise InductionLabError("exclude_scores needs exclude_label=, the other ranking's name in the conditions "
                                "(e.g. exclude_label='induction')")
    n_draws = _int("n_draws", n_draws, 0)
    rows = []                                              # (size tag, fraction or None, k or None, count)
    for x in sizes:
        if fractions is not None:
            rows.append((f"{_fraction(x, 'fraction') * 100:g}pct", x, None, heads_for_fraction(total, x)))
        else:
            rows.append((str(_int("k", x, 1)), None, x, int(x)))
    for i, (tag, *_, n) in enumerate(rows):
        same = [t for t, *_, m in rows[:i] if m == n]
        if same:
            raise InductionLabError(f"sizes {same[0]} and {tag} both select {n} of {total} heads; give each count once")
    excluded = []
    if random == "outside-top-n":
        N = default_exclude_top_n(total) if exclude_top_n is None else exclude_top_n
        if isinstance(N, (bool, np.bool_)) or not isinstance(N, (int, np.integer)) or not 0 <= N <= total:
            raise InductionLabError(f"exclude_top_n={N} must be between 0 and the model's {total} heads")
        excluded = top_k_heads(scores, N)
    prefix = "random-outside" if random == "outside-top-n" else "random"
    out = [Condition("intact", "intact")] if intact else []
    for tag, f, k, n in rows:
        out.append(Condition(f"{label}-{tag}", label, n, 0, select_heads(scores, fraction=f, k=k)))
        if exclude_scores is not None:
            kind = f"{label}-excl-{exclude_label}"
            out.append(Condition(f"{kind}-{tag}", kind, n, 0,
                                 select_heads(scores, fraction=f, k=k, exclude_scores=exclude_scores,
                                              exclude_fraction=exclude_fraction)))
        for d in range(n_draws):
            out.append(Condition(f"{prefix}-{tag}-d{d}", "random", n, d,
                                 random_heads(scores.shape, n, excluded, seed_for(seed, n, d))))
    return out


RANKED_RANDOM = {"outside-top-n": "random", "all": "random-all"}   # the name prefix of each random control


def ranked_label(rank_by: str = "induction", exclude_by: str | None = None) -> str:
    """The kind of the ranked conditions of :func:`ranked_conditions`: ``rank_by``, or
    ``<rank_by>-excl-<exclude_by>`` with an exclusion (``induction``, ``previous_token``, ``induction-excl-fv``)."""
    return rank_by if exclude_by is None else f"{rank_by}-excl-{exclude_by}"


def _score(scores, name: str, what: str) -> np.ndarray:
    if name not in scores:
        raise InductionLabError(f"{what} {name!r}: no such head score; available: {', '.join(scores)}")
    return scores[name]


def ranked_conditions(scores, ks, *, rank_by: str = "induction", exclude_by: str | None = None,
                      exclude_fraction: float = 0.02, random: str = "outside-top-n", n_draws: int = 3,
                      exclude_top_n: int | None = None, seed: int = 0, intact: bool = True) -> list[Condition]:
    """The ablation conditions of ``analyze``, ``study temporal`` and ``evaluate``: intact, then per k the
    top-k heads of one score's ranking and ``n_draws`` random-k draws (SPEC §4, with §10's selection).

    With the defaults (rank by ``induction``, no exclusion, random heads outside the top N) this is
    exactly :func:`ablation_conditions` of ``scores["induction"]``: ``induction-<k>`` and ``random-<k>-d<d>``.
    Otherwise the ranked conditions carry the ranking's label (:func:`ranked_label`) as name and kind,
    so a selection by another score is never called "induction":

    * ``<rank_by>-<k>`` — the top k by ``scores[rank_by]``;
    * ``<rank_by>-excl-<exclude_by>-<k>`` — with ``exclude_by``: the top k after removing the top
      ``max(1, int(exclude_fraction * N))`` heads by ``scores[exclude_by]`` (:func:`select_heads`, Yin & Steinhardt 2025);
    * ``random-<k>-d<d>`` (``random="outside-top-n"``: outside the top ``exclude_top_n`` by ``scores[rank_by]``,
      default min(300, N // 2)) or ``random-all-<k>-d<d>`` (``random="all"``: uniform over all heads); kind
      ``random``; draw ``d`` seeded ``seed_for(seed, k, d)`` as in :func:`ablation_conditions`. The
      exclusion applies to the ranked selection only.

    Args:
        scores: score name -> ``[n_layers, n_heads]`` (the run's head scores, plus columns of a scores file).

    Raises:
        InductionLabError: an unknown score name (the message lists the available ones), ``exclude_by``
            equal to ``rank_by``, an unknown ``random``, ``exclude_top_n`` with ``random="all"``, and what
            :func:`ablation_conditions` / :func:`select_heads` refuse.
    """
    rank = _scores(_score(scores, rank_by, "rank_by"))
    other = None
    if exclude_by is not None:
        if exclude_by == rank_by:
            raise InductionLabError(f"exclude_by {exclude_by!r} is the ranking itself; exclude another score's top heads")
        other = _score(scores, exclude_by, "exclude_by")
    if random not in RANKED_RANDOM:
        raise InductionLabError(f"random={random!r}: use one of {', '.join(RANKED_RANDOM)}")
    if random == "all" and exclude_top_n is not None:
        raise InductionLabError("exclude_top_n is for random='outside-top-n'; drop it or set that control")
    out = ablation_conditions(rank, ks, n_draws=n_draws, exclude_top_n=0 if random == "all" else exclude_top_n,
                              seed=seed, intact=intact)
    label = ranked_label(rank_by, exclude_by)
    for c in out:
        if c.kind == "induction":
            c.kind, c.name = label, f"{label}-{c.k}"
            if other is not None:
                c.heads = select_heads(rank, k=c.k, exclude_scores=other, exclude_fraction=exclude_fraction)
        elif c.kind == "random":
            c.name = f"{RANKED_RANDOM[random]}-{c.k}-d{c.draw}"
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
