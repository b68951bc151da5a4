"""Accounts: the tenants."""

from __future__ import annotations

from sqlalchemy.orm import Session

from ito.core.errors import ItoError
from ito.server.ids import new_id
from ito.server.store.tables import Account

__all__ = ["create_account"]


def create_account(session: Session, name: str) -> Account:
    name = name.strip()
    if not 1 <= len(name) <= 200:
        raise ItoError("invalid_arguments", "an account name is 1-200 characters")
    account = Account(id=new_id("acc"), name=name)
    session.add(account)
    session.flush()
    return account
