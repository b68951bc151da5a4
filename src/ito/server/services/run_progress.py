"""What a run has done of its stored stage plan (:mod:`ito.core.stage_plan`): the stage events
and the latest step of each stage, read in the caller's read transaction and turned into each
stage's progress (step / total, tokens, ETA) by :func:`ito.core.stage_plan.stage_progress`."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from sqlalchemy import bindparam, select

from ito.core.stage_plan import stage_progress, stored_stage_plan
from ito.core.states import RunState
from ito.server.services.metric_buckets import last_steps
from ito.server.store.runtime_tables import RunMetric
from ito.server.store.tables import RunEvent

if TYPE_CHECKING:
    from sqlalchemy.engine import Connection, Row
    from sqlalchemy.orm import Session

    from ito.server.store.tables import Run

__all__ = ["run_progress", "stages_completed"]

_STAGE_EVENTS = (
    select(RunEvent.kind, RunEvent.data)
    .where(RunEvent.run_id == bindparam("run_id"), RunEvent.kind.in_(("stage", "gate")))
    .order_by(RunEvent.id)
)
_LAST_STEP_SECONDS = (
    select(RunMetric.value)
    .where(RunMetric.run_id == bindparam("run_id"), RunMetric.name == "step_seconds")
    .order_by(RunMetric.id.desc())
    .limit(1)
)


def _stage_events(
    session: Session | Connection, run_id: str
) -> tuple[set[str], list[str], dict[str, int]]:
    """The stages that started (or reached their gate: the ladder reports only its gate), the
    stages that completed, in order, and the steps taken by those that ended early."""
    started: set[str] = set()
    completed: list[str] = []
    taken: dict[str, int] = {}
    for kind, data in session.execute(_STAGE_EVENTS, {"run_id": run_id}):
        name, status = (data or {}).get("stage"), (data or {}).get("status")
        if not isinstance(name, str):
            continue
        if status == "started" or kind == "gate":
            started.add(name)
        elif status == "completed" and name not in completed:
            completed.append(name)
            if isinstance(data.get("steps_taken"), int):
                taken[name] = data["steps_taken"]
    return started, completed, taken


def stages_completed(session: Session | Connection, run_id: str) -> list[str]:
    """The stages whose ``completed`` event the run reported, in order."""
    return _stage_events(session, run_id)[1]


def run_progress(session: Session | Connection, run: Run | Row[Any]) -> list[dict[str, Any]]:
    """Each stage of the run's plan with its status and progress inside it."""
    plan = stored_stage_plan(run.estimate)
    started, completed, taken = _stage_events(session, run.id)
    params = {"run_id": run.id}
    last_step = last_steps(session, run.id)
    pace = session.execute(_LAST_STEP_SECONDS, params).scalar()
    rows = stage_progress(
        plan,
        terminal=RunState(run.state).is_terminal(),
        started=started,
        completed=completed,
        taken=taken,
        last_step=last_step,
        step_seconds=None if pace is None else float(pace),
    )
    return [row.model_dump() for row in rows]
