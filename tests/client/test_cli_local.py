"""The ``ito`` CLI's own behaviour, without a server: envelope and exit codes, usage errors,
secrets in arguments, the capability contract, unreachable API, and a light import graph."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from tests.support import ITO, clean_env, free_port, run_cli


def test_usage_error_exits_2_with_an_invalid_arguments_envelope() -> None:
    result = run_cli([ITO, "train", "--booking", "b", "--json"], clean_env())
    assert result.rc == 2
    assert result.code == "invalid_arguments"
    assert result.envelope is not None and result.envelope["live_api_contacted"] is False


def test_json_given_twice_is_a_usage_error() -> None:
    result = run_cli([ITO, "--json", "capabilities", "--json"], clean_env())
    assert result.rc == 2 and result.code == "invalid_arguments"


def test_json_switch_works_before_the_verb() -> None:
    result = run_cli([ITO, "--json", "capabilities"], clean_env())
    assert result.rc == 0 and result.data["contract_version"] == "ito.cli.capabilities.v1"


def test_credentials_in_arguments_are_refused_without_echo() -> None:
    secret = "ito_req_AbCdEfGh_" + "s3cr3t" * 8
    for argv in (
        [ITO, "status", "--run", secret, "--json"],
        [ITO, "plan", "--booking", "Bearer abcdefghijklmnopqrstuvwxyz", "--json"],
        [ITO, "status", "--api-key=whatever", "--json"],
    ):
        result = run_cli(argv, clean_env(ITO_API_URL=f"http://127.0.0.1:{free_port()}"))
        assert result.rc == 1 and result.code == "secret_in_arguments"
        assert result.envelope is not None and result.envelope["live_api_contacted"] is False
        assert "s3cr3t" not in result.stdout + result.stderr
        assert "abcdefghijklmnopqrstuvwxyz" not in result.stdout + result.stderr


def test_capabilities_is_static_and_lists_compute_verbs_unsupported() -> None:
    result = run_cli(
        [ITO, "capabilities", "--json"],
        clean_env(ITO_API_URL="http://127.0.0.1:1", ITO_API_KEY="unused"),
    )
    assert result.rc == 0 and result.envelope is not None
    assert result.envelope["live_api_contacted"] is False
    commands = {c["name"]: c for c in result.data["commands"]}
    assert commands["find"]["availability"] == commands["evals"]["availability"] == "unsupported"
    assert commands["train"]["side_effect"] == "workload_start"
    for verb in ("find", "evals"):
        refused = run_cli([ITO, verb, "--json"], clean_env())
        assert refused.rc == 1 and refused.code == "capability_unavailable"
        assert refused.envelope is not None and refused.envelope["live_api_contacted"] is False


def test_unreachable_api_reports_nothing_was_sent(tmp_path: Path) -> None:
    result = run_cli(
        [ITO, "status", "--json"],
        clean_env(ITO_API_URL=f"http://127.0.0.1:{free_port()}", ITO_API_KEY="k"),
    )
    assert result.rc == 1 and result.code == "transport_unreachable"
    assert result.envelope is not None and result.envelope["live_api_contacted"] is False


def test_bad_timeout_configuration_is_refused() -> None:
    result = run_cli([ITO, "config", "--json"], clean_env(ITO_TIMEOUT="soon"))
    assert result.rc == 1 and result.code == "client_not_configured"
    shown = run_cli(
        [ITO, "config", "--json"], clean_env(ITO_API_KEY="ito_req_AbCdEfGh_xyz", ITO_TIMEOUT="12")
    )
    assert shown.data["timeout_s"] == 12.0
    assert shown.data["credential"]["key_prefix"] == "ito_req_AbCdEfGh"
    assert "xyz" not in shown.stdout


def test_manifest_init_writes_private_files_and_refuses_to_overwrite(tmp_path: Path) -> None:
    out = tmp_path / "demo"
    first = run_cli(
        [ITO, "manifest", "init", "--recipe", "test", "--out", str(out), "--json"], clean_env()
    )
    assert first.rc == 0
    for name in ["manifest.json", *first.data["files"]]:
        assert (out / name).stat().st_mode & 0o777 == 0o600
    assert out.stat().st_mode & 0o777 == 0o700
    again = run_cli(
        [ITO, "manifest", "init", "--recipe", "test", "--out", str(out), "--json"], clean_env()
    )
    assert again.rc == 1 and again.code == "invalid_arguments"
    valid = run_cli(
        [ITO, "manifest", "validate", str(out / "manifest.json"), "--json"], clean_env()
    )
    assert valid.data["manifest_id"] == first.data["manifest_id"]


def test_client_does_not_import_heavy_modules() -> None:
    heavy = {"torch", "sqlalchemy", "fastapi", "uvicorn", "alembic", "psycopg", "transformers"}
    code = (
        "import sys, ito.client.cli; "
        f"print(sorted(m for m in sys.modules if m.split('.')[0] in {heavy!r}))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True
    ).stdout.strip()
    assert out == "[]"
