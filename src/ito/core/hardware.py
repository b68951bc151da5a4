"""What each bookable accelerator offers: dense peak FLOP/s, memory, and fp8 support.

Peak dense bf16 figures are the vendors' datasheet numbers without sparsity (NVIDIA H100 SXM,
H200 SXM, A100 SXM, B200 datasheets). ``cpu`` is one CPU worker process standing in for a GPU on
machines without one; its figure is a conservative order of magnitude, not a measurement.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["ACCELERATORS", "FABRICS", "Accelerator"]


@dataclass(frozen=True)
class Accelerator:
    name: str
    peak_bf16_flops: float
    memory_gb: int
    fp8: bool
    assumed_mfu: float
    """Model-FLOPs utilisation the cost estimate assumes before anything was measured."""


ACCELERATORS: dict[str, Accelerator] = {
    a.name: a
    for a in (
        Accelerator("a100", 312e12, 80, fp8=False, assumed_mfu=0.40),
        Accelerator("h100", 989e12, 80, fp8=True, assumed_mfu=0.40),
        Accelerator("h200", 989e12, 141, fp8=True, assumed_mfu=0.40),
        Accelerator("b200", 2250e12, 192, fp8=True, assumed_mfu=0.35),
        Accelerator("cpu", 50e9, 8, fp8=False, assumed_mfu=0.10),
    )
}

FABRICS: tuple[str, ...] = ("nvlink", "infiniband", "roce", "ethernet")
"""``nvlink`` joins GPUs inside one node; the other three join nodes."""
