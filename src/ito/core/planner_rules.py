"""Why each choice of a plan is what it is: one :class:`Rule` per choice, in words and numbers.

A searched choice is explained against the best acceptable layout that chose differently (or,
when none did, by what refused the other values); a pinned one says it was validated; the
fixed ones (precision, compile, batch) name the practice they follow.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from ito.core.planner_checks import Candidate, nearest
from ito.core.planner_inputs import PlannerInput

__all__ = ["Rule", "explain"]

SEARCHED = (
    "dp_replicate",
    "dp_shard",
    "tp",
    "pp",
    "cp",
    "micro_batch",
    "activation_checkpointing",
)

PRINCIPLE = {
    "dp_replicate": "HSDP replicas all-reduce gradients once per step; across a slow fabric "
    "they beat sharding over it (TorchTitan dp_replicate)",
    "dp_shard": "FSDP2 shards parameters, gradients and optimizer states over these ranks "
    "(ZeRO-3; the Ultra-Scale Playbook)",
    "tp": "tensor parallel stays inside a node and divides heads, kv heads and the MLP width "
    "(TorchTitan parallelize_llama)",
    "pp": "1F1B pipeline; bubble (p-1)/(m+p-1) at most 0.25 (Narayanan et al. 2021)",
    "cp": "context parallel is only modelled: the engine does not apply it yet",
    "micro_batch": "activations grow with the micro-batch (Korthikanti et al. 2022); larger "
    "ones amortise each micro-batch's FSDP traffic",
    "activation_checkpointing": "recompute only what memory demands: none, else selective, "
    "else full (Korthikanti et al. 2022 §5)",
}


@dataclass(frozen=True)
class Rule:
    """Why one choice of the plan is what it is."""

    choice: str
    value: Any
    why: str

    def to_dict(self) -> dict[str, Any]:
        return {"choice": self.choice, "value": self.value, "why": self.why}


def _value(candidate: Candidate, choice: str) -> Any:
    return getattr(candidate.layout, choice)


def _searched(
    inp: PlannerInput,
    best: Candidate,
    choice: str,
    acceptable: Sequence[Candidate],
    candidates: Sequence[Candidate],
) -> str:
    value = _value(best, choice)
    principle = PRINCIPLE[choice]
    if getattr(inp.pinned, choice) is not None:
        return f"pinned by the caller and validated; {principle}"
    others = [c for c in acceptable if _value(c, choice) != value]
    if others:
        runner = max(others, key=lambda c: c.speed)
        return (
            f"fastest: {best.speed:.0f} tokens/s predicted, against {runner.speed:.0f} for the "
            f"best layout with {choice}={_value(runner, choice)}; {principle}"
        )
    refused: dict[Any, list[Candidate]] = {}
    for candidate in candidates:
        if _value(candidate, choice) != value:
            refused.setdefault(_value(candidate, choice), []).append(candidate)
    if not refused:
        return f"the only value weighed; {principle}"
    shown = "; ".join(
        f"{choice}={other}: {', '.join(r.code.value for r in nearest(group))}"
        for other, group in sorted(refused.items(), key=lambda item: str(item[0]))[:4]
    )
    return f"the only value that works ({shown}); {principle}"


def explain(
    inp: PlannerInput,
    best: Candidate,
    acceptable: Sequence[Candidate],
    candidates: Sequence[Candidate],
) -> list[Rule]:
    layout = best.layout
    rules = [
        Rule(choice, _value(best, choice), _searched(inp, best, choice, acceptable, candidates))
        for choice in SEARCHED
    ]
    m = layout.microbatches
    if inp.global_batch_tokens is None:
        batch = (
            f"chosen: {layout.dp} data-parallel ranks × micro-batch {layout.micro_batch} × "
            f"{m} micro-batches × {inp.seq_len} tokens"
        )
    else:
        batch = "given by the caller"
    rules.append(
        Rule("global_batch_tokens", layout.dp * layout.micro_batch * m * inp.seq_len, batch)
    )
    if layout.pp > 1:
        rules.append(
            Rule(
                "pp_microbatches",
                m,
                f"each data-parallel rank's sequences in micro-batches of {layout.micro_batch}; "
                f"bubble {(layout.pp - 1) / (m + layout.pp - 1):.2f}",
            )
        )
    else:
        rules.append(
            Rule(
                "grad_accum",
                m,
                f"each data-parallel rank's sequences in micro-batches of {layout.micro_batch}",
            )
        )
    if inp.on_gpu:
        precision = (
            "bf16 compute, fp32 master weights and gradient reduction "
            "(FSDP2 MixedPrecisionPolicy, TorchTitan's default)"
        )
    else:
        precision = "fp32 throughout: the CPU stand-in has no fast bf16 matmuls"
    rules.append(Rule("precision", "bfloat16" if inp.on_gpu else "float32", precision))
    rules.append(
        Rule(
            "fp8",
            inp.fp8,
            "requested, and the tensor cores support it (compute capability ≥ 8.9); linear "
            "layers only (TorchTitan Float8Linear)"
            if inp.fp8
            else "not requested: fp8 changes numerics, so the planner never turns it on alone",
        )
    )
    rules.append(
        Rule(
            "compile",
            inp.compiles,
            "torch.compile per decoder layer, as TorchTitan does; the assumed kernel "
            "efficiency counts on it"
            if inp.compiles
            else (
                "eager: the engine that runs this plan does not compile, and the predicted "
                "step time assumes the kernel efficiency of compiled layers, so it is optimistic"
                if inp.on_gpu
                else "eager on the CPU stand-in"
            ),
        )
    )
    return rules
