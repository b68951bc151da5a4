"""Token storage (DESIGN §5.1): the OS keyring by default; a private file only when
``ITO_ALLOW_FILE_TOKEN=1``, refusing looser modes; ``ITO_API_KEY`` wins over both."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from ito.client.credentials import TokenStore, resolve_token
from ito.core.errors import ItoError

URL = "http://127.0.0.1:9"


@pytest.fixture(autouse=True)
def isolated(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    import keyring

    monkeypatch.setenv("ITO_HOME", str(tmp_path / "home"))
    for name in ("ITO_API_KEY", "ITO_ALLOW_FILE_TOKEN", "PYTHON_KEYRING_BACKEND"):
        monkeypatch.delenv(name, raising=False)
    previous = keyring.get_keyring()
    yield tmp_path
    keyring.set_keyring(previous)


def test_without_a_keyring_or_file_permission_saving_is_refused() -> None:
    import keyring
    from keyring.backends import fail

    keyring.set_keyring(fail.Keyring())  # type: ignore[no-untyped-call]
    with pytest.raises(ItoError) as refused:
        TokenStore(URL).save("ito_req_AbCdEfGh_secret")
    assert refused.value.code == "client_not_configured"
    assert TokenStore(URL).load() is None


def test_keyring_round_trip(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import keyring

    from tests.client.file_keyring import FileKeyring

    monkeypatch.setenv("ITO_TEST_KEYRING_FILE", str(tmp_path / "ring.json"))
    keyring.set_keyring(FileKeyring())  # type: ignore[no-untyped-call]
    store = TokenStore(URL)
    store.save("ito_req_AbCdEfGh_secret")
    assert resolve_token(URL) == ("ito_req_AbCdEfGh_secret", "keyring")
    assert store.delete() is True
    assert resolve_token(URL) == (None, None)


def test_file_token_is_private_and_looser_modes_are_refused(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("ITO_ALLOW_FILE_TOKEN", "1")
    store = TokenStore(URL)
    store.save("ito_req_AbCdEfGh_secret")
    assert store.path.stat().st_mode & 0o777 == 0o600
    assert store.path.parent.stat().st_mode & 0o777 == 0o700
    assert store.load() == "ito_req_AbCdEfGh_secret"

    os.chmod(store.path, 0o644)
    with pytest.raises(ItoError) as loose_file:
        store.load()
    assert loose_file.value.code == "client_not_configured"

    os.chmod(store.path, 0o600)
    os.chmod(store.path.parent, 0o755)
    with pytest.raises(ItoError) as loose_dir:
        store.load()
    assert loose_dir.value.code == "client_not_configured"


def test_symlinked_token_file_is_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ITO_ALLOW_FILE_TOKEN", "1")
    store = TokenStore(URL)
    store.save("real")
    elsewhere = tmp_path / "elsewhere"
    elsewhere.write_text("planted")
    os.chmod(elsewhere, 0o600)
    store.path.unlink()
    store.path.symlink_to(elsewhere)
    with pytest.raises(ItoError) as refused:
        store.load()
    assert refused.value.code == "client_not_configured"


def test_api_key_environment_wins(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ITO_ALLOW_FILE_TOKEN", "1")
    TokenStore(URL).save("stored")
    monkeypatch.setenv("ITO_API_KEY", "from-env")
    assert resolve_token(URL) == ("from-env", "ITO_API_KEY")
