"""Every answer the e2e tests get — through the CLI, the desk and direct API calls — passes
through a proxy that checks it against the server's own OpenAPI document
(:mod:`tests.openapi_conformance`): a test fails if any answer does not match the schema its
operation documents for that status."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator

import pytest

from tests.openapi_conformance import PROXIES, ConformanceProxy
from tests.support import Server


@pytest.fixture(scope="session")
def server(server: Server) -> Iterator[Server]:
    """The real server, reached through the checking proxy."""
    proxy = ConformanceProxy(server.url).start()
    PROXIES[proxy.url] = proxy
    try:
        yield dataclasses.replace(server, url=proxy.url)
    finally:
        del PROXIES[proxy.url]
        proxy.stop()


@pytest.fixture(autouse=True)
def _answers_match_the_openapi_document(server: Server) -> Iterator[None]:
    proxy = PROXIES[server.url]
    proxy.take_mismatches()
    yield
    mismatches = proxy.take_mismatches()
    assert not mismatches, "\n".join(mismatches[:20])
