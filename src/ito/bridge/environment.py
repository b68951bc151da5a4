"""The scrubbed environments the bridge gives the canonical client (DESIGN §6.3).

Ported from ECC's ``scripts/lib/ito-environment.js``: an allowlist, never a denylist. A child
gets the system variables below and nothing else unless its verb needs the Itô runtime keys:

* the **capability probe** gets the system variables only — no ``ITO_*`` at all, so it can
  neither read a credential nor find an API to send one to;
* a **credential verb** (one that talks to the Itô API) also gets ``ITO_RUNTIME_KEYS``
  (API URL, timeouts, where and how the stored login lives);
* ``ITO_API_KEY`` is added only for credential verbs that may use a key: never for ``login``
  (device login must not inherit a key) or ``logout`` (it revokes the stored device token);
* every other variable — ``AWS_SECRET_ACCESS_KEY``, ``OPENAI_API_KEY``, ``PYTHONPATH``,
  ``ECC_*`` and anything unknown — is dropped.
"""

from __future__ import annotations

from collections.abc import Mapping

__all__ = [
    "API_KEY",
    "ITO_RUNTIME_KEYS",
    "SYSTEM_KEYS",
    "child_environment",
    "probe_environment",
]

SYSTEM_KEYS: tuple[str, ...] = (
    # ECC's list, less its Windows-only names.
    "CI",
    "DISPLAY",
    "FORCE_COLOR",
    "HOME",
    "LANG",
    "LC_ALL",
    "NO_COLOR",
    "PATH",
    "SHELL",
    "TEMP",
    "TERM",
    "TMP",
    "TMPDIR",
    "WAYLAND_DISPLAY",
    "XDG_RUNTIME_DIR",
    # Added here: who the user is, and where a Linux keyring (Secret Service over D-Bus, or
    # keyring's own config and data) is found. None of them is a credential.
    "USER",
    "LOGNAME",
    "DBUS_SESSION_BUS_ADDRESS",
    "XDG_CONFIG_HOME",
    "XDG_DATA_HOME",
)
"""Passed to every child, the probe included; plus every ``LC_*``."""

ITO_RUNTIME_KEYS: tuple[str, ...] = (
    "ITO_API_URL",
    "ITO_CONNECT_TIMEOUT",
    "ITO_TIMEOUT",
    "ITO_HOME",
    "ITO_ALLOW_FILE_TOKEN",
    "PYTHON_KEYRING_BACKEND",
)
"""Where the API is, how long to wait for it, and where/how the stored login lives (the token
settings): passed to credential verbs only. ``ITO_API_KEY`` is handled separately."""

API_KEY = "ITO_API_KEY"


def _system(source: Mapping[str, str]) -> dict[str, str]:
    safe = {key: source[key] for key in SYSTEM_KEYS if key in source}
    safe |= {key: value for key, value in source.items() if key.startswith("LC_")}
    return safe


def probe_environment(source: Mapping[str, str]) -> dict[str, str]:
    """For ``<client> capabilities --json``: system variables only, no credential, no URL."""
    return _system(source)


def child_environment(
    source: Mapping[str, str], *, credentials: bool, api_key: bool
) -> dict[str, str]:
    """For the forwarded call. ``credentials``: the verb talks to the Itô API; ``api_key``:
    it may also receive ``ITO_API_KEY`` (never true for login or logout)."""
    safe = _system(source)
    if credentials:
        safe |= {key: source[key] for key in ITO_RUNTIME_KEYS if key in source}
        if api_key and API_KEY in source:
            safe[API_KEY] = source[API_KEY]
    return safe
