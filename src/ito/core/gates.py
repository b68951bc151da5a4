"""The pure checks behind the gates of run creation (DESIGN §5.2, §5.8).

The server loads rows, turns them into these plain values, and calls the checks inside the
creating transaction; every check raises the stable :class:`ItoError` of its gate. Nothing here
reads a clock: ``now`` is passed in.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, replace
from datetime import datetime, timedelta
from typing import Any
from urllib.parse import quote

from ito.core.errors import ItoError
from ito.core.manifest import Manifest
from ito.core.model_sizes import SIZES
from ito.core.pricing import CostEstimate, estimate_cost
from ito.core.run_plan import RunPlan, plan_run_parallelism
from ito.core.runtime_support import check_runtime_support
from ito.core.stage_plan import data_parallel, sequences_per_step
from ito.core.storage import contained_storage_uri, run_checkpoint_uri

__all__ = [
    "BookingView",
    "ResourceCheck",
    "check_eligibility",
    "check_resources",
    "eligibility_record",
    "idempotency_fingerprint",
    "validate_idempotency_key",
]

ELIGIBILITY_TTL = timedelta(seconds=60)
"""How long an eligibility record may be relied on; run creation re-checks regardless."""

CHECKPOINT_BYTES_PER_PARAMETER = 16
"""fp32 master weights + two Adam moments + bf16 weights and gradients, rounded up (Rajbhandari
et al. 2020, "ZeRO", §3.1: 16 bytes per parameter with mixed-precision Adam)."""


@dataclass(frozen=True)
class BookingView:
    id: str
    account_id: str
    state: str
    gpu: str
    nodes: int
    gpus_per_node: int
    gpu_memory_gb: int
    region: str
    fabric: str
    term_start: datetime
    term_end: datetime
    storage_uri: str | None
    storage_quota_gb: float
    rate_usd_per_gpu_hour: float


def check_eligibility(booking: BookingView, now: datetime) -> None:
    """Fail closed unless the booking is completed, unreleased and inside its term."""
    if booking.state == "revoked":
        raise ItoError("booking_revoked", booking_id=booking.id)
    if booking.state == "released":
        raise ItoError("booking_released", booking_id=booking.id)
    if booking.state == "expired":
        raise ItoError("booking_expired", booking_id=booking.id)
    if booking.state != "completed":
        raise ItoError("booking_not_completed", booking_id=booking.id, state=booking.state)
    if not booking.term_start <= now < booking.term_end:
        raise ItoError("booking_expired", booking_id=booking.id)


def eligibility_record(booking: BookingView, now: datetime) -> dict[str, Any]:
    """The record §5.2 returns: bound to account, booking, topology, region, fabric and term."""
    check_eligibility(booking, now)
    valid_until = min(now + ELIGIBILITY_TTL, booking.term_end)
    return {
        "eligible": True,
        "account_id": booking.account_id,
        "booking_id": booking.id,
        "topology": {
            "gpu": booking.gpu,
            "nodes": booking.nodes,
            "gpus_per_node": booking.gpus_per_node,
            "gpu_memory_gb": booking.gpu_memory_gb,
        },
        "region": booking.region,
        "fabric": booking.fabric,
        "term": {"start": booking.term_start.isoformat(), "end": booking.term_end.isoformat()},
        "checked_at": now.isoformat(),
        "valid_until": valid_until.isoformat(),
    }


@dataclass(frozen=True)
class ResourceCheck:
    estimate: CostEstimate
    """The cost estimate; its ``parallelism`` is :attr:`plan`'s document, which the run
    stores with it (``runs.estimate``) and the worker hands to the engine."""
    checkpoint_uri: str
    checkpoint_bytes: int
    plan: RunPlan
    """The accepted parallelism plan (:mod:`ito.core.run_plan`)."""


def check_resources(
    manifest: Manifest, booking: BookingView, now: datetime, run_id_hint: str = "{run_id}"
) -> ResourceCheck:
    """Gate 5: fabric, capacity, the parallelism plan, what the runtime supports (data URI
    schemes, measurable evals: :mod:`ito.core.runtime_support`), data policy, checkpoint
    storage, term and budget."""
    res = manifest.resources
    if booking.gpu not in res.accelerators:
        raise ItoError(
            "booking_mismatch",
            f"the booking's {booking.gpu} is not among the manifest's accepted accelerators",
            accepted=list(res.accelerators),
            booked=booking.gpu,
        )
    if booking.nodes < res.nodes or booking.gpus_per_node < res.gpus_per_node:
        raise ItoError(
            "capacity_insufficient",
            needed={"nodes": res.nodes, "gpus_per_node": res.gpus_per_node},
            booked={"nodes": booking.nodes, "gpus_per_node": booking.gpus_per_node},
        )
    if booking.nodes > 1 and (booking.fabric == "nvlink" or booking.fabric not in res.fabrics):
        raise ItoError("fabric_incompatible", booked=booking.fabric, accepted=list(res.fabrics))
    size = SIZES[manifest.model.size]
    accelerators = booking.nodes * booking.gpus_per_node
    # Fully sharded states (FSDP/ZeRO-3) divide the 16 B/param over every accelerator.
    per_gpu_gb = size.parameters * CHECKPOINT_BYTES_PER_PARAMETER / accelerators / 1e9
    if per_gpu_gb > booking.gpu_memory_gb:
        raise ItoError(
            "capacity_insufficient",
            "the model's sharded training state does not fit in the booked accelerator memory",
            per_gpu_gb=round(per_gpu_gb, 2),
            gpu_memory_gb=booking.gpu_memory_gb,
        )

    # The planner: a layout that cannot run, or wastes the booking, refuses the run here
    # (``plan_refused`` with every reason).
    run_plan = plan_run_parallelism(
        manifest,
        gpu=booking.gpu,
        nodes=booking.nodes,
        gpus_per_node=booking.gpus_per_node,
        fabric=booking.fabric,
    )

    layout = run_plan.layout
    check_runtime_support(
        manifest,
        layout.pp if layout is not None else 1,
        # What ``ito.pipeline.rollout_worker.worker_supported`` serves: CPU, fp32, FSDP only.
        rollout_worker_served=booking.gpu == "cpu"
        and (
            layout is None or (layout.tp, layout.pp, layout.cp, layout.dp_replicate) == (1, 1, 1, 1)
        ),
    )
    _check_data_policy(manifest)
    uri, checkpoint_bytes = _check_checkpoint_storage(manifest, booking, run_id_hint)
    _check_data_locations(manifest, booking)

    estimate = estimate_cost(
        manifest,
        accelerator=booking.gpu,
        nodes=booking.nodes,
        gpus_per_node=booking.gpus_per_node,
        rate_usd_per_gpu_hour=booking.rate_usd_per_gpu_hour,
        # The steps of the stage plan are those of the layout the engine will build.
        sequences_per_step=sequences_per_step(run_plan.plan, accelerators),
        data_parallel=data_parallel(run_plan.plan, accelerators),
    )
    if now + timedelta(seconds=estimate.seconds) > booking.term_end:
        raise ItoError(
            "booking_term_insufficient",
            estimated_seconds=estimate.seconds,
            term_end=booking.term_end.isoformat(),
        )
    if not estimate.within_ceiling:
        raise ItoError(
            "budget_exceeded",
            "the cost estimate exceeds the budget ceiling",
            cost_usd=estimate.cost_usd,
            ceiling_usd=estimate.ceiling_usd,
        )
    if not estimate.within_incremental:
        raise ItoError(
            "budget_exceeded",
            "the cost estimate exceeds the maximum incremental cost",
            cost_usd=estimate.cost_usd,
            max_incremental_cost_usd=estimate.max_incremental_cost_usd,
        )
    return ResourceCheck(
        estimate=replace(estimate, parallelism=run_plan.to_dict()),
        checkpoint_uri=uri,
        checkpoint_bytes=checkpoint_bytes,
        plan=run_plan,
    )


def _check_data_policy(manifest: Manifest) -> None:
    policy = manifest.data_policy
    eval_ids = {ref.id for ref in manifest.data if ref.role == "eval"}
    violations: list[dict[str, str]] = []
    for i, ref in enumerate(manifest.data):
        if ref.license not in policy.allowed_licenses:
            violations.append(
                {
                    "path": f"$.data[{i}].license",
                    "reason": f"licence {ref.license!r} is not allowed",
                }
            )
        if ref.role == "eval":
            continue
        deco = ref.decontamination
        if deco is None:
            violations.append(
                {
                    "path": f"$.data[{i}].decontamination",
                    "reason": "training data needs decontamination provenance",
                }
            )
            continue
        missing = sorted(eval_ids - set(deco.eval_suites))
        if missing:
            violations.append(
                {
                    "path": f"$.data[{i}].decontamination.eval_suites",
                    "reason": f"not decontaminated against {missing}",
                }
            )
    if violations:
        raise ItoError("data_policy_violation", violations=violations)


def _inside_storage(uri: str, storage_uri: str) -> bool:
    try:
        contained_storage_uri(uri, storage_uri)
    except ItoError:
        return False
    return True


def _check_data_locations(manifest: Manifest, booking: BookingView) -> None:
    """Local files the run reads — data (custom data for the ladder included) and the tokenizer
    — must lie inside the booking's storage: what the tenant may read on the node, not any
    path of the worker's host. Decided on the URIs alone (nothing is opened here, so no answer
    says anything about a file outside); the worker then reads them through directories proven
    from the storage root."""
    assert booking.storage_uri is not None  # _check_checkpoint_storage refused it otherwise
    violations = [
        {"path": f"$.data[{i}].uri", "reason": "not inside the booking's storage"}
        for i, ref in enumerate(manifest.data)
        if ref.uri.startswith("file://") and not _inside_storage(ref.uri, booking.storage_uri)
    ]
    if violations:
        raise ItoError(
            "data_policy_violation",
            "data files must lie inside the booking's storage",
            violations=violations,
        )
    tokenizer = manifest.model.tokenizer
    if tokenizer is not None and tokenizer.uri.startswith(("file://", "/")):
        uri = (
            tokenizer.uri
            if tokenizer.uri.startswith("file://")
            else "file://" + quote(tokenizer.uri)
        )
        if not _inside_storage(uri, booking.storage_uri):
            raise ItoError(
                "tokenizer_invalid",
                "the tokenizer file must lie inside the booking's storage",
                path="$.model.tokenizer.uri",
                reason="outside_booking_storage",
            )


def _check_checkpoint_storage(
    manifest: Manifest, booking: BookingView, run_id_hint: str
) -> tuple[str, int]:
    if not booking.storage_uri:
        raise ItoError("checkpoint_storage_invalid", "the booking has no checkpoint storage")
    # Decided on the normalised, percent-decoded path the worker will use (ito.core.storage);
    # the URI stored on the run is that normalised one.
    uri = run_checkpoint_uri(manifest.checkpoint.storage, booking.storage_uri, run_id_hint)
    size = SIZES[manifest.model.size]
    # keep_last committed checkpoints plus the one being written.
    needed = size.parameters * CHECKPOINT_BYTES_PER_PARAMETER * (manifest.checkpoint.keep_last + 1)
    quota = int(booking.storage_quota_gb * 1e9)
    if needed > quota:
        raise ItoError(
            "checkpoint_storage_invalid",
            "checkpoints would exceed the storage quota",
            needed_bytes=needed,
            quota_bytes=quota,
        )
    return uri, needed


def validate_idempotency_key(key: str) -> None:
    if not 1 <= len(key) <= 255 or not all(32 <= ord(c) < 127 for c in key):
        raise ItoError("idempotency_key_invalid")


def idempotency_fingerprint(
    action: str, target: str, manifest_digest: str | None, confirmation_ref: str
) -> str:
    material = json.dumps([action, target, manifest_digest, confirmation_ref])
    return hashlib.sha256(material.encode()).hexdigest()
