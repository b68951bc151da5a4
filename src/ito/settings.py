"""Where every ``ITO_*`` setting is read: the base of the settings objects, the API
connection's (:class:`ito.connection.ApiConnection`, which the client's and the worker's extend)
and the server's (:class:`ito.server.settings.ServerSettings`).

Both are pydantic-settings objects built by the caller, never at import. A field ``name`` is read
from ``ITO_<NAME>`` (an empty variable counts as unset); ``ITO_HOME`` — the state directory
every process shares — is declared once, here. :meth:`ItoSettings.effective` is what
``ito config`` and ``ito-server config`` print: each field's value and where it came from
(``default``, ``environment``, ``argument`` or ``file``), with a secret shown only as
``set``/``not set`` and a URL's password masked.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, ClassVar, Self
from urllib.parse import urlsplit, urlunsplit

from pydantic import Field, PrivateAttr, SecretStr
from pydantic_settings import BaseSettings, SettingsConfigDict

__all__ = ["ENV_PREFIX", "ItoSettings", "default_home", "env_name", "mask_url"]

ENV_PREFIX = "ITO_"


def default_home() -> Path:
    return Path.home() / ".ito"


class ItoSettings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix=ENV_PREFIX, extra="ignore", env_ignore_empty=True)

    home: Path = Field(default_factory=default_home)
    """State directory (``ITO_HOME``, default ``~/.ito``): the embedded server's database,
    pepper and logs; a file-stored login; the worker's scratch space."""

    url_fields: ClassVar[frozenset[str]] = frozenset()
    """Fields holding a URL, printed with any password masked."""

    _sources: dict[str, str] = PrivateAttr(default_factory=dict)

    def with_source(self, source: str, **values: Any) -> Self:
        """A copy with ``values`` set, each recorded as coming from ``source`` (``argument``
        for a command-line option, ``file`` for a value read from a state file)."""
        copy = self.model_copy(update=values)
        copy._sources = {**self._sources, **dict.fromkeys(values, source)}
        return copy

    def source_of(self, name: str) -> str:
        if name in self._sources:
            return self._sources[name]
        if name not in self.model_fields_set:
            return "default"
        return "environment" if os.environ.get(env_name(name)) else "argument"

    def effective(self) -> dict[str, dict[str, Any]]:
        """Every setting as ``{"variable", "value", "source"}``; no secret is ever included."""
        shown: dict[str, dict[str, Any]] = {}
        for name in type(self).model_fields:
            value = getattr(self, name)
            if isinstance(value, SecretStr) or (value is None and _is_secret(type(self), name)):
                value = "set" if value is not None and value.get_secret_value() else "not set"
            elif isinstance(value, Path):
                value = str(value)
            elif name in self.url_fields and isinstance(value, str):
                value = mask_url(value)
            shown[name] = {
                "variable": env_name(name),
                "value": value,
                "source": self.source_of(name),
            }
        return shown


def env_name(field: str) -> str:
    return ENV_PREFIX + field.upper()


def _is_secret(cls: type[ItoSettings], name: str) -> bool:
    return "SecretStr" in str(cls.model_fields[name].annotation)


def mask_url(url: str) -> str:
    """``url`` with the password of its user part replaced by ``***``."""
    try:
        parts = urlsplit(url)
        password = parts.password
    except ValueError:
        return "(unparseable URL)"
    if not password:
        return url
    host = parts.netloc.rpartition("@")[2]
    return urlunsplit(parts._replace(netloc=f"{parts.username or ''}:***@{host}"))
