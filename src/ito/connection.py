"""How a process reaches the canonical API: the settings the client side (``ito``,
``ito-mcp``) and the worker share, from the environment only — never from arguments: no secret
there. Read through :class:`ito.settings.ItoSettings`.

``ITO_API_URL`` (default ``http://127.0.0.1:8000``), ``ITO_CONNECT_TIMEOUT`` (seconds,
default 5), ``ITO_TIMEOUT`` (overall deadline of one request in seconds, default 30),
``ITO_HOME`` and ``ITO_API_KEY``. The client adds its login settings
(:class:`ito.client.config.ClientConfig`), the worker its drills
(:class:`ito.worker.settings.WorkerSettings`); neither imports the other.
"""

from __future__ import annotations

from typing import TypeVar

from pydantic import Field, SecretStr, ValidationError, field_validator, model_validator
from pydantic_settings import SettingsConfigDict

from ito.core.errors import ItoError
from ito.settings import ItoSettings, env_name
from ito.transport import DEFAULT_CONNECT_TIMEOUT, DEFAULT_TIMEOUT, Transport

__all__ = ["DEFAULT_API_URL", "ApiConnection", "build"]

DEFAULT_API_URL = "http://127.0.0.1:8000"


class ApiConnection(ItoSettings):
    model_config = SettingsConfigDict(frozen=True)
    url_fields = frozenset({"api_url"})

    api_url: str = DEFAULT_API_URL
    """Base URL of the canonical API (``ITO_API_URL``)."""
    connect_timeout: float = Field(default=DEFAULT_CONNECT_TIMEOUT, gt=0, le=3600)
    """Bound on opening a connection, seconds (``ITO_CONNECT_TIMEOUT``)."""
    timeout: float = Field(default=DEFAULT_TIMEOUT, gt=0, le=3600)
    """Overall deadline of one request, retries included, seconds (``ITO_TIMEOUT``); never
    below the connect timeout."""
    api_key: SecretStr | None = None
    """A key for non-interactive use (``ITO_API_KEY``); wins over the stored login."""

    @field_validator("api_url")
    @classmethod
    def _http_url(cls, value: str) -> str:
        if not value.startswith(("http://", "https://")):
            raise ValueError("must be an http(s) URL")
        return value.rstrip("/")

    @model_validator(mode="after")
    def _deadline_covers_connect(self) -> ApiConnection:
        if self.timeout < self.connect_timeout:
            object.__setattr__(self, "timeout", self.connect_timeout)
        return self

    def transport(self, token: str | None) -> Transport:
        """The one HTTP transport (:mod:`ito.transport`) to this API with ``token``."""
        return Transport(
            self.api_url, token, connect_timeout=self.connect_timeout, timeout=self.timeout
        )


_C = TypeVar("_C", bound=ApiConnection)


def build(kind: type[_C]) -> _C:
    """``kind`` from the environment, or ``client_not_configured`` naming the variables at
    fault (never their values: they may be secrets)."""
    try:
        return kind()
    except ValidationError as exc:
        names = sorted({env_name(str(e["loc"][0])) for e in exc.errors() if e["loc"]})
        raise ItoError(
            "client_not_configured", f"{', '.join(names) or 'a setting'} is not valid"
        ) from None
