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
from ito.core.envelope import ok_envelope
from ito.core.run_views import LogPage, MetricPage, RunView

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
    last: tuple[Any, ...] | None = None
    progress = None if json_mode else _Progress()
    try:
        while True:
            status = ops.runs(run)
            if not status["ok"]:
                return status
            data = status["data"]
            step = _latest_step(ops, run)
            key = (data["state"], data["stage"], step)
            if key != last:
                last = key
                if json_mode:
                    sys.stdout.write(
                        json.dumps(
                            ok_envelope(
                                {
                                    "run_id": run,
                                    "state": data["state"],
                                    "stage": data["stage"],
                                    "step": step,
                                },
                                f"run is {data['state']}",
                            )
                        )
                        + "\n"
                    )
                    sys.stdout.flush()
                elif progress is not None:
                    progress.update(data, step)
            if data["state"] in TERMINAL:
                return ok_envelope(
                    {"run_id": run, "state": data["state"], "stage": data["stage"], "step": step},
                    f"the run ended: {data['state']}",
                )
            time.sleep(interval)
    finally:
        if progress is not None:
            progress.close()


def _latest_step(ops: Operations, run: str) -> int | None:
    answer = ops.metrics(run, name="loss")
    if not answer["ok"]:
        return None
    points = MetricPage.model_validate(answer["data"]).points
    return points[-1].step if points else None


class _Progress:
    """Rich progress bars, one per stage, for a human at a terminal."""

    def __init__(self) -> None:
        from rich.progress import BarColumn, Progress, TextColumn

        self.progress = Progress(
            TextColumn("{task.description}"), BarColumn(), TextColumn("{task.fields[detail]}")
        )
        self.progress.start()
        self.tasks: dict[str, Any] = {}

    def update(self, data: dict[str, Any], step: int | None) -> None:
        stage = data["stage"] or "queued"
        stages = [s["stage"] for s in data.get("estimate", {}).get("stages", [])] or [stage]
        for name in stages:
            if name not in self.tasks:
                self.tasks[name] = self.progress.add_task(name, total=1, detail="")
        task = self.tasks.get(stage)
        if task is not None:
            self.progress.update(task, detail=f"{data['state']} step {step or 0}")
        if stage in stages:
            for name in stages[: stages.index(stage)]:
                self.progress.update(self.tasks[name], completed=1, detail="done")
        if data["state"] == "succeeded":
            for task_id in self.tasks.values():
                self.progress.update(task_id, completed=1, detail="done")

    def close(self) -> None:
        self.progress.stop()
