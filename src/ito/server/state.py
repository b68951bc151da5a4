"""What every request handler shares: settings and the database. Built once per app."""

from __future__ import annotations

from dataclasses import dataclass

from ito.server.settings import ServerSettings
from ito.server.store.db import Database

__all__ = ["AppState"]


@dataclass
class AppState:
    settings: ServerSettings
    db: Database

    @property
    def pepper(self) -> str:
        return self.settings.pepper.get_secret_value()
