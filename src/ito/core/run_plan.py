"""The parallelism plan of one run on one booking: what gate 5 asks the planner (DESIGN §5.8,
§7.2) and what the run carries to its engine.

The planner is asked about the manifest's model at the curriculum's longest sequence (a run
builds one mesh for all its stages, so the stage with the most activation memory decides), the
global batch the engine trains on (:data:`SEQUENCES_PER_RANK` sequences for every booked
accelerator each step), and the booking's accelerator, nodes, GPUs per node and fabric. Degrees
the manifest pins (``resources.parallelism``) are validated instead of chosen; more than one
replica group pins ``dp_replicate`` (each group is one replica of HSDP, kept in step by torchft).

A booking of the ``cpu`` stand-in (tests, the demo) is not planned for speed: the planner only
checks, with every degree pinned to what the engine runs on CPU (FSDP2 over every process of a
replica group, :data:`SEQUENCES_PER_RANK` sequences per process, fp32, no activation
checkpointing), that the model fits. The answer says which of the two it did (``mode``).

A plan other than the engine's default carries its ``layout`` (:class:`~ito.core.run_spec.
LayoutSpec`: the degrees, micro-batching, activation checkpointing and precision) to the engine,
which builds exactly that mesh and fails the run if it cannot (``ito.pipeline.layout``); the
default layout travels as ``None``. Nothing planned is dropped on the way: a layout the engine
would not apply is refused here, at plan time — context parallelism (the planner refuses it),
a layout other than FSDP inside torchft replica groups, and ``torch.compile`` (the planner is
told this engine runs eager, and says what that costs its prediction).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import lru_cache
from typing import Any, Literal

from ito.core.hardware import ACCELERATORS, FABRIC_LINKS
from ito.core.manifest import Manifest
from ito.core.model_sizes import SIZES
from ito.core.planner import ModelShape, Parallelism, Plan, PlannerInput, PlanRefused, plan
from ito.core.planner_checks import Reason, ReasonCode
from ito.core.planner_inputs import MESH_ORDER
from ito.core.run_spec import LayoutSpec

__all__ = [
    "SEQUENCES_PER_RANK",
    "RunPlan",
    "engine_layout",
    "layout_spec",
    "plan_run_parallelism",
]

SEQUENCES_PER_RANK = 4
"""Sequences each data-parallel rank trains on per optimizer step: the engine's batch
(``ito.pipeline.train.MICRO_BATCH`` is this constant)."""

PlanMode = Literal["planned", "cpu_stand_in"]


@dataclass(frozen=True)
class RunPlan:
    mode: PlanMode
    """``planned``: the planner chose (a GPU booking); ``cpu_stand_in``: the engine's CPU
    layout, checked by the planner."""
    applied: bool
    """Whether this version's engine trains exactly this layout and precision."""
    note: str
    seq_len: int
    """The sequence length planned for (the curriculum's longest)."""
    pinned: dict[str, object]
    """What the manifest (and its replica groups) pinned."""
    plan: Plan
    layout: LayoutSpec | None = None
    """What the engine applies; ``None``: its default layout, which is the plan."""
    _rendered: dict[str, Any] = field(default_factory=dict, init=False, repr=False, compare=False)

    def to_dict(self) -> dict[str, Any]:
        """The plan as the API and the stored estimate show it: built once per plan (a create
        asks for it on every request, and plans are memoised), a fresh outer dict each call."""
        if not self._rendered:
            self._rendered.update(
                mode=self.mode,
                applied=self.applied,
                note=self.note,
                seq_len=self.seq_len,
                pinned=dict(self.pinned),
                plan=self.plan.to_dict(),
                layout=None if self.layout is None else self.layout.model_dump(),
            )
        return dict(self._rendered)


def engine_layout(world: int, replica_groups: int) -> Parallelism:
    """What this version's engine runs: FSDP2 over each replica group's processes, the groups
    replicas of each other, :data:`SEQUENCES_PER_RANK` sequences per rank in one micro-batch,
    no tensor, pipeline or context parallelism, no activation checkpointing."""
    return Parallelism(
        dp_replicate=replica_groups,
        dp_shard=world // replica_groups,
        tp=1,
        pp=1,
        cp=1,
        micro_batch=SEQUENCES_PER_RANK,
        activation_checkpointing="none",
    )


def _manifest_pins(manifest: Manifest) -> dict[str, object]:
    res = manifest.resources
    pins: dict[str, object] = {}
    if res.parallelism is not None:
        pins = res.parallelism.model_dump(exclude_none=True)
    if res.replica_groups > 1:
        pins.setdefault("dp_replicate", res.replica_groups)
    return pins


def _cpu_pins(engine: Parallelism, pins: dict[str, object]) -> dict[str, object]:
    """The engine's CPU layout where the manifest pins nothing; degrees the manifest pins
    replace the engine's whole mesh (the planner then chooses the degrees left free)."""
    base = engine.pinned
    if any(key in MESH_ORDER for key in pins):
        base = {k: v for k, v in base.items() if k not in MESH_ORDER}
    return base | pins


def plan_run_parallelism(
    manifest: Manifest, *, gpu: str, nodes: int, gpus_per_node: int, fabric: str
) -> RunPlan:
    """The run's plan on this booking, or :class:`~ito.core.planner.PlanRefused`.

    The planner is a pure function of what is passed on here, so its answer is memoised on
    exactly those values: every create of a run re-asks gate 5, and the search and its rendering
    were a third of a create's CPU. A refusal is not memoised (it is raised anew)."""
    pins = _manifest_pins(manifest)
    return _planned(
        manifest.model.size,
        max(stage.seq_len for stage in manifest.curriculum),
        tuple(sorted(pins.items())),
        manifest.resources.replica_groups,
        gpu,
        nodes,
        gpus_per_node,
        fabric,
    )


@lru_cache(maxsize=512)
def _planned(
    size: str,
    seq_len: int,
    pinned_items: tuple[tuple[str, object], ...],
    replica_groups: int,
    gpu: str,
    nodes: int,
    gpus_per_node: int,
    fabric: str,
) -> RunPlan:
    accelerator = ACCELERATORS[gpu]
    world = nodes * gpus_per_node
    pins = dict(pinned_items)
    on_cpu = accelerator.compute_capability is None
    engine = engine_layout(world, replica_groups)
    pinned = Parallelism.from_mapping(_cpu_pins(engine, pins) if on_cpu else pins)
    inp = PlannerInput(
        model=ModelShape.from_size(SIZES[size]),
        seq_len=seq_len,
        accelerator=accelerator,
        nodes=nodes,
        gpus_per_node=gpus_per_node,
        fabric=FABRIC_LINKS[fabric],
        global_batch_tokens=SEQUENCES_PER_RANK * world * seq_len,
        pinned=pinned,
        # The CPU stand-in is for tests and the demo: only what cannot run refuses it.
        allow_wasteful=on_cpu,
        compile=False,  # this engine runs eager
    )
    result = plan(inp)
    layout = result.layout
    same_layout = (
        layout.dp_replicate,
        layout.dp_shard,
        layout.tp,
        layout.pp,
        layout.cp,
        layout.micro_batch,
        layout.microbatches,
        layout.activation_checkpointing,
    ) == (
        engine.dp_replicate,
        engine.dp_shard,
        1,
        1,
        1,
        SEQUENCES_PER_RANK,
        1,
        "none",
    )
    carried = None if same_layout else layout_spec(result)
    if carried is not None and replica_groups > 1:
        raise PlanRefused(
            [
                Reason(
                    ReasonCode.layout_with_replica_groups,
                    f"{replica_groups} torchft replica groups train FSDP2 "
                    "inside each group; the plan needs another layout "
                    f"({_degrees(result)}), which this engine does not apply there",
                )
            ]
        )
    if carried is None:
        note = (
            "the engine's default layout (FSDP2 over every process of a replica group, "
            f"{SEQUENCES_PER_RANK} sequences per rank, {result.param_dtype} parameters, "
            f"{result.reduce_dtype} reduction), checked by the planner to fit; trained exactly so"
        )
    else:
        note = (
            f"the engine builds exactly this mesh ({_degrees(result)}) with this "
            f"micro-batching, activation checkpointing and precision ({result.param_dtype} "
            f"parameters, {result.reduce_dtype} reduction), eager (no torch.compile), and "
            "fails the run if it cannot"
        )
    return RunPlan(
        mode="cpu_stand_in" if on_cpu else "planned",
        applied=True,
        note=note,
        seq_len=seq_len,
        pinned=pins,
        plan=result,
        layout=carried,
    )


def _degrees(result: Plan) -> str:
    return " × ".join(f"{dim} {degree}" for dim, degree in result.mesh.items() if degree > 1) or (
        "one process"
    )


def layout_spec(result: Plan) -> LayoutSpec:
    """The plan as the run spec carries it to the engine (also what the benches build)."""
    return LayoutSpec(
        dp_replicate=result.dp_replicate,
        dp_shard=result.dp_shard,
        tp=result.tp,
        pp=result.pp,
        cp=result.cp,
        micro_batch=result.micro_batch,
        grad_accum=result.grad_accum,
        pp_microbatches=result.pp_microbatches,
        activation_checkpointing=result.activation_checkpointing,
        param_dtype=_dtype(result.param_dtype),
        reduce_dtype=_dtype(result.reduce_dtype),
    )


def _dtype(name: str) -> Literal["float32", "bfloat16"]:
    if name == "bfloat16":
        return "bfloat16"
    assert name == "float32", name
    return "float32"
