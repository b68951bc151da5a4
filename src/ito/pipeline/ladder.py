"""The ladder decision job (DESIGN §7.4): custom data wins its place before the real training.

Run by the engine on a fresh start, before the untrained model is measured and before any
training step of the run. It trains the proxy model (:func:`ito.core.ladder.proxy_size`) twice,
each time from the same seed and for the same number of steps (``ladder.tokens`` tokens, over
every rank of this torchrun world with the engine's default layout — FSDP2 over every rank, the
precision the planner plans for the device): on the reference mix of the stage that names the
custom data, then on that mix with the custom data. Both proxies are measured on the stage's
battery at its sequence length (its RoPE base included) with the same batteries the gates use
(:mod:`ito.pipeline.batteries`), and :func:`ito.core.ladder.ladder_passes` decides per eval.

The decision is a gate: one ``gate`` event (stage ``ladder``, each result with the custom run's
value, the reference run's, the bound and the rule; the job's facts: proxy size, data, tokens,
steps and seconds of each arm). A rejection ends the run ``gate_failed`` with
``ladder_rejected`` before the real training starts. The decision is also written once, as
``ladder.json`` at the root of the checkpoint storage (through the proven directory):
an attempt restarted before the first checkpoint reads it instead of training the proxies again.

The global RNG is left as it was (``fork_rng``): the run trains the same with or without a
ladder in front of it.
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

import torch
import torch.distributed as dist
from tokenizers import Tokenizer

from ito.core.ladder import LadderPlan, ladder_passes, ladder_rule, ladder_threshold
from ito.core.manifest import EvalSpec, Manifest
from ito.core.model_sizes import ModelSize
from ito.data.rows import Row
from ito.pipeline.batteries import BATTERIES, EvalContext
from ito.pipeline.data import PackedData, pack
from ito.pipeline.grad_accum import accumulate
from ito.pipeline.layout import EngineLayout, build_mesh
from ito.pipeline.model import (
    build_model,
    build_optimizer,
    build_scheduler,
    llama_config,
    rope_base,
    set_rope_base,
)
from ito.pipeline.parallelize import clip_grad_norm
from ito.pipeline.storage_fs import StoragePath, proven_dir

__all__ = ["LADDER_FILE", "ArmResult", "LadderJob"]

LADDER_FILE = "ladder.json"


class Events(Protocol):
    def emit(self, type_: str, **fields: object) -> None: ...

    def log(self, level: str, message: str) -> None: ...


@dataclass(frozen=True)
class ArmResult:
    """One proxy run."""

    data: tuple[str, ...]
    values: list[float | None]
    """The battery's values, in battery order (``None``: not finite)."""
    steps: int
    tokens: int
    seconds: float
    final_loss: float | None
    """Training loss of the last step, averaged over the ranks."""


@dataclass
class LadderJob:
    """The job of one attempt: what it trains on, where it records its decision."""

    manifest: Manifest
    plan: LadderPlan
    size: ModelSize
    tokenizer: Tokenizer
    heldout: Callable[[str], list[str]]
    train_docs: Callable[[str], list[str]]
    rows: Callable[[str], list[Row]]
    seed: int
    device: torch.device
    events: Events
    storage: StoragePath
    group: dist.ProcessGroup
    max_grad_norm: float
    rank: int = field(init=False)
    specs: list[EvalSpec] = field(init=False)

    def __post_init__(self) -> None:
        self.rank = dist.get_rank()
        self.specs = list(self.manifest.eval_batteries[self.plan.stage.battery])

    def decide(self) -> bool:
        """The decision: an earlier attempt's, or the job's. Returns whether the run goes on."""
        earlier = self._earlier()
        if earlier is not None:
            self.events.log(
                "info",
                "ladder: decided by an earlier attempt of this run: "
                + ("the custom data passed" if earlier else "the custom data was rejected"),
            )
            return earlier
        self.events.emit("stage", stage="ladder", status="started")
        layout = EngineLayout.default(dist.get_world_size(), self.device.type)
        mesh = build_mesh(self.device.type, layout)
        with torch.random.fork_rng(devices=[self.device] if self.device.type == "cuda" else []):
            reference = self._arm(self.plan.reference, layout, mesh)
            custom = self._arm(self.plan.with_custom, layout, mesh)
        margin = self.manifest.ladder.margin
        results: list[dict[str, Any]] = []
        for spec, ref, mine in zip(self.specs, reference.values, custom.values, strict=True):
            results.append(
                {
                    "eval": spec.eval,
                    "data": spec.data,
                    "value": mine,
                    "reference": ref,
                    "threshold": ladder_threshold(spec.eval, ref, margin),
                    "rule": ladder_rule(spec, margin),
                    "passed": ladder_passes(spec.eval, ref, mine, margin),
                }
            )
        passed = all(r["passed"] for r in results)
        facts = {
            "proxy_size": self.manifest.ladder.proxy_size,
            "margin": margin,
            "stage": self.plan.stage.stage,
            "reference_data": list(reference.data),
            "custom_data": list(self.plan.custom),
            "tokens": reference.tokens,
            "steps": reference.steps,
            "seconds": {"reference": reference.seconds, "with_custom": custom.seconds},
        }
        self.events.emit(
            "gate",
            stage="ladder",
            battery=self.plan.stage.battery,
            results=results,
            passed=passed,
            ladder=facts,
        )
        shown = "; ".join(
            f"{r['rule']}: {_fmt(r['value'])} vs {_fmt(r['reference'])}" for r in results
        )
        self.events.log(
            "info" if passed else "error",
            f"ladder: {'passed' if passed else 'REJECTED'} — {shown}",
        )
        self._record(passed, results, facts)
        if passed:
            self.events.emit("stage", stage="ladder", status="completed")
        return passed

    # ---- the two proxy runs -------------------------------------------------------------------

    def _arm(self, data_ids: tuple[str, ...], layout: EngineLayout, mesh: Any) -> ArmResult:
        stage = self.plan.stage
        seq_len = stage.seq_len
        start = time.perf_counter()
        model = build_model(self.size, self.seed, mesh, layout, self.device)
        set_rope_base(model, rope_base(llama_config(self.size)) * stage.rope_base_scale)
        optimizer = build_optimizer(model, self.size.name)
        docs = [d for data_id in data_ids for d in self.train_docs(data_id)]
        data = PackedData(pack(self.tokenizer, docs, seq_len), self.seed, self.plan.stage_index)
        per_rank = layout.sequences_per_rank
        step_tokens = per_rank * layout.dp * seq_len
        steps = max(1, self.manifest.ladder.tokens // step_tokens)
        scheduler = build_scheduler(optimizer, steps)
        dp_rank = dist.get_rank()
        last = torch.zeros((), device=self.device)
        for k in range(steps):
            batch = data.batch(k, dp_rank, layout.dp, per_rank).to(self.device)
            last = accumulate(model, batch, layout)
            clip_grad_norm(list(model.parameters()), self.max_grad_norm, None)
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            scheduler.step()
        dist.all_reduce(last)
        final = float(last.item()) / dist.get_world_size()
        ctx = EvalContext(
            model=model,
            tokenizer=self.tokenizer,
            device=self.device,
            dp_rank=dp_rank,
            dp_world=layout.dp,
            micro_batch=layout.micro_batch,
            heldout=self.heldout,
            rows=self.rows,
        )
        values: list[float | None] = []
        for spec in self.specs:
            value = BATTERIES[spec.eval].measure(ctx, spec.data, seq_len)
            values.append(value if math.isfinite(value) else None)
        seconds = time.perf_counter() - start
        result = ArmResult(
            data=data_ids,
            values=values,
            steps=steps,
            tokens=steps * step_tokens,
            seconds=seconds,
            final_loss=final if math.isfinite(final) else None,
        )
        self.events.log(
            "info",
            f"ladder: proxy {self.size.name} on {', '.join(data_ids)}: {steps} steps, "
            f"{result.tokens} tokens in {seconds:.1f}s, last loss {_fmt(result.final_loss)}, "
            + ", ".join(
                f"{s.eval}({s.data}) {_fmt(v)}" for s, v in zip(self.specs, values, strict=True)
            ),
        )
        del model, optimizer
        return result

    # ---- the decision on disk -----------------------------------------------------------------

    def _earlier(self) -> bool | None:
        found: list[bool | None] = [None]
        if self.rank == 0:
            with proven_dir(self.storage, create=True) as root:
                if LADDER_FILE in root.entries():
                    found[0] = bool(json.loads(root.read(LADDER_FILE))["passed"])
        dist.broadcast_object_list(found, src=0, group=self.group)
        return found[0]

    def _record(self, passed: bool, results: list[dict[str, Any]], facts: dict[str, Any]) -> None:
        if self.rank == 0:
            body = {"passed": passed, "results": results, **facts}
            tmp = f".{LADDER_FILE}.tmp"
            with proven_dir(self.storage, create=True) as root:
                root.unlink(tmp, missing_ok=True)  # a torn write of a crashed attempt
                root.write_new(tmp, json.dumps(body, sort_keys=True).encode() + b"\n")
                root.replace(tmp, LADDER_FILE)
        dist.barrier(group=self.group)


def _fmt(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.4g}"
