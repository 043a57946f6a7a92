"""Training metrics: JSONL (one row per logged step) + CSV, TensorBoard when installed, and a
tqdm progress bar with tokens/s and loss. Only the main process writes.

After a resume, rows beyond the resumed step are dropped first, so the log of a killed and
resumed run reads like the log of an uninterrupted one (a torn last line is skipped).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pandas as pd

from ..runtime.runs import _jsonable, atomic_write_text


class MetricsLogger:
    def __init__(self, run_dir: str | Path, *, start_step: int, total_steps: int, enabled: bool = True,
                 progress: bool = True, tensorboard: bool = True):
        self.enabled = enabled
        self.path = Path(run_dir) / "metrics.jsonl"
        self.csv = Path(run_dir) / "metrics.csv"
        self.tb = None
        self.bar = None
        if not enabled:
            return
        kept = [r for r in read_jsonl(self.path) if r.get("step", 0) <= start_step]
        atomic_write_text(self.path, "".join(json.dumps(r) + "\n" for r in kept))
        self.fh = open(self.path, "a", buffering=1)
        if tensorboard:
            try:
                from torch.utils.tensorboard import SummaryWriter
                self.tb = SummaryWriter(str(Path(run_dir) / "tensorboard"), purge_step=start_step + 1)
            except (ImportError, ModuleNotFoundError):
                self.tb = None
        if progress:
            from tqdm.auto import tqdm
            self.bar = tqdm(total=total_steps, initial=start_step, unit="step", dynamic_ncols=True)

    def log(self, row: dict[str, Any]) -> None:
        if not self.enabled:
            return
        try:
            self.fh.write(json.dumps(_jsonable(row)) + "\n")
        except OSError as e:                  # a full disk: name the file (a torn last line is skipped on resume)
            e.filename = e.filename or str(self.path)
            raise
        if self.tb is not None:
            for k, v in row.items():
                if k != "step" and isinstance(v, (int, float)):
                    self.tb.add_scalar(f"train/{k}", v, row["step"])
        if self.bar is not None:
            self.bar.update(1)
            self.bar.set_postfix(loss=f"{row['loss']:.3f}", tok_s=f"{row.get('tokens_per_s', 0):.0f}")

    def log_eval(self, step: int, values: dict[str, float]) -> None:
        if self.enabled and self.tb is not None:
            for k, v in values.items():
                if v is not None:
                    self.tb.add_scalar(k, v, step)

    def write_csv(self) -> None:
        if self.enabled:
            self.fh.flush()
            atomic_write_text(self.csv, pd.DataFrame(read_jsonl(self.path)).to_csv(index=False))

    def close(self) -> None:
        if not self.enabled:
            return
        self.write_csv()
        self.fh.close()
        if self.tb is not None:
            self.tb.close()
        if self.bar is not None:
            self.bar.close()


def read_jsonl(path: str | Path) -> list[dict]:
    rows = []
    p = Path(path)
    if not p.is_file():
        return rows
    for line in p.read_text().splitlines():
        try:
            rows.append(json.loads(line))
        except (ValueError, RecursionError):
            continue                        # a line torn by a kill
    return rows
