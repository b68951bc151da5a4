"""Where the client's credential comes from, and where a login stores it (DESIGN §5.1).

Order: ``ITO_API_KEY`` (the only non-interactive way), else the token ``ito login`` stored for
this API URL. Storage is the OS keyring through ``keyring``; only when ``ITO_ALLOW_FILE_TOKEN=1``
a file ``$ITO_HOME/credentials/<host>.token`` in a 0700 directory with mode 0600 — and a file or
directory with looser modes is refused, never silently used.
"""

from __future__ import annotations

import hashlib
import os
import stat
from pathlib import Path
from typing import Any

from ito.client.config import ClientConfig, load_config
from ito.core.errors import ItoError

__all__ = ["TokenStore", "resolve_token"]

KEYRING_SERVICE = "ito-training"


class TokenStore:
    """The stored login token of one API URL."""

    def __init__(self, api_url: str, config: ClientConfig | None = None) -> None:
        self.api_url = api_url
        self.config = config or load_config()
        self.file_allowed = self.config.allow_file_token

    @property
    def kind(self) -> str:
        return "file" if self.file_allowed else "keyring"

    @property
    def path(self) -> Path:
        name = hashlib.sha256(self.api_url.encode()).hexdigest()[:16]
        return self.config.home / "credentials" / f"{name}.token"

    def load(self) -> str | None:
        if self.file_allowed:
            return self._load_file()
        keyring = _keyring()
        try:
            value = keyring.get_password(KEYRING_SERVICE, self.api_url)
        except Exception:
            return None
        return value or None

    def save(self, token: str) -> None:
        if self.file_allowed:
            self._save_file(token)
            return
        keyring = _keyring()
        try:
            keyring.set_password(KEYRING_SERVICE, self.api_url, token)
        except Exception:
            raise ItoError(
                "client_not_configured",
                "no usable OS keyring; set "
                "ITO_ALLOW_FILE_TOKEN=1 to store the token in a private file "
                "instead",
            ) from None

    def delete(self) -> bool:
        if self.file_allowed:
            try:
                self.path.unlink()
            except FileNotFoundError:
                return False
            return True
        keyring = _keyring()
        try:
            keyring.delete_password(KEYRING_SERVICE, self.api_url)
        except Exception:
            return False
        return True

    def _check_dir(self, directory: Path) -> None:
        st = os.lstat(directory)
        if stat.S_ISLNK(st.st_mode) or not stat.S_ISDIR(st.st_mode):
            raise ItoError(
                "client_not_configured", "the credentials directory is not a plain directory"
            )
        if st.st_mode & 0o077 or st.st_uid != os.getuid():
            raise ItoError(
                "client_not_configured",
                "the credentials directory must be 0700 and ours; refusing to use it",
            )

    def _load_file(self) -> str | None:
        directory = self.path.parent
        if not directory.exists():
            return None
        self._check_dir(directory)
        try:
            fd = os.open(self.path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
        except FileNotFoundError:
            return None
        except OSError:
            raise ItoError(
                "client_not_configured", "the token file cannot be opened safely"
            ) from None
        with os.fdopen(fd) as handle:
            st = os.fstat(handle.fileno())
            if not stat.S_ISREG(st.st_mode) or st.st_mode & 0o077 or st.st_uid != os.getuid():
                raise ItoError(
                    "client_not_configured",
                    "the token file must be a 0600 regular file of ours; refusing to use it",
                )
            return handle.read().strip() or None

    def _save_file(self, token: str) -> None:
        directory = self.path.parent
        directory.mkdir(mode=0o700, parents=True, exist_ok=True)
        self._check_dir(directory)
        temporary = directory / f".{self.path.name}.{os.getpid()}"
        fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
        with os.fdopen(fd, "w") as handle:
            handle.write(token + "\n")
        os.replace(temporary, self.path)


def _keyring() -> Any:
    import keyring

    return keyring


def resolve_token(
    api_url: str,
    config: ClientConfig | None = None,
) -> tuple[str | None, str | None]:
    """(token, source): ``ITO_API_KEY`` first, then the stored login."""
    config = config or load_config()
    if config.api_key is not None and config.api_key.get_secret_value():
        return config.api_key.get_secret_value(), "ITO_API_KEY"
    store = TokenStore(api_url, config)
    stored = store.load()
    if stored:
        return stored, store.kind
    return None, None
