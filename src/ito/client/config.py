"""The client side's settings (``ito``, ``ito-mcp``): how to reach the API
(:class:`ito.connection.ApiConnection`: ``ITO_API_URL``, ``ITO_CONNECT_TIMEOUT``,
``ITO_TIMEOUT``, ``ITO_HOME``, ``ITO_API_KEY``) and ``ITO_ALLOW_FILE_TOKEN``, from the
environment only. Which credential is used is decided in :mod:`ito.client.credentials`.
"""

from __future__ import annotations

from ito.connection import DEFAULT_API_URL, ApiConnection, build

__all__ = ["DEFAULT_API_URL", "ClientConfig", "build", "load_config"]


class ClientConfig(ApiConnection):
    allow_file_token: bool = False
    """Store ``ito login``'s token in a private file under ``ITO_HOME`` instead of the OS
    keyring (``ITO_ALLOW_FILE_TOKEN=1``)."""


def load_config() -> ClientConfig:
    """The settings in effect, or ``client_not_configured`` naming the variable at fault (never
    its value: it may be a secret)."""
    return build(ClientConfig)
