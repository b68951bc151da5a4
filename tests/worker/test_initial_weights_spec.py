"""What the supervisor hands the engine for a lease's initial weights
(``ito.worker.supervisor.initial_weights_spec``): a checkpoint's step directory below the
booking's storage, the source run's checkpoint URI re-checked against it as the run's own is;
anything else refused with ``revision_unresolvable`` before the engine starts."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from ito.core.errors import ItoError
from ito.core.worker_messages import Lease
from ito.worker.supervisor import initial_weights_spec

ROOT = Path("/srv/storage")
SOURCE = "run_aaaaaaaaaaaaaaaaaaaaaaaa"
SHA = "ab" * 32


def _lease(weights: dict[str, Any] | None) -> Lease:
    return Lease.model_validate(
        {
            "run_id": "run_bbbbbbbbbbbbbbbbbbbbbbbb",
            "attempt": 1,
            "resuming": False,
            "restart_from": None,
            "manifest_b64": "e30=",
            "manifest_id": "sha256:" + "0" * 64,
            "checkpoint_uri": f"file://{ROOT}/runs/run_bbbbbbbbbbbbbbbbbbbbbbbb",
            "booking": {
                "booking_id": "bkg_x",
                "gpu": "cpu",
                "nodes": 1,
                "gpus_per_node": 2,
                "node_inventory": [],
                "storage_uri": f"file://{ROOT}",
            },
            "lease_ttl_s": 8.0,
            "heartbeat_s": 1.0,
            "initial_weights": weights,
        }
    )


def _run_weights(uri: str) -> dict[str, Any]:
    return {
        "kind": "run",
        "sha256": SHA,
        "revision": f"run:{SOURCE}@6",
        "run_id": SOURCE,
        "stage": "pretrain",
        "step": 6,
        "checkpoint_uri": uri,
    }


def test_a_checkpoint_is_its_step_directory_below_the_resolved_storage_root() -> None:
    resolved = Path("/mnt/real/storage")
    spec = initial_weights_spec(_lease(_run_weights(f"file://{ROOT}/runs/{SOURCE}")), resolved)
    assert spec == {
        "kind": "run",
        "path": f"{resolved}/runs/{SOURCE}/pretrain/step_00000006",
        "sha256": SHA,
        "revision": f"run:{SOURCE}@6",
    }


def test_a_hugging_face_directory_is_handed_on_and_scratch_is_nothing() -> None:
    hf = {
        "kind": "hf",
        "sha256": SHA,
        "revision": f"hf:{ROOT}/models/t@sha256:{SHA}",
        "path": f"{ROOT}/models/t",
    }
    resolved = Path("/mnt/real/storage")
    assert initial_weights_spec(_lease(hf), resolved) == {
        "kind": "hf",
        "path": f"{resolved}/models/t",
        "sha256": SHA,
        "revision": hf["revision"],
    }
    assert initial_weights_spec(_lease(None), ROOT) is None


@pytest.mark.parametrize(
    "weights",
    [
        _run_weights(f"file:///elsewhere/runs/{SOURCE}"),
        _run_weights(f"file://{ROOT}/runs/%2e%2e/{SOURCE}"),
        _run_weights(f"file://{ROOT}/runs/run_cccccccccccccccccccccccc"),
        {"kind": "run", "sha256": SHA, "revision": "x"},
        {"kind": "run", "sha256": SHA, "revision": "x", "unknown": 1},
        {"kind": "hf", "sha256": SHA, "revision": "x", "path": "/models/t"},
        {"kind": "hf", "sha256": SHA, "revision": "x", "path": str(ROOT)},
        {"kind": "hf", "sha256": SHA, "revision": "x"},
    ],
    ids=[
        "outside",
        "escape",
        "another_run",
        "incomplete",
        "unknown_field",
        "hf_outside",
        "hf_root",
        "hf_no_path",
    ],
)
def test_weights_the_worker_cannot_place_inside_the_booking_are_refused(
    weights: dict[str, Any],
) -> None:
    with pytest.raises(ItoError) as refused:
        initial_weights_spec(_lease(weights), ROOT)
    assert refused.value.code == "revision_unresolvable"
