"""The one HTTP transport to the canonical API, used by the client (``ito``, ``ito-mcp``) and the
worker (DESIGN §4, §6.2). It guarantees:

* **Bounded time.** A connect timeout, and one overall deadline for the whole call, retries
  included (``asyncio.wait_for`` around each attempt, so a server that trickles bytes is cut at
  the deadline too).
* **Bounded size.** At most ``max_response_bytes`` of (decoded) response body is read.
* **Retries of idempotent calls only.** A safe method (GET, HEAD) is retried after a failure
  that left it without an answer, and after a retryable 5xx answer (``store_busy``,
  ``internal_error``, a proxy's 502/503/504). A POST that carries an ``idempotency_key`` is
  retried only after such an *answer*: after a timeout or reset the request may have been
  applied, and §6.2 says the caller then looks the result up by its key before anything else —
  so it gets the failure. Any other POST is sent once.
* **Every failure is a registered code** (:mod:`ito.core.errors`), raised as an
  :class:`~ito.core.errors.ItoError`:

  - :class:`ApiRefusal`: the API answered with an error envelope; carried unchanged in
    ``envelope``, ``code`` rebuilt from it (an unknown code from a newer server reads as
    ``internal_error``).
  - :class:`TransportFailure` with ``live_api_contacted``:
    ``transport_unreachable`` (no connection: nothing was sent, false);
    for a mutation, anything after the request may have left — timeout, reset, an answer that is
    not an envelope (a proxy's error page, a truncated or oversized body) —
    ``transport_ambiguous`` (true); for a read, ``transport_timeout`` (no answer in time) or
    ``transport_bad_response`` (an answer that is not an envelope).

* **Nothing from outside.** ``trust_env=False`` (no proxy, ``.netrc`` or CA bundle from the
  environment), no redirects followed. No error carries the URL, a header or the exception text
  of the HTTP library: the credential can never leak through an error.

Each call runs its own short event loop and connection (thread-safe, nothing to close); the TLS
context is built once per transport.
"""

from __future__ import annotations

import asyncio
import json as jsonlib
import ssl
import time
from typing import TYPE_CHECKING, Any

from ito import __version__
from ito.core.errors import REGISTRY, ErrorCode, ItoError

if TYPE_CHECKING:
    import httpx

__all__ = [
    "DEFAULT_CONNECT_TIMEOUT",
    "DEFAULT_MAX_RESPONSE_BYTES",
    "DEFAULT_TIMEOUT",
    "ApiRefusal",
    "Transport",
    "TransportFailure",
]

DEFAULT_CONNECT_TIMEOUT = 5.0
DEFAULT_TIMEOUT = 30.0
DEFAULT_MAX_RESPONSE_BYTES = 16 * 1024 * 1024
"""Well above the largest page the API returns (500 log lines of at most 8 KiB each)."""
DEFAULT_RETRIES = 2
"""Extra attempts of an idempotent call, within the one deadline."""
BACKOFF_S = 0.1
"""First pause before a retry; doubled after each."""

_SAFE_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})
_RETRYABLE_STATUSES = frozenset({500, 502, 503, 504})


class TransportFailure(ItoError):
    """No usable answer came back. ``live_api_contacted`` says whether a byte may have reached
    the API (true after any ambiguous failure)."""

    def __init__(
        self, code: ErrorCode, message: str | None = None, *, live_api_contacted: bool
    ) -> None:
        super().__init__(code, message)
        self.live_api_contacted = live_api_contacted


class ApiRefusal(ItoError):
    """The API answered with an error envelope, kept unchanged in ``envelope``."""

    def __init__(self, envelope: dict[str, Any], status: int) -> None:
        error = envelope["error"]
        code = error["code"]
        message = error.get("message")
        super().__init__(
            code if code in REGISTRY else "internal_error",
            message if isinstance(message, str) and message else None,
        )
        self.envelope = envelope
        self.http_status = status
        self.retryable_answer = bool(error.get("retryable")) and status in _RETRYABLE_STATUSES
        """Whether the same request may be sent again at once (a 5xx the API calls retryable)."""


class _Retry(Exception):
    """An attempt ended in a way a retry may fix; carries the failure to raise if none does."""

    def __init__(self, failure: ItoError, *, answered: bool) -> None:
        super().__init__(failure.code)
        self.failure = failure
        self.answered = answered
        """Whether the API (or a proxy in front of it) answered: the outcome is known."""


class Transport:
    """Requests to one API base URL with one credential (or none)."""

    def __init__(
        self,
        api_url: str,
        token: str | None = None,
        *,
        connect_timeout: float = DEFAULT_CONNECT_TIMEOUT,
        timeout: float = DEFAULT_TIMEOUT,
        max_response_bytes: int = DEFAULT_MAX_RESPONSE_BYTES,
        retries: int = DEFAULT_RETRIES,
    ) -> None:
        if not api_url.startswith(("http://", "https://")):
            raise ItoError("client_not_configured", "the API URL must be an http(s) URL")
        self.api_url = api_url.rstrip("/")
        self.connect_timeout = min(connect_timeout, timeout)
        self.timeout = timeout
        self.max_response_bytes = max_response_bytes
        self.retries = retries
        self._headers = {"user-agent": f"ito/{__version__}", "accept": "application/json"}
        if token:
            self._headers["authorization"] = f"Bearer {token}"
        self._tls: ssl.SSLContext | None = None

    def close(self) -> None:
        """Nothing is held between calls; kept so owners can release a transport uniformly."""

    def request(
        self,
        method: str,
        path: str,
        *,
        json: Any = None,
        content: bytes | None = None,
        params: dict[str, Any] | None = None,
        mutation: bool | None = None,
    ) -> dict[str, Any]:
        """The API's ok envelope, or raise :class:`ApiRefusal` / :class:`TransportFailure`.

        ``mutation`` defaults to "not a safe method"; it picks ``transport_ambiguous`` over
        ``transport_timeout`` when no answer came back."""
        method = method.upper()
        is_mutation = method not in _SAFE_METHODS if mutation is None else mutation
        keyed = isinstance(json, dict) and bool(json.get("idempotency_key"))
        headers = dict(self._headers)
        if content is not None:
            headers["content-type"] = "application/octet-stream"
        call = _Call(
            method,
            path,
            json,
            content,
            params,
            headers,
            is_mutation,
            safe=not is_mutation,
            keyed=keyed,
        )
        return asyncio.run(self._call(call))

    async def _call(self, call: _Call) -> dict[str, Any]:
        import httpx  # here, not at import: ``ito --help`` and local commands stay light

        deadline = time.monotonic() + self.timeout
        contacted = False
        pause = BACKOFF_S
        failure: ItoError = TransportFailure("transport_timeout", live_api_contacted=False)
        async with httpx.AsyncClient(
            base_url=self.api_url,
            verify=self._tls_context(),
            timeout=httpx.Timeout(self.timeout, connect=self.connect_timeout),
            follow_redirects=False,
            trust_env=False,
        ) as client:
            for attempt in range(self.retries + 1):
                remaining = deadline - time.monotonic()
                try:
                    if remaining <= 0:
                        raise TimeoutError
                    return await asyncio.wait_for(self._attempt(client, call), remaining)
                except _Retry as retry:
                    failure, answered = retry.failure, retry.answered
                except TimeoutError:
                    # The deadline cut the attempt somewhere: a byte may have left.
                    failure = call.no_answer("the API did not answer within the deadline")
                    answered = False
                sent = not isinstance(failure, TransportFailure) or failure.live_api_contacted
                contacted = contacted or sent
                # A keyed POST is sent again only when its outcome is known: an answer came
                # back, or nothing was sent. After a silent failure the caller looks it up.
                may_retry = call.safe or (call.keyed and (answered or not sent))
                last = attempt == self.retries
                if not may_retry or last or time.monotonic() + pause >= deadline:
                    break
                await asyncio.sleep(pause)
                pause *= 2
        if isinstance(failure, TransportFailure) and contacted != failure.live_api_contacted:
            # An earlier attempt may have reached the API even if the last one did not connect.
            failure = call.no_answer("the API stopped answering")
        raise failure

    async def _attempt(self, client: httpx.AsyncClient, call: _Call) -> dict[str, Any]:
        import httpx

        try:
            async with client.stream(
                call.method,
                call.path,
                json=call.json,
                content=call.content,
                params=call.params,
                headers=call.headers,
            ) as response:
                status = response.status_code
                body = await self._read_bounded(response, call)
        except (
            httpx.ConnectError,
            httpx.ConnectTimeout,
            httpx.PoolTimeout,
            httpx.UnsupportedProtocol,
            httpx.InvalidURL,
        ):
            raise _Retry(
                TransportFailure("transport_unreachable", live_api_contacted=False), answered=False
            ) from None
        except httpx.TimeoutException:
            raise _Retry(
                call.no_answer("the API did not answer within the deadline"), answered=False
            ) from None
        except httpx.HTTPError:
            raise _Retry(
                call.no_answer("the connection broke after the request was sent"), answered=False
            ) from None
        envelope = _envelope(body)
        if envelope is None:
            failure = call.bad_answer("the API's answer was not an envelope")
            if status in _RETRYABLE_STATUSES:
                raise _Retry(failure, answered=True)
            raise failure
        if envelope["ok"] is True:
            return envelope
        refusal = ApiRefusal(envelope, status)
        if refusal.retryable_answer:
            raise _Retry(refusal, answered=True)
        raise refusal

    async def _read_bounded(self, response: httpx.Response, call: _Call) -> bytes:
        declared = response.headers.get("content-length", "")
        if declared.isdigit() and int(declared) > self.max_response_bytes:
            raise call.bad_answer("the API's answer exceeds the response size bound")
        body = bytearray()
        async for chunk in response.aiter_bytes():
            body += chunk
            if len(body) > self.max_response_bytes:
                raise call.bad_answer("the API's answer exceeds the response size bound")
        return bytes(body)

    def _tls_context(self) -> ssl.SSLContext:
        # Built once: httpx would otherwise load the CA bundle for every call's client.
        if self._tls is None:
            import httpx

            self._tls = httpx.create_ssl_context()
        return self._tls


class _Call:
    """One request as the attempts see it."""

    def __init__(
        self,
        method: str,
        path: str,
        json: Any,
        content: bytes | None,
        params: dict[str, Any] | None,
        headers: dict[str, str],
        mutation: bool,
        *,
        safe: bool,
        keyed: bool,
    ) -> None:
        self.method, self.path, self.json, self.content = method, path, json, content
        self.params, self.headers, self.mutation = params, headers, mutation
        self.safe, self.keyed = safe, keyed

    def no_answer(self, message: str) -> TransportFailure:
        """The request may have left and no answer came back."""
        code: ErrorCode = "transport_ambiguous" if self.mutation else "transport_timeout"
        return TransportFailure(code, None if self.mutation else message, live_api_contacted=True)

    def bad_answer(self, message: str) -> TransportFailure:
        """Something answered, but not with an envelope this side can read."""
        code: ErrorCode = "transport_ambiguous" if self.mutation else "transport_bad_response"
        return TransportFailure(code, message, live_api_contacted=True)


def _envelope(body: bytes) -> dict[str, Any] | None:
    """The body as an envelope (``ok`` a bool; a refusal has an ``error`` with a string
    ``code``), else None."""
    try:
        value = jsonlib.loads(body)
    except (ValueError, UnicodeDecodeError):
        return None
    if not isinstance(value, dict) or not isinstance(value.get("ok"), bool):
        return None
    if value["ok"] is False:
        error = value.get("error")
        if not isinstance(error, dict) or not isinstance(error.get("code"), str):
            return None
    return value
