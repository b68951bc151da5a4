"""The capability gate in front of the training verbs (DESIGN §6.3): ``<client> capabilities
--json`` runs first, without any credential, and the credential-bearing call is spawned only
when every gate and lifecycle operation is advertised supported and labelled as reviewed.
Fake clients first, then the real ``ito`` client against a real server.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from ito.bridge.capabilities import REQUIRED_TRAINING_OPERATIONS
from tests.bridge.ecc_fakes import (
    all_supported,
    base_env,
    ecc,
    envelope,
    make_fake,
    with_change,
)
from tests.support import ITO, Tenant, run_cli

SECRETS = {
    "ITO_API_KEY": "ito_requester_key",
    "ITO_API_URL": "https://ito.example.test",
    "ITO_HOME": "/tmp/ito-home",
    "ITO_ALLOW_FILE_TOKEN": "1",
    "ITO_TIMEOUT": "9",
    "PYTHON_KEYRING_BACKEND": "keyring.backends.null.Keyring",
    "AWS_SECRET_ACCESS_KEY": "must-not-cross",
}
TRAINING = [
    ["plan", "--booking", "b", "--manifest", "/m.json"],
    ["confirm", "--action", "train", "--booking", "b", "--manifest", "/m.json"],
    [
        "train",
        "--booking",
        "b",
        "--manifest",
        "/m.json",
        "--confirmation-ref",
        "cfr_1",
        "--idempotency-key",
        "k-1",
    ],
    ["runs", "list"],
    ["runs", "logs", "run_1", "--follow"],
    ["runs", "cancel", "run_1", "--confirmation-ref", "cfr_2"],
    ["runs", "cleanup", "run_1"],
]


@pytest.mark.parametrize("args", TRAINING, ids=lambda a: " ".join(a[:2]))
def test_a_training_verb_is_forwarded_after_a_credential_free_probe(
    tmp_path: Path, args: list[str]
) -> None:
    fake = make_fake(tmp_path / "client")
    env = base_env(tmp_path, ECC_ITO_CLI_EXECUTABLE=str(fake.path), **SECRETS)
    result = ecc(["ito", *args, "--json"], env)
    assert result.rc == 0, result.stderr
    (probe,) = fake.probes()
    assert probe["argv"] == ["capabilities", "--json"]
    assert not [key for key in probe["env"] if key.startswith(("ITO_", "ECC_", "PYTHON"))]
    assert "AWS_SECRET_ACCESS_KEY" not in probe["env"]
    (call,) = fake.calls()
    assert call["argv"] == ["--json", *args]
    assert call["env"]["ITO_API_KEY"] == "ito_requester_key"
    assert "AWS_SECRET_ACCESS_KEY" not in call["env"]
    assert result.stdout == f"fake-client:{'|'.join(['--json', *args])}\n"


@pytest.mark.parametrize("operation", REQUIRED_TRAINING_OPERATIONS)
def test_one_unsupported_operation_refuses_every_training_verb_and_spawns_nothing_more(
    tmp_path: Path, operation: str
) -> None:
    fake = make_fake(
        tmp_path / "client", probe=envelope(with_change(operation, availability="unsupported"))
    )
    env = base_env(tmp_path, ECC_ITO_CLI_EXECUTABLE=str(fake.path), **SECRETS)
    for args in (["train", "--booking", "b"], ["plan"], ["runs", "show", "run_1"]):
        result = ecc(["ito", *args, "--json"], env)
        assert (result.rc, result.code) == (1, "capability_unavailable")
        assert result.envelope is not None and result.envelope["live_api_contacted"] is False
        assert result.envelope["error"]["details"]["unsupported"] == [operation]
    assert len(fake.probes()) == 3
    assert fake.calls() == []


def test_train_is_refused_while_the_real_contract_lacks_lifecycle_operations(
    tmp_path: Path,
) -> None:
    """The contract as the client shipped it when the bridge was written: logs, metrics,
    checkpoints, watch, cancel and cleanup still unsupported."""
    lacking = [
        "runs logs",
        "runs metrics",
        "runs checkpoints",
        "runs watch",
        "runs cancel",
        "runs cleanup",
    ]
    commands = all_supported()
    for command in commands:
        if command["name"] in [*lacking, "telemetry", "find", "evals", "login", "logout"]:
            command["availability"] = "unsupported"
    fake = make_fake(tmp_path / "client", probe=envelope(commands))
    result = ecc(
        ["ito", "train", "--booking", "b", "--manifest", "/m.json", "--json"],
        base_env(tmp_path, ECC_ITO_CLI_EXECUTABLE=str(fake.path), **SECRETS),
    )
    assert (result.rc, result.code) == (1, "capability_unavailable")
    assert result.envelope is not None
    assert result.envelope["error"]["details"]["unsupported"] == lacking
    assert fake.calls() == []


def test_an_unadvertised_subcommand_is_refused(tmp_path: Path) -> None:
    fake = make_fake(tmp_path / "client")
    result = ecc(
        ["ito", "runs", "rewind", "run_1", "--json"],
        base_env(tmp_path, ECC_ITO_CLI_EXECUTABLE=str(fake.path)),
    )
    assert (result.rc, result.code) == (1, "capability_unavailable")
    assert result.envelope is not None
    assert result.envelope["error"]["details"]["unsupported"] == ["runs rewind"]
    assert fake.calls() == []


def test_runs_without_a_subcommand_is_refused_before_anything_is_spawned(tmp_path: Path) -> None:
    fake = make_fake(tmp_path / "client")
    result = ecc(
        ["ito", "runs", "--json"], base_env(tmp_path, ECC_ITO_CLI_EXECUTABLE=str(fake.path))
    )
    assert (result.rc, result.code) == (1, "invalid_arguments")
    assert fake.probes() == [] and fake.calls() == []


def _duplicate() -> dict[str, Any]:
    commands = all_supported()
    return envelope([*commands, commands[0]])


def _unknown_field() -> dict[str, Any]:
    commands = all_supported()
    commands[0] = commands[0] | {"extra": "x"}
    return envelope(commands)


BAD_PROBES: dict[str, dict[str, Any]] = {
    "exit-nonzero": {"probe_exit": 1},
    "garbage": {"probe": "this is not json\n"},
    "empty": {"probe": ""},
    "json-array": {"probe": "[]\n"},
    "wrong-contract-version": {
        "probe": envelope(all_supported(), contract_version="ito.cli.capabilities.v2")
    },
    "not-ok": {"probe": {**envelope(all_supported()), "ok": False}},
    "contacted-the-api": {"probe": {**envelope(all_supported()), "live_api_contacted": True}},
    "another-cli": {"probe": envelope(all_supported(), cli={"name": "evil", "version": "1"})},
    "no-commands": {"probe": envelope([])},
    "duplicate-command": {"probe": _duplicate()},
    "unknown-field": {"probe": _unknown_field()},
    "unknown-availability": {"probe": envelope(with_change("train", availability="maybe"))},
    "train-without-side-effect": {
        "probe": envelope(with_change("train", side_effect="none", authority="none"))
    },
    "plan-starts-a-workload": {
        "probe": envelope(with_change("plan", side_effect="workload_start"))
    },
    "cancel-without-entitlement": {"probe": envelope(with_change("runs cancel", authority="none"))},
    "status-as-approver": {"probe": envelope(with_change("status", authority="approver"))},
}


@pytest.mark.parametrize("case", list(BAD_PROBES))
def test_a_failed_or_untrustworthy_probe_refuses_and_never_spawns_the_call(
    tmp_path: Path, case: str
) -> None:
    fake = make_fake(tmp_path / "client", **BAD_PROBES[case])
    result = ecc(
        ["ito", "train", "--booking", "b", "--idempotency-key", "k", "--json"],
        base_env(tmp_path, ECC_ITO_CLI_EXECUTABLE=str(fake.path), **SECRETS),
    )
    assert (result.rc, result.code) == (1, "capability_unavailable")
    assert result.envelope is not None and result.envelope["live_api_contacted"] is False
    assert len(fake.probes()) == 1
    assert fake.calls() == []


def test_a_probe_that_hangs_is_stopped_and_refused(tmp_path: Path) -> None:
    fake = make_fake(tmp_path / "client", probe_hang=True)
    result = ecc(
        ["ito", "plan", "--json"],
        base_env(tmp_path, ECC_ITO_CLI_EXECUTABLE=str(fake.path), ECC_ITO_TIMEOUT="0.5", **SECRETS),
    )
    assert (result.rc, result.code) == (1, "capability_unavailable")
    assert len(fake.probes()) == 1 and fake.calls() == []


# --- the real client, against a real server (SQLite and PostgreSQL) ---------------------------


def _real_env(tenant: Tenant, key: str | None) -> dict[str, str]:
    env = base_env(
        tenant.workdir,
        ECC_ITO_CLI_EXECUTABLE=ITO,
        ITO_API_URL=tenant.server.url,
        ITO_HOME=str(tenant.workdir / "client-home"),
    )
    if key:
        env["ITO_API_KEY"] = key
    return env


def test_status_through_the_real_client_returns_its_envelope(tenant: Tenant) -> None:
    result = ecc(["ito", "status", "--json"], _real_env(tenant, tenant.requester_key))
    assert result.rc == 0, result.stderr
    assert result.envelope is not None and result.envelope["ok"] is True
    assert result.envelope["live_api_contacted"] is True
    direct = tenant.ito("status")
    assert set(result.data) == set(direct.data)


def test_find_through_the_real_client_is_its_own_capability_refusal(tenant: Tenant) -> None:
    result = ecc(["ito", "find", "--json"], _real_env(tenant, tenant.requester_key))
    assert (result.rc, result.code) == (1, "capability_unavailable")
    assert result.envelope is not None and result.envelope["live_api_contacted"] is False
    assert not result.stderr.startswith("Error: ")  # the client's answer, not the bridge's


def test_train_through_the_real_client_is_gated_on_its_real_contract(tenant: Tenant) -> None:
    manifest = tenant.manifest()
    ref = tenant.approved_confirmation(manifest)
    contract = run_cli([ITO, "capabilities", "--json"], tenant.env(None)).data
    supported = {c["name"] for c in contract["commands"] if c["availability"] == "supported"}
    lacking = [op for op in REQUIRED_TRAINING_OPERATIONS if op not in supported]
    result = ecc(
        [
            "ito",
            "train",
            "--booking",
            tenant.booking_id,
            "--manifest",
            str(manifest),
            "--confirmation-ref",
            ref,
            "--idempotency-key",
            "bridge-k1",
            "--json",
        ],
        _real_env(tenant, tenant.requester_key),
    )
    if lacking:  # today: the lifecycle is incomplete, so nothing may start
        assert (result.rc, result.code) == (1, "capability_unavailable")
        assert result.envelope is not None
        assert result.envelope["error"]["details"]["unsupported"] == lacking
        assert tenant.counts()["runs"] == 0
        assert tenant.counts()["confirmations"] == {"approved": 1}
    else:
        assert result.rc == 0, result.stderr
        assert result.data["idempotency_key"] == "bridge-k1"
        assert tenant.counts()["runs"] == 1
        shown = ecc(
            ["ito", "runs", "show", result.data["run_id"], "--json"],
            _real_env(tenant, tenant.requester_key),
        )
        assert shown.rc == 0, shown.stderr
        assert shown.data["run_id"] == result.data["run_id"]
