"""The training pipeline that runs under ``torchrun`` on the booked machines (DESIGN §7).

``python -m ito.pipeline.run --spec spec.json`` is the pretrain engine's entry point: the worker
writes a :class:`~ito.pipeline.spec.RunSpec`, launches the engine and tails the events file it
appends to (:mod:`ito.pipeline.events`). Importing this package loads neither torch nor any
model code; the modules that need torch import it themselves.
"""

from __future__ import annotations

__all__: list[str] = []
