"""What every request handler shares: settings and the database. Built once per app."""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field

from ito.core.errors import ItoError
from ito.core.rate_limit import TokenBucket
from ito.server.services.auth_failures import AuthFailures
from ito.server.settings import ServerSettings
from ito.server.store.db import Database
from ito.server.store.tables import utcnow

__all__ = ["AppState", "Limits"]


class Limits:
    """The rate limits. The per-principal request bucket (:class:`TokenBucket`) lives in this
    process, behind one lock (request handlers run on a thread pool): with several server
    processes each counts on its own, so a credential gets up to the rate times the processes
    (documented in the README). The failed-authentication window lives in the database
    (:class:`AuthFailures`), shared by every process: guessing is refused at the same count
    however many processes answer."""

    def __init__(self, settings: ServerSettings, db: Database) -> None:
        self._lock = threading.Lock()
        self._requests = TokenBucket(settings.rate_limit_per_second, settings.rate_limit_burst)
        self._failures = AuthFailures(
            db, settings.pepper.get_secret_value(), settings.auth_failures_per_minute, 60.0
        )
        self._sign_in_addresses = AuthFailures(
            db,
            settings.pepper.get_secret_value(),
            SIGN_IN_ADDRESS_FACTOR * settings.auth_failures_per_minute,
            60.0,
        )

    def admit(self, principal_id: str) -> None:
        """Spend one request of a principal, or refuse with ``rate_limited``."""
        with self._lock:
            wait = self._requests.take(principal_id, time.monotonic())
        if wait is not None:
            raise ItoError(
                "rate_limited",
                "too many requests for this credential",
                retry_after_s=round(wait, 3),
            )

    def check_source(self, key: str) -> None:
        """Refuse a source that failed authentication too often lately."""
        wait = self._failures.blocked([key], utcnow())
        if wait is not None:
            raise ItoError(
                "rate_limited", "too many failed sign-ins from here", retry_after_s=round(wait, 3)
            )

    def failed(self, key: str) -> None:
        self._failures.record([key], utcnow())

    def check_sign_in_address(self, address: str) -> None:
        """Refuse sign-in from an address whose failures, over every email, passed
        :data:`SIGN_IN_ADDRESS_FACTOR` × the per-email limit lately (an email spray)."""
        wait = self._sign_in_addresses.blocked([f"sign-in-address:{address}"], utcnow())
        if wait is not None:
            raise ItoError(
                "rate_limited", "too many failed sign-ins from here", retry_after_s=round(wait, 3)
            )

    def sign_in_address_failed(self, address: str) -> None:
        self._sign_in_addresses.record([f"sign-in-address:{address}"], utcnow())

    def key_failed(self, source: str, key_prefix: str | None) -> None:
        """Count an API key that did not verify against its source address and, when it had
        the shape of one, its public prefix; refuse with ``rate_limited`` when either was
        already past the limit. Only failures are refused: a key that verifies is never
        looked up here (DESIGN §5.1: its secret is 256 random bits, so failures cannot be a
        path to guessing it, only to denying it)."""
        keys = [source] + ([f"prefix:{key_prefix}"] if key_prefix else [])
        wait = self._failures.record(keys, utcnow())
        if wait is not None:
            raise ItoError(
                "rate_limited", "too many failed sign-ins from here", retry_after_s=round(wait, 3)
            )


SIGN_IN_ADDRESS_FACTOR = 3
"""Sign-in failures one address may make per minute over all emails, as a multiple of the
per-email limit: a spray of many emails from one address is stopped, while one account's
guesser behind a shared NAT (up to the per-email limit) never locks its neighbours out."""


@dataclass
class AppState:
    settings: ServerSettings
    db: Database
    limits: Limits = field(init=False)

    def __post_init__(self) -> None:
        self.limits = Limits(self.settings, self.db)

    @property
    def pepper(self) -> str:
        return self.settings.pepper.get_secret_value()
