"""Fixtures of the core tests."""

from __future__ import annotations

import json
from typing import Any

import pytest

from ito.recipes import build_recipe

POST_TRAINING: dict[str, Any] = {
    "sft": {"data": ["arith-sft"], "epochs": 1, "max_tokens": 4_000, "battery": "arith"},
    "dpo": {"data": ["arith-prefs"], "beta": 0.1, "max_tokens": 4_000, "battery": "arith"},
    "rlvr": {
        "algorithm": "grpo",
        "data": ["arith-prompts"],
        "rewards": ["exact_match_arith"],
        "group_size": 8,
        "max_staleness": 1,
        "max_tokens": 4_000,
        "battery": "arith",
        "dapo": {
            "clip_low": 0.2,
            "clip_high": 0.28,
            "dynamic_sampling": True,
            "token_level_loss": True,
            "overlong": {"max_tokens": 32, "soft_tokens": 8},
        },
    },
}
"""Every post-training stage on the recipe's data: the schema validates them although this
runtime version refuses them at plan (``ito.core.runtime_support``), so the recipes ask for
none."""


@pytest.fixture
def doc() -> dict[str, Any]:
    """The test recipe's manifest as a fresh document (a JSON round trip, not deepcopy: the
    recipe shares lists between entries), its data in the storage of the bookings of
    :mod:`tests.core.booking_views` (where a run may read it)."""
    data_dir = "/srv/ckpt/bkg_1/data"
    document: dict[str, Any] = json.loads(json.dumps(build_recipe("test", data_dir).manifest))
    return document


def with_post_training(document: dict[str, Any]) -> dict[str, Any]:
    """``document`` with every post-training stage (:data:`POST_TRAINING`)."""
    document["post_training"] = json.loads(json.dumps(POST_TRAINING))
    return document
