"""The events file the worker tails: one JSON object per line, appended by rank 0 only.

Each line is written with a single ``write()`` on a file opened ``O_APPEND``, so a reader never
sees half a line from a live writer and two attempts appending to the same file interleave by
whole lines. No fsync: the file is telemetry, the checkpoint's ``COMMIT`` is the durable record.

Event types (every line also has ``ts``, unix seconds):

- ``{"type": "log", "level", "message"}``
- ``{"type": "stage", "stage", "status": "started" | "completed"}``
- ``{"type": "metric", "stage", "step", "values": {"loss", "lr", "grad_norm", "tokens_per_s",
  "mfu", "step_seconds"}}``
- ``{"type": "checkpoint", "stage", "step", "path", "bytes", "seconds"}``
- ``{"type": "gate", "stage", "battery", "results": [...], "passed"}``
- ``{"type": "restart", "restarts"}`` — torchrun restarted the ranks (an interruption)
- ``{"type": "spike", "stage", "step", "loss", "z", "checkpoint_step", "skip_steps"}``
- ``{"type": "done", "status": "succeeded" | "gate_failed" | "spike" | "stopped" | "failed"}``
  — ``stopped``: the worker asked for a stop (its stop file), the engine committed a checkpoint
  at ``step`` and exited; ``failed``: a refusal with a stable ``code`` and a ``reason`` (the
  checkpoint storage failed its proof on disk), the processes exit non-zero

A non-finite number (a diverged loss) is written as ``null``.
"""

from __future__ import annotations

import json
import math
import os
import time
from pathlib import Path
from typing import Any

__all__ = ["EventWriter"]


class EventWriter:
    """Appends events; a writer built with ``enabled=False`` (ranks other than 0) drops them."""

    def __init__(self, path: Path, *, enabled: bool) -> None:
        self._fd: int | None = None
        if enabled:
            path.parent.mkdir(parents=True, exist_ok=True)
            self._fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)

    def emit(self, type_: str, **fields: Any) -> None:
        if self._fd is None:
            return
        event = _finite({"type": type_, "ts": time.time(), **fields})
        line = json.dumps(event, allow_nan=False)
        os.write(self._fd, line.encode() + b"\n")

    def log(self, level: str, message: str) -> None:
        self.emit("log", level=level, message=message)

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None


def _finite(value: Any) -> Any:
    """NaN and infinities become ``null``: JSON has no spelling for them."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_finite(v) for v in value]
    return value
