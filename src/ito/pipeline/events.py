"""The events file the worker tails: one JSON object per line, appended by rank 0 only.

Each line is written with a single ``write()`` on a file opened ``O_APPEND``, so a reader never
sees half a line from a live writer and two attempts appending to the same file interleave by
whole lines. No fsync: the file is telemetry, the checkpoint's ``COMMIT`` is the durable record.

Every line is one of the event models of :mod:`ito.core.pipeline_events` (``log``, ``stage``,
``metric``, ``checkpoint``, ``gate``, ``restart``, ``spike``, ``done``; each also has ``ts``, unix
seconds): :meth:`EventWriter.emit` validates an event of those types against its model before
writing it, so the engine cannot write a line the supervisor would refuse. (Other types — the
fault-tolerance drill's ``step`` records — are written as given.)

A non-finite number (a diverged loss) is written as ``null``.
"""

from __future__ import annotations

import json
import math
import os
import time
from pathlib import Path
from typing import Any, get_args

from ito.core.pipeline_events import LOG_MESSAGE_MAX_CHARS, PipelineEvent, pipeline_event

__all__ = ["EventWriter"]

_MODELLED = frozenset(
    model.model_fields["type"].default for model in get_args(get_args(PipelineEvent)[0])
)
"""The ``type`` values that have a model."""


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
        if type_ in _MODELLED:
            # What the engine gave, checked and in its canonical form (defaults not written).
            event = pipeline_event(event).model_dump(mode="json", exclude_unset=True)
        line = json.dumps(event, allow_nan=False)
        os.write(self._fd, line.encode() + b"\n")

    @property
    def enabled(self) -> bool:
        """Whether this writer writes (rank 0's) or drops what it is given."""
        return self._fd is not None

    def log(self, level: str, message: str) -> None:
        if len(message) > LOG_MESSAGE_MAX_CHARS:
            message = message[: LOG_MESSAGE_MAX_CHARS - 16] + " … (truncated)"
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
