"""``ecc ito …`` against fake canonical clients: the intent of ECC's bridge tests
(``tests/scripts/ito-cli-bridge.test.js``) — forwarding with argv unchanged and ``--json`` moved
first, the environment rules, refusals before anything is spawned, PATH decoys never called,
the explicit absolute executable, dry-run and help, exit codes and output passed through —
plus the deadline and the output bound. Every call is a real ``ecc`` subprocess.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.bridge.ecc_fakes import ECC, base_env, ecc, make_decoy, make_fake

ALLOWED = {
    "CI",
    "DISPLAY",
    "FORCE_COLOR",
    "HOME",
    "LANG",
    "LC_ALL",
    "NO_COLOR",
    "PATH",
    "SHELL",
    "TEMP",
    "TERM",
    "TMP",
    "TMPDIR",
    "WAYLAND_DISPLAY",
    "XDG_RUNTIME_DIR",
    "USER",
    "LOGNAME",
    "DBUS_SESSION_BUS_ADDRESS",
    "XDG_CONFIG_HOME",
    "XDG_DATA_HOME",
    "ITO_API_URL",
    "ITO_CONNECT_TIMEOUT",
    "ITO_TIMEOUT",
    "ITO_HOME",
    "ITO_ALLOW_FILE_TOKEN",
    "PYTHON_KEYRING_BACKEND",
    "ITO_API_KEY",
}
HOSTILE = {
    "AWS_SECRET_ACCESS_KEY": "must-not-cross",
    "OPENAI_API_KEY": "must-not-cross",
    "TEST_PASSWORD": "must-not-cross",
    "FOO": "bar",
    "PYTHONPATH": "/hostile",
    "ECC_ITO_TIMEOUT": "60",
    "ITO_TOKEN_FILE": "/tmp/x",
    "ITO_UNKNOWN": "1",
}
ITO_SETTINGS = {
    "ITO_API_URL": "https://ito.example.test",
    "ITO_CONNECT_TIMEOUT": "3",
    "ITO_TIMEOUT": "20",
    "ITO_HOME": "/tmp/ito-home",
    "ITO_ALLOW_FILE_TOKEN": "1",
    "LC_CTYPE": "C.UTF-8",
}
NON_TRAINING = [
    ["login"],
    ["logout"],
    ["auth"],
    ["find", "--gpu", "h200"],
    ["status"],
    ["evals"],
    ["bookings", "list"],
    ["manifest", "validate", "/abs/m.json"],
    ["telemetry", "--booking", "bkg_1"],
]


@pytest.mark.parametrize("args", NON_TRAINING, ids=lambda a: " ".join(a))
def test_each_non_training_verb_is_forwarded_unchanged_without_a_probe(
    tmp_path: Path, args: list[str]
) -> None:
    fake = make_fake(tmp_path / "client")
    result = ecc(["ito", *args], base_env(tmp_path, ECC_ITO_CLI_EXECUTABLE=str(fake.path)))
    assert result.rc == 0, result.stderr
    assert [call["argv"] for call in fake.calls()] == [args]
    assert result.stdout == f"fake-client:{'|'.join(args)}\n"
    assert result.stderr == "fake-client-stderr\n"
    assert fake.probes() == []


def test_json_is_moved_first_and_every_other_argument_is_forwarded_unchanged(
    tmp_path: Path,
) -> None:
    fake = make_fake(tmp_path / "client")
    args = ["bookings", "show", "bkg 1", "--flag=a=b", "", "--", "-x", "ünï", "--json"]
    env = base_env(tmp_path, ECC_ITO_CLI_EXECUTABLE=str(fake.path))
    assert ecc(["ito", *args], env).rc == 0
    assert ecc(["--json", "ito", "status", "--run", "run_1"], env).rc == 0
    assert [call["argv"] for call in fake.calls()] == [
        ["--json", *args[:-1]],
        ["--json", "status", "--run", "run_1"],
    ]


def test_a_second_json_flag_is_refused_before_spawning(tmp_path: Path) -> None:
    fake = make_fake(tmp_path / "client")
    result = ecc(
        ["ito", "--json", "status", "--json"],
        base_env(tmp_path, ECC_ITO_CLI_EXECUTABLE=str(fake.path)),
    )
    assert (result.rc, result.code) == (1, "invalid_arguments")
    assert result.envelope is not None and result.envelope["live_api_contacted"] is False
    assert result.stderr.startswith("Error: ")
    assert fake.calls() == [] and fake.probes() == []


def test_login_never_receives_the_api_key_but_keeps_token_settings(tmp_path: Path) -> None:
    fake = make_fake(tmp_path / "client")
    env = base_env(
        tmp_path,
        ECC_ITO_CLI_EXECUTABLE=str(fake.path),
        ITO_API_KEY="ito_k_1",
        **ITO_SETTINGS,
        **HOSTILE,
    )
    assert ecc(["ito", "login", "--no-browser"], env).rc == 0
    (call,) = fake.calls()
    assert call["argv"] == ["login", "--no-browser"]
    child = call["env"]
    assert "ITO_API_KEY" not in child
    assert {k: child.get(k) for k in ITO_SETTINGS} == ITO_SETTINGS
    assert not set(HOSTILE) & set(child)
    assert "ECC_ITO_CLI_EXECUTABLE" not in child
    assert {k for k in child if not k.startswith("LC_")} <= ALLOWED


def test_logout_never_receives_the_api_key(tmp_path: Path) -> None:
    fake = make_fake(tmp_path / "client")
    env = base_env(
        tmp_path, ECC_ITO_CLI_EXECUTABLE=str(fake.path), ITO_API_KEY="ito_k_1", **ITO_SETTINGS
    )
    assert ecc(["ito", "logout", "--json"], env).rc == 0
    (call,) = fake.calls()
    assert call["argv"] == ["--json", "logout"]
    assert "ITO_API_KEY" not in call["env"]
    assert call["env"]["ITO_ALLOW_FILE_TOKEN"] == "1"
    assert call["env"]["ITO_API_URL"] == "https://ito.example.test"


@pytest.mark.parametrize(
    "args",
    [["auth"], ["find"], ["status"], ["bookings", "list"], ["telemetry", "--run", "run_1"]],
    ids=lambda a: a[0],
)
def test_credential_verbs_receive_the_api_key_and_nothing_unlisted(
    tmp_path: Path, args: list[str]
) -> None:
    fake = make_fake(tmp_path / "client")
    env = base_env(
        tmp_path,
        ECC_ITO_CLI_EXECUTABLE=str(fake.path),
        ITO_API_KEY="ito_k_1",
        **ITO_SETTINGS,
        **HOSTILE,
    )
    assert ecc(["ito", *args], env).rc == 0
    child = fake.calls()[0]["env"]
    assert child["ITO_API_KEY"] == "ito_k_1"
    assert {k: child.get(k) for k in ITO_SETTINGS} == ITO_SETTINGS
    assert not set(HOSTILE) & set(child)
    assert {k for k in child if not k.startswith("LC_")} <= ALLOWED


@pytest.mark.parametrize(
    "args", [["manifest", "init", "--out", "/tmp/m"], ["evals"]], ids=lambda a: a[0]
)
def test_local_verbs_receive_no_ito_variable_at_all(tmp_path: Path, args: list[str]) -> None:
    fake = make_fake(tmp_path / "client")
    env = base_env(
        tmp_path, ECC_ITO_CLI_EXECUTABLE=str(fake.path), ITO_API_KEY="ito_k_1", **ITO_SETTINGS
    )
    assert ecc(["ito", *args], env).rc == 0
    child = fake.calls()[0]["env"]
    assert not [k for k in child if k.startswith("ITO_")]
    assert child["PATH"] == env["PATH"] and child["HOME"] == env["HOME"]


def test_login_output_streams_before_the_client_ends_and_its_exit_code_passes(
    tmp_path: Path,
) -> None:
    fake = make_fake(tmp_path / "client", stdout="device-code-now\n", exit_code=7, wait_stdin=True)
    bridge = subprocess.Popen(
        [ECC, "ito", "login"],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=base_env(tmp_path, ECC_ITO_CLI_EXECUTABLE=str(fake.path)),
    )
    assert bridge.stdout is not None and bridge.stdin is not None
    try:
        # The line arrives while the client still waits on the (inherited) stdin.
        assert bridge.stdout.readline() == b"device-code-now\n"
        assert bridge.poll() is None
        bridge.stdin.write(b"\n")
        bridge.stdin.close()
        assert bridge.wait(timeout=30) == 7
    finally:
        if bridge.poll() is None:
            bridge.kill()
        bridge.stdout.close()
        assert bridge.stderr is not None
        bridge.stderr.close()


def test_auth_with_no_browser_is_refused_before_spawning(tmp_path: Path) -> None:
    fake = make_fake(tmp_path / "client")
    result = ecc(
        ["ito", "auth", "--no-browser", "--json"],
        base_env(tmp_path, ECC_ITO_CLI_EXECUTABLE=str(fake.path)),
    )
    assert (result.rc, result.code) == (1, "invalid_arguments")
    assert fake.calls() == [] and fake.probes() == []


@pytest.mark.parametrize(
    "verb",
    [
        "approve",
        "reject",
        "rent",
        "lock",
        "purchase",
        "run",
        "inference",
        "mcp",
        "capabilities",
        "config",
        "Train",
        "",
    ],
)
@pytest.mark.parametrize("executable", ["unset", "relative", "missing", "valid"])
def test_unknown_verbs_are_refused_before_the_executable_is_resolved(
    tmp_path: Path, verb: str, executable: str
) -> None:
    fake = make_fake(tmp_path / "client")
    env = base_env(tmp_path)
    env |= {
        "unset": {},
        "relative": {"ECC_ITO_CLI_EXECUTABLE": "ito"},
        "missing": {"ECC_ITO_CLI_EXECUTABLE": str(tmp_path / "nowhere" / "ito")},
        "valid": {"ECC_ITO_CLI_EXECUTABLE": str(fake.path)},
    }[executable]
    result = ecc(["ito", verb, "REF", "--json"], env)
    assert (result.rc, result.code) == (1, "invalid_arguments")
    assert result.stderr.startswith("Error: ")
    assert fake.calls() == [] and fake.probes() == []


@pytest.mark.parametrize(
    ("args", "extra"),
    [
        (["--dry-run", "ito", "find"], {}),
        (["ito", "train", "--booking", "b", "--dry-run"], {}),
        (["ito", "status", "--dry-run=1"], {}),
        (["ito", "status"], {"ECC_DRY_RUN": "1"}),
    ],
    ids=["flag-before-ito", "flag-after-verb", "flag-with-value", "environment"],
)
def test_dry_run_is_refused_and_spawns_nothing(
    tmp_path: Path, args: list[str], extra: dict[str, str]
) -> None:
    fake = make_fake(tmp_path / "client")
    result = ecc(
        [*args, "--json"], base_env(tmp_path, ECC_ITO_CLI_EXECUTABLE=str(fake.path), **extra)
    )
    assert (result.rc, result.code) == (1, "capability_unavailable")
    assert "no paper or dry-run success mode" in result.stderr
    assert fake.calls() == [] and fake.probes() == []


@pytest.mark.parametrize(
    "args",
    [
        ["ito", "--help"],
        ["ito", "train", "--booking", "b", "-h"],
        ["--help"],
        ["ito"],
        [],
        ["ito", "approve", "--help"],
    ],
)
def test_help_anywhere_prints_help_and_spawns_nothing(tmp_path: Path, args: list[str]) -> None:
    fake = make_fake(tmp_path / "client")
    result = ecc(args, base_env(tmp_path, ECC_ITO_CLI_EXECUTABLE=str(fake.path), ECC_DRY_RUN="1"))
    assert result.rc == 0, result.stderr
    for verb in [
        "login [--no-browser]",
        "logout",
        "auth",
        "status",
        "bookings",
        "manifest",
        "plan",
        "confirm",
        "train",
        "runs",
        "telemetry",
        "find [--gpu G --count N …]",
        "evals [--cluster C …]",
    ]:
        assert f"ecc ito {verb}" in result.stdout
    assert "ecc ito approve" not in result.stdout and "ecc ito reject" not in result.stdout
    assert "never discovers this credential-bearing client through PATH" in result.stdout
    assert fake.calls() == [] and fake.probes() == []


@pytest.mark.parametrize("configured", [None, "", "   "], ids=["unset", "empty", "blank"])
def test_an_absent_executable_is_not_configured_and_path_is_never_searched(
    tmp_path: Path, configured: str | None
) -> None:
    marker = make_decoy(tmp_path / "decoy")
    env = base_env(
        tmp_path,
        PATH=f"{tmp_path / 'decoy'}:{os.environ['PATH']}",
        ITO_API_KEY="ito_must_never_reach_the_decoy",
    )
    if configured is not None:
        env["ECC_ITO_CLI_EXECUTABLE"] = configured
    for args in (
        ["ito", "auth", "--json"],
        ["ito", "status", "--json"],
        ["ito", "train", "--booking", "b", "--json"],
    ):
        result = ecc(args, env, cwd=tmp_path / "decoy")
        assert (result.rc, result.code) == (1, "client_not_configured")
    assert not marker.exists()


@pytest.mark.parametrize("relative", ["ito", "./ito", "decoy/ito"])
def test_a_relative_override_is_refused_without_searching_or_guessing(
    tmp_path: Path, relative: str
) -> None:
    marker = make_decoy(tmp_path / "decoy")
    env = base_env(
        tmp_path,
        PATH=f"{tmp_path / 'decoy'}:{os.environ['PATH']}",
        ECC_ITO_CLI_EXECUTABLE=relative,
        ITO_API_KEY="ito_must_never_cross",
    )
    cwd = tmp_path / "decoy" if relative != "decoy/ito" else tmp_path
    result = ecc(["ito", "status", "--json"], env, cwd=cwd)
    assert (result.rc, result.code) == (1, "client_executable_invalid")
    assert not marker.exists()


def _unusable(tmp_path: Path, case: str) -> tuple[Path, Path | None]:
    """An executable path that must be refused, and a marker that must never appear."""
    directory = tmp_path / "bad"
    if case == "missing":
        return directory / "ito", None
    if case == "directory":
        (directory / "ito").mkdir(parents=True)
        return directory / "ito", None
    if case in ("env-shim", "relative-interpreter"):
        marker = make_decoy(directory / "path", name="python3")
        shebang = "#!/usr/bin/env python3" if case == "env-shim" else "#!python3"
        make_decoy(directory, name="ito", shebang=shebang)
        return directory / "ito", marker
    if case == "link-to-writable":
        fake = make_fake(directory, name="real-ito", mode=0o775)
        (directory / "ito").symlink_to(fake.path)
        return directory / "ito", fake.log
    mode = {"not-executable": 0o644, "group-writable": 0o775, "world-writable": 0o757}[case]
    fake = make_fake(directory, mode=mode)
    return fake.path, fake.log


@pytest.mark.parametrize(
    "case",
    [
        "missing",
        "directory",
        "not-executable",
        "group-writable",
        "world-writable",
        "env-shim",
        "relative-interpreter",
        "link-to-writable",
    ],
)
def test_an_unusable_executable_is_refused_and_never_run(tmp_path: Path, case: str) -> None:
    path, marker = _unusable(tmp_path, case)
    env = base_env(
        tmp_path,
        ECC_ITO_CLI_EXECUTABLE=str(path),
        ITO_API_KEY="ito_never",
        PATH=f"{tmp_path / 'bad' / 'path'}:{os.environ['PATH']}",
    )
    result = ecc(["ito", "auth", "--json"], env)
    assert (result.rc, result.code) == (1, "client_executable_invalid")
    assert result.envelope is not None and result.envelope["live_api_contacted"] is False
    assert marker is None or not marker.exists()


def test_a_symlink_is_followed_and_the_resolved_file_is_what_runs(tmp_path: Path) -> None:
    fake = make_fake(tmp_path / "real")
    link = tmp_path / "links" / "ito"
    link.parent.mkdir()
    link.symlink_to(fake.path)
    result = ecc(["ito", "status"], base_env(tmp_path, ECC_ITO_CLI_EXECUTABLE=str(link)))
    assert result.rc == 0, result.stderr
    assert fake.calls()[0]["exe"] == os.path.realpath(fake.path)


def test_the_exit_code_stdout_and_stderr_pass_through_unchanged(tmp_path: Path) -> None:
    out = '{"ok": false, "weird": "ünï\\u0000"}\n  trailing  \n'
    fake = make_fake(tmp_path / "client", exit_code=7, stdout=out, stderr="client says no\n")
    result = ecc(
        ["ito", "status", "--json"], base_env(tmp_path, ECC_ITO_CLI_EXECUTABLE=str(fake.path))
    )
    assert (result.rc, result.stdout, result.stderr) == (7, out, "client says no\n")


@pytest.mark.parametrize(
    "args",
    [
        ["ito", "status", "--api-key", "plain"],
        ["ito", "status", "--token=opaque-value"],
        ["ito", "bookings", "show", "ghp_" + "A1b2" * 9],
        ["ito", "sk-" + "x9" * 12],
        ["ito", "plan", "--manifest", "https://user:hunter22@example.test/m.json"],
    ],
    ids=["api-key-option", "token-option", "github-token", "secret-as-verb", "uri-userinfo"],
)
def test_secret_looking_arguments_are_refused_without_echo(tmp_path: Path, args: list[str]) -> None:
    fake = make_fake(tmp_path / "client")
    result = ecc([*args, "--json"], base_env(tmp_path, ECC_ITO_CLI_EXECUTABLE=str(fake.path)))
    assert (result.rc, result.code) == (1, "secret_in_arguments")
    for secret in ("plain", "opaque-value", "ghp_", "sk-", "hunter22"):
        assert secret not in result.stdout + result.stderr
    assert fake.calls() == [] and fake.probes() == []


def test_a_client_past_the_deadline_is_stopped_and_reported(tmp_path: Path) -> None:
    fake = make_fake(tmp_path / "client", hang=True)
    env = base_env(tmp_path, ECC_ITO_CLI_EXECUTABLE=str(fake.path), ECC_ITO_TIMEOUT="0.5")
    result = ecc(["ito", "status", "--json"], env)
    assert (result.rc, result.code) == (1, "transport_timeout")
    assert result.envelope is not None and result.envelope["live_api_contacted"] is True
    # A training verb probes first (well within a generous deadline), then hangs.
    train = ecc(
        ["ito", "train", "--booking", "b", "--idempotency-key", "k-1", "--json"],
        env | {"ECC_ITO_TIMEOUT": "3"},
    )
    assert (train.rc, train.code) == (1, "transport_ambiguous")
    assert train.envelope is not None
    assert train.envelope["error"]["details"] == {"idempotency_key": "k-1"}
    local = ecc(["ito", "manifest", "validate", "/m.json", "--json"], env)
    assert (local.rc, local.code) == (1, "transport_timeout")
    assert local.envelope is not None and local.envelope["live_api_contacted"] is False


def test_output_beyond_the_bound_is_discarded_and_refused(tmp_path: Path) -> None:
    fake = make_fake(tmp_path / "client", stdout="", flood=10 * 1024 * 1024 + 1)
    result = ecc(
        ["ito", "status", "--json"], base_env(tmp_path, ECC_ITO_CLI_EXECUTABLE=str(fake.path))
    )
    assert (result.rc, result.code) == (1, "client_executable_invalid")
    assert len(result.stdout) < 4096  # the envelope only, nothing of the flood


def test_a_client_killed_by_a_signal_is_reported_not_passed_as_success(tmp_path: Path) -> None:
    fake = make_fake(tmp_path / "client", kill_self=True)
    result = ecc(
        ["ito", "bookings", "list", "--json"],
        base_env(tmp_path, ECC_ITO_CLI_EXECUTABLE=str(fake.path)),
    )
    assert (result.rc, result.code) == (1, "internal_error")


@pytest.mark.parametrize("value", ["abc", "0", "-1", "90000", "nan"])
def test_an_invalid_timeout_setting_is_refused_before_spawning(tmp_path: Path, value: str) -> None:
    fake = make_fake(tmp_path / "client")
    result = ecc(
        ["ito", "status", "--json"],
        base_env(tmp_path, ECC_ITO_CLI_EXECUTABLE=str(fake.path), ECC_ITO_TIMEOUT=value),
    )
    assert (result.rc, result.code) == (1, "client_not_configured")
    assert fake.calls() == []


def test_ecc_offers_only_the_ito_bridge(tmp_path: Path) -> None:
    fake = make_fake(tmp_path / "client")
    result = ecc(["status", "--json"], base_env(tmp_path, ECC_ITO_CLI_EXECUTABLE=str(fake.path)))
    assert (result.rc, result.code) == (1, "invalid_arguments")
    assert fake.calls() == []


def test_the_bridge_imports_nothing_heavy() -> None:
    heavy = [
        "torch",
        "sqlalchemy",
        "fastapi",
        "httpx",
        "typer",
        "rich",
        "pydantic",
        "keyring",
        "uvicorn",
        "ito.client",
        "ito.server",
    ]
    code = f"import sys, ito.bridge.ecc; print(sorted(m for m in {heavy!r} if m in sys.modules))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"
