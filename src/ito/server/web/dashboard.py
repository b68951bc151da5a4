"""What the run dashboard shows (DESIGN §8): the runs list, one run's page and the bookings
desk view, each assembled from the same service functions the JSON API answers with (runs,
events, gates, metrics, logs, checkpoints, exports, provenance, telemetry, confirmations) —
no query of its own, and every read scoped to the signed-in user's account, so another
tenant's run is ``run_not_found`` exactly like a missing one.

Nothing here is a secret: a run's record, its events and figures are what ``ito runs show``
prints to the same account.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from markupsafe import Markup
from sqlalchemy.orm import Session

from ito.core.errors import ItoError
from ito.core.states import CleanupState, RunState
from ito.server.services.approvals import run_confirmations
from ito.server.services.bookings import booking_dict, list_bookings
from ito.server.services.gates import gates_of
from ito.server.services.lifecycle import (
    checkpoint_dict,
    list_checkpoints,
    list_exports,
    log_tail,
)
from ito.server.services.metric_buckets import ChartSeries, chart_series
from ito.server.services.provenance import provenance_of
from ito.server.services.run_events import events_of_kinds, latest_events
from ito.server.services.run_progress import run_progress
from ito.server.services.runs import event_dict, get_run, list_runs, run_dict
from ito.server.services.telemetry import booking_telemetry, run_costs, run_telemetry
from ito.server.web.charts import Series, line_chart

__all__ = [
    "LOG_TAIL_LINES",
    "bookings_page",
    "progress_of",
    "run_page",
    "runs_page",
    "timeline_of",
]

LOG_TAIL_LINES = 100
LATEST_EVENTS = 15
"""The events the run page lists (the newest)."""


def _planned_stages(run: dict[str, Any]) -> list[dict[str, Any]]:
    stages = (run.get("estimate") or {}).get("stages") or []
    return [s for s in stages if isinstance(s, dict) and s.get("stage")]


def progress_of(run: dict[str, Any], completed: int | None = None) -> dict[str, Any]:
    """Stages completed of the stages planned: counted from the stage events when given
    (the run's page), else (the runs list) the stages before the current one — all of them
    for a run that succeeded, which ran every planned stage."""
    planned = [s["stage"] for s in _planned_stages(run)]
    total = len(planned)
    if completed is None:
        current = run.get("stage")
        if run["state"] == RunState.succeeded.value:
            completed = total
        else:
            completed = planned.index(current) if current in planned else 0
    return {
        "completed": completed,
        "total": total,
        "percent": round(100 * completed / total) if total else 0,
    }


def runs_page(
    session: Session, account_id: str, *, state: str | None, booking_id: str | None, limit: int
) -> dict[str, Any]:
    rows = list_runs(session, account_id, state=state, booking_id=booking_id, limit=limit)
    costs = run_costs(session, account_id, [r.id for r in rows])
    runs = [
        run | {"progress": progress_of(run), "cost_usd": costs[run["run_id"]]}
        for run in map(run_dict, rows)
    ]
    return {
        "runs": runs,
        "states": [s.value for s in RunState],
        "bookings": [b.id for b in list_bookings(session, account_id)],
        "state_filter": state or "",
        "booking_filter": booking_id or "",
    }


def timeline_of(
    run: dict[str, Any],
    events: list[dict[str, Any]],
    gates: list[dict[str, Any]],
    steps: dict[str, list[int]],
) -> list[dict[str, Any]]:
    """One entry per stage — those the events show in the order they ran, then the planned
    ones not reached — with its times, steps and gate records."""
    entries: dict[str, dict[str, Any]] = {}

    def entry(stage: str) -> dict[str, Any]:
        return entries.setdefault(
            stage,
            {"stage": stage, "started_at": None, "completed_at": None, "planned_tokens": None},
        )

    for event in events:
        data = event["data"] or {}
        if event["kind"] == "stage" and data.get("stage"):
            item = entry(str(data["stage"]))
            if data.get("status") == "started" and item["started_at"] is None:
                item["started_at"] = event["at"]
            elif data.get("status") == "completed":
                item["completed_at"] = event["at"]
    for planned in _planned_stages(run):
        entry(str(planned["stage"]))["planned_tokens"] = planned.get("tokens")
    terminal = RunState(run["state"]).is_terminal()
    for item in entries.values():
        stage_gates = [g for g in gates if g["stage"] == item["stage"]]
        item["gates"] = stage_gates
        item["verdict"] = (
            None
            if not stage_gates
            else ("passed" if all(g["passed"] for g in stage_gates) else "failed")
        )
        seen = steps.get(item["stage"], [])
        item["steps"] = (min(seen), max(seen)) if seen else None
        if item["completed_at"]:
            item["status"] = "completed"
        elif item["started_at"]:
            item["status"] = "stopped" if terminal else "running"
        else:
            item["status"] = "not run" if terminal else "planned"
    return list(entries.values())


def _charts(series: dict[str, ChartSeries], stage_starts: list[tuple[float, str]]) -> list[Markup]:
    def drawn(name: str, label: str | None = None) -> Series:
        s = series[name]
        return Series(label or name, s.points, reported=s.reported, width=s.width, last=s.last)

    def several(names: list[str]) -> list[Series]:
        return [drawn(n) for n in names if n in series]

    evals = sorted(n for n in series if n.startswith("eval/"))
    rewards = sorted(n for n in series if "reward" in n)
    charts = [
        line_chart("loss", "Training loss", several(["loss"]), marks=stage_starts),
        line_chart(
            "eval",
            "Eval results",
            [drawn(n, n.removeprefix("eval/")) for n in evals],
            marks=stage_starts,
        ),
        line_chart(
            "tokens_per_s",
            "Throughput",
            several(["tokens_per_s"]),
            unit="tokens/s",
            marks=stage_starts,
        ),
        line_chart("mfu", "MFU", several(["mfu"]), unit="fraction of peak", marks=stage_starts),
    ]
    if rewards:
        charts.append(line_chart("reward", "Reward", several(rewards), marks=stage_starts))
    preference = several(["dpo_margin", "dpo_accuracy"])
    if preference:
        charts.append(line_chart("dpo", "Preference (DPO)", preference, marks=stage_starts))
    return charts


def _waiting_for(events: list[dict[str, Any]], run: dict[str, Any]) -> dict[str, Any]:
    """The data of the event that put the run in ``awaiting_approval`` (``{}`` if it is not
    waiting): a proposed restart, or the figures of a cost bound reached."""
    if run["state"] != RunState.awaiting_approval.value:
        return {}
    for event in reversed(events):
        if event["to_state"] == RunState.awaiting_approval.value:
            return dict(event["data"] or {})
    return {}


def _cost_wait(events: list[dict[str, Any]], run: dict[str, Any]) -> dict[str, Any] | None:
    """What a run waiting at its approved cost bound needs decided, with the figures."""
    data = _waiting_for(events, run)
    return data if data.get("reason") == "cost_bound_reached" else None


def _restart_proposal(events: list[dict[str, Any]], run: dict[str, Any]) -> dict[str, Any] | None:
    data = _waiting_for(events, run)
    return data if data.get("checkpoint_step") is not None else None


def run_page(
    session: Session, account_id: str, run_id: str, public_url: str, now: datetime
) -> dict[str, Any]:
    """Everything the run's page shows; ``run_not_found`` for a missing or another tenant's."""
    row = get_run(session, account_id, run_id)
    run = run_dict(row)
    # The stage and state events (the timeline, what a waiting run waits for) and the latest
    # few: bounded by stages and state changes, never by the checkpoints of a long history.
    events = [event_dict(e) for e in events_of_kinds(session, row, ("stage", "state"))]
    latest = [event_dict(e) for e in latest_events(session, row, LATEST_EVENTS)]
    gates = gates_of(session, account_id, run_id)
    # Bounded whatever the history: each series' span from a few summary rows, then at most
    # a fixed number of points or buckets (ito.server.services.metric_buckets).
    series = chart_series(session, account_id, run_id)
    loss = series.get("loss")
    steps = {stage: list(span) for stage, span in (loss.stage_steps if loss else {}).items()}
    timeline = timeline_of(run, events, gates["gates"], steps)
    # Step / total, tokens and ETA inside each stage of the stored plan.
    inside = {p["name"]: p for p in run_progress(session, row)}
    for item in timeline:
        item["progress"] = inside.get(item["stage"])
    planned = {s["stage"] for s in _planned_stages(run)}
    completed = sum(1 for t in timeline if t["status"] == "completed" and t["stage"] in planned)
    try:
        provenance: dict[str, Any] | None = provenance_of(session, account_id, run_id)
    except ItoError as error:
        if error.code != "provenance_not_found":
            raise
        provenance = None
    state = RunState(run["state"])
    confirmations = run_confirmations(session, account_id, run_id, public_url, now)
    proposal = _restart_proposal(events, run)
    last_step = loss.last_step if loss is not None else None
    return {
        "run": run,
        "progress": progress_of(run, completed),
        "last_step": last_step,
        # The header's step is the one the stage table shows (N of M inside the current
        # stage); the global step is beside it, named as such.
        "current": inside.get(str(run["stage"])) if run["stage"] else None,
        "timeline": timeline,
        "ladder": gates["ladder"],
        "charts": _charts(
            series, [(float(t["steps"][0]), t["stage"]) for t in timeline if t["steps"]]
        ),
        "loss_points": loss.reported if loss is not None else 0,
        "logs": log_tail(session, account_id, run_id, limit=LOG_TAIL_LINES),
        "events": latest,
        "checkpoints": [checkpoint_dict(r) for r in list_checkpoints(session, account_id, run_id)],
        "exports": list_exports(session, account_id, run_id),
        "provenance": provenance,
        "telemetry": run_telemetry(session, account_id, run_id),
        "confirmations": confirmations,
        "can": {
            "cancel": state.is_cancellable(),
            "cleanup": state.is_terminal() and run["cleanup_state"] == CleanupState.none.value,
            "restart": proposal is not None,
        },
        "proposal": proposal,
        "cost_wait": _cost_wait(events, run),
    }


def bookings_page(session: Session, account_id: str) -> dict[str, Any]:
    bookings = []
    for row in list_bookings(session, account_id):
        bookings.append(
            {
                "booking": booking_dict(row),
                "telemetry": booking_telemetry(session, account_id, row.id),
            }
        )
    return {"bookings": bookings}
