"""Lost responses (DESIGN §6.2): a fault-injecting proxy on loopback forwards ``POST /v1/runs``
to the real server, lets it commit, and drops the answer. The client must find the run by its
idempotency key and never create a second one."""

from __future__ import annotations

import socket
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from urllib.parse import urlparse

import pytest

from tests.support import ITO, Tenant, run_cli

pytestmark = pytest.mark.slow


def _read_message(sock: socket.socket) -> bytes:
    """One HTTP/1.1 message (head + Content-Length body) from ``sock``."""
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = sock.recv(65536)
        if not chunk:
            return data
        data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    length = 0
    for line in head.split(b"\r\n")[1:]:
        name, _, value = line.partition(b":")
        if name.strip().lower() == b"content-length":
            length = int(value.strip())
    while len(body) < length:
        chunk = sock.recv(65536)
        if not chunk:
            break
        body += chunk
    return head + b"\r\n\r\n" + body


@dataclass
class DroppingProxy:
    """Forwards each connection's one request; drops the responses of matching requests."""

    upstream: tuple[str, int]
    drop: set[str] = field(default_factory=set)
    """Request-line prefixes (``POST /v1/runs``) whose response is swallowed after the
    upstream answered."""
    dropped: list[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.listener = socket.socket()
        self.listener.bind(("127.0.0.1", 0))
        self.listener.listen(64)
        self.port = self.listener.getsockname()[1]
        self.closed = threading.Event()
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        while not self.closed.is_set():
            try:
                client, _ = self.listener.accept()
            except OSError:
                return
            threading.Thread(target=self._handle, args=(client,), daemon=True).start()

    def _handle(self, client: socket.socket) -> None:
        with client, socket.create_connection(self.upstream, timeout=30) as upstream:
            request = _read_message(client)
            request_line = request.split(b"\r\n", 1)[0].decode()
            upstream.sendall(request)
            response = _read_message(upstream)
            if any(request_line.startswith(prefix) for prefix in self.drop):
                self.dropped.append(request_line)
                client.shutdown(socket.SHUT_RDWR)  # the server committed; the answer is lost
                return
            client.sendall(response)

    def close(self) -> None:
        self.closed.set()
        self.listener.close()


@pytest.fixture
def proxy(tenant: Tenant) -> Iterator[DroppingProxy]:
    url = urlparse(tenant.server.url)
    p = DroppingProxy(upstream=(url.hostname or "127.0.0.1", url.port or 80))
    yield p
    p.close()


def _train(tenant: Tenant, url: str, manifest: str, ref: str, key: str):  # type: ignore[no-untyped-def]
    env = tenant.env(tenant.requester_key) | {"ITO_API_URL": url}
    return run_cli(
        [
            ITO,
            "train",
            "--booking",
            tenant.booking_id,
            "--manifest",
            manifest,
            "--confirmation-ref",
            ref,
            "--idempotency-key",
            key,
            "--json",
        ],
        env,
    )


def test_lost_create_response_is_recovered_by_idempotency_key(
    tenant: Tenant, proxy: DroppingProxy
) -> None:
    path = tenant.manifest()
    manifest, ref = str(path), tenant.approved_confirmation(path)
    proxy.drop = {"POST /v1/runs"}
    through_proxy = f"http://127.0.0.1:{proxy.port}"

    first = _train(tenant, through_proxy, manifest, ref, "lost-1")
    assert proxy.dropped == ["POST /v1/runs HTTP/1.1"]
    assert first.rc == 0, first.stdout + first.stderr
    assert first.data["recovered_after_lost_response"] is True
    assert first.envelope is not None and first.envelope["live_api_contacted"] is True

    # A retry with the same key, now with answers getting through, gives the same run.
    retry = _train(tenant, tenant.server.url, manifest, ref, "lost-1")
    assert retry.rc == 0 and retry.data["run_id"] == first.data["run_id"]
    assert retry.data["replayed"] is True
    assert tenant.counts()["runs"] == 1


def test_when_the_lookup_is_lost_too_the_client_says_ambiguous_and_a_retry_gives_one_run(
    tenant: Tenant, proxy: DroppingProxy
) -> None:
    path = tenant.manifest()
    manifest, ref = str(path), tenant.approved_confirmation(path)
    proxy.drop = {"POST /v1/runs", "GET /v1/runs"}

    lost = _train(tenant, f"http://127.0.0.1:{proxy.port}", manifest, ref, "lost-2")
    assert lost.rc == 1 and lost.code == "transport_ambiguous"
    assert lost.envelope is not None and lost.envelope["live_api_contacted"] is True
    assert lost.envelope["error"]["details"]["idempotency_key"] == "lost-2"
    assert tenant.counts()["runs"] == 1  # the server did commit

    retry = _train(tenant, tenant.server.url, manifest, ref, "lost-2")
    assert retry.rc == 0 and retry.data["replayed"] is True
    assert tenant.counts()["runs"] == 1
