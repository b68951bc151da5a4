"""Following a run: ``ito runs logs --follow`` and ``ito runs watch``.

Both poll at a fixed interval until the run reaches a terminal state, and stop at once on any
refusal — a revoked credential above all: no retry, no further polling, never a login. With
``--json``, ``watch`` prints one envelope per change (JSON lines) and the final envelope last.
"""

from __future__ import annotations

import json
import sys
import time
from typing import Any

from ito.client.operations import Envelope, Operations
from ito.client.run_display import stage_detail
from ito.core.envelope import ok_envelope
from ito.core.run_views import LogPage, RunView

__all__ = ["follow_logs", "watch_run"]

TERMINAL = {"succeeded", "failed", "gate_failed", "cancelled"}


def follow_logs(
    ops: Operations, run: str, since: int, *, json_mode: bool, interval: float = 1.0
) -> Envelope:
    cursor = since
    while True:
        answer = ops.logs(run, since=cursor)
        if not answer["ok"]:
            return answer
        page = LogPage.model_validate(answer["data"])
        for line in page.lines:
            if json_mode:
                sys.stdout.write(line.model_dump_json() + "\n")
            else:
                sys.stdout.write(f"[{line.level}] {line.message}\n")
        sys.stdout.flush()
        cursor = page.next_cursor
        status = ops.runs(run)
        if not status["ok"]:
            return status
        state = RunView.model_validate(status["data"]).state
        if state in TERMINAL and not page.lines:
            return ok_envelope(
                {"run_id": run, "state": state, "next_cursor": cursor},
                f"the run is {state}; no more lines",
            )
        if not page.lines:
            time.sleep(interval)


def watch_run(ops: Operations, run: str, *, interval: float, json_mode: bool) -> Envelope:
    """Poll the run until it ends. Every change of state, stage or a stage's progress is one
    envelope (``--json``: ``state``, ``stage``, ``step`` — the running stage's step inside it —
    and ``progress``, each stage of the run's plan) or a redraw of the bars."""
    last: tuple[Any, ...] | None = None
    progress = None if json_mode else _Progress()
    try:
        while True:
            status = ops.runs(run)
            if not status["ok"]:
                return status
            data = status["data"]
            rows: list[dict[str, Any]] = data.get("progress") or []
            view = {
                "run_id": run,
                "state": data["state"],
                "stage": data["stage"],
                "step": _current_step(rows, data["stage"]),
                "progress": rows,
            }
            key = (data["state"], data["stage"], json.dumps(rows, sort_keys=True))
            if key != last:
                last = key
                if json_mode:
                    sys.stdout.write(json.dumps(ok_envelope(view, f"run is {data['state']}")))
                    sys.stdout.write("\n")
                    sys.stdout.flush()
                elif progress is not None:
                    progress.update(rows)
            latest: dict[str, Any] = data.get("latest_event") or {}
            if data["state"] in TERMINAL:
                last_event = latest
                ended = view | {
                    "failure_code": data.get("failure_code"),
                    "reason": last_event.get("message"),
                }
                return ok_envelope(ended, f"the run ended: {data['state']}")
            if data["state"] == "awaiting_approval":
                # A human must decide (a proposed restart, or a new cost bound): watching
                # longer changes nothing; say what it waits for and how to go on.
                waiting = latest if latest.get("to_state") == "awaiting_approval" else {}
                return ok_envelope(
                    view | {"waiting": waiting.get("data"), "reason": waiting.get("message")},
                    f"the run waits for a human: {waiting.get('message') or 'see ito status'}",
                )
            time.sleep(interval)
    finally:
        if progress is not None:
            progress.close()


def _current_step(rows: list[dict[str, Any]], stage: str | None) -> int | None:
    row = next((r for r in rows if r["name"] == stage), None)
    return None if row is None else row.get("step")


class _Progress:
    """Rich progress bars for a human at a terminal: one per stage of the run's stored plan,
    filled by the steps taken inside it (a stage without steps fills when done)."""

    def __init__(self) -> None:
        from rich.progress import BarColumn, Progress, TextColumn

        self.progress = Progress(
            TextColumn("{task.description}"), BarColumn(), TextColumn("{task.fields[detail]}")
        )
        self.progress.start()
        self.tasks: dict[str, Any] = {}

    def update(self, rows: list[dict[str, Any]]) -> None:
        for row in rows:
            name = str(row["name"])
            total = row.get("steps") or 1
            if name not in self.tasks:
                self.tasks[name] = self.progress.add_task(name, total=total, detail="")
            if row["status"] == "done":
                completed = total
            elif row.get("steps"):
                completed = row.get("step") or 0
            else:
                completed = 0
            self.progress.update(
                self.tasks[name], total=total, completed=completed, detail=stage_detail(row)
            )

    def close(self) -> None:
        self.progress.stop()
