"""Properties of the manifest parser and the secret scanner over generated documents: whatever
the bytes, the answer is a manifest or an :class:`ItoError` with a registered refusal code —
never another exception."""

from __future__ import annotations

import json
import tempfile
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ito.core.errors import REGISTRY, ItoError
from ito.core.manifest import Manifest, parse_manifest
from ito.core.secret_scan import MAX_FINDINGS, scan_document
from ito.recipes import build_recipe
from tests.core.credential_corpus import CREDENTIALS

REFUSALS = {"manifest_invalid", "manifest_contains_secret", "manifest_too_large"}
assert set(REGISTRY) >= REFUSALS

_SETTINGS = settings(
    max_examples=150,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)

_scalars = (
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**70), max_value=2**70)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=80)
)
json_trees = st.recursive(
    _scalars,
    lambda children: (
        st.lists(children, max_size=6) | st.dictionaries(st.text(max_size=20), children, max_size=6)
    ),
    max_leaves=40,
)

with tempfile.TemporaryDirectory() as _directory:
    _VALID: dict[str, Any] = json.loads(json.dumps(build_recipe("test", _directory).manifest))


def _parse_or_refuse(raw: bytes) -> None:
    try:
        assert isinstance(parse_manifest(raw), Manifest)
    except ItoError as exc:
        assert exc.code in REFUSALS, exc.code


@_SETTINGS
@given(json_trees)
def test_any_json_document_parses_or_is_refused_with_a_registered_code(tree: Any) -> None:
    _parse_or_refuse(json.dumps(tree).encode())


@_SETTINGS
@given(st.binary(max_size=512))
def test_any_bytes_parse_or_are_refused_with_a_registered_code(raw: bytes) -> None:
    _parse_or_refuse(raw)


def _paths(value: Any, prefix: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    out = [prefix]
    if isinstance(value, dict):
        for key, child in value.items():
            out += _paths(child, (*prefix, key))
    elif isinstance(value, list):
        for index, child in enumerate(value):
            out += _paths(child, (*prefix, index))
    return out


@st.composite
def mutated_manifests(draw: st.DrawFn) -> Any:
    document = json.loads(json.dumps(_VALID))
    for _ in range(draw(st.integers(min_value=1, max_value=4))):
        paths = [p for p in _paths(document) if p]
        if not paths:
            break
        path = draw(st.sampled_from(paths))
        parent = document
        for part in path[:-1]:
            parent = parent[part]
        action = draw(st.sampled_from(["replace", "delete", "insert"]))
        if action == "replace":
            parent[path[-1]] = draw(json_trees)
        elif action == "delete":
            del parent[path[-1]]
        elif isinstance(parent, dict):
            parent[draw(st.text(max_size=20))] = draw(json_trees)
        else:
            parent.insert(path[-1], draw(json_trees))
    return document


@_SETTINGS
@given(mutated_manifests())
def test_a_mutated_valid_manifest_parses_or_is_refused_with_a_registered_code(
    document: Any,
) -> None:
    _parse_or_refuse(json.dumps(document).encode())


@_SETTINGS
@given(json_trees)
def test_the_scanner_never_raises_and_reports_a_bounded_list(tree: Any) -> None:
    findings = scan_document(tree)
    assert len(findings) <= MAX_FINDINGS
    assert all(f.path.startswith("$") for f in findings)


@_SETTINGS
@given(st.one_of(mutated_manifests(), json_trees), st.sampled_from(CREDENTIALS), st.data())
def test_a_credential_inserted_anywhere_is_refused_and_not_echoed(
    document: Any, credential: tuple[str, str], data: st.DataObject
) -> None:
    _, secret = credential
    containers = [p for p in _paths(document) if isinstance(_at(document, p), dict | list)]
    if not containers:
        document = {"wrapper": document}
        containers = [()]
    container = _at(document, data.draw(st.sampled_from(containers)))
    if isinstance(container, list):
        container.insert(data.draw(st.integers(0, len(container))), secret)
    elif data.draw(st.booleans()):
        container[secret] = data.draw(json_trees)
    else:
        container[data.draw(st.text(max_size=20))] = secret
    try:
        parse_manifest(json.dumps(document).encode())
    except ItoError as exc:
        assert exc.code == "manifest_contains_secret", exc.code
        assert secret not in json.dumps(exc.to_error_body()) + str(exc)
    else:
        raise AssertionError("a manifest holding a credential was accepted")


def _at(document: Any, path: tuple[Any, ...]) -> Any:
    for part in path:
        document = document[part]
    return document
