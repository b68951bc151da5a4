"""The canonical API: ``create_app(settings)`` builds the FastAPI app; nothing at import.

Every response body is the §4 envelope. Errors are converted here, at the boundary: an
:class:`ItoError` keeps its code and status; request-shape errors become ``invalid_arguments``
(without echoing input); unknown routes ``not_found``; anything unexpected ``internal_error``
with the traceback in the server log only.
"""

from __future__ import annotations

import logging
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from ito import __version__
from ito.core.envelope import error_envelope
from ito.core.errors import ItoError
from ito.server.routers import bookings, confirmations, desk, manifests, meta, runs
from ito.server.settings import ServerSettings
from ito.server.state import AppState
from ito.server.store.db import Database

__all__ = ["create_app"]

log = logging.getLogger("ito.server")


def create_app(settings: ServerSettings, db: Database | None = None) -> FastAPI:
    app = FastAPI(title="ito-training", version=__version__, docs_url=None, redoc_url=None)
    app.state.ito = AppState(settings=settings,
                             db=db or Database(settings.resolved_database_url(),
                                               pool_size=settings.db_pool_size))
    for module in (meta, bookings, manifests, confirmations, runs, desk):
        app.include_router(module.router)
    _install_error_handlers(app)
    return app


def _respond(error: ItoError) -> JSONResponse:
    return JSONResponse(status_code=error.status,
                        content=error_envelope(error, live_api_contacted=True))


def _install_error_handlers(app: FastAPI) -> None:
    @app.exception_handler(ItoError)
    async def _ito_error(_: Request, exc: ItoError) -> JSONResponse:
        return _respond(exc)

    @app.exception_handler(RequestValidationError)
    async def _invalid(_: Request, exc: RequestValidationError) -> JSONResponse:
        errors: list[dict[str, Any]] = []
        for err in exc.errors():
            loc = [str(p) for p in err.get("loc", ())]
            errors.append({"path": ".".join(loc), "message": str(err.get("msg", ""))})
        return _respond(ItoError("invalid_arguments", errors=errors))

    @app.exception_handler(StarletteHTTPException)
    async def _http(_: Request, exc: StarletteHTTPException) -> JSONResponse:
        code = "not_found" if exc.status_code == 404 else "invalid_arguments"
        error = ItoError(code, "no such endpoint" if code == "not_found" else
                         "this method is not allowed here")
        return JSONResponse(status_code=exc.status_code,
                            content=error_envelope(error, live_api_contacted=True))

    @app.exception_handler(Exception)
    async def _unexpected(request: Request, exc: Exception) -> JSONResponse:
        log.exception("unexpected error on %s %s", request.method, request.url.path)
        return _respond(ItoError("internal_error"))
