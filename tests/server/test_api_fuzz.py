"""Schemathesis against the live server's OpenAPI (both backends): every operation, a bounded
number of generated requests each, with hostile characters (NUL, other C0 and C1 controls,
DEL, bidi overrides and isolates, newlines) spliced into its strings — path parameters, query
values and JSON bodies at any depth. Whatever arrives, the answer is never a server error (5xx),
and every answer matches the schema its operation documents for that status in the same
OpenAPI document (schemathesis' response schema conformance). Bodies are also sent with two
media types (duplicated or listed ``Content-Type``): always ``invalid_arguments``.

Each operation is called with the credential its role needs (desk, worker, approver or
requester; none for device login), so generated requests get past authentication and reach
the code behind it. Generation is derandomized: the same requests on every run.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import httpx
import pytest
import schemathesis
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st
from schemathesis import GenerationMode
from schemathesis.core.failures import Failure, FailureGroup
from schemathesis.core.result import Ok
from schemathesis.specs.openapi.checks import response_schema_conformance

from tests.support import Server, make_tenant

pytestmark = pytest.mark.slow

HOSTILE = [
    "\x00",
    "\x01",
    "\x08",
    "\x0b",
    "\x1b",
    "\x7f",
    "\x85",
    "\x9b",
    "\n",
    "\r",
    "\u202a",
    "\u202e",
    "\u2066",
    "\u2069",
]
EXAMPLES_PER_OPERATION = 25
_SETTINGS = settings(
    derandomize=True,
    database=None,
    deadline=None,
    phases=[Phase.explicit, Phase.generate],
    suppress_health_check=list(HealthCheck),
)
"""Every generation here: the same requests on every run, no example database."""
EXCLUDED = ("/v1/credentials/self/revoke",)
"""Revoking the fuzzer's own key would leave every later request unauthenticated."""


def _poisoned(value: Any, *, keys: bool = True) -> st.SearchStrategy[Any]:
    """``value`` as generated, or with a hostile character spliced into one or more of its
    strings (dictionary keys too, unless ``keys`` is false: path parameters keep their
    names)."""
    if isinstance(value, str):
        spliced = st.builds(
            lambda char, at: value[:at] + char + value[at:],
            st.sampled_from(HOSTILE),
            st.integers(0, len(value)),
        )
        return st.one_of(st.just(value), spliced)
    if isinstance(value, dict):
        names = (
            st.tuples(*[_poisoned(k) if keys else st.just(k) for k in value])
            if value
            else st.just(())
        )
        values = st.tuples(*[_poisoned(v) for v in value.values()]) if value else st.just(())
        return st.builds(lambda ks, vs: dict(zip(ks, vs, strict=True)), names, values)
    if isinstance(value, list):
        return st.tuples(*[_poisoned(v) for v in value]).map(list) if value else st.just([])
    return st.just(value)


@pytest.fixture
def fuzz_keys(server: Server, tmp_path: Path) -> dict[str, str]:
    tenant = make_tenant(server, tmp_path / "fuzz", "fuzz")
    worker = server.desk(
        "/v1/desk/keys",
        {"account_id": tenant.account_id, "role": "worker", "booking_id": tenant.booking_id},
    )["api_key"]
    return {
        "requester": tenant.requester_key,
        "approver": tenant.approver_key,
        "desk": server.desk_key,
        "worker": str(worker),
    }


def _role(path: str) -> str | None:
    if path.startswith("/v1/device/"):
        return None
    if path.startswith("/v1/desk/") or path == "/metrics":
        return "desk"
    if path.startswith("/v1/worker/"):
        return "worker"
    if path.endswith(("/approve", "/reject")):
        return "approver"
    return "requester"


def _fuzz(schema: Any, operation: Any, headers: dict[str, str]) -> list[str]:
    """Send the operation's generated requests; the ones answered with a server error or with
    a body its documented schema does not describe."""
    failures: list[str] = []
    cases = st.one_of(
        *[
            operation.as_strategy(mode, hooks=schema.hooks)
            for mode in (GenerationMode.POSITIVE, GenerationMode.NEGATIVE)
        ]
    )

    @given(case=cases)
    @settings(_SETTINGS, max_examples=EXAMPLES_PER_OPERATION)
    def call(case: Any) -> None:
        response = case.call(headers=headers, timeout=30)
        if response.status_code >= 500:
            failures.append(
                f"{operation.label} -> {response.status_code}: {case.as_curl_command()[:500]}"
            )
        try:
            case.validate_response(response, checks=[response_schema_conformance])
        except (Failure, FailureGroup) as exc:
            failures.append(
                f"{operation.label} -> {response.status_code} does not match its "
                f"documented schema: {str(exc)[:300]}"
            )

    call()
    return failures


DUPLICATED_CONTENT_TYPES = [
    [("content-type", "application/json"), ("content-type", "text/plain")],
    [("Content-Type", "text/plain"), ("content-type", "application/json")],
    [("content-type", "application/json, text/plain")],
]
EXAMPLES_WITH_DUPLICATES = 3


def _fuzz_duplicated(operation: Any, base_url: str, key: str | None) -> list[str]:
    """The operation's generated bodies sent with two media types: always refused before the
    body is read (``invalid_arguments``), never a server error."""
    failures: list[str] = []
    cases = operation.as_strategy(GenerationMode.POSITIVE)

    @given(case=cases, content_types=st.sampled_from(DUPLICATED_CONTENT_TYPES))
    @settings(_SETTINGS, max_examples=EXAMPLES_WITH_DUPLICATES)
    def call(case: Any, content_types: list[tuple[str, str]]) -> None:
        sent = case.as_transport_kwargs(base_url=base_url)
        auth = [("authorization", f"Bearer {key}")] if key else []
        response = httpx.request(
            sent["method"],
            sent["url"],
            params=sent.get("params"),
            headers=[*auth, *content_types],
            content=json.dumps(sent.get("json")).encode(),
            timeout=30,
        )
        body = response.json() if response.content else {}
        code = (body.get("error") or {}).get("code")
        if response.status_code >= 500 or code != "invalid_arguments":
            failures.append(
                f"{operation.label} with {content_types} -> {response.status_code} {code}"
            )

    call()
    return failures


def test_no_generated_request_gets_a_server_error(
    server: Server, fuzz_keys: dict[str, str]
) -> None:
    schema = schemathesis.openapi.from_url(server.url + "/openapi.json")
    schema.hook("flatmap_path_parameters")(lambda _ctx, value: _poisoned(value, keys=False))
    schema.hook("flatmap_query")(lambda _ctx, value: _poisoned(value))
    schema.hook("flatmap_body")(lambda _ctx, value: _poisoned(value))
    failures: list[str] = []
    operations = with_body = 0
    for result in schema.get_all_operations():
        assert isinstance(result, Ok), result
        operation = result.ok()
        if operation.path in EXCLUDED:
            continue
        operations += 1
        role = _role(operation.path)
        headers = {"authorization": f"Bearer {fuzz_keys[role]}"} if role else {}
        failures += _fuzz(schema, operation, headers)
        if operation.method.upper() in ("POST", "PUT", "PATCH") and operation.body:
            with_body += 1
            failures += _fuzz_duplicated(operation, server.url, fuzz_keys[role] if role else None)
    assert operations >= 25  # every operation of the published API was exercised
    assert with_body >= 10  # and those taking a JSON body got duplicated media types
    assert not failures, "\n".join(failures[:20])
