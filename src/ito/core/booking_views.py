"""What the API answers about bookings and confirmations (DESIGN §5.2, §5.5): the ``data`` of
those read and decide routes, as models (see :mod:`ito.core.run_views` for the rules)."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict

__all__ = [
    "BookingDetail",
    "BookingList",
    "BookingTerm",
    "BookingTopology",
    "ConfirmationTarget",
    "ConfirmationView",
    "EligibilityRecord",
]


class _View(BaseModel):
    model_config = ConfigDict(extra="ignore")


class BookingDetail(_View):
    booking_id: str
    account_id: str
    state: str
    gpu: str
    nodes: int
    gpus_per_node: int
    gpu_memory_gb: int
    region: str
    fabric: str
    term_start: str
    term_end: str
    storage_uri: str | None
    storage_quota_gb: float
    rate_usd_per_gpu_hour: float
    node_inventory: list[Any]


class BookingList(_View):
    bookings: list[BookingDetail]


class BookingTopology(_View):
    gpu: str
    nodes: int
    gpus_per_node: int
    gpu_memory_gb: int


class BookingTerm(_View):
    start: str
    end: str


class EligibilityRecord(_View):
    """A booking found eligible just now (§5.2), bound to its account, topology, region,
    fabric and term. An ineligible booking is a refusal, not a record."""

    eligible: Literal[True]
    account_id: str
    booking_id: str
    topology: BookingTopology
    region: str
    fabric: str
    term: BookingTerm
    checked_at: str
    valid_until: str
    """The earlier of the check's time-to-live and the booking's term end."""


class ConfirmationTarget(_View):
    kind: str
    """``booking`` (a run to create on it) or ``run`` (an action on that run)."""
    id: str


class ConfirmationView(_View):
    confirmation_ref: str
    """The reference alone authorizes nothing: a human approver must approve it."""
    action: str
    target: ConfirmationTarget
    manifest_id: str | None
    cost_usd: float
    state: str
    """``pending``, ``approved``, ``rejected``, ``consumed`` or ``expired``."""
    expires_at: str
    created_at: str
    decided_at: str | None
    approval_url: str
    approve_command: str
    details: dict[str, Any]
