"""The public id format the client checks against is the one the server mints."""

from __future__ import annotations

import pytest

from ito.core.ids import ID_BODY_CHARS, is_public_id
from ito.server.ids import new_id


@pytest.mark.parametrize("prefix", ["run", "bkg", "cfr", "acc", "prn", "key"])
def test_every_minted_id_has_the_public_format(prefix: str) -> None:
    for _ in range(200):
        value = new_id(prefix)
        assert is_public_id(value, prefix)
        assert len(value) == len(prefix) + 1 + ID_BODY_CHARS == len(prefix) + 25
        assert not is_public_id(value, "xyz")


@pytest.mark.parametrize(
    "value",
    [
        "",
        "run",
        "run_",
        "run_" + "a" * 23,
        "run_" + "a" * 25,
        "run_" + "A" * 24,
        "run_" + "a" * 23 + "0",
        "run_" + "a" * 23 + "=",
        "run_" + "a" * 24 + "\n",
        " run_" + "a" * 24,
        "run__" + "a" * 23,
        "../run_" + "a" * 24,
        "run_" + "a" * 22 + "/.",
        "run_" + "a" * 23 + "#",
    ],
)
def test_anything_else_is_not_a_run_id(value: str) -> None:
    assert not is_public_id(value, "run")
