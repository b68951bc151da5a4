"""A keyring backend for tests: headless machines have no OS keyring (keyring falls back to its
``fail`` backend), so tests select this one with ``PYTHON_KEYRING_BACKEND``. It differs from a
real keyring only in where the secret lives: a JSON file named by ``ITO_TEST_KEYRING_FILE``."""

from __future__ import annotations

import json
import os
from pathlib import Path

from keyring.backend import KeyringBackend
from keyring.errors import PasswordDeleteError


class FileKeyring(KeyringBackend):
    priority = 1

    def _path(self) -> Path:
        return Path(os.environ["ITO_TEST_KEYRING_FILE"])

    def _load(self) -> dict[str, str]:
        path = self._path()
        return json.loads(path.read_text()) if path.exists() else {}

    def get_password(self, service: str, username: str) -> str | None:
        return self._load().get(f"{service}\x1f{username}")

    def set_password(self, service: str, username: str, password: str) -> None:
        data = self._load()
        data[f"{service}\x1f{username}"] = password
        self._path().write_text(json.dumps(data))

    def delete_password(self, service: str, username: str) -> None:
        data = self._load()
        if data.pop(f"{service}\x1f{username}", None) is None:
            raise PasswordDeleteError("not found")
        self._path().write_text(json.dumps(data))
