"""The worker reads its settings through the API connection's settings object
(src/ito/connection.py, shared with the client side, which it never imports): each ``ITO_*``
variable it uses is honoured, and a malformed one is refused by its code."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from ito.connection import build
from ito.core.errors import ItoError
from ito.worker.settings import WorkerSettings


@pytest.fixture(autouse=True)
def clean(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in (
        "ITO_API_URL",
        "ITO_API_KEY",
        "ITO_HOME",
        "ITO_TIMEOUT",
        "ITO_CONNECT_TIMEOUT",
        "ITO_FAULT_INJECTION",
        "ITO_ALLOW_FILE_TOKEN",
    ):
        monkeypatch.delenv(name, raising=False)


def test_each_variable_is_honoured(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ITO_API_URL", "http://10.0.0.5:9000/")
    monkeypatch.setenv("ITO_API_KEY", "ito_wrk_AbCdEfGh_secret")
    monkeypatch.setenv("ITO_HOME", str(tmp_path))
    monkeypatch.setenv("ITO_TIMEOUT", "7")
    monkeypatch.setenv("ITO_FAULT_INJECTION", json.dumps({"fail_at": {"rank": 0, "step": 3}}))
    settings = build(WorkerSettings)
    assert settings.api_url == "http://10.0.0.5:9000"
    assert settings.api_key is not None
    assert settings.api_key.get_secret_value() == "ito_wrk_AbCdEfGh_secret"
    assert settings.home == tmp_path and settings.timeout == 7.0
    assert settings.fault_injection == {"fail_at": {"rank": 0, "step": 3}}
    assert settings.effective()["fault_injection"]["source"] == "environment"
    assert settings.effective()["api_key"]["value"] == "set"


def test_unset_and_empty_variables_take_the_defaults(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ITO_HOME", "")
    monkeypatch.setenv("ITO_API_KEY", "")
    settings = build(WorkerSettings)
    assert settings.home == Path.home() / ".ito"
    assert settings.api_key is None and settings.fault_injection is None
    assert settings.api_url == "http://127.0.0.1:8000"


@pytest.mark.parametrize("raw", ["not json", json.dumps({"delete_everything": 1}), "[1, 2]"])
def test_a_malformed_fault_injection_is_refused(raw: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ITO_FAULT_INJECTION", raw)
    with pytest.raises(ItoError) as refused:
        build(WorkerSettings)
    assert refused.value.code == "client_not_configured"
