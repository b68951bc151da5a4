"""The canonical API: ``create_app(settings)`` builds the FastAPI app; nothing at import.

Every response body is the §4 envelope. Errors are converted here, at the boundary: an
:class:`ItoError` keeps its code and status; request-shape errors become ``invalid_arguments``
(without echoing input); unknown routes ``not_found``; a known route with another method
``method_not_allowed``; a body over ``max_request_bytes`` ``request_too_large``, before anything
reads it (:mod:`ito.server.body_limit`); a control, bidi-override or other refused character
anywhere in the path, query, headers we read, form fields or JSON body ``invalid_arguments``,
before routing (:mod:`ito.server.text_guard`); anything unexpected ``internal_error`` with the
traceback in the server log only. Every code answers with its registered status, whatever
raised it. ``OPTIONS`` on a known path answers the methods it allows (``Allow``, also on every
``method_not_allowed``), gathered from every route of that path. Under ``/ui`` (the web
pages) the same refusals are rendered as the HTML error page, with the same status.
"""

from __future__ import annotations

import logging
import math
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.routing import Match

from ito import __version__
from ito.core.envelope import error_envelope, ok_envelope
from ito.core.errors import ItoError
from ito.core.responses import ErrorEnvelope
from ito.server.background import lifespan_for
from ito.server.body_limit import BodyLimit
from ito.server.routers import (
    bookings,
    confirmations,
    credentials,
    desk,
    device,
    manifests,
    meta,
    runs,
    telemetry,
    web,
    web_runs,
    worker,
)
from ito.server.settings import ServerSettings
from ito.server.state import AppState
from ito.server.store.db import Database
from ito.server.text_guard import TextGuard
from ito.server.web.pages import error_page

__all__ = ["create_app"]

log = logging.getLogger("ito.server")

_METHODS = ("GET", "HEAD", "POST", "PUT", "PATCH", "DELETE")
ERROR_RESPONSES: dict[int | str, dict[str, Any]] = {
    "default": {
        "model": ErrorEnvelope,
        "description": "A refusal: the error envelope, with the status its code is "
        "registered with (ito.core.errors)",
    }
}
"""Every API route documents its refusals as the §4 error envelope (request-shape errors
included: they answer ``invalid_arguments``, not FastAPI's own validation body)."""
CONTENT_PATHS = ("/v1/manifests", "/v1/plans")
"""Routes whose body is manifest bytes (content, hashed exactly): the manifest parser, not the
text guard, decides what they may carry (``manifest_invalid``)."""


def create_app(
    settings: ServerSettings,
    db: Database | None = None,
    *,
    embedded_worker_url: str | None = None,
    background: bool = True,
) -> FastAPI:
    """The API. With ``embedded_worker_url`` (the embedded default) it also runs the
    in-process worker against that URL; the lease sweeper runs unless ``background`` is false
    (a worker process of ``serve --workers N``, whose supervisor runs it once)."""
    state = AppState(
        settings=settings,
        db=db or Database(settings.resolved_database_url(), pool_size=settings.db_pool_size),
    )
    app = FastAPI(
        title="ito-training",
        version=__version__,
        docs_url=None,
        redoc_url=None,
        lifespan=lifespan_for(state, embedded_worker_url, background=background),
    )
    app.state.ito = state
    for module in (
        meta,
        bookings,
        manifests,
        confirmations,
        runs,
        desk,
        device,
        credentials,
        worker,
        telemetry,
    ):
        app.include_router(module.router, responses=ERROR_RESPONSES)
    app.include_router(web.router)  # pages: a refusal is the HTML error page
    app.include_router(web_runs.router)
    _install_error_handlers(app)
    # Outermost first: the body bound, then the text checks on the bounded body.
    app.add_middleware(TextGuard, respond=_respond, content_paths=CONTENT_PATHS)
    app.add_middleware(BodyLimit, max_bytes=settings.max_request_bytes, respond=_respond)
    return app


def _respond(request: Request, error: ItoError) -> Response:
    if request.url.path == "/ui" or request.url.path.startswith("/ui/"):
        return error_page(error)
    headers = None
    if error.code == "rate_limited" and "retry_after_s" in error.details:
        headers = {"Retry-After": str(max(1, math.ceil(float(error.details["retry_after_s"]))))}
    return JSONResponse(
        status_code=error.status,
        content=error_envelope(error, live_api_contacted=True),
        headers=headers,
    )


def _install_error_handlers(app: FastAPI) -> None:
    @app.exception_handler(ItoError)
    async def _ito_error(request: Request, exc: ItoError) -> Response:
        return _respond(request, exc)

    @app.exception_handler(RequestValidationError)
    async def _invalid(request: Request, exc: RequestValidationError) -> Response:
        errors: list[dict[str, Any]] = []
        for err in exc.errors():
            loc = [str(p) for p in err.get("loc", ())]
            errors.append({"path": ".".join(loc), "message": str(err.get("msg", ""))})
        return _respond(request, ItoError("invalid_arguments", errors=errors))

    @app.exception_handler(StarletteHTTPException)
    async def _http(request: Request, exc: StarletteHTTPException) -> Response:
        if exc.status_code == 404:
            return _respond(request, ItoError("not_found", "no such endpoint"))
        if exc.status_code == 405:
            allow = ", ".join(_allowed_methods(app, request))
            if request.method == "OPTIONS":
                return JSONResponse(
                    ok_envelope({"allow": allow.split(", ")}, "the methods this path allows"),
                    headers={"Allow": allow},
                )
            response = _respond(request, ItoError("method_not_allowed"))
            response.headers["Allow"] = allow
            return response
        # Any other HTTP-level refusal (a form that cannot be parsed): the arguments are bad.
        return _respond(request, ItoError("invalid_arguments"))

    @app.exception_handler(Exception)
    async def _unexpected(request: Request, exc: Exception) -> Response:
        log.exception("unexpected error on %s %s", request.method, request.url.path)
        return _respond(request, ItoError("internal_error"))


def _allowed_methods(app: FastAPI, request: Request) -> list[str]:
    """Every method some route of this path accepts, and ``OPTIONS``. (Starlette's own
    ``Allow`` names only the first route that matched the path; FastAPI's included routers hide
    the routes, so each method is probed through the public ``matches``.)"""
    methods = {"OPTIONS"}
    for method in _METHODS:
        probe = {**request.scope, "method": method}
        if any(route.matches(probe)[0] is Match.FULL for route in app.router.routes):
            methods.add(method)
    return sorted(methods)
