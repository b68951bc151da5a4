"""Device login: the OAuth 2.0 device authorization grant (RFC 8628) behind ``ito login``.

A device asks for a code pair: the ``device_code`` (32 random bytes; only its HMAC under the
server pepper is stored) that it polls with, and a short ``user_code`` a human types or follows
on the verification page. A signed-in approver approves or denies it there; approval binds the
code to the approver's account. The next poll exchanges an approved code, exactly once, for a
brand-new ``requester`` key of that account — never the approver's own principal — so a device
login can never approve anything, and its requests are approved by someone else.

Poll answers (RFC 8628 §3.5): ``authorization_pending``, ``slow_down`` (polled inside the
interval), ``access_denied``, ``device_code_expired``, ``device_code_not_found`` (unknown, or
already exchanged), else the token.
"""

from __future__ import annotations

import secrets
from dataclasses import dataclass
from datetime import datetime, timedelta

from sqlalchemy import select
from sqlalchemy.orm import Session

from ito.core.errors import ItoError
from ito.server.ids import new_id
from ito.server.services.credentials import MintedKey, create_key, hmac_hex
from ito.server.services.web_sessions import SignedInUser
from ito.server.store.tables import DeviceCode, User

__all__ = [
    "USER_CODE_ALPHABET",
    "DeviceGrant",
    "DevicePoll",
    "decide_device_code",
    "device_code_view",
    "format_user_code",
    "normalise_user_code",
    "poll_device_code",
    "start_device_login",
]

USER_CODE_ALPHABET = "BCDFGHJKLMNPQRSTVWXZ"
"""RFC 8628 §6.1: base-20 consonants — no vowels (no words), no 0/O or 1/I to confuse."""
USER_CODE_LENGTH = 8
"""20^8 ≈ 2^34.6 codes; guessing one needs a signed-in approver and beats a 10-minute life."""


def format_user_code(code: str) -> str:
    return f"{code[:4]}-{code[4:]}"


def normalise_user_code(text: str | None) -> str | None:
    """What a human typed, as stored (``BCDF-GHJK`` → ``BCDFGHJK``), or ``None`` if malformed."""
    if not text:
        return None
    value = "".join(ch for ch in text.upper() if ch not in "- ")
    if len(value) != USER_CODE_LENGTH or any(ch not in USER_CODE_ALPHABET for ch in value):
        return None
    return value


def _code_hash(pepper: str, device_code: str) -> str:
    return hmac_hex(pepper, "device_code:" + device_code)


@dataclass(frozen=True)
class DeviceGrant:
    """What the device is told once; ``device_code`` exists nowhere else."""

    device_code: str
    user_code: str
    expires_in: int
    interval: int


def start_device_login(
    session: Session,
    pepper: str,
    *,
    client_name: str | None,
    ttl_seconds: int,
    interval_seconds: int,
    now: datetime,
) -> DeviceGrant:
    if client_name is not None:
        client_name = "".join(ch for ch in client_name if ch.isprintable()).strip()[:100] or None
    for _ in range(20):
        user_code = "".join(secrets.choice(USER_CODE_ALPHABET) for _ in range(USER_CODE_LENGTH))
        if session.scalar(select(DeviceCode.id).where(DeviceCode.user_code == user_code)) is None:
            break
    else:  # pragma: no cover - 20 collisions in a space of 2^34 codes
        raise ItoError("store_busy", "could not allocate a user code; retry")
    device_code = secrets.token_urlsafe(32)
    session.add(
        DeviceCode(
            id=new_id("dvc"),
            code_hash=_code_hash(pepper, device_code),
            user_code=user_code,
            client_name=client_name,
            state="pending",
            interval_seconds=interval_seconds,
            created_at=now,
            expires_at=now + timedelta(seconds=ttl_seconds),
        )
    )
    session.flush()
    return DeviceGrant(
        device_code=device_code,
        user_code=format_user_code(user_code),
        expires_in=ttl_seconds,
        interval=interval_seconds,
    )


def _pending_code(session: Session, user_code: str | None, now: datetime) -> DeviceCode:
    normalised = normalise_user_code(user_code)
    row = None
    if normalised is not None:
        row = session.scalar(
            select(DeviceCode).where(DeviceCode.user_code == normalised).with_for_update()
        )
    if row is None:
        raise ItoError("device_code_not_found", "no device login has this code")
    if row.state != "pending":
        raise ItoError("device_code_not_pending")
    if now >= row.expires_at:
        raise ItoError("device_code_expired")
    return row


def device_code_view(session: Session, user_code: str | None, now: datetime) -> DeviceCode:
    """The pending code a human is about to decide on (refusals as for the decision)."""
    return _pending_code(session, user_code, now)


def decide_device_code(
    session: Session, user: SignedInUser, user_code: str | None, *, approve: bool, now: datetime
) -> DeviceCode:
    row = _pending_code(session, user_code, now)
    row.state = "approved" if approve else "denied"
    row.account_id = user.account_id
    row.decided_by = user.user_id
    row.decided_at = now
    return row


@dataclass(frozen=True)
class DevicePoll:
    """The outcome of one poll. A refusal is returned, not raised, so the poll time it
    recorded is committed."""

    error: ItoError | None = None
    minted: MintedKey | None = None
    account_id: str | None = None


def _too_soon(last: datetime | None, now: datetime, interval: int) -> bool:
    # A little slack for network jitter: a client waiting exactly `interval` on its own clock
    # may arrive slightly early on ours.
    return last is not None and (now - last).total_seconds() < interval - min(0.5, interval / 5)


def poll_device_code(session: Session, pepper: str, device_code: str, now: datetime) -> DevicePoll:
    row = session.scalar(
        select(DeviceCode)
        .where(DeviceCode.code_hash == _code_hash(pepper, device_code))
        .with_for_update()
    )
    if row is None:
        return DevicePoll(ItoError("device_code_not_found"))
    if row.state == "consumed":
        return DevicePoll(
            ItoError(
                "device_code_not_found",
                "this device code was already exchanged for a token; start a new login",
            )
        )
    if now >= row.expires_at:
        return DevicePoll(ItoError("device_code_expired"))
    if row.state == "denied":
        return DevicePoll(ItoError("access_denied"))
    if row.state == "pending":
        too_soon = _too_soon(row.last_polled_at, now, row.interval_seconds)
        row.last_polled_at = now
        if too_soon:
            return DevicePoll(ItoError("slow_down", interval=row.interval_seconds))
        return DevicePoll(ItoError("authorization_pending", interval=row.interval_seconds))
    assert row.state == "approved", row.state
    assert row.account_id is not None and row.decided_by is not None
    approver = session.get(User, row.decided_by)
    assert approver is not None
    minted = create_key(
        session,
        pepper,
        account_id=row.account_id,
        role="requester",
        name=f"device login approved by {approver.email}",
    )
    row.state = "consumed"
    row.consumed_at = now
    row.last_polled_at = now
    row.key_id = minted.key_id
    return DevicePoll(minted=minted, account_id=row.account_id)
