"""The parallel layout the engine applies, and the device mesh it builds for it (DESIGN §7.2).

A run spec carries the planner's degrees (:class:`ito.core.run_spec.LayoutSpec`); without them
the engine trains FSDP over every rank, four sequences per rank, in the precision the planner
plans for the device (fp32 on the CPU stand-in; bf16 parameters, fp32 reduction on a GPU). The
mesh is built in TorchTitan's order, outermost first ``pp, dp_replicate, dp_shard, cp, tp``
(torchtitan ``ParallelDims.build_mesh``), every dimension named even at degree 1, so the mesh the
engine reports compares one to one with the plan's ``mesh`` — except under torchft replica
groups, where each group builds its own mesh (``dp_replicate`` 1) and torchft replicates across
them (the plan's ``dp_replicate`` is the number of groups).

Nothing planned is ignored: a degree the engine cannot apply (context parallel, a pipeline
with fewer micro-batches than stages) is refused with ``layout_unsupported``, and a mesh that
differs from the plan (the degrees do not multiply to the world size) with ``mesh_mismatch`` —
both before any training.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

import torch

from ito.core.errors import ItoError
from ito.core.planner_inputs import MESH_ORDER
from ito.core.run_plan import SEQUENCES_PER_RANK
from ito.core.run_spec import LayoutSpec

if TYPE_CHECKING:
    from torch.distributed.device_mesh import DeviceMesh

__all__ = ["DEFAULT_MICRO_BATCH", "EngineLayout", "build_mesh", "mesh_dims"]

DEFAULT_MICRO_BATCH = SEQUENCES_PER_RANK
"""Sequences per rank when the spec plans no layout: what gate 5 plans a run's batch with."""

UNSUPPORTED: dict[str, str] = {
    "cp": "context parallel is not applied by this engine",
}
"""Degrees the planner may model that the engine refuses above 1, and why."""

DTYPES: dict[str, torch.dtype] = {"float32": torch.float32, "bfloat16": torch.bfloat16}


@dataclass(frozen=True)
class EngineLayout:
    dp_replicate: int
    dp_shard: int
    tp: int
    pp: int
    cp: int
    micro_batch: int
    """Sequences per micro-batch on one data-parallel rank."""
    grad_accum: int
    """Micro-batches accumulated per optimizer step (without a pipeline)."""
    pp_microbatches: int
    """Micro-batches of the pipeline schedule per optimizer step (with one)."""
    activation_checkpointing: Literal["none", "selective", "full"]
    param_dtype: torch.dtype
    reduce_dtype: torch.dtype
    planned: bool
    """Whether a plan set it (``False``: the default for a spec without one)."""

    @classmethod
    def default(cls, world: int, device_type: str = "cpu") -> EngineLayout:
        """FSDP over every rank in the precision the planner plans for the device: bf16
        parameters with fp32 gradient reduction on a GPU (``MixedPrecisionPolicy``), fp32 on
        the CPU stand-in (:func:`ito.core.run_plan.plan_run_parallelism`)."""
        on_gpu = device_type == "cuda"
        return cls(
            dp_replicate=1,
            dp_shard=world,
            tp=1,
            pp=1,
            cp=1,
            micro_batch=DEFAULT_MICRO_BATCH,
            grad_accum=1,
            pp_microbatches=1,
            activation_checkpointing="none",
            param_dtype=torch.bfloat16 if on_gpu else torch.float32,
            reduce_dtype=torch.float32,
            planned=False,
        )

    @classmethod
    def from_spec(
        cls, spec: LayoutSpec | None, world: int, device_type: str = "cpu"
    ) -> EngineLayout:
        """The layout of a spec, checked against what this engine applies and the world size;
        raises :class:`ItoError` (``layout_unsupported``, ``mesh_mismatch``) otherwise."""
        if spec is None:
            return cls.default(world, device_type)
        for dim, why in UNSUPPORTED.items():
            if getattr(spec, dim) > 1:
                raise ItoError(
                    "layout_unsupported", f"the plan has {dim}={getattr(spec, dim)}: {why}"
                )
        if spec.pp == 1 and spec.pp_microbatches > 1:
            raise ItoError(
                "layout_unsupported", "the plan has pp_microbatches without a pipeline to run"
            )
        if spec.pp > 1 and (spec.pp_microbatches < spec.pp or spec.grad_accum > 1):
            # 1F1B keeps every stage busy only with at least as many micro-batches as stages;
            # a pipeline accumulates through its schedule, never around it.
            raise ItoError(
                "layout_unsupported",
                f"pp={spec.pp} needs pp_microbatches >= {spec.pp} and grad_accum 1 "
                f"(the plan has {spec.pp_microbatches} and {spec.grad_accum})",
            )
        layout = cls(
            dp_replicate=spec.dp_replicate,
            dp_shard=spec.dp_shard,
            tp=spec.tp,
            pp=spec.pp,
            cp=spec.cp,
            micro_batch=spec.micro_batch,
            grad_accum=spec.grad_accum,
            pp_microbatches=spec.pp_microbatches,
            activation_checkpointing=spec.activation_checkpointing,
            param_dtype=DTYPES[spec.param_dtype],
            reduce_dtype=DTYPES[spec.reduce_dtype],
            planned=True,
        )
        if layout.world != world:
            raise ItoError(
                "mesh_mismatch",
                f"the plan's degrees ({layout.describe()}) make {layout.world} ranks, "
                f"this run has {world}",
            )
        return layout

    @property
    def degrees(self) -> dict[str, int]:
        """Mesh dimensions, outermost first."""
        return {dim: int(getattr(self, dim)) for dim in MESH_ORDER}

    @property
    def world(self) -> int:
        return math.prod(self.degrees.values())

    @property
    def dp(self) -> int:
        """Data-parallel ranks: each reads its own batches."""
        return self.dp_replicate * self.dp_shard

    @property
    def sequences_per_rank(self) -> int:
        """Sequences one data-parallel rank trains on per optimizer step."""
        return self.micro_batch * (self.pp_microbatches if self.pp > 1 else self.grad_accum)

    @property
    def mixed_precision(self) -> bool:
        return self.param_dtype != torch.float32 or self.reduce_dtype != torch.float32

    def describe(self) -> str:
        return " ".join(f"{dim}={n}" for dim, n in self.degrees.items())

    def dp_coordinates(self, mesh: DeviceMesh) -> tuple[int, int]:
        """This rank's data-parallel rank and the data-parallel size: ranks of one tensor-parallel
        group read the same batch."""
        rank = mesh.get_local_rank("dp_replicate") * self.dp_shard + mesh.get_local_rank("dp_shard")
        return rank, self.dp


def build_mesh(device_type: str, layout: EngineLayout) -> DeviceMesh:
    """The device mesh of ``layout`` (every dimension of :data:`MESH_ORDER`, named); raises
    ``mesh_mismatch`` if what was built differs from the plan."""
    from torch.distributed.device_mesh import init_device_mesh

    degrees = layout.degrees
    mesh = init_device_mesh(device_type, tuple(degrees.values()), mesh_dim_names=tuple(degrees))
    built = mesh_dims(mesh)
    if built != degrees:
        raise ItoError("mesh_mismatch", f"built mesh {built} differs from the plan {degrees}")
    return mesh


def mesh_dims(mesh: DeviceMesh) -> dict[str, int]:
    """The mesh's dimension names and sizes, outermost first."""
    names = mesh.mesh_dim_names or ()
    return {name: int(size) for name, size in zip(names, mesh.shape, strict=True)}
