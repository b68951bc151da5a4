"""Run states, stages and the allowed-transition table (DESIGN §5.7).

``RunState`` is what users see. The server's ``transition_run`` is the only code that changes a
run's state; it asks :func:`check_transition` first and records an event for every change.

    queued ──► running ──► succeeded | failed | gate_failed
       │         │  ▲ ▲
       │         │  │ └──── recovering ◄── (lease expired)
       │         ▼  │          ▲
       │   awaiting_approval ───┘ (a confirmed restart from checkpoint S, or a new cost
       │         │                  bound approved after cost_bound_reached)
       ▼         │
    cancelling ◄─┘ (from queued, running, recovering, awaiting_approval) ──► cancelled
"""

from __future__ import annotations

from enum import StrEnum

from ito.core.errors import ItoError

__all__ = [
    "ALLOWED_TRANSITIONS",
    "CleanupState",
    "ConfirmationAction",
    "ConfirmationState",
    "RunStage",
    "RunState",
    "check_transition",
]


class RunState(StrEnum):
    queued = "queued"
    running = "running"
    recovering = "recovering"
    awaiting_approval = "awaiting_approval"
    cancelling = "cancelling"
    succeeded = "succeeded"
    failed = "failed"
    gate_failed = "gate_failed"
    cancelled = "cancelled"

    def is_terminal(self) -> bool:
        return self in _TERMINAL

    def is_cancellable(self) -> bool:
        return self in ALLOWED_TRANSITIONS and RunState.cancelling in ALLOWED_TRANSITIONS[self]


_TERMINAL = frozenset(
    {RunState.succeeded, RunState.failed, RunState.gate_failed, RunState.cancelled}
)


class RunStage(StrEnum):
    data_prep = "data_prep"
    ladder = "ladder"
    pretrain = "pretrain"
    midtrain = "midtrain"
    long_context = "long_context"
    sft = "sft"
    dpo = "dpo"
    rlvr = "rlvr"


class CleanupState(StrEnum):
    none = "none"
    cleaning = "cleaning"
    cleaned = "cleaned"


class ConfirmationState(StrEnum):
    pending = "pending"
    approved = "approved"
    rejected = "rejected"
    consumed = "consumed"


class ConfirmationAction(StrEnum):
    train_create = "train.create"
    run_cancel = "run.cancel"
    run_cleanup = "run.cleanup"
    run_restart = "run.restart_from_checkpoint"
    run_raise_bound = "run.raise_cost_bound"

    @property
    def target_kind(self) -> str:
        return "booking" if self is ConfirmationAction.train_create else "run"


_S = RunState
ALLOWED_TRANSITIONS: dict[RunState, frozenset[RunState]] = {
    _S.queued: frozenset({_S.running, _S.cancelling, _S.failed}),
    _S.running: frozenset(
        {
            _S.recovering,
            _S.awaiting_approval,
            _S.cancelling,
            _S.succeeded,
            _S.failed,
            _S.gate_failed,
        }
    ),
    _S.recovering: frozenset({_S.running, _S.cancelling, _S.failed}),
    # A confirmed restart from checkpoint S re-queues the run as recovering (§7.3).
    _S.awaiting_approval: frozenset({_S.running, _S.recovering, _S.cancelling, _S.failed}),
    _S.cancelling: frozenset({_S.cancelled, _S.failed}),
    _S.succeeded: frozenset(),
    _S.failed: frozenset(),
    _S.gate_failed: frozenset(),
    _S.cancelled: frozenset(),
}


def check_transition(current: RunState, target: RunState) -> None:
    """Raise ``invalid_transition`` unless ``current → target`` is in the table."""
    if target not in ALLOWED_TRANSITIONS[current]:
        raise ItoError(
            "invalid_transition",
            f"a run cannot go from {current.value} to {target.value}",
            current=current.value,
            target=target.value,
        )
