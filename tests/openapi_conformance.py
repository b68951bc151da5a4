"""A loopback HTTP proxy in front of the real server that checks every answer against the
server's own OpenAPI document: the JSON body of each response must match the schema the
operation documents for that status (or its ``default``), with every ``$ref`` resolved against
``/openapi.json``. Requests and answers pass through unchanged; what does not match is
recorded, and the fixture that owns the proxy fails the test on it.

Put in front of the CLI, the desk and direct API calls of a test (its ``Server.url`` is the
proxy's), it checks the answers of real flows — so the OpenAPI document describes what the
server really returns.
"""

from __future__ import annotations

import json
import re
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import httpx
from jsonschema import Draft202012Validator

__all__ = ["PROXIES", "ConformanceProxy"]

_HOP = {
    "connection",
    "keep-alive",
    "transfer-encoding",
    "content-length",
    "host",
    "content-encoding",
    "proxy-connection",
    "upgrade",
    "te",
    "trailer",
}


PROXIES: dict[str, ConformanceProxy] = {}
"""The running proxies, by the URL tests reach the server at through them."""


class _Operation:
    def __init__(self, method: str, template: str, spec: dict[str, Any]) -> None:
        self.method = method.upper()
        self.template = template
        self.regex = re.compile(
            "/".join(
                "[^/]+" if part.startswith("{") and part.endswith("}") else re.escape(part)
                for part in template.split("/")
            )
            + "$"
        )
        self.responses: dict[str, Any] = spec.get("responses", {})

    @property
    def label(self) -> str:
        return f"{self.method} {self.template}"


class ConformanceProxy:
    def __init__(self, upstream: str) -> None:
        self.upstream = upstream.rstrip("/")
        self.client = httpx.Client(base_url=self.upstream, timeout=120, trust_env=False)
        self.document: dict[str, Any] = self.client.get("/openapi.json").json()
        self.operations = [
            _Operation(method, path, spec)
            for path, item in self.document["paths"].items()
            for method, spec in item.items()
        ]
        self.mismatches: list[str] = []
        self.checked = 0
        self.answered: set[str] = set()
        """The operations (``GET /v1/runs/{run_id}``) that answered a success through the
        proxy: which documented answers real calls have checked."""
        self._lock = threading.Lock()
        self._validators: dict[str, Draft202012Validator] = {}
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    @property
    def url(self) -> str:
        host, port = self._server.server_address[:2]
        return f"http://{host!s}:{port}"

    def start(self) -> ConformanceProxy:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        self.client.close()

    def take_mismatches(self) -> list[str]:
        with self._lock:
            found, self.mismatches = self.mismatches, []
            return found

    def operation(self, method: str, path: str) -> _Operation | None:
        """The documented operation this request is, if any."""
        return next(
            (o for o in self.operations if o.method == method and o.regex.match(path)), None
        )

    # ---- checking ------------------------------------------------------------------------------

    def check(
        self, method: str, path: str, status: int, content_type: str, body: bytes
    ) -> str | None:
        """Why this answer does not match the document, or ``None``."""
        if method == "OPTIONS" or path == "/ui" or path.startswith("/ui/"):
            return None  # the allowed methods (not an operation), and the HTML pages
        operation = self.operation(method, path)
        if operation is None:
            # No such operation: the answer must still be the documented error envelope.
            schema: dict[str, Any] | None = {"$ref": "#/components/schemas/ErrorEnvelope"}
            label = f"{method} {path} (no operation)"
        else:
            label = operation.label
            documented = (
                operation.responses.get(str(status))
                or operation.responses.get(f"{str(status)[0]}XX")
                or operation.responses.get("default")
            )
            if documented is None:
                return f"{label}: status {status} is not documented"
            content = documented.get("content", {})
            media = content_type.split(";")[0].strip()
            if media not in content:
                return f"{label}: {status} answered {media!r}, documented {sorted(content)}"
            schema = content[media].get("schema")
            if media != "application/json":
                return None
        try:
            value = json.loads(body)
        except ValueError:
            return f"{label}: {status} body is not JSON"
        if schema is None:
            return None
        errors = sorted(self._validator(schema).iter_errors(value), key=lambda e: e.path)
        if errors:
            first = errors[0]
            where = "/".join(str(p) for p in first.absolute_path)
            return (
                f"{label}: {status} body does not match its schema at /{where}: "
                f"{first.message[:300]}"
            )
        return None

    def _validator(self, schema: dict[str, Any]) -> Draft202012Validator:
        key = json.dumps(schema, sort_keys=True)
        validator = self._validators.get(key)
        if validator is None:
            # The operation's schema is the root, with the document's components beside it,
            # so "#/components/schemas/..." resolves against the server's own document.
            root = {**schema, "components": self.document.get("components", {})}
            validator = Draft202012Validator(root)
            self._validators[key] = validator
        return validator

    # ---- proxying ------------------------------------------------------------------------------

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        proxy = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, format: str, *args: Any) -> None:
                pass

            def _forward(self) -> None:
                length = int(self.headers.get("content-length") or 0)
                body = self.rfile.read(length) if length else b""
                headers = {k: v for k, v in self.headers.items() if k.lower() not in _HOP}
                answer = proxy.client.request(
                    self.command, self.path, headers=headers, content=body
                )
                path = self.path.split("?", 1)[0]
                if self.command != "HEAD":
                    problem = proxy.check(
                        self.command,
                        path,
                        answer.status_code,
                        answer.headers.get("content-type", ""),
                        answer.content,
                    )
                    operation = proxy.operation(self.command, path)
                    with proxy._lock:
                        proxy.checked += 1
                        if problem is not None:
                            proxy.mismatches.append(problem)
                        elif operation is not None and answer.is_success:
                            proxy.answered.add(operation.label)
                self.send_response(answer.status_code)
                for key, value in answer.headers.multi_items():
                    if key.lower() not in _HOP:
                        self.send_header(key, value)
                self.send_header("content-length", str(len(answer.content)))
                self.end_headers()
                if self.command != "HEAD":
                    self.wfile.write(answer.content)

            do_GET = do_POST = do_PUT = do_PATCH = do_DELETE = do_OPTIONS = do_HEAD = _forward

        return Handler
