"""The manifest parser: strict schema, exact-bytes digest, size bound, secret refusal and the
cross-field checks, each refusal carrying the JSON path of what is wrong (DESIGN §5.3)."""

from __future__ import annotations

import dataclasses
import hashlib
import json
from collections.abc import Callable
from typing import Any

import pytest

from ito.core.errors import ItoError
from ito.core.manifest import (
    MANIFEST_MAX_BYTES,
    Manifest,
    manifest_digest,
    manifest_json_schema,
    manifest_summary,
    parse_manifest,
)
from ito.core.planner import Parallelism
from tests.core.conftest import with_post_training

Doc = dict[str, Any]


@pytest.fixture
def doc(doc: Doc) -> Doc:
    """The test recipe's manifest with every post-training stage: the whole schema is checked
    here, although the runtime refuses post-training at plan."""
    return with_post_training(doc)


def _raw(document: Any) -> bytes:
    return json.dumps(document).encode()


def _refusal(raw: bytes) -> ItoError:
    with pytest.raises(ItoError) as info:
        parse_manifest(raw)
    return info.value


def _paths(exc: ItoError) -> list[str]:
    return [err["path"] for err in exc.details["errors"]]


# --- valid manifests and the digest ---------------------------------------------------------


def test_the_test_recipe_parses_into_a_manifest(doc: Doc) -> None:
    manifest = parse_manifest(_raw(doc))
    assert isinstance(manifest, Manifest)
    assert manifest.name == doc["name"]
    assert [stage.stage for stage in manifest.curriculum] == [
        "pretrain",
        "midtrain",
        "long_context",
    ]
    assert set(manifest.data_by_id()) == {d["id"] for d in doc["data"]}


def test_digest_is_sha256_of_the_exact_bytes(doc: Doc) -> None:
    raw = _raw(doc)
    assert manifest_digest(raw) == "sha256:" + hashlib.sha256(raw).hexdigest()


def test_a_whitespace_change_gives_a_different_digest_of_an_equally_valid_manifest(
    doc: Doc,
) -> None:
    compact = json.dumps(doc, separators=(",", ":")).encode()
    indented = json.dumps(doc, indent=2).encode()
    parse_manifest(compact)
    parse_manifest(indented)
    assert manifest_digest(compact) != manifest_digest(indented)


def test_a_manifest_of_exactly_the_size_bound_is_accepted(doc: Doc) -> None:
    raw = _raw(doc)
    padded = raw + b" " * (MANIFEST_MAX_BYTES - len(raw))
    assert len(padded) == MANIFEST_MAX_BYTES
    parse_manifest(padded)


def test_a_manifest_one_byte_over_the_size_bound_is_too_large(doc: Doc) -> None:
    raw = _raw(doc)
    padded = raw + b" " * (MANIFEST_MAX_BYTES + 1 - len(raw))
    assert _refusal(padded).code == "manifest_too_large"


# --- strict schema --------------------------------------------------------------------------


def test_an_unknown_top_level_field_is_refused_with_its_path(doc: Doc) -> None:
    doc["extra"] = 1
    exc = _refusal(_raw(doc))
    assert exc.code == "manifest_invalid"
    assert "$.extra" in _paths(exc)


def test_an_unknown_nested_field_is_refused_with_its_path(doc: Doc) -> None:
    doc["model"]["layers"] = 2
    exc = _refusal(_raw(doc))
    assert exc.code == "manifest_invalid"
    assert "$.model.layers" in _paths(exc)


def test_a_number_written_as_a_string_is_not_coerced(doc: Doc) -> None:
    doc["budget"]["ceiling_usd"] = "5.0"
    exc = _refusal(_raw(doc))
    assert exc.code == "manifest_invalid"
    assert "$.budget.ceiling_usd" in _paths(exc)


@pytest.mark.parametrize("value", [True, 2000.0, "2000"], ids=["bool", "float", "string"])
def test_an_integer_field_accepts_only_json_integers(doc: Doc, value: Any) -> None:
    doc["curriculum"][0]["tokens"] = value
    exc = _refusal(_raw(doc))
    assert exc.code == "manifest_invalid"
    assert "$.curriculum[0].tokens" in _paths(exc)


def test_an_error_inside_a_list_is_reported_with_its_index(doc: Doc) -> None:
    doc["data"][2]["sha256"] = "not-a-digest"
    exc = _refusal(_raw(doc))
    assert exc.code == "manifest_invalid"
    assert "$.data[2].sha256" in _paths(exc)


def test_every_reported_error_has_a_path_and_a_message(doc: Doc) -> None:
    doc["extra"] = 1
    doc["budget"]["ceiling_usd"] = "5.0"
    exc = _refusal(_raw(doc))
    assert len(exc.details["errors"]) >= 2
    for err in exc.details["errors"]:
        assert err["path"].startswith("$")
        assert isinstance(err["message"], str) and err["message"]


def test_a_repeated_json_key_is_refused(doc: Doc) -> None:
    raw = _raw(doc)
    duplicated = b'{"name": "other-name", ' + raw[1:]
    exc = _refusal(duplicated)
    assert exc.code == "manifest_invalid"


def test_a_key_repeated_deep_inside_the_document_is_refused(doc: Doc) -> None:
    raw = _raw(doc).replace(b'"family": "llama"', b'"family": "llama", "family": "llama"', 1)
    assert raw != _raw(doc)
    assert _refusal(raw).code == "manifest_invalid"


@pytest.mark.parametrize("constant", [b"NaN", b"Infinity", b"-Infinity"])
def test_non_json_number_constants_are_refused(doc: Doc, constant: bytes) -> None:
    raw = _raw(doc).replace(b'"max_contamination": 0.0', b'"max_contamination": ' + constant, 1)
    assert raw != _raw(doc)
    assert _refusal(raw).code == "manifest_invalid"


def test_deeply_nested_json_within_the_size_bound_is_refused_as_invalid() -> None:
    depth = 100_000
    assert _refusal(b"[" * depth + b"]" * depth).code == "manifest_invalid"


@pytest.mark.parametrize(
    "raw",
    [b"\xff\xfe{}", b'{"name": "caf\xe9"}', b"{not json", b"", b'{"a": 1} trailing'],
    ids=["bad-utf8-bom", "latin1-byte", "broken-json", "empty", "trailing-garbage"],
)
def test_bytes_that_are_not_utf8_json_are_refused(raw: bytes) -> None:
    assert _refusal(raw).code == "manifest_invalid"


@pytest.mark.parametrize("document", [[], "text", 3, None])
def test_a_json_document_that_is_not_an_object_is_refused(document: Any) -> None:
    exc = _refusal(_raw(document))
    assert exc.code == "manifest_invalid"
    assert _paths(exc) == ["$"]


# --- secrets --------------------------------------------------------------------------------

PEM = (
    "-----BEGIN RSA PRIVATE KEY-----\nMIIEowIBAAKCAQEAzQ8mYpl3xPq7Uv\n-----END RSA PRIVATE KEY-----"
)


def _set(path: tuple[Any, ...], value: Any) -> Callable[[Doc], None]:
    def apply(doc: Doc) -> None:
        target: Any = doc
        for part in path[:-1]:
            target = target[part]
        target[path[-1]] = value

    return apply


SECRET_CASES = [
    ("pem", _set(("name",), PEM), "MIIEowIBAAKCAQEAzQ8mYpl3xPq7Uv", "$.name", "private_key"),
    (
        "bearer",
        _set(("checkpoint", "storage"), "Bearer abcDEF123456ghiJKL789"),
        "abcDEF123456ghiJKL789",
        "$.checkpoint.storage",
        "bearer_token",
    ),
    (
        "aws",
        _set(("data", 0, "license"), "AKIAQWERTYUIOPASDFGH"),
        "AKIAQWERTYUIOPASDFGH",
        "$.data[0].license",
        "cloud_key",
    ),
    (
        "password-known-place",
        _set(("model", "password"), "CorrectHorse42"),
        "CorrectHorse42",
        "$.model.password",
        "password_field",
    ),
    (
        "password-unknown-field",
        _set(("extra",), {"nested": {"password": "CorrectHorse42"}}),
        "CorrectHorse42",
        "$.extra.nested.password",
        "password_field",
    ),
    (
        "uri-userinfo",
        _set(("data", 1, "uri"), "s3://alice:Sup3rS3cretPw@bucket.example/x"),
        "Sup3rS3cretPw",
        "$.data[1].uri",
        "uri_userinfo",
    ),
]


@pytest.mark.parametrize(
    ("mutate", "secret", "path", "kind"),
    [case[1:] for case in SECRET_CASES],
    ids=[case[0] for case in SECRET_CASES],
)
def test_a_credential_anywhere_is_refused_naming_where_but_never_echoing_it(
    doc: Doc, mutate: Callable[[Doc], None], secret: str, path: str, kind: str
) -> None:
    mutate(doc)
    exc = _refusal(_raw(doc))
    assert exc.code == "manifest_contains_secret"
    assert {"path": path, "kind": kind} in exc.details["findings"]
    for rendered in (
        str(exc),
        repr(exc),
        exc.message,
        repr(exc.details),
        json.dumps(exc.to_error_body()),
    ):
        assert secret not in rendered


def test_secrets_are_refused_before_the_schema_so_an_unknown_field_cannot_hide_one(
    doc: Doc,
) -> None:
    doc["api_key"] = "k-123456789"
    assert _refusal(_raw(doc)).code == "manifest_contains_secret"


@pytest.mark.parametrize("duplicated", [False, True], ids=["unknown-key", "duplicated-key"])
def test_a_credential_used_as_a_key_is_refused_without_echoing_it(
    doc: Doc, duplicated: bool
) -> None:
    secret = "AKIAQWERTYUIOPASDFGH"
    doc["extra"] = {secret: 1}
    raw = _raw(doc)
    if duplicated:
        raw = raw.replace(
            b'{"' + secret.encode() + b'": 1}',
            b'{"' + secret.encode() + b'": 1, "' + secret.encode() + b'": 2}',
        )
    exc = _refusal(raw)
    assert exc.code in {"manifest_contains_secret", "manifest_invalid"}
    assert secret not in json.dumps(exc.to_error_body())
    assert secret not in str(exc)


# --- cross-field checks ---------------------------------------------------------------------


def _swap_stages(doc: Doc) -> None:
    doc["curriculum"].reverse()


def _exact_match_with_max(doc: Doc) -> None:
    doc["eval_batteries"]["arith"][0] = {"eval": "exact_match", "data": "arith-heldout", "max": 0.5}


def _clip_inverted(doc: Doc) -> None:
    doc["post_training"]["rlvr"]["dapo"].update(clip_low=0.3, clip_high=0.2)


def _ladder_without_custom_data(doc: Doc) -> None:
    doc["ladder"]["enabled"] = True


def _custom_data_without_a_reference_mix(doc: Doc) -> None:
    doc["data"][0]["custom"] = True  # web, the pretrain stage's only data
    doc["ladder"]["enabled"] = True


def _proxy_shorter_than_the_stage(doc: Doc) -> None:
    doc["data"][1]["custom"] = True  # arith-mid, beside web in the pretrain stage
    doc["curriculum"][0]["data"] = ["web", "arith-mid"]
    doc["curriculum"][0]["seq_len"] = 2048
    doc["model"]["size"] = "150m"
    doc["ladder"].update(enabled=True, proxy_size="tiny")


def _nvlink_two_nodes(doc: Doc) -> None:
    doc["resources"].update(nodes=2, fabrics=["nvlink"])


def _replicas_across_nodes(doc: Doc) -> None:
    # 3 nodes × 2 = 6 accelerators in 2 groups would split a node between groups.
    doc["resources"].update(nodes=3, gpus_per_node=2, replica_groups=2, fabrics=["infiniband"])


def _pinned_replicas_off_groups(doc: Doc) -> None:
    doc["resources"].update(replica_groups=2, parallelism={"dp_replicate": 1})


CROSS_FIELD_CASES = [
    ("unknown-data-id", _set(("curriculum", 0, "data"), ["nope"]), "$.curriculum[0].data[0]"),
    ("stage-order", _swap_stages, "$.curriculum[1].stage"),
    ("battery-missing", _set(("curriculum", 0, "battery"), "absent"), "$.curriculum[0].battery"),
    ("exact-match-with-max", _exact_match_with_max, "$.eval_batteries.arith[0]"),
    ("custom-without-ladder", _set(("data", 0, "custom"), True), "$.ladder.enabled"),
    ("ladder-without-custom-data", _ladder_without_custom_data, "$.ladder.enabled"),
    ("custom-without-reference-mix", _custom_data_without_a_reference_mix, "$.curriculum[0].data"),
    ("ladder-proxy-too-short", _proxy_shorter_than_the_stage, "$.ladder.proxy_size"),
    ("clip-low-above-high", _clip_inverted, "$.post_training.rlvr.dapo.clip_high"),
    (
        "incremental-above-ceiling",
        _set(("budget", "max_incremental_cost_usd"), 6.0),
        "$.budget.max_incremental_cost_usd",
    ),
    ("wrong-role", _set(("post_training", "sft", "data"), ["web"]), "$.post_training.sft.data[0]"),
    ("nvlink-between-nodes", _nvlink_two_nodes, "$.resources.fabrics"),
    ("duplicate-data-id", _set(("data", 1, "id"), "web"), "$.data[1].id"),
    (
        "decontaminated-against-non-eval",
        _set(("data", 0, "decontamination", "eval_suites"), ["arith-sft"]),
        "$.data[0].decontamination.eval_suites[0]",
    ),
    (
        "exact-match-min-above-one",
        _set(("eval_batteries", "arith", 0, "min"), 1.5),
        "$.eval_batteries.arith[0].min",
    ),
    (
        "soft-tokens-not-below-max",
        _set(("post_training", "rlvr", "dapo", "overlong", "soft_tokens"), 32),
        "$.post_training.rlvr.dapo.overlong.soft_tokens",
    ),
    ("seq-len-over-model", _set(("curriculum", 1, "seq_len"), 4096), "$.curriculum[1].seq_len"),
    (
        "post-seq-len-over-context",
        _set(("post_training", "sft", "seq_len"), 512),
        "$.post_training.sft.seq_len",
    ),
    (
        "rlvr-completion-filling-seq-len",
        _set(("post_training", "rlvr", "seq_len"), 32),
        "$.post_training.rlvr.dapo.overlong.max_tokens",
    ),
    (
        "replica-groups-not-dividing",
        _set(("resources", "replica_groups"), 3),
        "$.resources.replica_groups",
    ),
    ("replica-groups-splitting-nodes", _replicas_across_nodes, "$.resources.replica_groups"),
    (
        "pinned-degrees-not-the-world",
        _set(
            ("resources", "parallelism"),
            {"dp_replicate": 1, "dp_shard": 1, "tp": 1, "pp": 1, "cp": 1},
        ),
        "$.resources.parallelism",
    ),
    (
        "pinned-degrees-not-dividing-the-world",
        _set(("resources", "parallelism"), {"pp": 3}),
        "$.resources.parallelism",
    ),
    (
        "pinned-tp-not-dividing-a-node",
        _set(("resources", "parallelism"), {"tp": 4}),
        "$.resources.parallelism.tp",
    ),
    (
        "pinned-replicas-not-the-groups",
        _pinned_replicas_off_groups,
        "$.resources.parallelism.dp_replicate",
    ),
]


@pytest.mark.parametrize(
    ("mutate", "path"),
    [case[1:] for case in CROSS_FIELD_CASES],
    ids=[case[0] for case in CROSS_FIELD_CASES],
)
def test_a_cross_field_inconsistency_is_refused_with_its_path(
    doc: Doc, mutate: Callable[[Doc], None], path: str
) -> None:
    mutate(doc)
    exc = _refusal(_raw(doc))
    assert exc.code == "manifest_invalid"
    assert path in _paths(exc)


def test_replica_groups_default_to_one_and_may_split_a_node_or_take_whole_nodes(doc: Doc) -> None:
    assert parse_manifest(_raw(doc)).resources.replica_groups == 1
    doc["resources"]["replica_groups"] = 2  # one node, 2 processes: one each
    assert parse_manifest(_raw(doc)).resources.replica_groups == 2
    doc["resources"].update(nodes=4, gpus_per_node=8, fabrics=["infiniband"])
    assert parse_manifest(_raw(doc)).resources.replica_groups == 2  # two nodes each


def test_pinned_parallelism_is_optional_and_parsed_into_the_planner_s_pins(doc: Doc) -> None:
    assert parse_manifest(_raw(doc)).resources.parallelism is None
    doc["resources"]["parallelism"] = {
        "dp_shard": 2,
        "micro_batch": 2,
        "activation_checkpointing": "selective",
    }
    pins = parse_manifest(_raw(doc)).resources.parallelism
    assert pins is not None
    assert Parallelism.from_mapping(pins.model_dump(exclude_none=True)) == Parallelism(
        dp_shard=2, micro_batch=2, activation_checkpointing="selective"
    )


@pytest.mark.parametrize(
    ("pins", "path"),
    [
        ({"tp": 0}, "$.resources.parallelism.tp"),
        ({"dp_shard": "2"}, "$.resources.parallelism.dp_shard"),
        ({"activation_checkpointing": "some"}, "$.resources.parallelism.activation_checkpointing"),
        ({"zero": 3}, "$.resources.parallelism.zero"),
    ],
    ids=["zero-degree", "string-degree", "unknown-checkpointing", "unknown-key"],
)
def test_a_malformed_pinned_parallelism_is_refused_with_its_path(
    doc: Doc, pins: Doc, path: str
) -> None:
    doc["resources"]["parallelism"] = pins
    exc = _refusal(_raw(doc))
    assert exc.code == "manifest_invalid"
    assert path in _paths(exc)


def test_the_published_schema_describes_the_pinned_parallelism() -> None:
    schema = manifest_json_schema()
    pins = schema["$defs"]["ParallelismPins"]
    assert set(pins["properties"]) == {f.name for f in dataclasses.fields(Parallelism)}
    assert pins["additionalProperties"] is False


def test_custom_data_is_accepted_when_the_ladder_is_enabled(doc: Doc) -> None:
    doc["data"][1]["custom"] = True  # arith-mid, beside web: web is the reference mix
    doc["curriculum"][0]["data"] = ["web", "arith-mid"]
    doc["ladder"]["enabled"] = True
    assert parse_manifest(_raw(doc)).ladder.enabled


# --- published schema -----------------------------------------------------------------------


def test_the_published_schema_is_named_and_closed() -> None:
    schema = manifest_json_schema()
    assert schema["$id"] == "ito.training.manifest.v1"
    assert schema["additionalProperties"] is False
    assert "schema" in schema["properties"]
    assert "schema" in schema["required"]


# --- the curriculum's stages --------------------------------------------------------------------


def test_only_the_long_context_stage_scales_the_rope_base(doc: Doc) -> None:
    doc["curriculum"][0]["rope_base_scale"] = 2.0
    with pytest.raises(ItoError) as refused:
        parse_manifest(_raw(doc))
    assert refused.value.code == "manifest_invalid"
    assert _paths(refused.value) == ["$.curriculum[0].rope_base_scale"]


def test_a_long_context_stage_no_longer_than_an_earlier_stage_is_refused(doc: Doc) -> None:
    doc["curriculum"][-1]["seq_len"] = doc["curriculum"][0]["seq_len"]
    with pytest.raises(ItoError) as refused:
        parse_manifest(_raw(doc))
    assert refused.value.code == "manifest_invalid"
    assert _paths(refused.value) == [f"$.curriculum[{len(doc['curriculum']) - 1}].seq_len"]


@pytest.mark.parametrize("scale", [0.5, 0, 1001, "2"])
def test_a_rope_base_scale_out_of_range_is_refused(doc: Doc, scale: object) -> None:
    doc["curriculum"][-1]["rope_base_scale"] = scale
    with pytest.raises(ItoError) as refused:
        parse_manifest(_raw(doc))
    assert refused.value.code == "manifest_invalid"


# --- the model's tokenizer ----------------------------------------------------------------------

TOKENIZER_SHA256 = "ab" * 32


@pytest.mark.parametrize(
    "uri",
    ["file:///data/tokenizer.json", "/data/tokenizer.json", "s3://bucket/tokenizer.json"],
    ids=["file-uri", "absolute-path", "s3-refused-at-plan-not-here"],
)
def test_a_named_tokenizer_is_optional_and_shown_to_the_approver(doc: Doc, uri: str) -> None:
    assert parse_manifest(_raw(doc)).model.tokenizer is None
    assert "tokenizer" not in manifest_summary(parse_manifest(_raw(doc)))["model"]
    doc["model"]["tokenizer"] = {"uri": uri, "sha256": TOKENIZER_SHA256}
    manifest = parse_manifest(_raw(doc))
    assert manifest.model.tokenizer is not None
    assert (manifest.model.tokenizer.uri, manifest.model.tokenizer.sha256) == (
        uri,
        TOKENIZER_SHA256,
    )
    assert manifest_summary(manifest)["model"]["tokenizer"] == doc["model"]["tokenizer"]


@pytest.mark.parametrize(
    ("tokenizer", "path"),
    [
        ({"uri": "tokenizer.json", "sha256": TOKENIZER_SHA256}, "$.model.tokenizer.uri"),
        ({"uri": "ftp://host/tokenizer.json", "sha256": TOKENIZER_SHA256}, "$.model.tokenizer.uri"),
        ({"uri": "", "sha256": TOKENIZER_SHA256}, "$.model.tokenizer.uri"),
        ({"uri": "/t.json", "sha256": "AB" * 32}, "$.model.tokenizer.sha256"),
        ({"uri": "/t.json", "sha256": "ab" * 31}, "$.model.tokenizer.sha256"),
        ({"uri": "/t.json"}, "$.model.tokenizer.sha256"),
        ({"uri": "/t.json", "sha256": TOKENIZER_SHA256, "vocab": 512}, "$.model.tokenizer.vocab"),
        ("/t.json", "$.model.tokenizer"),
    ],
    ids=[
        "relative-path",
        "unknown-scheme",
        "empty-uri",
        "uppercase-digest",
        "short-digest",
        "no-digest",
        "unknown-field",
        "not-an-object",
    ],
)
def test_a_malformed_tokenizer_is_refused_with_its_path(
    doc: Doc, tokenizer: Any, path: str
) -> None:
    doc["model"]["tokenizer"] = tokenizer
    exc = _refusal(_raw(doc))
    assert exc.code == "manifest_invalid"
    assert path in _paths(exc)


POST_TRAINING_NUMBERS = [
    # (stage, field, value, accepted): DPO's rpo_alpha is a weight in [0, 10]; RLVR's
    # temperature lies in (0, 2].
    *(
        ("dpo", "rpo_alpha", v, ok)
        for v, ok in [(-0.5, False), (0.0, True), (1.0, True), (11, False)]
    ),
    *(
        ("rlvr", "temperature", v, ok)
        for v, ok in [
            (0.0, False),
            (-0.7, False),
            (0.01, True),
            (0.7, True),
            (2.0, True),
            (2.5, False),
        ]
    ),
]


@pytest.mark.parametrize(("stage", "field", "value", "valid"), POST_TRAINING_NUMBERS)
def test_a_post_training_number_is_accepted_within_its_bounds_and_refused_outside(
    doc: Doc, stage: str, field: str, value: float, valid: bool
) -> None:
    doc["post_training"][stage][field] = value
    if valid:
        recipe = getattr(parse_manifest(_raw(doc)).post_training, stage)
        assert getattr(recipe, field) == value
        return
    exc = _refusal(_raw(doc))
    assert exc.code == "manifest_invalid"
    assert f"$.post_training.{stage}.{field}" in _paths(exc)


@pytest.mark.parametrize(
    ("stage", "field", "default"), [("dpo", "rpo_alpha", 0.0), ("rlvr", "temperature", 1.0)]
)
def test_a_post_training_number_left_out_takes_its_default(
    doc: Doc, stage: str, field: str, default: float
) -> None:
    """No rpo_alpha: plain DPO; no temperature: RLVR samples at 1."""
    doc["post_training"][stage].pop(field, None)
    recipe = getattr(parse_manifest(_raw(doc)).post_training, stage)
    assert getattr(recipe, field) == default
