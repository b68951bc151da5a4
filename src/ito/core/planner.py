"""The parallelism and precision planner (DESIGN §7.2): pure arithmetic, no torch, no I/O.

``plan(PlannerInput) -> Plan`` weighs every layout the hardware and the model allow
(data-parallel replicate × shard, tensor, pipeline and context-parallel degrees, micro-batch,
activation checkpointing), keeps those nothing refuses, and returns the fastest predicted one
with the rule behind each choice. When none is acceptable it raises :class:`PlanRefused`
(``plan_refused``) carrying every reason, each a stable code and a sentence. Choices the caller
pins (:class:`Parallelism`, a manifest's ``resources.parallelism``) are validated instead of
chosen.

Where things live: the inputs and layouts in :mod:`ito.core.planner_inputs`, memory in
:mod:`ito.core.planner_memory`, time and communication in :mod:`ito.core.planner_time`, the
refusal rules in :mod:`ito.core.planner_checks`, the explanations in
:mod:`ito.core.planner_rules`.

Example::

    inp = PlannerInput(ModelShape.from_size(SIZES["8b"]), seq_len=8192,
                       accelerator=ACCELERATORS["h100"], nodes=1, gpus_per_node=8,
                       fabric=FABRIC_LINKS["infiniband"], global_batch_tokens=8 * 8192)
    plan(inp).to_dict()      # or: except PlanRefused as refused: refused.reasons
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, replace
from typing import Any

from ito.core.errors import ItoError
from ito.core.planner_checks import (
    Candidate,
    Reason,
    ReasonCode,
    evaluate,
    global_reasons,
    idle,
    nearest,
    tp_misfit,
)
from ito.core.planner_inputs import (
    AC_MODES,
    MESH_ORDER,
    ActivationCheckpointing,
    Layout,
    ModelShape,
    Parallelism,
    PlannerInput,
)
from ito.core.planner_memory import MemoryBreakdown
from ito.core.planner_rules import Rule, explain
from ito.core.planner_time import StepTime

__all__ = [
    "Layout",
    "ModelShape",
    "Parallelism",
    "Plan",
    "PlanRefused",
    "PlannerInput",
    "Reason",
    "ReasonCode",
    "Rule",
    "plan",
]

FREE_MICRO_BATCHES = (1, 2, 4, 8, 16)
"""Micro-batch sizes tried when the global batch is left to the planner."""


class PlanRefused(ItoError):
    """``plan_refused``: no acceptable layout; ``reasons`` says why, one code each. Its error
    body carries them as ``error.reasons``."""

    def __init__(self, reasons: Sequence[Reason]) -> None:
        self.reasons = tuple(reasons)
        codes = ", ".join(dict.fromkeys(r.code.value for r in self.reasons))
        super().__init__("plan_refused", f"no acceptable parallelism plan ({codes})")

    def to_error_body(self) -> dict[str, Any]:
        return super().to_error_body() | {"reasons": [r.to_dict() for r in self.reasons]}


@dataclass(frozen=True)
class Plan:
    layout: Layout
    """Degrees, micro-batching and activation checkpointing."""
    global_batch_tokens: int
    param_dtype: str
    """What the model computes in (FSDP2 ``MixedPrecisionPolicy.param_dtype``)."""
    reduce_dtype: str
    fp8: bool
    compile: bool
    memory: MemoryBreakdown
    time: StepTime
    rules: tuple[Rule, ...]
    warnings: tuple[Reason, ...] = ()
    """Wasteful choices let through by ``allow_wasteful``."""
    candidates: int = 0
    """Layouts weighed."""
    acceptable: int = 0
    """Layouts nothing refused."""

    @property
    def dp_replicate(self) -> int:
        return self.layout.dp_replicate

    @property
    def dp_shard(self) -> int:
        return self.layout.dp_shard

    @property
    def tp(self) -> int:
        return self.layout.tp

    @property
    def pp(self) -> int:
        return self.layout.pp

    @property
    def cp(self) -> int:
        return self.layout.cp

    @property
    def micro_batch(self) -> int:
        return self.layout.micro_batch

    @property
    def activation_checkpointing(self) -> ActivationCheckpointing:
        return self.layout.activation_checkpointing

    @property
    def grad_accum(self) -> int:
        return self.layout.microbatches if self.layout.pp == 1 else 1

    @property
    def pp_microbatches(self) -> int:
        return self.layout.microbatches if self.layout.pp > 1 else 1

    @property
    def mesh(self) -> dict[str, int]:
        """Mesh dimensions in the order the engine builds them, outermost first."""
        return {dim: self.layout.degree(dim) for dim in MESH_ORDER}

    def rule(self, choice: str) -> Rule:
        return next(r for r in self.rules if r.choice == choice)

    def to_dict(self) -> dict[str, Any]:
        t = self.time
        traffic = {"fsdp": t.fsdp, "replicate": t.replicate, "tp": t.tp, "pp": t.pp}
        return {
            "dp_replicate": self.dp_replicate,
            "dp_shard": self.dp_shard,
            "tp": self.tp,
            "pp": self.pp,
            "cp": self.cp,
            "mesh": self.mesh,
            "micro_batch": self.micro_batch,
            "grad_accum": self.grad_accum,
            "pp_microbatches": self.pp_microbatches,
            "global_batch_tokens": self.global_batch_tokens,
            "activation_checkpointing": self.activation_checkpointing,
            "precision": {
                "param_dtype": self.param_dtype,
                "reduce_dtype": self.reduce_dtype,
                "fp8": self.fp8,
            },
            "compile": self.compile,
            "memory": self.memory.to_dict(),
            "communication": {
                kind: {
                    "bytes": each.bytes,
                    "seconds": each.seconds,
                    "exposed_seconds": each.exposed_seconds,
                    "crosses_nodes": each.crosses_nodes,
                }
                for kind, each in traffic.items()
            },
            "predicted": {
                "step_seconds": t.step_seconds,
                "compute_seconds": t.compute_seconds,
                "recompute_seconds": t.recompute_seconds,
                "bubble_seconds": t.bubble_seconds,
                "bubble_fraction": t.bubble_fraction,
                "exposed_communication_seconds": sum(e.exposed_seconds for e in traffic.values()),
                "tokens_per_second": t.tokens_per_second,
                "mfu": t.mfu,
            },
            "rules": [r.to_dict() for r in self.rules],
            "warnings": [w.to_dict() for w in self.warnings],
            "candidates": self.candidates,
            "acceptable": self.acceptable,
        }


# --- the search ----------------------------------------------------------------------------------


def _divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


def _degrees(inp: PlannerInput) -> Iterator[tuple[int, int, int, int, int]]:
    """(dp_replicate, dp_shard, tp, pp, cp) whose product is the world, pins respected. Free
    degrees take only values that can work (TP inside a node dividing the model, no more
    stages than layers, no context parallelism); pinned ones are taken as given, to be
    checked."""
    shape, pins, world, g = inp.model, inp.pinned, inp.world, inp.gpus_per_node
    tps = [pins.tp] if pins.tp else [t for t in _divisors(g) if not tp_misfit(shape, t)]
    pps = [pins.pp] if pins.pp else [p for p in _divisors(world) if p <= shape.layers]
    cps = [pins.cp] if pins.cp else [1]
    for tp, pp, cp in itertools.product(tps, pps, cps):
        if world % (tp * pp * cp):
            continue
        dp = world // (tp * pp * cp)
        for dp_replicate in [pins.dp_replicate] if pins.dp_replicate else _divisors(dp):
            if dp % dp_replicate:
                continue
            dp_shard = dp // dp_replicate
            if pins.dp_shard and pins.dp_shard != dp_shard:
                continue
            yield dp_replicate, dp_shard, tp, pp, cp


def _batching(inp: PlannerInput, dp: int, pp: int) -> Iterator[tuple[int, int] | Reason]:
    """(micro_batch, micro-batches per step) options for ``dp`` ranks, or why there is none."""
    pinned, sequences = inp.pinned.micro_batch, inp.sequences
    if sequences is None:
        # Without a batch the planner sizes it: one micro-batch per rank, or the fewest that
        # keep a pipeline's bubble within bounds: (p-1)/(m+p-1) ≤ 1/4 ⇔ m ≥ 3(p-1).
        microbatches = 1 if pp == 1 else max(pp, 3 * (pp - 1))
        for micro_batch in [pinned] if pinned else FREE_MICRO_BATCHES:
            yield micro_batch, microbatches
        return
    if sequences < dp or sequences % dp:
        yield idle(sequences, dp)
        return
    per_rank = sequences // dp
    for micro_batch in [pinned] if pinned else _divisors(per_rank):
        if per_rank % micro_batch:
            yield Reason(
                ReasonCode.micro_batch_not_dividing,
                f"a micro-batch of {micro_batch} does not divide the {per_rank} sequences "
                "each data-parallel rank gets per step",
            )
        else:
            yield micro_batch, per_rank // micro_batch


def _search(inp: PlannerInput) -> list[Candidate]:
    pinned_ac = inp.pinned.activation_checkpointing
    modes: tuple[ActivationCheckpointing, ...] = (pinned_ac,) if pinned_ac else AC_MODES
    candidates = []
    for dp_replicate, dp_shard, tp, pp, cp in _degrees(inp):
        for option in _batching(inp, dp_replicate * dp_shard, pp):
            if isinstance(option, Reason):
                layout = Layout(dp_replicate, dp_shard, tp, pp, cp, 1, 1, modes[0])
                candidates.append(Candidate(layout, (option,)))
                continue
            micro_batch, microbatches = option
            for mode in modes:
                layout = Layout(dp_replicate, dp_shard, tp, pp, cp, micro_batch, microbatches, mode)
                candidates.append(evaluate(inp, layout))
    return candidates


def _fastest(candidates: Sequence[Candidate]) -> Candidate | None:
    """Highest predicted tokens/s; ties go to the simpler layout."""

    def key(c: Candidate) -> tuple[float, int, int, int, int]:
        lay = c.layout
        return (-c.speed, lay.tp, lay.pp, lay.dp_replicate, -lay.micro_batch)

    return min(candidates, key=key) if candidates else None


def _plain_would_do(inp: PlannerInput, best: Candidate) -> list[Reason]:
    """PP or TP where plain FSDP/HSDP fits and is faster (the Ultra-Scale Playbook: add model
    parallelism only when data parallelism runs out of memory or of batch)."""
    if best.layout.tp == 1 and best.layout.pp == 1:
        return []
    plain_inp = replace(inp, pinned=Parallelism(tp=1, pp=1, cp=1), allow_wasteful=False)
    plain = _fastest([c for c in _search(plain_inp) if not c.reasons])
    if plain is None or plain.speed <= best.speed:
        return []
    lay = plain.layout
    alternative = (
        f"plain data parallelism (dp_replicate={lay.dp_replicate}, dp_shard={lay.dp_shard}) "
        f"fits and predicts {plain.speed:.0f} tokens/s against {best.speed:.0f}"
    )
    found = []
    if best.layout.tp > 1:
        found.append(Reason(ReasonCode.tp_not_needed, f"tensor parallel: {alternative}"))
    if best.layout.pp > 1:
        found.append(Reason(ReasonCode.pp_not_needed, f"pipeline parallel: {alternative}"))
    return found


def plan(inp: PlannerInput) -> Plan:
    """The fastest acceptable plan for ``inp``, or :class:`PlanRefused` with every reason."""
    reasons = global_reasons(inp)
    candidates = _search(inp)
    if not candidates:
        pins = {k: v for k, v in inp.pinned.pinned.items() if k in MESH_ORDER}
        reasons.append(
            Reason(
                ReasonCode.degrees_mismatch_world,
                f"the pinned degrees {pins} cannot multiply to the {inp.world} GPUs booked",
            )
        )
    acceptable = [c for c in candidates if not c.blocking(inp.allow_wasteful)]
    best = _fastest(acceptable)
    if best is not None:
        reasons.extend(_plain_would_do(inp, best))
    blocking = [r for r in reasons if not (inp.allow_wasteful and r.code.wasteful)]
    if best is None:
        raise PlanRefused(_dedupe([*blocking, *nearest(candidates, inp.allow_wasteful)]))
    if blocking:
        raise PlanRefused(blocking)
    assert best.memory is not None and best.time is not None
    layout = best.layout
    return Plan(
        layout=layout,
        global_batch_tokens=layout.dp * layout.micro_batch * layout.microbatches * inp.seq_len,
        param_dtype="bfloat16" if inp.on_gpu else "float32",
        reduce_dtype="float32",
        fp8=inp.fp8,
        compile=inp.compiles,
        memory=best.memory,
        time=best.time,
        rules=tuple(explain(inp, best, acceptable, candidates)),
        warnings=tuple(_dedupe([*reasons, *best.reasons])),
        candidates=len(candidates),
        acceptable=len(acceptable),
    )


def _dedupe(reasons: Sequence[Reason]) -> list[Reason]:
    found: dict[ReasonCode, Reason] = {}
    for reason in reasons:
        found.setdefault(reason.code, reason)
    return list(found.values())
