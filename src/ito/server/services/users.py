"""Users: the humans who sign in to the web pages to approve device logins and confirmations.

A user is an email, an argon2id password hash and one ``approver`` principal of one account;
the principal is who the user acts as. Passwords are hashed and checked outside any database
transaction (argon2 is deliberately slow), and never stored, logged or echoed.
"""

from __future__ import annotations

from dataclasses import dataclass

from argon2 import PasswordHasher
from argon2.exceptions import InvalidHashError, VerificationError, VerifyMismatchError
from sqlalchemy import select
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from ito.core.errors import ItoError
from ito.server.ids import new_id
from ito.server.store.tables import Account, Principal, User

__all__ = [
    "USER_ROLES",
    "SignInCandidate",
    "create_user",
    "find_sign_in_candidate",
    "hash_password",
    "normalise_email",
    "rehash_password",
    "set_password_hash",
    "verify_password",
]

USER_ROLES = ("approver",)
"""Roles a web user may hold. Requesters are agents with keys; they never sign in."""
PASSWORD_MIN_CHARS = 12
PASSWORD_MAX_CHARS = 1024

# argon2-cffi's defaults are RFC 9106's second recommended option (argon2id, t=3, m=64 MiB, p=4).
_HASHER = PasswordHasher()
# Verified against when the email is unknown, so both answers cost the same time.
_DUMMY_HASH = _HASHER.hash("not a password of anyone")


def normalise_email(email: str) -> str:
    value = email.strip().lower()
    local, at, domain = value.partition("@")
    if (
        not at
        or not local
        or "." not in domain
        or "@" in domain
        or len(value) > 254
        or any(ch.isspace() or ord(ch) < 32 for ch in value)
    ):
        raise ItoError("invalid_arguments", "the email address is not valid")
    return value


def hash_password(password: str) -> str:
    if not PASSWORD_MIN_CHARS <= len(password) <= PASSWORD_MAX_CHARS:
        raise ItoError(
            "invalid_arguments",
            f"a password is {PASSWORD_MIN_CHARS}-{PASSWORD_MAX_CHARS} characters",
        )
    return _HASHER.hash(password)


def verify_password(password_hash: str | None, password: str) -> bool:
    """Constant work whether or not the user exists; ``None`` means no such user."""
    try:
        return _HASHER.verify(password_hash or _DUMMY_HASH, password) and password_hash is not None
    except (VerifyMismatchError, VerificationError, InvalidHashError):
        return False


def rehash_password(password_hash: str, password: str) -> str | None:
    """A fresh hash when the stored one used weaker parameters than today's, else ``None``."""
    return _HASHER.hash(password) if _HASHER.check_needs_rehash(password_hash) else None


def set_password_hash(session: Session, user_id: str, password_hash: str) -> None:
    user = session.get(User, user_id)
    if user is not None:
        user.password_hash = password_hash


@dataclass(frozen=True)
class SignInCandidate:
    user_id: str
    account_id: str
    password_hash: str


def create_user(
    session: Session, *, account_id: str, role: str, email: str, password_hash: str
) -> User:
    """A user and its principal, in the caller's transaction."""
    if role not in USER_ROLES:
        raise ItoError("invalid_arguments", f"a user's role must be one of {', '.join(USER_ROLES)}")
    email = normalise_email(email)
    if session.get(Account, account_id) is None:
        raise ItoError("account_not_found")
    if session.scalar(select(User.id).where(User.email == email)) is not None:
        raise ItoError("user_exists")
    principal = Principal(
        id=new_id("prn"), account_id=account_id, role=role, name=f"{role} {email}"
    )
    session.add(principal)
    session.flush()
    user = User(
        id=new_id("usr"),
        account_id=account_id,
        principal_id=principal.id,
        email=email,
        password_hash=password_hash,
    )
    session.add(user)
    try:
        session.flush()
    except IntegrityError:
        # Another transaction took the email between our check and this insert.
        raise ItoError("user_exists") from None
    return user


def find_sign_in_candidate(session: Session, email: str) -> SignInCandidate | None:
    try:
        email = normalise_email(email)
    except ItoError:
        return None
    user = session.scalar(select(User).where(User.email == email))
    if user is None:
        return None
    return SignInCandidate(
        user_id=user.id, account_id=user.account_id, password_hash=user.password_hash
    )
