"""``ito config`` (real CLI processes): every client setting is read from its ``ITO_*`` variable
through one settings object, printed with where it came from, and no secret is printed."""

from __future__ import annotations

from pathlib import Path

from tests.support import ITO, clean_env, run_cli

KEY = "ito_req_AbCdEfGh_" + "Zq9" * 12


def test_defaults_are_shown_as_defaults(tmp_path: Path) -> None:
    shown = run_cli([ITO, "config", "--json"], clean_env(HOME=str(tmp_path)))
    assert shown.rc == 0
    settings = shown.data["settings"]
    assert {name: s["source"] for name, s in settings.items()} == dict.fromkeys(
        ["home", "api_url", "connect_timeout", "timeout", "api_key", "allow_file_token"], "default"
    )
    assert settings["home"]["value"] == str(tmp_path / ".ito")
    assert settings["api_url"]["value"] == "http://127.0.0.1:8000"
    assert settings["api_key"]["value"] == "not set"
    assert shown.envelope is not None and shown.envelope["live_api_contacted"] is False


def test_every_variable_is_honoured_and_no_secret_is_printed(tmp_path: Path) -> None:
    env = clean_env(
        ITO_HOME=str(tmp_path / "home"),
        ITO_API_URL="https://alice:pa55word@api.test/",
        ITO_CONNECT_TIMEOUT="2.5",
        ITO_TIMEOUT="40",
        ITO_API_KEY=KEY,
        ITO_ALLOW_FILE_TOKEN="1",
    )
    shown = run_cli([ITO, "config", "--json"], env)
    assert shown.rc == 0, shown.stdout + shown.stderr
    settings = shown.data["settings"]
    assert {name: (s["variable"], s["source"]) for name, s in settings.items()} == {
        "home": ("ITO_HOME", "environment"),
        "api_url": ("ITO_API_URL", "environment"),
        "connect_timeout": ("ITO_CONNECT_TIMEOUT", "environment"),
        "timeout": ("ITO_TIMEOUT", "environment"),
        "api_key": ("ITO_API_KEY", "environment"),
        "allow_file_token": ("ITO_ALLOW_FILE_TOKEN", "environment"),
    }
    assert settings["home"]["value"] == str(tmp_path / "home")
    assert settings["api_url"]["value"] == "https://alice:***@api.test"
    assert settings["connect_timeout"]["value"] == 2.5
    assert settings["timeout"]["value"] == 40.0
    assert settings["api_key"]["value"] == "set"
    assert settings["allow_file_token"]["value"] is True
    assert shown.data["credential"] == {"source": "ITO_API_KEY", "key_prefix": "ito_req_AbCdEfGh"}
    assert "Zq9" not in shown.stdout + shown.stderr
    assert "pa55word" not in shown.stdout + shown.stderr


def test_a_key_of_another_shape_is_not_shown_even_in_part() -> None:
    shown = run_cli([ITO, "config", "--json"], clean_env(ITO_API_KEY="plainsecretvalue"))
    assert shown.data["credential"] == {"source": "ITO_API_KEY", "key_prefix": None}
    assert "plainsecretvalue" not in shown.stdout + shown.stderr


def test_the_deadline_is_never_below_the_connect_timeout() -> None:
    shown = run_cli([ITO, "config", "--json"], clean_env(ITO_CONNECT_TIMEOUT="9", ITO_TIMEOUT="3"))
    assert shown.data["timeout_s"] == 9.0


def test_invalid_settings_are_refused_without_echoing_them() -> None:
    for name, value in (
        ("ITO_API_URL", "ftp://s3cr3t@example"),
        ("ITO_CONNECT_TIMEOUT", "0"),
        ("ITO_TIMEOUT", "99999"),
        ("ITO_ALLOW_FILE_TOKEN", "perhaps"),
    ):
        refused = run_cli([ITO, "config", "--json"], clean_env(**{name: value}))
        assert refused.rc == 1 and refused.code == "client_not_configured", name
        assert value not in refused.stdout + refused.stderr
