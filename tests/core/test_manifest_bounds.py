"""Every list and map of a manifest is bounded, so validation is linear in a small fixed maximum:
one item past a bound is ``manifest_invalid`` at that list's path, and the adversarial maximal
manifest (every list at its bound, every data reference decontaminated against every eval suite,
the cross-field check that used to rebuild a set per suite) is valid. CPU cost is measured in
``bench/manifest_validation.py``, never asserted here."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import pytest

from ito.core.errors import ItoError
from ito.core.manifest import (
    MANIFEST_MAX_BYTES,
    MAX_BATTERIES,
    MAX_DATA_REFS,
    MAX_EVALS_PER_BATTERY,
    MAX_IDS_PER_LIST,
    MAX_LICENSES,
    MAX_SUITES,
    parse_manifest,
)
from tests.core.manifest_worst_case import anchor_heavy_manifest, worst_case_manifest

Doc = dict[str, Any]


def _pretrain(doc: Doc) -> Doc:
    ref: Doc = next(d for d in doc["data"] if d["role"] == "pretrain")
    return ref


def _grow_data(doc: Doc, n: int) -> str:
    template = _pretrain(doc)
    doc["data"] += [template | {"id": f"extra-{i}"} for i in range(n - len(doc["data"]))]
    return "$.data"


def _grow_stage_data(doc: Doc, n: int) -> str:
    doc["curriculum"][0]["data"] = [_pretrain(doc)["id"]] * n
    return "$.curriculum[0].data"


def _grow_suites(doc: Doc, n: int) -> str:
    ref = _pretrain(doc)
    ref["decontamination"]["eval_suites"] = ref["decontamination"]["eval_suites"][:1] * n
    return f"$.data[{doc['data'].index(ref)}].decontamination.eval_suites"


def _grow_batteries(doc: Doc, n: int) -> str:
    battery = next(iter(doc["eval_batteries"].values()))
    doc["eval_batteries"] |= {f"b{i}": battery for i in range(n - len(doc["eval_batteries"]))}
    return "$.eval_batteries"


def _grow_battery(doc: Doc, n: int) -> str:
    name, battery = next(iter(doc["eval_batteries"].items()))
    doc["eval_batteries"][name] = battery[:1] * n
    return f"$.eval_batteries.{name}"


def _grow_licenses(doc: Doc, n: int) -> str:
    doc["data_policy"]["allowed_licenses"] = [f"lic-{i}" for i in range(n)]
    return "$.data_policy.allowed_licenses"


def _grow_accelerators(doc: Doc, n: int) -> str:
    doc["resources"]["accelerators"] = ["cpu"] * n
    return "$.resources.accelerators"


BOUNDED: dict[str, tuple[Callable[[Doc, int], str], int]] = {
    "data": (_grow_data, MAX_DATA_REFS),
    "stage_data": (_grow_stage_data, MAX_IDS_PER_LIST),
    "eval_suites": (_grow_suites, MAX_SUITES),
    "eval_batteries": (_grow_batteries, MAX_BATTERIES),
    "evals_per_battery": (_grow_battery, MAX_EVALS_PER_BATTERY),
    "allowed_licenses": (_grow_licenses, MAX_LICENSES),
    "accelerators": (_grow_accelerators, 5),
}


@pytest.mark.parametrize("name", sorted(BOUNDED))
def test_a_list_one_past_its_bound_is_refused_at_its_path(doc: Doc, name: str) -> None:
    grow, bound = BOUNDED[name]
    path = grow(doc, bound + 1)
    with pytest.raises(ItoError) as info:
        parse_manifest(json.dumps(doc).encode())
    assert info.value.code == "manifest_invalid"
    assert path in {e["path"] for e in info.value.details["errors"]}


@pytest.mark.parametrize("name", sorted(BOUNDED))
def test_a_list_at_its_bound_is_not_refused_for_its_length(doc: Doc, name: str) -> None:
    grow, bound = BOUNDED[name]
    path = grow(doc, bound)
    try:
        parse_manifest(json.dumps(doc).encode())
    except ItoError as exc:
        assert exc.code == "manifest_invalid"
        assert path not in {e["path"] for e in exc.details["errors"]}


def test_an_over_long_licence_string_is_refused(doc: Doc) -> None:
    doc["data_policy"]["allowed_licenses"] = ["x" * 65]
    with pytest.raises(ItoError) as info:
        parse_manifest(json.dumps(doc).encode())
    assert info.value.code == "manifest_invalid"
    assert info.value.details["errors"][0]["path"] == "$.data_policy.allowed_licenses[0]"


def test_the_adversarial_maximal_manifest_is_valid_and_within_the_size_bound() -> None:
    raw = worst_case_manifest()
    assert len(raw) <= MANIFEST_MAX_BYTES
    manifest = parse_manifest(raw)
    assert len(manifest.data) == MAX_DATA_REFS


def test_the_anchor_heavy_manifest_is_valid_and_within_the_size_bound() -> None:
    # The bench's worst case for the secret scan: every expression runs, and finds nothing.
    raw = anchor_heavy_manifest()
    assert MANIFEST_MAX_BYTES - 4096 <= len(raw) <= MANIFEST_MAX_BYTES
    parse_manifest(raw)


def test_schema_errors_are_bounded_in_number(doc: Doc) -> None:
    doc["data"] = [{"id": "UPPER"}] * MAX_DATA_REFS
    with pytest.raises(ItoError) as info:
        parse_manifest(json.dumps(doc).encode())
    assert info.value.code == "manifest_invalid"
    assert 0 < len(info.value.details["errors"]) <= 50


def test_an_object_with_more_keys_than_any_valid_one_is_refused_once_at_its_path(doc: Doc) -> None:
    doc["model"] |= {f"k{i}": 0 for i in range(MAX_BATTERIES + 1)}
    with pytest.raises(ItoError) as info:
        parse_manifest(json.dumps(doc).encode())
    assert info.value.code == "manifest_invalid"
    assert [e["path"] for e in info.value.details["errors"]] == ["$.model"]


def test_an_array_longer_than_any_valid_one_is_refused_once_at_its_path(doc: Doc) -> None:
    doc["extra"] = [{"x": 1}] * (MAX_DATA_REFS + 1)
    with pytest.raises(ItoError) as info:
        parse_manifest(json.dumps(doc).encode())
    assert info.value.code == "manifest_invalid"
    assert [e["path"] for e in info.value.details["errors"]] == ["$.extra"]
