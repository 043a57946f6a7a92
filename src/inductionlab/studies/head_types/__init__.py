"""``inductionlab study head-types``: FV and induction heads scored, compared and ablated exclusively (SPEC §10).

``config`` (:class:`HeadTypesConfig`, ``SPEC``), ``study`` (``prepare`` / ``phases`` / ``result``, ``STUDY``,
:func:`run_head_types`), ``verdicts`` (claims Y1–Y4), ``report`` (``write``, ``summary``). Names are imported on
first use: importing ``config`` loads no torch.
"""

from ..spec import lazy_exports

__getattr__ = lazy_exports(__name__, {
    "HeadTypesConfig": "config", "SPEC": "config", "HeadTypesStudy": "study", "run_head_types": "study"})
__all__ = ["HeadTypesConfig", "SPEC", "HeadTypesStudy", "run_head_types"]
