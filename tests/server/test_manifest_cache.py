"""The per-process cache of parsed manifests: same bytes, same (frozen) result, parsed once;
refused bytes are never cached; the cache stays within its bound."""

from __future__ import annotations

import json
import threading
from pathlib import Path
from typing import Any

import pytest

from ito.core.errors import ItoError
from ito.core.manifest import manifest_digest, parse_manifest
from ito.recipes import build_recipe
from ito.server.services import manifest_cache


def _manifest(tmp_path: Path, name: str) -> bytes:
    document = dict(build_recipe("test", str(tmp_path / "data")).manifest)
    document["name"] = name
    return json.dumps(document).encode()


def test_the_same_bytes_are_parsed_once_and_give_the_same_manifest(tmp_path: Path) -> None:
    raw = _manifest(tmp_path, "cache-same")
    first = manifest_cache.parsed_manifest(raw)
    assert manifest_cache.cached_manifest(manifest_digest(raw)) is first
    assert manifest_cache.parsed_manifest(raw, manifest_digest(raw)) is first
    other = manifest_cache.parsed_manifest(_manifest(tmp_path, "cache-other"))
    assert other is not first and other.name == "cache-other"


def test_refused_bytes_are_refused_every_time_and_never_cached() -> None:
    raw = b'{"schema": "ito.training.manifest.v1"}'
    for _ in range(2):
        with pytest.raises(ItoError) as refused:
            manifest_cache.parsed_manifest(raw)
        assert refused.value.code == "manifest_invalid"
    assert manifest_cache.cached_manifest(manifest_digest(raw)) is None


def test_the_cache_keeps_at_most_its_bound(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(manifest_cache, "MAX_ENTRIES", 3)
    raws = [_manifest(tmp_path, f"cache-bound-{i}") for i in range(5)]
    for raw in raws:
        manifest_cache.parsed_manifest(raw)
    kept = [manifest_cache.cached_manifest(manifest_digest(raw)) is not None for raw in raws]
    assert kept == [False, False, True, True, True]


def test_parses_run_one_at_a_time_and_the_same_bytes_at_once_are_parsed_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """While one parse runs, every other waits outside it (it would only compete for the GIL);
    the same bytes sent at once are parsed once. The first parse holds until a second one
    enters or a deadline passes: with parses serialised none can enter, so it is the deadline."""
    guard = threading.Lock()
    inside: list[str] = []
    overlapped = threading.Event()
    calls: list[bytes] = []
    real = parse_manifest

    def parse(raw: bytes) -> Any:
        with guard:
            calls.append(raw)
            inside.append("in")
            if len(inside) > 1:
                overlapped.set()
        if len(calls) == 1:
            overlapped.wait(timeout=1.0)
        try:
            return real(raw)
        finally:
            with guard:
                inside.pop()

    monkeypatch.setattr(manifest_cache, "parse_manifest", parse)
    distinct = [_manifest(tmp_path, f"cache-serial-{i}") for i in range(3)]
    same = _manifest(tmp_path, "cache-serial-same")
    bodies = [*distinct, same, same, same]
    results: dict[int, Any] = {}

    def work(index: int) -> None:
        results[index] = manifest_cache.parsed_manifest(bodies[index])

    threads = [threading.Thread(target=work, args=(i,)) for i in range(len(bodies))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    assert not overlapped.is_set()
    assert len(results) == len(bodies)
    assert calls.count(same) == 1 and len(calls) == 4
    assert results[3] is results[4] is results[5]
