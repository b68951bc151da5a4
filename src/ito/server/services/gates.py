"""A run's eval gate records (DESIGN §7.5): one per eval of every battery the engine measured,
read from the run's ``gate`` events (the worker reports them as the engine writes them), in
the order they were recorded."""

from __future__ import annotations

from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from ito.server.services.runs import get_run
from ito.server.store.tables import RunEvent

__all__ = ["gates_of"]


def gates_of(session: Session, account_id: str, run_id: str) -> dict[str, Any]:
    """This account's run's gate records (another tenant's run: ``run_not_found``)."""
    run = get_run(session, account_id, run_id)
    events = session.scalars(
        select(RunEvent)
        .where(
            RunEvent.run_id == run.id,
            RunEvent.account_id == run.account_id,
            RunEvent.kind == "gate",
        )
        .order_by(RunEvent.id)
    )
    records: list[dict[str, Any]] = []
    ladder: dict[str, Any] | None = None
    for event in events:
        data = event.data
        if isinstance(data.get("ladder"), dict):
            ladder = {**data["ladder"], "passed": bool(data.get("passed"))}
        for result in data.get("results", []):
            records.append(
                {
                    "stage": data.get("stage"),
                    "battery": data.get("battery"),
                    "eval": result.get("eval"),
                    "data": result.get("data"),
                    "value": result.get("value"),
                    "initial": result.get("initial"),
                    "reference": result.get("reference"),
                    "threshold": result.get("threshold"),
                    "rule": result.get("rule"),
                    "passed": bool(result.get("passed")),
                    "at": event.created_at.isoformat(),
                }
            )
    return {
        "run_id": run.id,
        "state": run.state,
        "failure_code": run.failure_code,
        "gates": records,
        "ladder": ladder,
    }
