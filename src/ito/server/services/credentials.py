"""API keys: minted once, stored as a peppered HMAC beside a short public prefix, revocable.

A key reads ``ito_<role>_<prefix>_<secret>``. The prefix (``ito_req_AbCdEfGh``) is public: it
names the key in logs and finds its row; only the HMAC of the whole key is stored, so a database
dump authorizes nothing. Comparison is constant-time.

Two kinds of credential exist and never mix. A tenant's key (requester, approver, worker) belongs
to one account and resolves to an :class:`AuthContext`. The desk's key belongs to the platform's
operator, has no account, lives in its own table, is minted only on the host that holds the
database (:func:`create_operator_key`), and resolves to an :class:`OperatorContext`, which has no
account a tenant-scoped service could be handed.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
import string
from dataclasses import dataclass

from sqlalchemy import bindparam, select
from sqlalchemy.engine import Connection
from sqlalchemy.orm import Session

from ito.core.errors import ItoError
from ito.server.ids import new_id
from ito.server.store.operator_tables import OperatorKey
from ito.server.store.tables import Account, ApiKey, Booking, Principal, utcnow

__all__ = [
    "OPERATOR_ROLE",
    "ROLES",
    "TENANT_ROLES",
    "AuthContext",
    "Credential",
    "OperatorContext",
    "authenticate",
    "create_key",
    "create_operator_key",
    "hmac_hex",
    "revoke_key",
]

TENANT_ROLES = ("requester", "approver", "worker")
OPERATOR_ROLE = "desk"
ROLES = (*TENANT_ROLES, OPERATOR_ROLE)
_ROLE_TAG = {"requester": "req", "approver": "apr", "worker": "wrk", "desk": "dsk"}
_ALPHABET = string.ascii_letters + string.digits


# Built once: a request's lookup then costs the query, not the building of its statement.
# Plain rows (the tables' columns), not ORM objects: authentication runs on every request and
# reads, never changes, what it finds (:meth:`ito.server.store.db.Database.lookup`).
_TENANT_KEY = select(ApiKey.__table__).where(ApiKey.prefix == bindparam("prefix"))
_OPERATOR_KEY = select(OperatorKey.__table__).where(OperatorKey.prefix == bindparam("prefix"))


def hmac_hex(pepper: str, value: str) -> str:
    return hmac.new(pepper.encode(), value.encode(), hashlib.sha256).hexdigest()


@dataclass(frozen=True)
class AuthContext:
    """A tenant's principal calling: resolved from a credential on every request, never
    cached."""

    account_id: str
    principal_id: str
    role: str
    key_id: str
    key_prefix: str
    booking_id: str | None


@dataclass(frozen=True)
class OperatorContext:
    """The desk calling: the platform's operator, acting for no tenant."""

    key_id: str
    key_prefix: str
    name: str
    role: str = OPERATOR_ROLE
    account_id: None = None
    """Always ``None``: the operator is no tenant (so ``/v1/me`` reads alike for both kinds)."""
    booking_id: None = None

    @property
    def principal_id(self) -> str:
        """The operator key is its own principal."""
        return self.key_id


Credential = AuthContext | OperatorContext


@dataclass(frozen=True)
class MintedKey:
    key_id: str
    principal_id: str
    prefix: str
    api_key: str


def create_key(
    session: Session,
    pepper: str,
    *,
    account_id: str,
    role: str,
    name: str | None = None,
    booking_id: str | None = None,
) -> MintedKey:
    """A tenant's key. The desk's keys are not a tenant's: see :func:`create_operator_key`."""
    if role not in TENANT_ROLES:
        raise ItoError(
            "invalid_arguments",
            f"a tenant key's role is one of {', '.join(TENANT_ROLES)}",
            role=role,
        )
    if session.get(Account, account_id) is None:
        raise ItoError("account_not_found")
    if role == "worker":
        booking = session.get(Booking, booking_id) if booking_id else None
        if booking is None or booking.account_id != account_id:
            raise ItoError("booking_not_found", "a worker key needs a booking of this account")
    elif booking_id is not None:
        raise ItoError("invalid_arguments", "only worker keys are bound to a booking")
    principal = Principal(
        id=new_id("prn"),
        account_id=account_id,
        role=role,
        name=name or f"{role} key",
        booking_id=booking_id,
    )
    session.add(principal)
    session.flush()
    prefix, api_key = _new_secret(role)
    key = ApiKey(
        id=new_id("key"),
        account_id=account_id,
        principal_id=principal.id,
        prefix=prefix,
        secret_hash=hmac_hex(pepper, api_key),
        role=role,
        booking_id=booking_id,
    )
    session.add(key)
    session.flush()
    return MintedKey(key_id=key.id, principal_id=principal.id, prefix=prefix, api_key=api_key)


def create_operator_key(session: Session, pepper: str, *, name: str | None = None) -> MintedKey:
    """A desk key: bound to no account. Only ``ito-server`` on the database's host calls this;
    no API route does, so no credential can mint one."""
    prefix, api_key = _new_secret(OPERATOR_ROLE)
    key = OperatorKey(
        id=new_id("key"),
        prefix=prefix,
        secret_hash=hmac_hex(pepper, api_key),
        name=name or "desk key",
    )
    session.add(key)
    session.flush()
    return MintedKey(key_id=key.id, principal_id=key.id, prefix=prefix, api_key=api_key)


def _new_secret(role: str) -> tuple[str, str]:
    prefix = f"ito_{_ROLE_TAG[role]}_" + "".join(secrets.choice(_ALPHABET) for _ in range(8))
    return prefix, f"{prefix}_{secrets.token_urlsafe(32)}"


def authenticate(session: Session | Connection, pepper: str, presented: str) -> Credential:
    """Resolve a presented key, or raise ``not_authenticated`` / ``credential_revoked``."""
    parts = presented.split("_")
    if len(parts) < 4 or parts[0] != "ito":
        raise ItoError("not_authenticated")
    prefix = "_".join(parts[:3])
    if parts[1] == _ROLE_TAG[OPERATOR_ROLE]:
        return _authenticate_operator(session, pepper, prefix, presented)
    key = session.execute(_TENANT_KEY, {"prefix": prefix}).first()
    if key is None or not hmac.compare_digest(key.secret_hash, hmac_hex(pepper, presented)):
        raise ItoError("not_authenticated")
    if key.role not in TENANT_ROLES:  # a tenant row never carries the operator's role
        raise ItoError("not_authenticated")
    if key.revoked_at is not None:
        raise ItoError("credential_revoked", key_prefix=key.prefix)
    return AuthContext(
        account_id=key.account_id,
        principal_id=key.principal_id,
        role=key.role,
        key_id=key.id,
        key_prefix=key.prefix,
        booking_id=key.booking_id,
    )


def _authenticate_operator(
    session: Session | Connection, pepper: str, prefix: str, presented: str
) -> OperatorContext:
    key = session.execute(_OPERATOR_KEY, {"prefix": prefix}).first()
    if key is None or not hmac.compare_digest(key.secret_hash, hmac_hex(pepper, presented)):
        raise ItoError("not_authenticated")
    if key.revoked_at is not None:
        raise ItoError("credential_revoked", key_prefix=key.prefix)
    return OperatorContext(key_id=key.id, key_prefix=key.prefix, name=key.name)


def revoke_key(session: Session, key_id: str) -> ApiKey | OperatorKey:
    """Revoke a tenant's or the operator's key (idempotent)."""
    key: ApiKey | OperatorKey | None = session.get(ApiKey, key_id) or session.get(
        OperatorKey, key_id
    )
    if key is None:
        raise ItoError("key_not_found")
    if key.revoked_at is None:
        key.revoked_at = utcnow()
    return key
