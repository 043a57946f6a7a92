"""``inductionlab study routes``: which route (token induction, concept induction, CMR-like, FV heads) carries the
seed's effects (SPEC §10, issue 26).

``config`` (:class:`RoutesConfig`, ``SPEC``), ``study`` (``prepare`` / ``phases`` / ``result``, ``STUDY``,
:func:`run_routes`), ``verdicts`` (claims R1–R3), ``report`` (``write``, ``summary``). Names are imported on first
use: importing ``config`` loads no torch.
"""

from ..spec import lazy_exports

__getattr__ = lazy_exports(__name__, {
    "RoutesConfig": "config", "SPEC": "config", "RoutesStudy": "study", "run_routes": "study"})
__all__ = ["RoutesConfig", "SPEC", "RoutesStudy", "run_routes"]
