"""ECC's compute-side verbs (DESIGN §6.3): ``ecc ito find --gpu h200 --count 8 …`` and ``ecc ito
evals --cluster …`` take their ECC options and are answered ``capability_unavailable`` by the
real canonical client — never a usage error — with nothing contacted: a listening socket
standing in for the API sees no connection, and no credential is needed.
"""

from __future__ import annotations

import socket
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.bridge.ecc_fakes import base_env, ecc
from tests.support import ITO, clean_env, run_cli

CALLS = [
    ["find", "--gpu", "h200", "--count", "8", "--region", "us-east", "--hours", "72"],
    ["find", "--gpu=h200", "--count=8", "--interconnect", "infiniband"],
    ["find"],
    ["evals", "--cluster", "cl_123"],
    ["evals", "--cluster", "cl_123", "--suite", "nccl", "--nodes", "2"],
    ["evals"],
]


class _Listener:
    """A TCP socket on loopback that only counts the connections made to it."""

    def __init__(self) -> None:
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(8)
        self.sock.settimeout(0.1)
        self.accepted = 0
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.sock.getsockname()[1]}"

    def _serve(self) -> None:
        while not self.stop.is_set():
            try:
                conn, _ = self.sock.accept()
            except OSError:
                continue
            self.accepted += 1
            conn.close()

    def close(self) -> None:
        self.stop.set()
        self.thread.join(timeout=5)
        self.sock.close()


@pytest.fixture
def api() -> Iterator[_Listener]:
    listener = _Listener()
    try:
        yield listener
    finally:
        listener.close()


@pytest.mark.parametrize("args", CALLS, ids=lambda a: " ".join(a))
def test_a_compute_verb_through_the_bridge_is_capability_unavailable_contacting_nothing(
    tmp_path: Path, api: _Listener, args: list[str]
) -> None:
    env = base_env(
        tmp_path,
        ECC_ITO_CLI_EXECUTABLE=ITO,
        ITO_API_URL=api.url,
        ITO_API_KEY="ito_requester_abcdefgh_unused",
        ITO_HOME=str(tmp_path / "home"),
    )
    result = ecc(["ito", *args, "--json"], env)
    assert (result.rc, result.code) == (1, "capability_unavailable"), result.stdout
    assert result.envelope is not None and result.envelope["live_api_contacted"] is False
    assert not result.stderr.startswith("Error: ")  # the client's answer, not the bridge's
    assert "h200" not in result.stdout and "cl_123" not in result.stdout  # values not echoed
    assert api.accepted == 0


@pytest.mark.parametrize("args", CALLS[:1] + CALLS[3:4], ids=lambda a: a[0])
def test_the_client_alone_answers_the_same_without_any_configuration(args: list[str]) -> None:
    result = run_cli([ITO, *args, "--json"], clean_env())
    assert (result.rc, result.code) == (1, "capability_unavailable")
    assert result.envelope is not None and result.envelope["live_api_contacted"] is False


def test_the_compute_verbs_still_have_help() -> None:
    for verb in ("find", "evals"):
        result = run_cli([ITO, verb, "--help"], clean_env())
        assert result.rc == 0 and "ito-compute" in result.stdout
