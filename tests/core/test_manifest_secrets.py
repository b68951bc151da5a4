"""Credentials anywhere in a manifest are refused as ``manifest_contains_secret`` before any other
check, at their JSON path, without their value; ordinary manifest content is never taken for
one (DESIGN §5.3)."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import pytest

from ito.core.errors import ItoError
from ito.core.manifest import parse_manifest
from ito.core.secret_scan import MAX_FINDINGS, scan_document
from ito.recipes import RECIPES, build_recipe
from tests.core.credential_corpus import BENIGN, CREDENTIALS

Doc = dict[str, Any]


def _recipe(name: str, directory: str) -> Doc:
    document: Doc = json.loads(json.dumps(build_recipe(name, directory).manifest))
    return document


@pytest.fixture
def doc(tmp_path: Any) -> Doc:
    return _recipe("test", str(tmp_path))


def _top_level_unknown_key(d: Doc, secret: str) -> str:
    d["notes"] = secret
    return "$.notes"


def _nested_value(d: Doc, secret: str) -> str:
    d["data"][0]["license"] = secret
    return "$.data[0].license"


def _list_item(d: Doc, secret: str) -> str:
    d["data_policy"]["allowed_licenses"].append(secret)
    return f"$.data_policy.allowed_licenses[{len(d['data_policy']['allowed_licenses']) - 1}]"


def _key_name(d: Doc, secret: str) -> str:
    d["model"][secret] = "x"
    return "$.model[<redacted key>]"


def _deep_in_unknown_structure(d: Doc, secret: str) -> str:
    d["ladder"]["extra"] = {"a": [[{"b": secret}]]}
    return "$.ladder.extra.a[0][0].b"


PLACEMENTS: dict[str, Callable[[Doc, str], str]] = {
    "top_level_unknown_key": _top_level_unknown_key,
    "nested_value": _nested_value,
    "list_item": _list_item,
    "key_name": _key_name,
    "deep_in_unknown_structure": _deep_in_unknown_structure,
}


def test_the_corpus_covers_at_least_35_credential_shapes() -> None:
    assert len(CREDENTIALS) >= 35


@pytest.mark.parametrize("placement", sorted(PLACEMENTS))
@pytest.mark.parametrize(("shape", "secret"), CREDENTIALS, ids=[c[0] for c in CREDENTIALS])
def test_a_credential_is_refused_wherever_it_sits_and_never_echoed(
    doc: Doc, shape: str, secret: str, placement: str
) -> None:
    path = PLACEMENTS[placement](doc, secret)
    with pytest.raises(ItoError) as info:
        parse_manifest(json.dumps(doc).encode())
    error = info.value
    assert error.code == "manifest_contains_secret"
    assert path in {f["path"] for f in error.details["findings"]}
    shown = json.dumps(error.to_error_body()) + str(error)
    assert secret not in shown
    assert json.dumps(secret)[1:-1] not in shown


def test_a_secret_in_an_otherwise_invalid_manifest_is_refused_as_a_secret(doc: Doc) -> None:
    _, secret = CREDENTIALS[0]
    del doc["budget"]
    doc["model"]["size"] = secret
    with pytest.raises(ItoError) as info:
        parse_manifest(json.dumps(doc).encode())
    assert info.value.code == "manifest_contains_secret"
    assert info.value.details["findings"] == [{"path": "$.model.size", "kind": "cloud_key"}]


def test_findings_are_bounded_however_many_credentials_there_are(doc: Doc) -> None:
    doc["extra"] = [secret for _, secret in CREDENTIALS] * 3
    with pytest.raises(ItoError) as info:
        parse_manifest(json.dumps(doc).encode())
    assert info.value.code == "manifest_contains_secret"
    assert len(info.value.details["findings"]) == MAX_FINDINGS


@pytest.mark.parametrize("recipe", sorted(RECIPES))
def test_the_recipes_manifests_parse_without_a_finding(recipe: str, tmp_path: Any) -> None:
    document = _recipe(recipe, str(tmp_path))
    assert scan_document(document) == []
    parse_manifest(json.dumps(document, indent=2).encode())


@pytest.mark.parametrize(("name", "text"), BENIGN, ids=[b[0] for b in BENIGN])
def test_ordinary_manifest_strings_are_not_credentials_as_values_or_keys(
    name: str, text: str
) -> None:
    assert scan_document({"value": text, "list": [text], text: 1}) == []


def test_a_valid_manifest_full_of_digests_and_uris_parses(doc: Doc) -> None:
    for index, (_, text) in enumerate(
        b for b in BENIGN if b[1].startswith(("file:", "s3:", "gs:", "https:"))
    ):
        template = dict(doc["data"][0])
        doc["data"].append(template | {"id": f"extra-{index}", "uri": text})
    parse_manifest(json.dumps(doc).encode())


def test_an_unknown_field_name_is_not_echoed_when_it_is_not_a_plain_name(doc: Doc) -> None:
    odd = "not a field name: " + "x" * 100
    doc["model"][odd] = 1
    with pytest.raises(ItoError) as info:
        parse_manifest(json.dumps(doc).encode())
    assert info.value.code == "manifest_invalid"
    assert odd not in json.dumps(info.value.to_error_body())
