"""``ito-server config`` (real CLI processes): every server setting is read from its ``ITO_*``
variable through :class:`~ito.server.settings.ServerSettings`, printed with where it came from
(default, environment, argument, file); the pepper and database passwords never are; nothing is
created or opened."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ito.server.settings import ServerSettings
from tests.support import ITO_SERVER, clean_env, run_cli

PEPPER = "pepper-" + "Qx7" * 10
NON_DEFAULT: dict[str, str] = {
    "database_url": "postgresql+psycopg://ito:dbpa55@db.internal:5432/ito",
    "pepper": PEPPER,
    "public_url": "https://ito.example.test",
    "confirmation_ttl_seconds": "600",
    "device_code_ttl_seconds": "300",
    "device_poll_interval_seconds": "7",
    "web_session_ttl_seconds": "3600",
    "db_pool_size": "12",
    "lease_ttl_seconds": "45.0",
    "heartbeat_seconds": "3.0",
    "lease_sweep_seconds": "2.0",
    "rate_limit_per_second": "50.0",
    "rate_limit_burst": "300",
    "auth_failures_per_minute": "30",
    "trusted_proxies": "10.0.0.1",
    "max_request_bytes": str(8 * 1024 * 1024),
}
"""A valid, non-default value for every setting but ``home`` (set separately)."""


def _config(env: dict[str, str], *args: str) -> dict[str, Any]:
    shown = run_cli([ITO_SERVER, "config", "--json", *args], env)
    assert shown.rc == 0, shown.stdout + shown.stderr
    assert PEPPER not in shown.stdout + shown.stderr and "dbpa55" not in shown.stdout
    return shown.data


def test_the_table_covers_every_setting() -> None:
    assert set(ServerSettings.model_fields) == {"home", *NON_DEFAULT}


def test_every_variable_is_honoured_and_no_secret_is_printed(tmp_path: Path) -> None:
    env = clean_env(
        ITO_HOME=str(tmp_path / "home"),
        **{f"ITO_{name.upper()}": value for name, value in NON_DEFAULT.items()},
    )
    data = _config(env)
    settings = data["settings"]
    assert {name: s["source"] for name, s in settings.items()} == dict.fromkeys(
        ["home", *NON_DEFAULT], "environment"
    )
    assert settings["home"]["value"] == str(tmp_path / "home")
    assert settings["pepper"]["value"] == "set"
    assert settings["database_url"]["value"] == "postgresql+psycopg://ito:***@db.internal:5432/ito"
    assert data["embedded"] is False
    for name, raw in NON_DEFAULT.items():
        if name in ("pepper", "database_url"):
            continue
        value = settings[name]["value"]
        assert str(value) == raw, name
    assert not (tmp_path / "home").exists()


def test_defaults_and_the_embedded_pepper_file(tmp_path: Path) -> None:
    env = clean_env(HOME=str(tmp_path))
    data = _config(env)
    settings = data["settings"]
    assert {s["source"] for s in settings.values()} == {"default"}
    assert settings["home"]["value"] == str(tmp_path / ".ito")
    assert settings["pepper"] == {"variable": "ITO_PEPPER", "value": "not set", "source": "default"}
    assert data["embedded"] is True and data["database"].endswith("/.ito/ito.db")
    assert not (tmp_path / ".ito").exists()  # config creates nothing

    home = tmp_path / ".ito"
    home.mkdir(mode=0o700)
    (home / "server-pepper").write_text(PEPPER + "\n")
    settings = _config(env)["settings"]
    assert settings["pepper"] == {"variable": "ITO_PEPPER", "value": "set", "source": "file"}


def test_the_database_option_wins_over_the_environment(tmp_path: Path) -> None:
    env = clean_env(ITO_HOME=str(tmp_path), ITO_DATABASE_URL=NON_DEFAULT["database_url"])
    data = _config(env, "--database-url", f"sqlite:///{tmp_path}/other.db")
    assert data["settings"]["database_url"] == {
        "variable": "ITO_DATABASE_URL",
        "value": f"sqlite:///{tmp_path}/other.db",
        "source": "argument",
    }
    assert data["embedded"] is True


def test_an_invalid_setting_is_refused_by_its_code() -> None:
    refused = run_cli([ITO_SERVER, "config", "--json"], clean_env(ITO_LEASE_TTL_SECONDS="soon"))
    assert refused.rc == 1 and refused.code == "invalid_arguments"
