"""Fail closed on the accelerator (DESIGN §7.2, issue 9 item 5): a run on a GPU booking trains
only where the engine sees the booked GPUs — CUDA available, at least the booked count per node,
every device of the booked model. Anything else is ``accelerator_unavailable`` before the first
training step; the engine never falls back to the CPU (a GPU booking would be billed for it).

The ``cpu`` stand-in (tests, the demo) needs nothing.
"""

from __future__ import annotations

from ito.core.hardware import ACCELERATORS, device_matches
from ito.core.run_spec import BookedAccelerator

__all__ = ["accelerator_problem"]


def accelerator_problem(booked: BookedAccelerator | None) -> str | None:
    """Why this process cannot train on the booked accelerator, or ``None`` when it can."""
    if booked is None or ACCELERATORS[booked.gpu].compute_capability is None:
        return None
    import torch

    if not torch.cuda.is_available():
        return (
            f"the booking is of {booked.gpu} GPUs but this process sees no CUDA device; "
            "a GPU run never falls back to the CPU"
        )
    count = torch.cuda.device_count()
    if count < booked.gpus_per_node:
        return (
            f"the booking has {booked.gpus_per_node} {booked.gpu} GPU(s) per node but this "
            f"node shows {count} CUDA device(s)"
        )
    names = sorted({torch.cuda.get_device_name(i) for i in range(count)})
    wrong = [name for name in names if not device_matches(booked.gpu, name)]
    if wrong:
        return f"the booking is of {booked.gpu} GPUs but this node's devices are {names}"
    return None
