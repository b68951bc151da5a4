"""The app of one worker process of ``ito-server serve --workers N``.

uvicorn starts each worker process afresh and builds its app with
:func:`app_from_environment`; ``serve`` has put everything a worker needs into the environment
(``ITO_DATABASE_URL``, ``ITO_PUBLIC_URL``, and the pepper as the settings read it). Worker
processes run no background duty: the lease sweeper and the embedded worker run once, in the
process that supervises them (:func:`ito.server.cli.serve`).
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from fastapi import FastAPI

__all__ = ["app_from_environment"]


def app_from_environment() -> FastAPI:
    from ito.server.app import create_app
    from ito.server.home import private_umask
    from ito.server.settings import load_settings

    private_umask()
    settings = load_settings(os.environ.get("ITO_DATABASE_URL"))
    return create_app(settings, background=False)
