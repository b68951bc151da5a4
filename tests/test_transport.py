"""The one HTTP transport (src/ito/transport.py) against a real HTTP server on loopback whose
every path misbehaves in one way: each transport failure and each answer that is not an envelope
becomes a registered code, idempotent calls are retried and others are sent once."""

from __future__ import annotations

import json
import socket
import threading
from collections import Counter
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest

from ito.core.errors import REGISTRY
from ito.transport import ApiRefusal, Transport, TransportFailure

TOKEN = "ito_sk_transport_test_secret_value_0123456789"
BOUND = 64 * 1024
"""The response bound the transports under test use."""


def _envelope_ok(data: Any) -> bytes:
    return json.dumps(
        {"ok": True, "live_api_contacted": True, "notice": "ok", "data": data}
    ).encode()


def _envelope_error(code: str) -> bytes:
    return json.dumps(
        {
            "ok": False,
            "live_api_contacted": True,
            "notice": "refused",
            "error": {
                "code": code,
                "message": "refused",
                "retryable": REGISTRY[code].retryable if code in REGISTRY else False,
            },
        }
    ).encode()


class Stub(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self) -> None:
        super().__init__(("127.0.0.1", 0), Handler)
        self.hits: Counter[str] = Counter()
        self.seen_headers: list[dict[str, str]] = []
        self.release = threading.Event()
        """Set at teardown: lets handlers that hold a request forever return."""
        self.lock = threading.Lock()

    def handle_error(self, request: Any, client_address: Any) -> None:
        pass  # the reset path breaks its own connection on purpose

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}"

    def count(self, key: str) -> int:
        with self.lock:
            self.hits[key] += 1
            return self.hits[key]


class Handler(BaseHTTPRequestHandler):
    server: Stub
    protocol_version = "HTTP/1.1"

    def log_message(self, format: str, *args: Any) -> None:
        pass

    def _send(self, status: int, body: bytes, content_type: str = "application/json") -> None:
        self.send_response(status)
        self.send_header("content-type", content_type)
        self.send_header("content-length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def _handle(self) -> None:
        length = int(self.headers.get("content-length") or 0)
        if length:
            self.rfile.read(length)
        path = self.path.split("?")[0]
        n = self.server.count(f"{self.command} {path}")
        self.server.seen_headers.append({k.lower(): v for k, v in self.headers.items()})
        if path == "/ok":
            self._send(200, _envelope_ok({"n": n}))
        elif path == "/refused":
            self._send(404, _envelope_error("run_not_found"))
        elif path == "/unknown-code":
            self._send(409, _envelope_error("a_code_from_a_newer_server"))
        elif path == "/busy-then-ok":
            # A retryable 5xx envelope the first time, then an answer.
            if n == 1:
                self._send(503, _envelope_error("store_busy"))
            else:
                self._send(200, _envelope_ok({"n": n}))
        elif path == "/proxy-502":
            self._send(502, b"<html><body>502 Bad Gateway</body></html>", "text/html")
        elif path == "/not-json":
            self._send(200, b"Hello from somewhere that is not the API", "text/plain")
        elif path == "/not-an-envelope":
            self._send(200, json.dumps({"runs": []}).encode())
        elif path == "/oversized-declared":
            self._send(200, _envelope_ok("x" * (BOUND * 2)))
        elif path == "/oversized-chunked":
            self.send_response(200)
            self.send_header("content-type", "application/json")
            self.send_header("transfer-encoding", "chunked")
            self.end_headers()
            chunk = b"x" * 8192
            for _ in range(BOUND // len(chunk) + 2):
                self.wfile.write(b"%x\r\n%s\r\n" % (len(chunk), chunk))
            self.wfile.write(b"0\r\n\r\n")
        elif path == "/silent":
            self.server.release.wait(60)  # never answers while the test runs
            self.close_connection = True
        elif path == "/reset":
            self.close_connection = True
            self.connection.shutdown(socket.SHUT_RDWR)  # read the request, answer nothing
        elif path == "/redirect":
            self.send_response(307)
            self.send_header("location", "/ok")
            self.send_header("content-length", "0")
            self.end_headers()
        else:
            self._send(404, b"no such path", "text/plain")

    do_GET = _handle
    do_POST = _handle


@pytest.fixture
def stub() -> Iterator[Stub]:
    server = Stub()
    thread = threading.Thread(target=server.serve_forever, args=(0.02,), daemon=True)
    thread.start()
    yield server
    server.release.set()
    server.shutdown()
    server.server_close()


def transport(url: str, *, timeout: float = 10.0) -> Transport:
    return Transport(url, TOKEN, connect_timeout=2.0, timeout=timeout, max_response_bytes=BOUND)


def _assert_no_secret(exc: BaseException) -> None:
    assert TOKEN not in str(exc) and TOKEN not in repr(exc.__dict__)
    assert exc.__cause__ is None or TOKEN not in str(exc.__cause__)


def test_an_ok_envelope_comes_back_and_the_key_travels_only_in_the_header(stub: Stub) -> None:
    envelope = transport(stub.url).request("GET", "/ok")
    assert envelope["ok"] is True and envelope["data"] == {"n": 1}
    assert stub.seen_headers[0]["authorization"] == f"Bearer {TOKEN}"


def test_an_error_envelope_is_an_api_refusal_carrying_it_unchanged(stub: Stub) -> None:
    with pytest.raises(ApiRefusal) as refused:
        transport(stub.url).request("GET", "/refused")
    assert refused.value.code == "run_not_found" and refused.value.http_status == 404
    assert refused.value.envelope["error"]["code"] == "run_not_found"
    assert stub.hits["GET /refused"] == 1  # a refusal is an answer: never retried


def test_an_unknown_code_from_a_newer_server_reads_as_internal_error(stub: Stub) -> None:
    with pytest.raises(ApiRefusal) as refused:
        transport(stub.url).request("GET", "/unknown-code")
    assert refused.value.code == "internal_error"
    assert refused.value.envelope["error"]["code"] == "a_code_from_a_newer_server"


def test_connection_refused_is_unreachable_and_nothing_was_sent() -> None:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]  # closed on exit: nothing listens there
    for method in ("GET", "POST"):
        with pytest.raises(TransportFailure) as failed:
            transport(f"http://127.0.0.1:{port}").request(method, "/ok")
        assert failed.value.code == "transport_unreachable"
        assert failed.value.live_api_contacted is False
        _assert_no_secret(failed.value)


def test_a_silent_server_is_a_timeout_for_a_read_and_ambiguous_for_a_mutation(stub: Stub) -> None:
    with pytest.raises(TransportFailure) as read:
        transport(stub.url, timeout=0.5).request("GET", "/silent")
    assert read.value.code == "transport_timeout" and read.value.live_api_contacted is True
    with pytest.raises(TransportFailure) as write:
        transport(stub.url, timeout=0.5).request("POST", "/silent", json={"a": 1})
    assert write.value.code == "transport_ambiguous" and write.value.live_api_contacted is True
    assert stub.hits["POST /silent"] == 1
    _assert_no_secret(write.value)


def test_a_reset_after_the_request_is_ambiguous_for_a_mutation_sent_once(stub: Stub) -> None:
    with pytest.raises(TransportFailure) as failed:
        transport(stub.url).request("POST", "/reset", json={"a": 1})
    assert failed.value.code == "transport_ambiguous" and failed.value.live_api_contacted
    assert stub.hits["POST /reset"] == 1


def test_a_keyed_post_that_lost_its_answer_is_not_sent_again(stub: Stub) -> None:
    """§6.2: after a silent failure the caller looks the result up by its key first."""
    with pytest.raises(TransportFailure) as failed:
        transport(stub.url).request("POST", "/reset", json={"idempotency_key": "k-1"})
    assert failed.value.code == "transport_ambiguous"
    assert stub.hits["POST /reset"] == 1


def test_a_read_that_lost_its_answer_is_retried(stub: Stub) -> None:
    with pytest.raises(TransportFailure) as failed:
        transport(stub.url).request("GET", "/reset")
    assert failed.value.code == "transport_timeout" and failed.value.live_api_contacted
    assert stub.hits["GET /reset"] == 3  # one attempt and two retries


def test_a_retryable_5xx_is_retried_for_a_get(stub: Stub) -> None:
    envelope = transport(stub.url).request("GET", "/busy-then-ok")
    assert envelope["data"] == {"n": 2}
    assert stub.hits["GET /busy-then-ok"] == 2


def test_a_retryable_5xx_is_not_retried_for_a_non_idempotent_post(stub: Stub) -> None:
    with pytest.raises(ApiRefusal) as refused:
        transport(stub.url).request("POST", "/busy-then-ok", json={"attempt": 1})
    assert refused.value.code == "store_busy"
    assert stub.hits["POST /busy-then-ok"] == 1


def test_a_retryable_5xx_is_retried_for_a_post_with_an_idempotency_key(stub: Stub) -> None:
    envelope = transport(stub.url).request("POST", "/busy-then-ok", json={"idempotency_key": "k-2"})
    assert envelope["data"] == {"n": 2}
    assert stub.hits["POST /busy-then-ok"] == 2


def test_a_proxy_error_page_is_a_bad_response_for_a_read_after_retries(stub: Stub) -> None:
    with pytest.raises(TransportFailure) as failed:
        transport(stub.url).request("GET", "/proxy-502")
    assert failed.value.code == "transport_bad_response" and failed.value.live_api_contacted
    assert stub.hits["GET /proxy-502"] == 3


def test_a_proxy_error_page_is_ambiguous_for_a_mutation_sent_once(stub: Stub) -> None:
    with pytest.raises(TransportFailure) as failed:
        transport(stub.url).request("POST", "/proxy-502", json={"a": 1})
    assert failed.value.code == "transport_ambiguous"
    assert stub.hits["POST /proxy-502"] == 1


@pytest.mark.parametrize("path", ["/not-json", "/not-an-envelope"])
def test_an_answer_that_is_not_an_envelope_is_a_bad_response(stub: Stub, path: str) -> None:
    with pytest.raises(TransportFailure) as failed:
        transport(stub.url).request("GET", path)
    assert failed.value.code == "transport_bad_response"
    assert stub.hits[f"GET {path}"] == 1  # a 200 is an answer: retrying cannot help


@pytest.mark.parametrize("path", ["/oversized-declared", "/oversized-chunked"])
def test_an_oversized_answer_is_refused_at_the_bound(stub: Stub, path: str) -> None:
    with pytest.raises(TransportFailure) as read:
        transport(stub.url).request("GET", path)
    assert read.value.code == "transport_bad_response"
    with pytest.raises(TransportFailure) as write:
        transport(stub.url).request("POST", path, json={})
    assert write.value.code == "transport_ambiguous"


def test_redirects_are_not_followed(stub: Stub) -> None:
    with pytest.raises(TransportFailure) as failed:
        transport(stub.url).request("GET", "/redirect")
    assert failed.value.code == "transport_bad_response"
    assert stub.hits["GET /ok"] == 0


def test_proxy_settings_of_the_environment_are_ignored(
    stub: Stub, monkeypatch: pytest.MonkeyPatch
) -> None:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        dead = probe.getsockname()[1]
    for name in ("HTTP_PROXY", "http_proxy", "ALL_PROXY", "all_proxy"):
        monkeypatch.setenv(name, f"http://127.0.0.1:{dead}")
    monkeypatch.delenv("NO_PROXY", raising=False)
    monkeypatch.delenv("no_proxy", raising=False)
    assert transport(stub.url).request("GET", "/ok")["ok"] is True


def test_a_url_that_is_not_http_is_refused_before_anything_is_sent() -> None:
    with pytest.raises(Exception) as refused:
        Transport("file:///etc/passwd", TOKEN)
    assert getattr(refused.value, "code", None) == "client_not_configured"
