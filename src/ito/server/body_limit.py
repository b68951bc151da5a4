"""A bound on request bodies, enforced before anything else reads them (pure ASGI).

FastAPI reads a whole JSON body before any dependency (authentication included) runs, and a
model's ``max_length`` applies only once the body is in memory; uvicorn sets no bound. So the
bound lives here, outermost but for the server's last-resort error handler: a declared
``Content-Length`` over it is refused before one byte of the body is read, and a body without
one (chunked) is counted while it arrives and refused as soon as it passes the bound. Either way
the application is never called, so nothing is authenticated, parsed or stored, and the refusal
is the usual error (``request_too_large``, 413). At most ``max_bytes`` are ever held.

The body of an admitted request is handed to the application as it was received; after it,
``receive`` is the server's own again (disconnects still reach long-running responses).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable

from starlette.requests import Request
from starlette.responses import Response
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from ito.core.errors import ItoError

__all__ = ["BodyLimit", "replay"]

Responder = Callable[[Request, ItoError], Response]


class BodyLimit:
    """Refuse request bodies over ``max_bytes`` with ``respond(request, error)``."""

    def __init__(self, app: ASGIApp, *, max_bytes: int, respond: Responder) -> None:
        self.app = app
        self.max_bytes = max_bytes
        self.respond = respond

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        if _declared_length(scope) > self.max_bytes:
            await self._refuse(scope, receive, send)
            return
        received: list[Message] = []
        size = 0
        while True:
            message = await receive()
            received.append(message)
            if message["type"] != "http.request":
                break  # a disconnect: the application sees it as the client left it
            size += len(message.get("body", b""))
            if size > self.max_bytes:
                received.clear()
                await self._refuse(scope, receive, send)
                return
            if not message.get("more_body", False):
                break
        await self.app(scope, replay(received, receive), send)

    async def _refuse(self, scope: Scope, receive: Receive, send: Send) -> None:
        error = ItoError("request_too_large", max_bytes=self.max_bytes)
        response = self.respond(Request(scope), error)
        await response(scope, receive, send)


def _declared_length(scope: Scope) -> int:
    """The ``Content-Length`` the client declared; 0 when it declared none. (The HTTP server
    has already refused a malformed or repeated one.)"""
    for name, value in scope.get("headers", ()):
        if name.lower() == b"content-length":
            text = value.decode("latin-1").strip()
            return int(text) if text.isdigit() else 0
    return 0


def replay(messages: list[Message], receive: Receive) -> Callable[[], Awaitable[Message]]:
    """A receive that hands back the messages already read, then the rest of the request."""
    pending = list(messages)

    async def replayed() -> Message:
        if pending:
            return pending.pop(0)
        return await receive()

    return replayed
