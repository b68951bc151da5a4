"""Tenant-scoped booking reads, the desk's actions on a booking, and fresh eligibility."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Query

from ito.core.booking_views import BookingDetail, BookingList, EligibilityRecord
from ito.core.desk_views import AccountEventList
from ito.core.envelope import ok_envelope
from ito.core.responses import Envelope
from ito.server.routers.deps import Requester, State
from ito.server.routers.route import OneHopRoute
from ito.server.services.audit import account_event_dict, list_account_events
from ito.server.services.bookings import booking_dict, eligibility, get_booking, list_bookings

router = APIRouter(prefix="/v1/bookings", route_class=OneHopRoute)


@router.get("", response_model=Envelope[BookingList])
def bookings_list(caller: Requester, state: State) -> dict[str, Any]:
    with state.db.read() as session:
        items = [booking_dict(b) for b in list_bookings(session, caller.account_id)]
    return ok_envelope({"bookings": items}, f"{len(items)} booking(s)")


@router.get("/{booking_id}", response_model=Envelope[BookingDetail])
def bookings_show(booking_id: str, caller: Requester, state: State) -> dict[str, Any]:
    with state.db.read() as session:
        data = booking_dict(get_booking(session, caller.account_id, booking_id))
    return ok_envelope(data, f"booking {booking_id} is {data['state']}")


@router.get("/{booking_id}/eligibility", response_model=Envelope[EligibilityRecord])
def bookings_eligibility(booking_id: str, caller: Requester, state: State) -> dict[str, Any]:
    with state.db.read() as session:
        record = eligibility(session, caller.account_id, booking_id)
    return ok_envelope(record, "the booking is eligible for training, checked just now")


@router.get("/{booking_id}/events", response_model=Envelope[AccountEventList])
def bookings_events(
    booking_id: str, caller: Requester, state: State, limit: int = Query(default=100, ge=1, le=1000)
) -> dict[str, Any]:
    """What the desk did to this booking (recorded it, moved its state), newest first."""
    with state.db.read() as session:
        get_booking(session, caller.account_id, booking_id)
        events = [
            account_event_dict(e)
            for e in list_account_events(
                session, caller.account_id, booking_id=booking_id, limit=limit
            )
        ]
    return ok_envelope({"events": events}, f"{len(events)} desk action(s) on this booking")
