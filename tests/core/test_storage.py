"""Checkpoint storage must stay inside the booking's storage, as the worker will read the URI
(percent-decoded, fragment dropped) — not as the raw string looks (DESIGN §5.8 gate 5, §7.3)."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlparse

import pytest

from ito.core.errors import ItoError
from ito.core.gates import check_resources
from ito.core.manifest import Manifest, parse_manifest
from ito.core.storage import (
    booking_storage_uri,
    checkpoint_local_parts,
    checkpoint_local_path,
    contained_storage_uri,
    run_checkpoint_uri,
)
from ito.recipes import build_recipe
from tests.core.booking_views import NOW, booking_view

ROOT = "file:///data/bkg"
RUN = "run_abcdefghijklmnopqrstuvwx"
OTHER_RUN = "run_234567abcdefghijklmnopqr"


def _code(fn: Callable[[], object]) -> str:
    with pytest.raises(ItoError) as info:
        fn()
    return info.value.code


def _worker_path(uri: str) -> str:
    """What the worker does with a stored URI today (``supervisor.checkpoint_path``)."""
    return unquote(urlparse(uri).path)


# --- refused shapes ---------------------------------------------------------------------------

REFUSED_FILE = {
    # The two exploits of the review: decoded '..' with a dropped fragment, and a sibling run.
    "encoded-dotdot-with-fragment": f"{ROOT}/%2e%2e/%2e%2e/home/worker#",
    "sibling-run-with-fragment": f"{ROOT}/runs/{OTHER_RUN}#",
    "encoded-dotdot": f"{ROOT}/%2e%2e/%2e%2e/home/worker",
    "encoded-dotdot-upper": f"{ROOT}/%2E%2E/x",
    "encoded-dot": f"{ROOT}/%2e/x",
    "half-encoded-dotdot": f"{ROOT}/.%2e/x",
    "encoded-slash": f"{ROOT}/a%2f..%2f..%2fetc",
    "encoded-slash-upper": f"{ROOT}/a%2F..",
    "encoded-backslash": f"{ROOT}/a%5c..%5cx",
    "encoded-percent": f"{ROOT}/%252e%252e/x",
    "malformed-escape": f"{ROOT}/a%zz",
    "truncated-escape": f"{ROOT}/a%2",
    "encoded-non-utf8": f"{ROOT}/a%ff",
    "encoded-nul": f"{ROOT}/a%00b",
    "encoded-newline": f"{ROOT}/a%0ab",
    "dotdot": f"{ROOT}/../other",
    "nested-dotdot": f"{ROOT}/a/../../other",
    "dot": f"{ROOT}/./x",
    "trailing-dotdot": f"{ROOT}/x/..",
    "empty-segment": f"{ROOT}//x",
    "empty-segment-inside": f"{ROOT}/a//b",
    "double-trailing-slash": f"{ROOT}/a//",
    "fragment": f"{ROOT}/x#frag",
    "empty-fragment": f"{ROOT}/x#",
    "query": f"{ROOT}/x?a=b",
    "empty-query": f"{ROOT}/x?",
    "params": f"{ROOT}/x;type=d",
    "backslash": f"{ROOT}/a\\..\\..\\x",
    "nul": f"{ROOT}/a\x00b",
    "newline": f"{ROOT}/a\nb",
    "tab": f"{ROOT}/a\tb",
    "del": f"{ROOT}/a\x7fb",
    "space": f"{ROOT}/a b",
    "leading-space": f" {ROOT}/a",
    "non-ascii": f"{ROOT}/caf\u00e9",
    "userinfo": "file://user:pw@/data/bkg/x",
    "userinfo-localhost": "file://user@localhost/data/bkg/x",
    "other-host": "file://evil.example/data/bkg/x",
    "localhost-with-port": "file://localhost:22/data/bkg/x",
    "other-scheme": "s3://bkg/data/bkg/x",
    "no-scheme": "/data/bkg/x",
    "relative-scheme": "file:data/bkg/x",
    "single-slash": "file:/data/bkg/x",
    "outside": "file:///data/other/x",
    "same-prefix-sibling": f"{ROOT}0/x",
    "parent": "file:///data",
    "empty": "",
}


@pytest.mark.parametrize("uri", list(REFUSED_FILE.values()), ids=list(REFUSED_FILE))
def test_refused_shapes_are_checkpoint_storage_invalid(uri: str) -> None:
    assert _code(lambda: contained_storage_uri(uri, ROOT)) == "checkpoint_storage_invalid"
    assert _code(lambda: run_checkpoint_uri(uri, ROOT, RUN)) == "checkpoint_storage_invalid"


def test_the_review_exploits_really_escape_under_the_workers_reading() -> None:
    # Why the raw-string check was not enough: these start with ROOT + "/", have no literal
    # '..' segment, and still resolve outside the booking or onto another run.
    escape = f"{ROOT}/%2e%2e/%2e%2e/home/worker#/{RUN}"
    assert escape.startswith(ROOT + "/") and ".." not in escape.split("/")
    assert Path(_worker_path(escape)).resolve() == Path("/home/worker")
    sibling = f"{ROOT}/runs/{OTHER_RUN}#/{RUN}"
    assert _worker_path(sibling) == f"/data/bkg/runs/{OTHER_RUN}"


def test_refusal_never_echoes_the_uri() -> None:
    uri = "file://someone:hunter2hunter2@/data/bkg/x"
    with pytest.raises(ItoError) as info:
        contained_storage_uri(uri, ROOT)
    assert "hunter2" not in json.dumps(info.value.to_error_body())


REFUSED_BUCKET = {
    "other-bucket": "s3://other/bkg/x",
    "bucket-prefix": "s3://bucket2/bkg/x",
    "other-scheme": "gs://bucket/bkg/x",
    "no-bucket": "s3:///bkg/x",
    "credentials": "s3://AKIAX:secret@bucket/bkg/x",
    "encoded-dotdot": "s3://bucket/bkg/%2e%2e/x",
    "dotdot": "s3://bucket/bkg/../x",
    "empty-segment": "s3://bucket/bkg//x",
    "fragment": "s3://bucket/bkg/x#",
    "query": "s3://bucket/bkg/x?versionId=1",
    "outside-key": "s3://bucket/other/x",
}


@pytest.mark.parametrize("uri", list(REFUSED_BUCKET.values()), ids=list(REFUSED_BUCKET))
def test_bucket_storage_has_the_same_rules_and_the_same_bucket(uri: str) -> None:
    assert (
        _code(lambda: contained_storage_uri(uri, "s3://bucket/bkg")) == "checkpoint_storage_invalid"
    )


@pytest.mark.parametrize(
    "root",
    [
        "file:///data/%2e%2e/bkg",
        "file:///data/bkg#",
        "file:///data/bkg?x",
        "file://host/data",
        "file://u:p@/data",
        "/data/bkg",
        "file:///data//bkg",
        "s3://",
        "",
    ],
    ids=[
        "encoded-dotdot",
        "fragment",
        "query",
        "host",
        "credentials",
        "no-scheme",
        "empty-segment",
        "no-bucket",
        "empty",
    ],
)
def test_an_unusable_booking_root_refuses_everything(root: str) -> None:
    assert _code(lambda: run_checkpoint_uri("booking", root, RUN)) == "checkpoint_storage_invalid"
    assert (
        _code(lambda: contained_storage_uri("file:///data/bkg/x", root))
        == "checkpoint_storage_invalid"
    )


@pytest.mark.parametrize(
    "storage",
    [
        f"{ROOT}/runs/{OTHER_RUN}",
        f"{ROOT}/runs/{OTHER_RUN}/",
        f"{ROOT}/runs/{OTHER_RUN}/pretrain",
        f"{ROOT}/mine/{OTHER_RUN}",
        f"{ROOT}/{OTHER_RUN.upper()}",
        f"{ROOT}/run_%61bcdefghijklmnopqrstuvwx",
    ],
    ids=[
        "run-dir",
        "run-dir-slash",
        "inside-run-dir",
        "custom-run-dir",
        "upper-case",
        "encoded-letter",
    ],
)
def test_storage_inside_another_runs_directory_is_refused(storage: str) -> None:
    assert _code(lambda: run_checkpoint_uri(storage, ROOT, RUN)) == "checkpoint_storage_invalid"


# --- accepted shapes (the former semantics for valid input) ----------------------------------


@pytest.mark.parametrize(
    ("storage", "expected"),
    [
        ("booking", f"{ROOT}/runs/{RUN}"),
        (f"{ROOT}/mine", f"{ROOT}/mine/{RUN}"),
        (f"{ROOT}/mine/", f"{ROOT}/mine/{RUN}"),
        (f"{ROOT}/a/b-c_d.e/f", f"{ROOT}/a/b-c_d.e/f/{RUN}"),
        (f"{ROOT}/", f"{ROOT}/{RUN}"),
        (ROOT, f"{ROOT}/{RUN}"),
        (f"{ROOT}/runs", f"{ROOT}/runs/{RUN}"),
        (f"{ROOT}/..x/x..", f"{ROOT}/..x/x../{RUN}"),
        (f"{ROOT}/my%20dir", f"{ROOT}/my%20dir/{RUN}"),
        ("file://localhost/data/bkg/mine", f"{ROOT}/mine/{RUN}"),
        ("FILE:///data/bkg/mine", f"{ROOT}/mine/{RUN}"),
    ],
    ids=[
        "booking",
        "subdirectory",
        "subdirectory-slash",
        "deep",
        "root-slash",
        "root",
        "runs",
        "dots-inside-names",
        "encoded-space",
        "localhost",
        "upper-scheme",
    ],
)
def test_storage_inside_the_root_is_normalised(storage: str, expected: str) -> None:
    assert run_checkpoint_uri(storage, ROOT, RUN) == expected
    assert run_checkpoint_uri(storage, ROOT + "/", RUN) == expected


def test_containment_is_decided_on_decoded_segments() -> None:
    # %62 is 'b': the same directory the worker will open, written as the root is.
    assert contained_storage_uri("file:///data/%62kg/x", ROOT) == f"{ROOT}/x"
    assert contained_storage_uri(ROOT, ROOT) == ROOT


def test_filesystem_root_as_booking_storage() -> None:
    assert run_checkpoint_uri("booking", "file:///", RUN) == f"file:///runs/{RUN}"
    assert contained_storage_uri("file:///", "file:///") == "file:///"


@pytest.mark.parametrize(
    ("root", "storage", "expected"),
    [
        ("s3://bucket/bkg", "booking", f"s3://bucket/bkg/runs/{RUN}"),
        ("s3://bucket/bkg", "s3://bucket/bkg/mine/", f"s3://bucket/bkg/mine/{RUN}"),
        ("s3://bucket", "s3://bucket/mine", f"s3://bucket/mine/{RUN}"),
        ("gs://bucket/bkg/", "gs://bucket/bkg", f"gs://bucket/bkg/{RUN}"),
    ],
)
def test_bucket_storage_inside_the_root(root: str, storage: str, expected: str) -> None:
    assert run_checkpoint_uri(storage, root, RUN) == expected


# --- the worker's re-check -------------------------------------------------------------------


def test_worker_recheck_answers_the_decoded_local_path() -> None:
    assert checkpoint_local_path(f"{ROOT}/runs/{RUN}", ROOT, RUN) == f"/data/bkg/runs/{RUN}"
    assert (
        checkpoint_local_path(f"{ROOT}/my%20dir/{RUN}", ROOT + "/", RUN)
        == f"/data/bkg/my dir/{RUN}"
    )
    stored = run_checkpoint_uri(f"{ROOT}/mine", ROOT, RUN)
    assert checkpoint_local_path(stored, ROOT, RUN) == _worker_path(stored)


@pytest.mark.parametrize(
    ("uri", "root"),
    [
        (f"{ROOT}/%2e%2e/%2e%2e/home/worker#/{RUN}", ROOT),
        (f"{ROOT}/runs/{OTHER_RUN}#/{RUN}", ROOT),
        (f"{ROOT}/runs/{OTHER_RUN}", ROOT),
        (f"{ROOT}/runs", ROOT),
        (ROOT, ROOT),
        (f"{ROOT}/", ROOT),
        (f"file:///data/other/{RUN}", ROOT),
        (f"s3://bucket/bkg/{RUN}", "s3://bucket/bkg"),
    ],
    ids=[
        "escape",
        "sibling-with-fragment",
        "another-run",
        "all-runs",
        "root",
        "root-slash",
        "outside",
        "not-file",
    ],
)
def test_worker_recheck_refuses(uri: str, root: str) -> None:
    assert _code(lambda: checkpoint_local_path(uri, root, RUN)) == "checkpoint_storage_invalid"


def test_worker_recheck_splits_at_the_booking_root() -> None:
    assert checkpoint_local_parts(f"{ROOT}/my%20dir/{RUN}", ROOT + "/", RUN) == (
        "/data/bkg",
        ("my dir", RUN),
    )
    assert checkpoint_local_parts(f"file:///runs/{RUN}", "file:///", RUN) == ("/", ("runs", RUN))


# --- the booking's own storage, when the desk records it --------------------------------------

BAD_BOOKING_STORAGE = {
    "filesystem-root": "file:///",
    "filesystem-root-localhost": "file://localhost/",
    "etc": "file:///etc",
    "inside-etc": "file:///etc/ito/storage",
    "usr": "file:///usr/local/ito",
    "proc": "file:///proc/self",
    "sys": "file:///sys",
    "dev": "file:///dev/shm/x",
    "boot": "file:///boot",
    "root-home": "file:///root/storage",
    "lib64": "file:///lib64",
    "run": "file:///run/ito",
    "var-lib": "file:///var/lib",
    "var-lib-slash": "file:///var/lib/",
    "tmp": "file:///tmp",
    "home": "file:///home",
    "relative": "file:data/bkg",
    "no-scheme": "/data/bkg",
    "other-host": "file://host.example/data/bkg",
    "dotdot": "file:///data/../etc",
    "encoded-dotdot": "file:///data/%2e%2e/etc",
    "fragment": "file:///data/bkg#x",
    "s3": "s3://bucket/bkg",
    "gs": "gs://bucket/bkg",
    "empty": "",
}


@pytest.mark.parametrize("uri", BAD_BOOKING_STORAGE.values(), ids=BAD_BOOKING_STORAGE.keys())
def test_booking_storage_that_no_worker_may_write_is_refused(uri: str) -> None:
    assert _code(lambda: booking_storage_uri(uri)) == "checkpoint_storage_invalid"


@pytest.mark.parametrize(
    ("uri", "expected"),
    [
        (ROOT, ROOT),
        (ROOT + "/", ROOT),
        ("file://localhost/srv/ito/bkg", "file://localhost/srv/ito/bkg"),
        ("file:///var/lib/ito/storage", "file:///var/lib/ito/storage"),
        ("file:///tmp/pytest-of-x/storage", "file:///tmp/pytest-of-x/storage"),
        ("file:///home/alice/ito", "file:///home/alice/ito"),
    ],
)
def test_booking_storage_in_an_ordinary_directory_is_accepted(uri: str, expected: str) -> None:
    assert booking_storage_uri(uri) == expected


# --- through the gate ------------------------------------------------------------------------


def _manifest_with(tmp_path: Path, storage: str) -> Manifest:
    # The data in the booking's storage (ROOT's path), where a run may read it.
    document: dict[str, Any] = json.loads(json.dumps(build_recipe("test", "/data/bkg/in").manifest))
    document["checkpoint"]["storage"] = storage
    return parse_manifest(json.dumps(document).encode())


@pytest.mark.parametrize(
    "storage",
    [
        REFUSED_FILE["encoded-dotdot-with-fragment"],
        REFUSED_FILE["sibling-run-with-fragment"],
        REFUSED_FILE["encoded-slash"],
        REFUSED_FILE["empty-segment"],
        REFUSED_FILE["query"],
        f"{ROOT}/runs/{OTHER_RUN}",
    ],
    ids=[
        "encoded-dotdot-with-fragment",
        "sibling-run-with-fragment",
        "encoded-slash",
        "empty-segment",
        "query",
        "another-run",
    ],
)
def test_the_gate_refuses_escaping_storage(tmp_path: Path, storage: str) -> None:
    manifest = _manifest_with(tmp_path, storage)
    for hint in ("{run_id}", RUN):
        with pytest.raises(ItoError) as info:
            check_resources(manifest, booking_view(storage_uri=ROOT), NOW, run_id_hint=hint)
        assert info.value.code == "checkpoint_storage_invalid"


def test_the_gate_stores_the_normalised_uri(tmp_path: Path) -> None:
    manifest = _manifest_with(tmp_path, "file://localhost/data/bkg/mine/")
    checked = check_resources(manifest, booking_view(storage_uri=ROOT), NOW, run_id_hint=RUN)
    assert checked.checkpoint_uri == f"{ROOT}/mine/{RUN}"
    planned = check_resources(manifest, booking_view(storage_uri=ROOT), NOW)
    assert planned.checkpoint_uri == f"{ROOT}/mine/{{run_id}}"
