"""The provenance report's model and the checks the server makes before binding it."""

from __future__ import annotations

import json
from typing import Any

import pytest

from ito.core.errors import ItoError
from ito.core.provenance import (
    PROVENANCE_MAX_BYTES,
    contamination_over,
    parse_provenance,
    provenance_digest,
    unbound_data,
    unbound_tokenizer,
)

HEX_A, HEX_B, HEX_C = "a" * 64, "b" * 64, "c" * 64


def _report(**edits: Any) -> dict[str, Any]:
    report: dict[str, Any] = {
        "schema": "ito.data_prep.provenance.v1",
        "manifest_name": "m",
        "parameters": {"max_contamination": 0.0},
        "datasets": [
            {
                "id": "web",
                "role": "pretrain",
                "uri": "file:///d/web.jsonl",
                "input_sha256": HEX_A,
                "counts": {
                    "input": 10,
                    "empty_removed": 1,
                    "exact_dupes_removed": 2,
                    "near_dupes_removed": 1,
                    "contaminated_removed": 1,
                    "output": 5,
                },
                "shard": "web.jsonl",
                "output_sha256": HEX_B,
                "output_bytes": 300,
            }
        ],
        "evals": [{"id": "arith", "items": 4, "contaminated": 0, "fraction": 0.0}],
        "eval_contaminated_fraction": 0.0,
    }
    report.update(edits)
    return report


def _raw(report: dict[str, Any]) -> bytes:
    return json.dumps(report).encode()


def test_a_well_formed_report_parses_and_lists_its_shard_digests() -> None:
    report = parse_provenance(_raw(_report()))
    assert report.shard_digests() == {"web": HEX_B}
    assert provenance_digest(b"x").startswith("sha256:") and len(provenance_digest(b"x")) == 71


@pytest.mark.parametrize(
    "broken",
    [
        b"not json",
        b"\xff\xfe",
        _raw(_report(schema="other.v2")),
        _raw(_report(datasets=[{"id": "web"}])),
        _raw(_report(eval_contaminated_fraction=2.0)),
        _raw(_report(datasets=_report()["datasets"] * 2)),  # a data set twice
        # Past the request's text guard (it travels base64-encoded), a bidi override or an
        # escape in any string, keys included, would reach the run's page.
        _raw(_report(manifest_name="m\u202egnp.exe")),
        _raw(_report(parameters={"max_contamination": 0.0, "note\x1b[2J": 1})),
        _raw({**_report(), "extra": [[{"deep": "\x00"}]]}),
        # Nesting: 200,000 levels answered 500 (a RecursionError); any past 16 is refused.
        b"[" * 200_000 + b"]" * 200_000,
        _raw({**_report(), "extra": json.loads("[" * 17 + "]" * 17)}),
    ],
)
def test_a_malformed_report_is_refused_invalid_arguments(broken: bytes) -> None:
    with pytest.raises(ItoError) as refused:
        parse_provenance(broken)
    assert refused.value.code == "invalid_arguments"


def test_counts_that_do_not_add_up_are_refused() -> None:
    report = _report()
    report["datasets"][0]["counts"]["output"] = 6
    with pytest.raises(ItoError) as refused:
        parse_provenance(_raw(report))
    assert refused.value.code == "invalid_arguments"


def test_an_oversized_report_is_refused_before_it_is_parsed() -> None:
    with pytest.raises(ItoError) as refused:
        parse_provenance(b" " * (PROVENANCE_MAX_BYTES + 1))
    assert refused.value.code == "request_too_large"


def test_unbound_data_names_every_difference_from_the_manifest() -> None:
    report = parse_provenance(_raw(_report()))
    assert unbound_data(report, {"web": HEX_A}) == []
    assert unbound_data(report, {"web": HEX_C}) == ["web"]  # other bytes
    assert unbound_data(report, {"web": HEX_A, "code": HEX_C}) == ["code"]  # not prepared
    assert unbound_data(report, {}) == ["web"]  # not in the manifest


def test_contamination_is_recomputed_from_the_counts_not_the_reported_fraction() -> None:
    evals = [{"id": "arith", "items": 4, "contaminated": 1, "fraction": 0.0}]
    report = parse_provenance(_raw(_report(evals=evals)))
    assert contamination_over(report, 0.0) == ["arith"]
    assert contamination_over(report, 0.25) == []
    assert contamination_over(report, 0.2) == ["arith"]


def _tokenizer(source: str, sha256: str = HEX_C) -> dict[str, Any]:
    return {"source": source, "sha256": sha256, "vocab": 512}


@pytest.mark.parametrize(
    ("tokenizer", "named", "unbound"),
    [
        (_tokenizer("trained"), None, False),
        (None, None, False),  # a report of an earlier preparation, which trained in the engine
        (_tokenizer("manifest"), None, True),
        (_tokenizer("manifest"), HEX_C, False),
        (_tokenizer("manifest", HEX_A), HEX_C, True),
        (_tokenizer("trained"), HEX_C, True),
        (None, HEX_C, True),
    ],
    ids=[
        "trained-none-named",
        "absent-none-named",
        "manifest-none-named",
        "the-named-one",
        "another-file",
        "trained-instead-of-named",
        "absent-but-named",
    ],
)
def test_the_report_s_tokenizer_must_be_the_one_the_manifest_asks_for(
    tokenizer: dict[str, Any] | None, named: str | None, unbound: bool
) -> None:
    report = parse_provenance(_raw(_report(tokenizer=tokenizer)))
    assert unbound_tokenizer(report, named) is unbound


@pytest.mark.parametrize(
    "tokenizer",
    [
        {"source": "downloaded", "sha256": HEX_C, "vocab": 512},
        {"source": "trained", "sha256": "C" * 64, "vocab": 512},
        {"source": "trained", "sha256": HEX_C, "vocab": 0},
        {"source": "trained", "sha256": HEX_C},
    ],
)
def test_a_malformed_tokenizer_entry_is_refused(tokenizer: dict[str, Any]) -> None:
    with pytest.raises(ItoError) as refused:
        parse_provenance(_raw(_report(tokenizer=tokenizer)))
    assert refused.value.code == "invalid_arguments"
