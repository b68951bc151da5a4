"""A run's stages as a person reads them in ``ito runs show`` and ``ito runs watch``: exactly
the stages of the run's stored plan (never the manifest's or the estimate's list), each with
its status and its progress inside it — step / total, tokens, ETA."""

from __future__ import annotations

from typing import Any

from ito.core.human_format import duration, token_count

__all__ = ["render_run", "stage_detail"]

_STATUS_WORDS = {
    "pending": "pending",
    "running": "running",
    "done": "done",
    "stopped": "stopped",
    "not_run": "not run",
}


def stage_detail(row: dict[str, Any]) -> str:
    """``running · step 12/40 · 196k tokens · ETA 2 min 10 s``; ``done · 40/40 steps``;
    ``pending · est. 3 min 40 s``; ``not run``."""
    status = str(row.get("status", "pending"))
    parts = [_STATUS_WORDS.get(status, status)]
    steps, step = row.get("steps"), row.get("step")
    if steps is not None and status in ("running", "stopped"):
        parts.append(f"step {step or 0}/{steps}")
    elif steps is not None and status == "done":
        taken = steps if step is None else step
        parts.append(f"{taken}/{steps} steps" + (" (ended early)" if taken < steps else ""))
    elif steps is not None and status == "pending":
        parts.append(f"{steps} steps")
    tokens = row.get("tokens")
    if tokens and status in ("running", "stopped", "done"):
        parts.append(f"{token_count(int(tokens))} tokens")
    eta = row.get("eta_seconds")
    if status == "running" and eta is not None:
        parts.append(f"ETA {duration(float(eta))}")
    if status == "pending":
        parts.append(f"est. {duration(float(row.get('estimated_seconds') or 0))}")
        if row.get("upper_seconds"):
            parts.append(f"at most {duration(float(row['upper_seconds']))}")
    return " · ".join(parts)


def state_mark(state: object) -> str:
    """The mark a run's state is shown with: a tick only for what went right."""
    if state in ("failed", "gate_failed", "cancelled"):
        return "[red]✗[/red]"
    if state == "awaiting_approval":
        return "[yellow]‖[/yellow]"
    return "[green]✓[/green]"


def render_watch(envelope: dict[str, Any]) -> None:
    """``runs watch``'s last word for a human: how the run ended, or what it waits for."""
    from rich.console import Console

    console = Console(highlight=False)
    data = envelope["data"]
    console.print(f"{state_mark(data.get('state'))} {envelope['notice']}")
    if data.get("failure_code"):
        console.print(f"  code {data['failure_code']}: {data.get('reason') or ''}", markup=False)


def render_run(envelope: dict[str, Any]) -> None:
    """``runs show`` for a human: the run's state, then one line per stage of its plan."""
    from rich.console import Console

    console = Console(highlight=False)
    data = envelope["data"]
    console.print(f"{state_mark(data.get('state'))} {envelope['notice']}")
    console.print(
        f"run {data['run_id']} · {data['state']}"
        + (f" ({data['failure_code']})" if data.get("failure_code") else "")
        + f" · booking {data['booking_id']}",
        markup=False,
    )
    estimate = data.get("estimate") or {}
    if "cost_usd" in estimate:
        console.print(
            f"estimate ${estimate['cost_usd']:.2f} of ${estimate.get('ceiling_usd', 0):.2f} "
            f"ceiling, {duration(float(estimate.get('seconds', 0)))}",
            markup=False,
        )
    rows = data.get("progress") or []
    width = max((len(str(r["name"])) for r in rows), default=0)
    for row in rows:
        console.print(f"  {str(row['name']).ljust(width)}  {stage_detail(row)}", markup=False)
    if data.get("cost_bound_usd") is not None:
        console.print(f"cost bound ${data['cost_bound_usd']:.2f} (approved)", markup=False)
    latest = data.get("latest_event") or (data.get("events") or [None])[-1]
    if latest:
        console.print(f"last event: {latest['message']}", markup=False)
