"""Server settings: one pydantic-settings object, built by the caller and passed to
``create_app``; nothing is read at import.

The pepper that keys every stored hash comes from ``ITO_PEPPER`` in production. On the embedded
default (SQLite under ``$ITO_HOME``) a random pepper is generated once into
``$ITO_HOME/server-pepper`` (mode 0600). An example or short pepper is refused.
"""

from __future__ import annotations

import os
import secrets
from pathlib import Path

from pydantic import Field, SecretStr

from ito.core.manifest import MANIFEST_MAX_BYTES
from ito.settings import ItoSettings

__all__ = ["PEPPER_FILE", "ServerSettings", "load_settings", "pepper_state"]

PEPPER_FILE = "server-pepper"
"""Under ``home``: the embedded default's generated pepper."""
_EXAMPLE_PEPPERS = {"change-me", "changeme", "example", "pepper", "secret", "test"}


class ServerSettings(ItoSettings):
    """Every field is read from ``ITO_<FIELD>`` (:mod:`ito.settings`); ``home`` is
    ``ITO_HOME``, the embedded default's state directory (database, pepper, logs)."""

    url_fields = frozenset({"database_url", "public_url"})

    database_url: str = ""
    """SQLAlchemy URL; empty means the embedded SQLite file ``$ITO_HOME/ito.db``."""
    pepper: SecretStr = SecretStr("")
    """Key of the HMACs that stand in for stored secrets. Required outside the embedded default."""
    public_url: str = "http://127.0.0.1:8000"
    """Base URL humans reach the web pages at (approval links)."""
    confirmation_ttl_seconds: int = Field(default=900, ge=1, le=24 * 3600)
    """Default life of a pending confirmation (15 minutes)."""
    device_code_ttl_seconds: int = Field(default=600, ge=1, le=3600)
    """Life of a device-login code (RFC 8628 ``expires_in``)."""
    device_poll_interval_seconds: int = Field(default=5, ge=1, le=60)
    """Least seconds between two token polls of one device code (RFC 8628 ``interval``)."""
    web_session_ttl_seconds: int = Field(default=8 * 3600, ge=60, le=7 * 24 * 3600)
    """Life of a signed-in web session (approver pages)."""
    db_pool_size: int = Field(default=10, ge=1, le=200)
    lease_ttl_seconds: float = Field(default=30.0, ge=2, le=3600)
    """A run whose worker has not heartbeated for this long goes ``recovering`` (§7.1)."""
    heartbeat_seconds: float = Field(default=5.0, ge=0.2, le=600)
    """How often a worker renews its lease; must be well under the TTL."""
    lease_sweep_seconds: float = Field(default=1.0, ge=0.1, le=600)
    """How often the server looks for expired leases."""
    rate_limit_per_second: float = Field(default=20.0, gt=0, le=1_000_000)
    """Requests a credential may make per second, sustained (``rate_limited`` past it)."""
    rate_limit_burst: int = Field(default=200, ge=1, le=10_000_000)
    """Requests a credential may make at once before the sustained rate applies."""
    auth_failures_per_minute: int = Field(default=20, ge=1, le=1_000_000)
    """Failed authentications a source address may make in a minute (and an API key's public
    prefix, from anywhere). Past it, unknown keys are answered ``rate_limited`` for the rest of
    the minute, while a key that verifies still gets in (a neighbour behind the same NAT cannot
    lock a tenant out). At the sign-in page failures count per email and per address-and-email
    (never per address alone); past the limit that email is refused outright, the right
    password included (passwords are guessable, keys are not; a locked-out approver can still
    decide with ``ito approve`` and an approver key)."""
    trusted_proxies: str = ""
    """Comma-separated addresses or networks of the reverse proxies in front of the server. Only
    a request arriving from one of them has its ``X-Forwarded-For`` believed for the client
    address (rate limits, lockouts); empty (the default) means the socket's peer is the client
    and forwarded headers are ignored."""
    max_request_bytes: int = Field(
        default=4 * 1024 * 1024, ge=2 * MANIFEST_MAX_BYTES, le=1024 * 1024 * 1024
    )
    """Largest request body accepted, checked before anything reads it (``request_too_large``
    past it). The largest legitimate bodies are a manifest sent base64 inside JSON (about 4/3 of
    the manifest bound) and a worker's report batch; the floor keeps every manifest sendable."""

    def resolved_database_url(self) -> str:
        return self.database_url or f"sqlite:///{self.home / 'ito.db'}"

    def is_embedded(self) -> bool:
        return not self.database_url or self.database_url.startswith("sqlite")


def load_settings(database_url: str | None = None) -> ServerSettings:
    """Build settings from the environment (``database_url``, from ``--database-url``, wins),
    then make sure the pepper is usable."""
    settings = ServerSettings()
    if database_url:
        settings = settings.with_source("argument", database_url=database_url)
    pepper = settings.pepper.get_secret_value()
    if not pepper:
        if not settings.is_embedded():
            raise SystemExit("ITO_PEPPER must be set when the database is not the embedded SQLite")
        pepper = _embedded_pepper(settings.home)
        settings = settings.with_source("file", pepper=SecretStr(pepper))
    if pepper.lower() in _EXAMPLE_PEPPERS or len(pepper) < 16:
        raise SystemExit("ITO_PEPPER is an example value or shorter than 16 characters; refusing")
    return settings


def pepper_state(settings: ServerSettings) -> dict[str, str]:
    """How the pepper would be had, without creating or reading it: ``value`` is set or not set
    and ``source`` environment, file (the embedded default's generated pepper) or default."""
    if settings.pepper.get_secret_value():
        return {"value": "set", "source": settings.source_of("pepper")}
    if settings.is_embedded() and (settings.home / PEPPER_FILE).is_file():
        return {"value": "set", "source": "file"}
    return {"value": "not set", "source": "default"}


def _embedded_pepper(home: Path) -> str:
    home.mkdir(mode=0o700, parents=True, exist_ok=True)
    path = home / PEPPER_FILE
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:
        return path.read_text().strip()
    value = secrets.token_urlsafe(32)
    with os.fdopen(fd, "w") as handle:
        handle.write(value + "\n")
    return value
