"""Fixtures of the core tests."""

from __future__ import annotations

import json
from typing import Any

import pytest

from ito.recipes import build_recipe


@pytest.fixture
def doc(tmp_path: Any) -> dict[str, Any]:
    """The test recipe's manifest as a fresh document (a JSON round trip, not deepcopy: the
    recipe shares lists between entries)."""
    document: dict[str, Any] = json.loads(json.dumps(build_recipe("test", str(tmp_path)).manifest))
    return document
