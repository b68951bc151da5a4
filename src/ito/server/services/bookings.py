"""Bookings: created and changed by the desk only; read tenant-scoped; eligibility computed
afresh on every call (DESIGN §5.2)."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy import bindparam, select
from sqlalchemy.engine import Row
from sqlalchemy.orm import Session

from ito.core.errors import ItoError
from ito.core.gates import BookingView, eligibility_record
from ito.core.hardware import ACCELERATORS, FABRICS
from ito.core.secret_scan import scan_text
from ito.core.states import RunState
from ito.core.storage import booking_storage_uri
from ito.server.ids import new_id
from ito.server.services.run_events import record_event
from ito.server.store.tables import Account, Booking, Run, utcnow

__all__ = [
    "BOOKING_STATES",
    "NewBooking",
    "booking_dict",
    "booking_view",
    "create_booking",
    "eligibility",
    "get_booking",
    "list_bookings",
    "move_booking",
    "set_booking_state",
]

BOOKING_STATES = ("pending", "completed", "expired", "revoked", "released")
# The desk may move a booking forward only; a revoked, released or expired booking never returns.
_DESK_TRANSITIONS = {
    "pending": {"completed", "expired", "revoked", "released"},
    "completed": {"expired", "revoked", "released"},
    "expired": set(),
    "revoked": set(),
    "released": set(),
}


@dataclass(frozen=True)
class NewBooking:
    account_id: str
    gpu: str
    nodes: int
    gpus_per_node: int
    region: str
    fabric: str
    term_start: datetime
    term_end: datetime
    rate_usd_per_gpu_hour: float
    storage_uri: str | None
    storage_quota_gb: float = 100.0
    state: str = "pending"
    gpu_memory_gb: int | None = None
    node_inventory: list[dict[str, Any]] | None = None


def create_booking(session: Session, new: NewBooking) -> Booking:
    if session.get(Account, new.account_id) is None:
        raise ItoError("account_not_found")
    problems = []
    if new.gpu not in ACCELERATORS:
        problems.append(f"gpu must be one of {sorted(ACCELERATORS)}")
    if new.fabric not in FABRICS:
        problems.append(f"fabric must be one of {list(FABRICS)}")
    if not 1 <= new.nodes <= 4096 or not 1 <= new.gpus_per_node <= 64:
        problems.append("nodes must be 1-4096 and gpus per node 1-64")
    if new.term_start.tzinfo is None or new.term_end.tzinfo is None:
        problems.append("term start and end need a time zone")
    elif new.term_end <= new.term_start:
        problems.append("term end must be after its start")
    if not 0 <= new.rate_usd_per_gpu_hour <= 10_000:
        problems.append("rate must be within 0-10000 USD per GPU-hour")
    if new.state not in ("pending", "completed"):
        problems.append("a new booking is pending or completed")
    if new.storage_quota_gb < 0:
        problems.append("storage quota must not be negative")
    if new.storage_uri is not None and scan_text(new.storage_uri):
        problems.append("storage URI must not carry credentials")
    if problems:
        raise ItoError("invalid_arguments", "; ".join(problems), problems=problems)
    if new.storage_uri is not None:
        # Refused here, when the desk records it, rather than at every plan of every run.
        booking_storage_uri(new.storage_uri)
    memory = new.gpu_memory_gb or ACCELERATORS[new.gpu].memory_gb
    inventory = new.node_inventory or [{"name": f"n{i + 1}"} for i in range(new.nodes)]
    booking = Booking(
        id=new_id("bkg"),
        account_id=new.account_id,
        state=new.state,
        gpu=new.gpu,
        nodes=new.nodes,
        gpus_per_node=new.gpus_per_node,
        gpu_memory_gb=memory,
        region=new.region,
        fabric=new.fabric,
        term_start=new.term_start,
        term_end=new.term_end,
        storage_uri=new.storage_uri,
        storage_quota_gb=new.storage_quota_gb,
        rate_usd_per_gpu_hour=new.rate_usd_per_gpu_hour,
        node_inventory=inventory,
    )
    session.add(booking)
    session.flush()
    return booking


def set_booking_state(session: Session, booking_id: str, state: str) -> Booking:
    return move_booking(session, booking_id, state)[0]


def move_booking(session: Session, booking_id: str, state: str) -> tuple[Booking, str]:
    """The desk moves a booking; returns it and the state it left. Every run of it still going
    gets a ``desk`` event saying so, so the tenant sees why its runs stop (the desk's audit
    trail records the change on the booking itself)."""
    booking = session.get(Booking, booking_id, with_for_update=True)
    if booking is None:
        raise ItoError("booking_not_found")
    if state not in BOOKING_STATES:
        raise ItoError("invalid_arguments", f"state must be one of {BOOKING_STATES}")
    if state != booking.state and state not in _DESK_TRANSITIONS[booking.state]:
        raise ItoError(
            "invalid_transition",
            f"a booking cannot go from {booking.state} to {state}",
            current=booking.state,
            target=state,
        )
    previous = booking.state
    booking.state = state
    booking.updated_at = utcnow()
    if previous != state:
        _tell_runs(session, booking, previous)
    return booking, previous


def _tell_runs(session: Session, booking: Booking, previous: str) -> None:

    runs = session.scalars(
        select(Run)
        .where(
            Run.booking_id == booking.id,
            Run.account_id == booking.account_id,
            Run.state.not_in([s.value for s in RunState if s.is_terminal()]),
        )
        .order_by(Run.id)
    )
    for run in runs:
        record_event(
            session,
            run,
            "desk",
            f"the desk moved booking {booking.id} from {previous} to {booking.state}",
            data={
                "booking_id": booking.id,
                "booking_from_state": previous,
                "booking_to_state": booking.state,
            },
        )


_BOOKING = select(Booking).where(
    Booking.id == bindparam("booking_id"), Booking.account_id == bindparam("account_id")
)
"""Built once (the hot lookup of every create)."""


def get_booking(session: Session, account_id: str, booking_id: str) -> Booking:
    """This account's booking; another tenant's answers exactly like a missing one."""
    booking = session.scalar(_BOOKING, {"booking_id": booking_id, "account_id": account_id})
    if booking is None:
        raise ItoError("booking_not_found")
    return booking


def list_bookings(session: Session, account_id: str) -> list[Booking]:
    return list(
        session.scalars(
            select(Booking).where(Booking.account_id == account_id).order_by(Booking.created_at)
        )
    )


def booking_view(booking: Booking | Row[Any]) -> BookingView:
    return BookingView(
        id=booking.id,
        account_id=booking.account_id,
        state=booking.state,
        gpu=booking.gpu,
        nodes=booking.nodes,
        gpus_per_node=booking.gpus_per_node,
        gpu_memory_gb=booking.gpu_memory_gb,
        region=booking.region,
        fabric=booking.fabric,
        term_start=booking.term_start,
        term_end=booking.term_end,
        storage_uri=booking.storage_uri,
        storage_quota_gb=booking.storage_quota_gb,
        rate_usd_per_gpu_hour=booking.rate_usd_per_gpu_hour,
    )


def eligibility(session: Session, account_id: str, booking_id: str) -> dict[str, Any]:
    return eligibility_record(booking_view(get_booking(session, account_id, booking_id)), utcnow())


def booking_dict(booking: Booking) -> dict[str, Any]:
    return {
        "booking_id": booking.id,
        "account_id": booking.account_id,
        "state": booking.state,
        "gpu": booking.gpu,
        "nodes": booking.nodes,
        "gpus_per_node": booking.gpus_per_node,
        "gpu_memory_gb": booking.gpu_memory_gb,
        "region": booking.region,
        "fabric": booking.fabric,
        "term_start": booking.term_start.isoformat(),
        "term_end": booking.term_end.isoformat(),
        "storage_uri": booking.storage_uri,
        "storage_quota_gb": booking.storage_quota_gb,
        "rate_usd_per_gpu_hour": booking.rate_usd_per_gpu_hour,
        "node_inventory": booking.node_inventory,
    }
