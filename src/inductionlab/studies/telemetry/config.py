"""``inductionlab telemetry``: its config (:class:`TelemetryConfig`) and :data:`SPEC`.

Light (no torch): the command line generates ``telemetry``'s options from :class:`TelemetryConfig` (the runs
are its positional ``RUN...`` arguments, not an option: ``cli/train.py`` parses them and calls
:func:`~inductionlab.studies.telemetry.study.run_telemetry`).
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass
from pathlib import Path

from ...checks import check_fields, check_type
from ...config import nested, opt
from ...errors import InductionLabError
from ...protocols.configs import HeadTypeParams
from ..spec import StudySpec


@dataclass
class TelemetryConfig:
    """The head telemetry of training runs (SPEC §7) and, with ``head_types.enabled``, every head's type at every
    checkpoint (issue 26). The runs are inputs, read and never written.

    Attributes:
        runs: training run directories (``inductionlab train --out``); several must be matched-compute.
        threshold: the induction score of the emergence step (None: the first run's ``induction_threshold``).
        head_types: the head-type sweep (:class:`~inductionlab.protocols.configs.HeadTypeParams`; off by default).
    """
    runs: tuple[str, ...] = opt((), "Training run directories (several: matched compute).", cli=False)
    threshold: float | None = opt(None, "Induction-score threshold of the emergence step.",
                                  none="the run's induction_threshold")
    head_types: HeadTypeParams = nested(HeadTypeParams, "Head types over training (--head-types).")

    def names(self) -> list[str]:
        """Each run's name: its directory's last name (``runs/base/`` -> ``base``; ``.`` -> the folder's name),
        the prefix of its files and its key in the record."""
        return [Path(os.path.abspath(r)).name for r in self.runs]

    def validate(self) -> None:
        """Check every option that reads nothing (before a run is opened).

        Raises:
            InductionLabError: no run, two runs of one name, a threshold outside [0, 1] or not finite, a bad
                head-type option (:meth:`~inductionlab.protocols.configs.HeadTypeParams.validate`).
            TypeError: a field of the wrong type (``head_types`` not a HeadTypeParams, a run not a path)."""
        check_fields(self)
        check_type(self.head_types, HeadTypeParams, "TelemetryConfig.head_types")
        self.head_types.validate()
        if not self.runs:
            raise InductionLabError("no training run; pass RUN directories written by `inductionlab train`")
        for r in self.runs:
            check_type(r, (str, os.PathLike), "TelemetryConfig.runs[]")
        if len(set(self.names())) != len(self.runs):
            raise InductionLabError("run directories must have distinct names")
        t = self.threshold
        if t is not None and not (math.isfinite(t) and 0 <= t <= 1):
            raise InductionLabError(f"--threshold must be an attention probability in [0, 1], got {t}")


SPEC = StudySpec(
    "telemetry", TelemetryConfig,
    help="Plot head telemetry over training: score heat maps, max / top-2% mean / heads-above-threshold curves, "
         "held-out perplexity and the emergence step. Several RUNS must be matched-compute. With --head-types, "
         "also every head's induction, concept / token copying and CMR fit at every checkpoint (one resumable "
         "piece per checkpoint), crossings of each type's threshold, CMR-like share per layer and induction "
         "concentration (OUT/head_types/). Guide: docs/train.md.",
    model=None, out="{cfg.runs[0]}/telemetry")


__all__ = ["TelemetryConfig", "SPEC"]
