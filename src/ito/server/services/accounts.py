"""Accounts: the tenants."""

from __future__ import annotations

from sqlalchemy.orm import Session

from ito.core.errors import ItoError
from ito.core.text import is_safe
from ito.server.ids import new_id
from ito.server.store.tables import Account

__all__ = ["create_account"]


def create_account(session: Session, name: str) -> Account:
    name = name.strip()
    if not 1 <= len(name) <= 200:
        raise ItoError("invalid_arguments", "an account name is 1-200 characters")
    if not is_safe(name):  # shown to approvers; the operator's CLI does not pass the API guard
        raise ItoError(
            "invalid_arguments",
            "an account name may not carry control or bidirectional override characters",
        )
    account = Account(id=new_id("acc"), name=name)
    session.add(account)
    session.flush()
    return account
