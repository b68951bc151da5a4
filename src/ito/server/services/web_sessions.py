"""Signed-in browser sessions of web users, and the CSRF tokens of their forms.

The session cookie carries 32 random bytes; the table keeps only their HMAC under the server
pepper, so a database dump signs nobody in. Each form carries a CSRF token derived from the
session id (HMAC under the pepper, its own domain string), checked in constant time; the login
form, which comes before any session, uses the same derivation from a short-lived pre-session
cookie (double submit). None of these values is ever logged or stored in the clear.
"""

from __future__ import annotations

import hmac
import secrets
from dataclasses import dataclass
from datetime import datetime, timedelta

from sqlalchemy import delete, select, update
from sqlalchemy.orm import Session

from ito.server.ids import new_id
from ito.server.services.credentials import AuthContext, hmac_hex
from ito.server.store.tables import Principal, User, WebSession

__all__ = [
    "SignedInUser",
    "csrf_token",
    "csrf_valid",
    "end_session",
    "new_secret",
    "resolve_session",
    "start_session",
]


def new_secret() -> str:
    return secrets.token_urlsafe(32)


def _session_hash(pepper: str, secret: str) -> str:
    return hmac_hex(pepper, "web_session:" + secret)


def csrf_token(pepper: str, purpose: str, secret: str) -> str:
    """The form token bound to one session (or pre-session) secret."""
    return hmac_hex(pepper, f"csrf:{purpose}:{secret}")


def csrf_valid(pepper: str, purpose: str, secret: str | None, presented: str | None) -> bool:
    if not secret or not presented:
        return False
    return hmac.compare_digest(csrf_token(pepper, purpose, secret), presented)


@dataclass(frozen=True)
class SignedInUser:
    """The human behind a valid session cookie."""

    session_id: str
    """Public id of the session (``wss_…``), safe to log."""
    user_id: str
    account_id: str
    principal_id: str
    role: str
    email: str

    def auth_context(self) -> AuthContext:
        """The principal this user acts as, in the shape the services take."""
        return AuthContext(
            account_id=self.account_id,
            principal_id=self.principal_id,
            role=self.role,
            key_id=self.session_id,
            key_prefix="web-session",
            booking_id=None,
        )


def start_session(
    session: Session, pepper: str, *, user_id: str, account_id: str, now: datetime, ttl_seconds: int
) -> tuple[str, WebSession]:
    """A new session; returns the cookie secret (shown to the browser only) and the row."""
    # Housekeeping in the same transaction: this user's sessions that can never be used again.
    session.execute(
        delete(WebSession).where(WebSession.user_id == user_id, WebSession.expires_at <= now)
    )
    secret = new_secret()
    row = WebSession(
        id=new_id("wss"),
        secret_hash=_session_hash(pepper, secret),
        user_id=user_id,
        account_id=account_id,
        created_at=now,
        expires_at=now + timedelta(seconds=ttl_seconds),
    )
    session.add(row)
    session.flush()
    return secret, row


def resolve_session(
    session: Session, pepper: str, secret: str | None, now: datetime
) -> SignedInUser | None:
    """The signed-in user, or ``None`` for a missing, unknown, expired or ended session."""
    if not secret or len(secret) > 200:
        return None
    row = session.execute(
        select(WebSession, User, Principal)
        .join(User, User.id == WebSession.user_id)
        .join(Principal, Principal.id == User.principal_id)
        .where(WebSession.secret_hash == _session_hash(pepper, secret))
    ).first()
    if row is None:
        return None
    web, user, principal = row
    if web.revoked_at is not None or now >= web.expires_at:
        return None
    return SignedInUser(
        session_id=web.id,
        user_id=user.id,
        account_id=user.account_id,
        principal_id=principal.id,
        role=principal.role,
        email=user.email,
    )


def end_session(session: Session, session_id: str, now: datetime) -> None:
    session.execute(
        update(WebSession)
        .where(WebSession.id == session_id, WebSession.revoked_at.is_(None))
        .values(revoked_at=now)
        .execution_options(synchronize_session=False)
    )
