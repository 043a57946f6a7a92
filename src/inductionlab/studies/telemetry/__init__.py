"""``inductionlab telemetry``: head telemetry over training of one or more runs and, with ``--head-types``, every
head's type at every checkpoint (one resumable piece per run and checkpoint).

``config`` (:class:`TelemetryConfig`, ``SPEC``), ``study`` (``prepare`` / ``phases`` / ``result``,
:func:`run_telemetry`, :func:`training_pool`), ``report`` (``write``, ``summary``). Names are imported on first
use: importing ``config`` loads no torch.
"""

from ..spec import lazy_exports

__getattr__ = lazy_exports(__name__, {
    "TelemetryConfig": "config", "SPEC": "config", "TelemetryResult": "study", "run_telemetry": "study",
    "training_pool": "study"})
__all__ = ["TelemetryConfig", "SPEC", "TelemetryResult", "run_telemetry", "training_pool"]
