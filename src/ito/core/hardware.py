"""What each bookable accelerator and each fabric offers: peak FLOP/s, memory, links.

Accelerators: dense (no sparsity) peak figures, memory and compute capability are the vendors'
datasheet numbers (NVIDIA A100 SXM4 80 GB, H100 SXM5, H200 SXM, HGX B200); ``memory_bytes`` is
what ``nvidia-smi`` reports as total memory for the 80 GB / 141 GB / 180 GB parts (81920, 81559,
143771 and 183359 MiB), ``link_bandwidth`` one GPU's NVLink bandwidth in one direction (NVLink 3:
12 links × 25 GB/s; NVLink 4: 18 × 25 GB/s; NVLink 5: 18 × 50 GB/s). ``cpu`` is one CPU worker
process standing in for a GPU on machines without one; its figures are conservative orders of
magnitude, not measurements.

Fabrics join nodes. A rail-optimised fabric gives every GPU its own NIC (DGX H100: eight
ConnectX-7 at 400 Gb/s; Meta's RoCE clusters for Llama 3: 400 Gb/s per GPU, Llama 3 paper
§3.3.1); plain ``ethernet`` is one commodity 100 Gb/s NIC that all GPUs of a node share.
``nvlink`` joins the GPUs inside one node and nothing between nodes.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Literal

__all__ = [
    "ACCELERATORS",
    "FABRICS",
    "FABRIC_LINKS",
    "Accelerator",
    "Fabric",
    "device_matches",
]

_MIB = 1 << 20


@dataclass(frozen=True)
class Accelerator:
    name: str
    peak_bf16_flops: float
    """Dense bf16 tensor-core peak, FLOP/s."""
    memory_gb: int
    """Nominal memory in GB as sold (what a booking states)."""
    fp8: bool
    """Whether the tensor cores do fp8 (compute capability 8.9 or newer)."""
    assumed_mfu: float
    """Model-FLOPs utilisation the cost estimate assumes before anything was measured."""
    memory_bytes: int
    """Total device memory as the driver reports it; the planner's capacity."""
    peak_fp8_flops: float | None
    """Dense fp8 tensor-core peak, FLOP/s; ``None`` where the hardware has no fp8."""
    compute_capability: tuple[int, int] | None
    """CUDA compute capability (major, minor); ``None`` for the CPU stand-in."""
    link_bandwidth: float
    """Bytes/s one accelerator can send to the others of its node, in one direction."""
    kernel_efficiency: float
    """Fraction of the bf16 peak a Llama decoder's forward and backward kernels reach when
    nothing waits on communication or recomputation. Assumed, to be calibrated by the GPU
    benchmark (issue 9): TorchTitan reports 58 % MFU for Llama 3 8B under FSDP on A100
    (docs/performance.md), Hopper and Blackwell reach a smaller share of their larger peak."""


ACCELERATORS: dict[str, Accelerator] = {
    a.name: a
    for a in (
        Accelerator(
            "a100",
            peak_bf16_flops=312e12,
            memory_gb=80,
            fp8=False,
            assumed_mfu=0.40,
            memory_bytes=81920 * _MIB,
            peak_fp8_flops=None,
            compute_capability=(8, 0),
            link_bandwidth=300e9,
            kernel_efficiency=0.55,
        ),
        Accelerator(
            "h100",
            peak_bf16_flops=989e12,
            memory_gb=80,
            fp8=True,
            assumed_mfu=0.40,
            memory_bytes=81559 * _MIB,
            peak_fp8_flops=1979e12,
            compute_capability=(9, 0),
            link_bandwidth=450e9,
            kernel_efficiency=0.45,
        ),
        Accelerator(
            "h200",
            peak_bf16_flops=989e12,
            memory_gb=141,
            fp8=True,
            assumed_mfu=0.40,
            memory_bytes=143771 * _MIB,
            peak_fp8_flops=1979e12,
            compute_capability=(9, 0),
            link_bandwidth=450e9,
            kernel_efficiency=0.45,
        ),
        Accelerator(
            "b200",
            peak_bf16_flops=2250e12,
            memory_gb=192,
            fp8=True,
            assumed_mfu=0.35,
            memory_bytes=183359 * _MIB,
            peak_fp8_flops=4500e12,
            compute_capability=(10, 0),
            link_bandwidth=900e9,
            kernel_efficiency=0.40,
        ),
        Accelerator(
            "cpu",
            peak_bf16_flops=50e9,
            memory_gb=8,
            fp8=False,
            assumed_mfu=0.10,
            memory_bytes=8192 * _MIB,
            peak_fp8_flops=None,
            compute_capability=None,
            link_bandwidth=5e9,
            kernel_efficiency=0.5,
        ),
    )
}


@dataclass(frozen=True)
class Fabric:
    name: str
    inter_node: bool
    """Whether it joins nodes at all (``nvlink`` does not)."""
    nic_bandwidth: float
    """Bytes/s of one NIC in one direction."""
    nics: Literal["per_gpu", "per_node"]
    """One NIC for every GPU (rail-optimised) or one shared by the whole node."""

    def node_bandwidth(self, gpus_per_node: int) -> float:
        """Bytes/s one node can send to the others, in one direction."""
        if not self.inter_node:
            return 0.0
        return self.nic_bandwidth * (gpus_per_node if self.nics == "per_gpu" else 1)


FABRIC_LINKS: dict[str, Fabric] = {
    f.name: f
    for f in (
        Fabric("nvlink", inter_node=False, nic_bandwidth=0.0, nics="per_node"),
        Fabric("infiniband", inter_node=True, nic_bandwidth=400e9 / 8, nics="per_gpu"),
        Fabric("roce", inter_node=True, nic_bandwidth=400e9 / 8, nics="per_gpu"),
        Fabric("ethernet", inter_node=True, nic_bandwidth=100e9 / 8, nics="per_node"),
    )
}

FABRICS: tuple[str, ...] = tuple(FABRIC_LINKS)
"""``nvlink`` joins GPUs inside one node; the other three join nodes."""


def device_matches(accelerator: str, device_name: str) -> bool:
    """Whether a CUDA device name (``torch.cuda.get_device_name``: "NVIDIA H100 80GB HBM3",
    "NVIDIA A100-SXM4-80GB", "NVIDIA H200", "NVIDIA B200") is of the booked accelerator: the
    model as a whole word, so an ``h100`` booking is not met by an "H100 NVL"'s neighbour
    "GH100" nor an ``h200`` one by a "GH200"."""
    model = re.escape(accelerator.upper())
    return re.search(rf"(?<![A-Z0-9]){model}(?![0-9])", device_name.upper()) is not None
