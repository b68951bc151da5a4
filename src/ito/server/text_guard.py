"""Hostile bytes stop at the boundary, the same on every backend (pure ASGI, before routing).

Every text that enters the API is checked against :mod:`ito.core.text` before any route, model
or query sees it: the path, every query name and value, the headers we read (``Authorization``,
``Cookie``), form fields, and every JSON string and key at any depth. JSON numbers must be
finite and fit a signed 64-bit integer (no store can hold more). A refusal is
``invalid_arguments`` naming where (``path``, ``query``, ``header``, ``form``, ``body``) and,
for a body, the JSON paths — never the offending text. So a NUL byte can never reach PostgreSQL
(which cannot store it and would answer a retryable 500) while SQLite accepted it, a bidi
override can never reach a page an approver reads, and nothing of the kind reaches a log line.

Bodies that are content rather than arguments (the raw manifest bytes of ``content_paths``) are
left to their own parser, which refuses with its own code.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Collection
from typing import Any
from urllib.parse import parse_qsl

from starlette.requests import Request
from starlette.responses import Response
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from ito.core.errors import ItoError
from ito.core.text import is_safe, unsafe_json_paths
from ito.server.body_limit import replay

__all__ = ["TextGuard"]

Responder = Callable[[Request, ItoError], Response]
_HEADERS_READ = (b"authorization", b"cookie")
_INT_BOUND = 2**63


class TextGuard:
    """Refuse requests carrying refused characters with ``respond(request, error)``."""

    def __init__(
        self, app: ASGIApp, *, respond: Responder, content_paths: Collection[str] = ()
    ) -> None:
        self.app = app
        self.respond = respond
        self.content_paths = frozenset(content_paths)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        problem = _head_problem(scope)
        body_kind = None if problem else _body_kind(scope, self.content_paths)
        if body_kind is None:
            if problem is not None:
                await self._refuse(scope, receive, send, problem)
                return
            await self.app(scope, receive, send)
            return
        received: list[Message] = []
        chunks: list[bytes] = []
        while True:
            message = await receive()
            received.append(message)
            if message["type"] != "http.request":
                break
            chunks.append(message.get("body", b""))
            if not message.get("more_body", False):
                break
        problem = _body_problem(body_kind, b"".join(chunks))
        if problem is not None:
            await self._refuse(scope, receive, send, problem)
            return
        await self.app(scope, replay(received, receive), send)

    async def _refuse(
        self, scope: Scope, receive: Receive, send: Send, details: dict[str, Any]
    ) -> None:
        error = ItoError(
            "invalid_arguments",
            "the request carries a control, bidirectional override or other refused character",
            **details,
        )
        await self.respond(Request(scope), error)(scope, receive, send)


def _head_problem(scope: Scope) -> dict[str, Any] | None:
    if not is_safe(scope.get("path", "")):
        return {"location": "path"}
    query = scope.get("query_string", b"").decode("latin-1")
    try:
        pairs = parse_qsl(query, keep_blank_values=True, errors="strict")
    except UnicodeDecodeError:
        return {"location": "query"}
    for name, value in pairs:
        if not (is_safe(name) and is_safe(value)):
            return {"location": "query", **({"field": name} if _plain(name) else {})}
    content_types = 0
    for name, value in scope.get("headers", ()):
        if name.lower() in _HEADERS_READ and not is_safe(value.decode("latin-1")):
            return {"location": "header", "field": name.decode("latin-1").lower()}
        if name.lower() == b"content-type":
            content_types += 1
            # One media type per request: two headers, or a list in one, would let this guard
            # read the body as one type while the route's parser reads it as another.
            if content_types > 1 or b"," in value:
                return {"location": "header", "field": "content-type", "reason": "ambiguous"}
    return None


def _plain(name: str) -> bool:
    return len(name) <= 64 and name.replace("_", "").isalnum() and name.isascii()


def _body_kind(scope: Scope, content_paths: frozenset[str]) -> str | None:
    """``json`` or ``form`` when the body is arguments we parse; None otherwise. Mirrors
    FastAPI: a body without a content type is read as JSON."""
    if scope.get("method") in ("GET", "HEAD", "OPTIONS") or scope.get("path") in content_paths:
        return None
    content_type = ""
    for name, value in scope.get("headers", ()):
        if name.lower() == b"content-type":
            content_type = value.decode("latin-1").split(";", 1)[0].strip().lower()
    if not content_type or content_type == "application/json" or content_type.endswith("+json"):
        return "json"
    if content_type == "application/x-www-form-urlencoded":
        return "form"
    return None


def _body_problem(kind: str, body: bytes) -> dict[str, Any] | None:
    if not body.strip():
        return None
    if kind == "form":
        try:
            pairs = parse_qsl(body.decode("latin-1"), keep_blank_values=True, errors="strict")
        except UnicodeDecodeError:
            return {"location": "form"}
        for name, value in pairs:
            if not (is_safe(name) and is_safe(value, multiline=True)):
                return {"location": "form", **({"field": name} if _plain(name) else {})}
        return None
    try:
        document = json.loads(body)
    except RecursionError:
        return {"location": "body", "paths": ["$"]}  # nested past what any parser follows
    except (UnicodeDecodeError, ValueError):
        return None  # not JSON: the route's own parsing refuses it
    paths = unsafe_json_paths(document)
    paths += _bad_numbers(document)
    if paths:
        return {"location": "body", "paths": sorted(paths)[:20]}
    return None


def _bad_numbers(value: Any) -> list[str]:
    """Paths of numbers no store holds: non-finite floats (``NaN``, ``Infinity`` — Python's JSON
    parser accepts them) and integers past signed 64 bits."""
    found: list[str] = []
    stack: list[tuple[Any, str]] = [(value, "$")]
    while stack and len(found) < 20:
        item, where = stack.pop()
        if isinstance(item, bool):
            continue
        if (isinstance(item, int) and not -_INT_BOUND <= item < _INT_BOUND) or (
            isinstance(item, float) and not math.isfinite(item)
        ):
            found.append(where)
        elif isinstance(item, dict):
            stack.extend(
                (child, f"{where}.{key}" if _plain(str(key)) else f"{where}.<key>")
                for key, child in item.items()
            )
        elif isinstance(item, list):
            stack.extend((child, f"{where}[{i}]") for i, child in enumerate(item))
    return found
