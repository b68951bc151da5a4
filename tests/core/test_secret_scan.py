"""The credential scanner: finds credential-shaped values by kind and place, never by value, and
leaves ordinary manifest content alone."""

from __future__ import annotations

import hashlib
import json
from typing import Any

import pytest

from ito.core.secret_scan import scan_json_value, scan_text
from ito.recipes import build_recipe

POSITIVES = [
    (
        "pem-rsa",
        "-----BEGIN RSA PRIVATE KEY-----\nMIIEow\n-----END RSA PRIVATE KEY-----",
        "private_key",
    ),
    ("pem-openssh", "-----BEGIN OPENSSH PRIVATE KEY-----", "private_key"),
    ("pem-pkcs8", "-----BEGIN PRIVATE KEY-----", "private_key"),
    ("bearer", "Authorization: Bearer abcDEF123456ghiJKL789", "bearer_token"),
    ("bearer-lowercase", "bearer abcdefghijklmnop", "bearer_token"),
    ("aws-akia", "AKIAQWERTYUIOPASDFGH", "cloud_key"),
    ("aws-asia", "key ASIAQWERTYUIOPASDFGH here", "cloud_key"),
    ("google", "AIza" + "B" * 35, "cloud_key"),
    ("github", "ghp_" + "a1B2" * 9, "api_token"),
    ("gitlab", "glpat-" + "x" * 20, "api_token"),
    ("slack", "xoxb-1234567890-abcdef", "api_token"),
    ("openai-style", "sk-" + "Q" * 24, "api_token"),
    ("hugging-face", "hf_" + "Z" * 34, "api_token"),
    ("ito-key", "ito_live_AbCd1234_" + "s" * 24, "api_token"),
    ("jwt", "eyJhbGciOiJIUzI1.eyJzdWIiOiIxMjM0.SflKxwRJSMeKKF2Q", "jwt"),
    ("uri-user-password", "s3://alice:Sup3rS3cret@bucket.example/x", "uri_userinfo"),
    ("uri-user-only", "https://ghp_token_value@github.example/repo", "uri_userinfo"),
    ("password-assignment", "password=hunter2hunter2", "secret_assignment"),
    ("api-key-assignment", "API_KEY: 0123456789abcdef", "secret_assignment"),
]


@pytest.mark.parametrize(
    ("text", "kind"), [p[1:] for p in POSITIVES], ids=[p[0] for p in POSITIVES]
)
def test_a_credential_shaped_text_is_found_with_its_kind(text: str, kind: str) -> None:
    findings = scan_text(text, path="argv[3]")
    assert kind in {f.kind for f in findings}
    assert {f.path for f in findings} == {"argv[3]"}


def test_a_finding_carries_only_kind_and_place_never_the_value() -> None:
    secret = "AKIAQWERTYUIOPASDFGH"
    (finding,) = scan_text(secret)
    assert finding.path == "$"
    assert secret not in repr(finding)


def test_the_same_kind_at_the_same_place_is_reported_once() -> None:
    findings = scan_text("AKIAQWERTYUIOPASDFGH and AKIAZXCVBNMLKJHGFDSA")
    assert [f.kind for f in findings] == ["cloud_key"]


NEGATIVES = [
    ("sha256-hex", hashlib.sha256(b"x").hexdigest()),
    ("sha256-digest", "sha256:" + hashlib.sha256(b"x").hexdigest()),
    ("file-uri", "file:///srv/data/web.jsonl"),
    ("https-uri", "https://example.com/datasets/web.jsonl"),
    ("at-in-path", "https://example.com/pkg@1.0/file"),
    ("s3-uri", "s3://bucket/key/part-0001.jsonl"),
    ("password-in-prose", "choose a strong password for your account"),
    ("token-in-prose", "the model reads every token and the bearer of bad news"),
    ("short-akia", "AKIA1234"),
    ("empty", ""),
]


@pytest.mark.parametrize("text", [n[1] for n in NEGATIVES], ids=[n[0] for n in NEGATIVES])
def test_ordinary_text_is_not_a_credential(text: str) -> None:
    assert scan_text(text) == []


def test_a_secret_named_field_is_found_whatever_its_value_looks_like() -> None:
    findings = scan_json_value({"model": {"password": "x"}})
    assert [(f.kind, f.path) for f in findings] == [("password_field", "$.model.password")]


@pytest.mark.parametrize(
    "field",
    [
        "password",
        "PASSWORD",
        "passwd",
        "secret",
        "api_key",
        "access_token",
        "token",
        "client_secret",
        "credentials",
    ],
)
def test_every_secret_field_name_is_recognised(field: str) -> None:
    findings = scan_json_value({field: "value"})
    assert ("password_field", f"$.{field}") in {(f.kind, f.path) for f in findings}


@pytest.mark.parametrize("empty", [None, "", [], {}])
def test_an_empty_secret_field_is_not_a_finding(empty: Any) -> None:
    assert scan_json_value({"password": empty}) == []


def test_paths_follow_lists_and_quote_unusual_keys() -> None:
    document = {
        "data": [{"uri": "file:///ok"}, {"uri": "s3://u:p4ss@h/x"}],
        "odd key": {"password": "x"},
    }
    paths = {(f.kind, f.path) for f in scan_json_value(document)}
    assert ("uri_userinfo", "$.data[1].uri") in paths
    assert ("password_field", '$["odd key"].password') in paths


def test_a_credential_used_as_a_key_is_found() -> None:
    findings = scan_json_value({"AKIAQWERTYUIOPASDFGH": 1})
    assert [f.kind for f in findings] == ["cloud_key"]


def test_a_credential_used_as_a_key_does_not_appear_in_any_finding_path() -> None:
    secret = "AKIAQWERTYUIOPASDFGH"
    findings = scan_json_value({"extra": {secret: {"password": "x"}}})
    assert findings
    assert all(secret not in f.path for f in findings)


def test_numbers_and_booleans_are_never_credentials() -> None:
    assert (
        scan_json_value({"tokens": 2000, "max_tokens": 32, "custom": False, "beta": 0.1, "n": None})
        == []
    )


def test_the_test_recipe_manifest_has_no_findings(tmp_path: Any) -> None:
    manifest = build_recipe("test", str(tmp_path)).manifest
    assert scan_json_value(json.loads(json.dumps(manifest))) == []


def test_secret_field_names_among_many_keys_are_each_found() -> None:
    from ito.core.secret_scan import _SECRET_FIELD, _secret_fields

    keys = {f"k{i}" for i in range(1000)} | {
        "Password",
        "TOKEN\n",
        "x\npassword",
        "api_key2",
        "client_secret",
        "credential",
        "passwordx",
    }
    assert (
        _secret_fields(keys)
        == {k for k in keys if _SECRET_FIELD.match(k)}
        == {"Password", "TOKEN\n", "client_secret", "credential"}
    )
