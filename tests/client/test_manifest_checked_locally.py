"""The client parses and secret-scans a manifest before any byte leaves the machine (DESIGN §6.1):
``ito plan --manifest ~/.aws/credentials`` must not upload the credentials to have the server
refuse them. The API URL points at a loopback socket this test listens on; the refusal must
carry the server's code with ``live_api_contacted: false``, and no connection may ever arrive.
"""

from __future__ import annotations

import json
import socket
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.core.credential_corpus import CREDENTIALS
from tests.mcp.test_mcp_tools import Mcp, with_mcp
from tests.support import ITO, clean_env, run_cli

BOOKING = "bkg_" + "a" * 24
CONFIRMATION = "cfr_" + "b" * 24
_AWS_ID = dict(CREDENTIALS)["aws_access_key_id"]
_AWS_SECRET = dict(CREDENTIALS)["aws_secret_access_key_bare"]


@pytest.fixture
def listener() -> Iterator[socket.socket]:
    """A loopback socket that accepts connections into its backlog and never answers."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen(16)
        sock.setblocking(False)
        yield sock


def _connections(sock: socket.socket) -> int:
    count = 0
    while True:
        try:
            conn, _ = sock.accept()
        except BlockingIOError:
            return count
        conn.close()
        count += 1


def _env_for(sock: socket.socket) -> dict[str, str]:
    port = sock.getsockname()[1]
    return clean_env(
        ITO_API_URL=f"http://127.0.0.1:{port}",
        ITO_API_KEY="ito_req_" + "x" * 30,
        ITO_CONNECT_TIMEOUT="2",
        ITO_TIMEOUT="3",
    )


def _private(path: Path, content: str) -> Path:
    path.write_text(content)
    path.chmod(0o600)
    return path


def _credentials_file(tmp_path: Path) -> Path:
    aws = tmp_path / ".aws"
    aws.mkdir(mode=0o700)
    return _private(
        aws / "credentials",
        "[default]\naws_access_key_id = "
        + _AWS_ID
        + "\naws_secret_access_key = "
        + _AWS_SECRET
        + "\n",
    )


def _secret_manifest(tmp_path: Path) -> Path:
    init = run_cli(
        [ITO, "manifest", "init", "--out", str(tmp_path / "m"), "--recipe", "test", "--json"],
        clean_env(),
    )
    path = Path(init.data["manifest"])
    document: dict[str, Any] = json.loads(path.read_text())
    document["data"][0]["uri"] = (
        "https://data.example.com/web.jsonl?X-Amz-Credential="
        + _AWS_ID
        + "&X-Amz-"
        + "Signature="
        + "0f" * 32
    )
    return _private(path, json.dumps(document))


CASES = {
    "credentials_file": (_credentials_file, "manifest_invalid"),
    "secret_manifest": (_secret_manifest, "manifest_contains_secret"),
}


def _verbs(path: Path) -> dict[str, list[str]]:
    return {
        "plan": ["plan", "--booking", BOOKING, "--manifest", str(path)],
        "confirm": ["confirm", "--action", "train", "--booking", BOOKING, "--manifest", str(path)],
        "train": [
            "train",
            "--booking",
            BOOKING,
            "--manifest",
            str(path),
            "--confirmation-ref",
            CONFIRMATION,
            "--idempotency-key",
            "k-1",
        ],
        "manifest_validate": ["manifest", "validate", str(path)],
    }


@pytest.mark.parametrize("case", sorted(CASES))
def test_the_cli_refuses_a_bad_manifest_before_connecting(
    tmp_path: Path, listener: socket.socket, case: str
) -> None:
    make, code = CASES[case]
    path = make(tmp_path)
    for verb, argv in _verbs(path).items():
        result = run_cli([ITO, *argv, "--json"], _env_for(listener))
        assert result.rc == 1, (verb, result.stdout, result.stderr)
        assert result.code == code, (verb, result.stdout)
        assert result.envelope is not None and result.envelope["live_api_contacted"] is False
        assert _AWS_ID not in result.stdout + result.stderr
        assert _AWS_SECRET not in result.stdout + result.stderr
    assert _connections(listener) == 0


@pytest.mark.parametrize("case", sorted(CASES))
def test_the_mcp_tools_refuse_a_bad_manifest_before_connecting(
    tmp_path: Path, listener: socket.socket, case: str
) -> None:
    make, code = CASES[case]
    path = str(make(tmp_path))

    async def script(mcp: Mcp) -> list[Any]:
        return [
            await mcp.call("ito_plan", booking=BOOKING, manifest=path),
            await mcp.call("ito_confirm", action="train", booking=BOOKING, manifest=path),
            await mcp.call(
                "ito_train",
                booking=BOOKING,
                manifest=path,
                confirmation_ref=CONFIRMATION,
                idempotency_key="k-1",
            ),
        ]

    for call in with_mcp(_env_for(listener), script):
        assert call.code == code, call.envelope
        assert call.envelope["live_api_contacted"] is False
        assert _AWS_ID not in call.text and _AWS_SECRET not in call.text
    assert _connections(listener) == 0


def test_a_valid_manifest_does_reach_the_api(tmp_path: Path, listener: socket.socket) -> None:
    # The control: the same command with a good manifest does connect (the listener never
    # answers, so the client gives up at its deadline).
    init = run_cli(
        [ITO, "manifest", "init", "--out", str(tmp_path / "m"), "--recipe", "test", "--json"],
        clean_env(),
    )
    result = run_cli(
        [ITO, "plan", "--booking", BOOKING, "--manifest", init.data["manifest"], "--json"],
        _env_for(listener),
    )
    assert result.rc == 1 and result.envelope is not None
    assert _connections(listener) >= 1
