"""``plan``: what creating a run would do, computed from the same checks — and nothing written
(DESIGN §5.4). The session is a read transaction; no row of any kind is added."""

from __future__ import annotations

from typing import Any

from sqlalchemy.orm import Session

from ito.core.errors import ItoError
from ito.core.gates import check_resources, eligibility_record
from ito.core.manifest import manifest_digest, manifest_summary
from ito.core.planner import PlanRefused
from ito.core.pricing import CostEstimate, estimate_cost
from ito.core.run_plan import RunPlan, plan_run_parallelism
from ito.core.stage_plan import PlannedStage, data_parallel, sequences_per_step
from ito.server.services.bookings import booking_view, get_booking
from ito.server.services.manifest_cache import parsed_manifest
from ito.server.services.revisions import resolve_revision
from ito.server.store.tables import utcnow

__all__ = ["plan_run", "plan_stage_dict"]


def plan_run(session: Session, account_id: str, booking_id: str, raw: bytes) -> dict[str, Any]:
    booking = get_booking(session, account_id, booking_id)
    manifest = parsed_manifest(raw)
    view = booking_view(booking)
    now = utcnow()
    refusals: list[dict[str, Any]] = []

    try:
        eligibility: dict[str, Any] = eligibility_record(view, now)
    except ItoError as exc:
        eligibility = {
            "eligible": False,
            "booking_id": booking.id,
            "checked_at": now.isoformat(),
            "error": exc.to_error_body(),
        }
        refusals.append(exc.to_error_body())

    checks: dict[str, Any]
    run_plan: RunPlan | None = None
    estimate: CostEstimate | None = None
    try:
        result = check_resources(manifest, view, now)
        estimate, run_plan = result.estimate, result.plan
        checks = {
            "ok": True,
            "checkpoint_uri": result.checkpoint_uri,
            "checkpoint_bytes_reserved": result.checkpoint_bytes,
        }
    except ItoError as exc:
        checks = {"ok": False, "error": exc.to_error_body()}
        refusals.append(exc.to_error_body())

    # The initial weights (model.revision): resolved as create will resolve them.
    initial_weights: dict[str, Any] | None = None
    try:
        resolved = resolve_revision(session, account_id, manifest, view)
        initial_weights = resolved.to_dict() if resolved is not None else None
    except ItoError as exc:
        if checks["ok"]:
            checks = {"ok": False, "error": exc.to_error_body()}
        refusals.append(exc.to_error_body())

    # Gate 5 planned the run when its checks passed; otherwise the plan is asked for on its own,
    # so the answer still says what the layout would be (or why there is none).
    parallelism: dict[str, Any]
    try:
        if run_plan is None:
            run_plan = plan_run_parallelism(
                manifest,
                gpu=view.gpu,
                nodes=view.nodes,
                gpus_per_node=view.gpus_per_node,
                fabric=view.fabric,
            )
        parallelism = {"ok": True} | run_plan.to_dict()
    except PlanRefused as refused:
        parallelism = {"ok": False, "error": refused.to_error_body()}
    if estimate is None:
        accelerators = view.nodes * view.gpus_per_node
        estimate = estimate_cost(
            manifest,
            accelerator=view.gpu,
            nodes=view.nodes,
            gpus_per_node=view.gpus_per_node,
            rate_usd_per_gpu_hour=view.rate_usd_per_gpu_hour,
            sequences_per_step=sequences_per_step(
                run_plan.plan if run_plan is not None else None, accelerators
            ),
            data_parallel=data_parallel(
                run_plan.plan if run_plan is not None else None, accelerators
            ),
        )

    # What this version cannot run is refused above (gate 5's capability check), not warned
    # about: nothing is planned or priced that will not run.
    warnings: list[dict[str, Any]] = []
    stages = [plan_stage_dict(s) for s in estimate.stage_plan.stages]
    return {
        "ready": not refusals,
        "booking_id": booking.id,
        "manifest_id": manifest_digest(raw),
        "validation": {"ok": True, "schema": "ito.training.manifest.v1"},
        "summary": manifest_summary(manifest),
        "eligibility": eligibility,
        "checks": checks,
        "parallelism": parallelism,
        "initial_weights": initial_weights,
        "stage_plan": stages,
        "cost": {
            k: v
            for k, v in estimate.to_dict().items()
            if k not in ("stages", "stage_plan", "parallelism")
        },
        "refusals": refusals,
        "warnings": warnings,
    }


def plan_stage_dict(stage: PlannedStage) -> dict[str, Any]:
    """A stage of the plan as ``ito plan`` (:class:`ito.core.manifest_views.StagePlan`)
    answers it."""
    return {
        "stage": stage.name,
        "kind": stage.kind,
        "steps": stage.steps,
        "tokens": stage.tokens,
        "tokens_per_step": stage.tokens_per_step,
        "seq_len": stage.seq_len,
        "battery": stage.battery,
        "estimated_seconds": round(stage.seconds, 1),
        "upper_seconds": round(stage.upper, 1),
    }
