"""Fixtures live in ``tests/support.py``; importing them here registers them with pytest.

The longest modules run first (:data:`LONGEST_FIRST`, from ``--durations`` of a full run): with
two workers stealing work from each other (``--dist worksteal`` in ``scripts/test``), what is
left at the end is short tests that both workers share, not one long test that one worker runs
while the other waits."""

from __future__ import annotations

import pytest

from tests.support import backend_url, fresh_failure_window, other_tenant, server, tenant
from tests.worker.slurm_support import slurm_cluster

__all__ = [
    "backend_url",
    "fresh_failure_window",
    "other_tenant",
    "server",
    "slurm_cluster",
    "tenant",
]

LONGEST_FIRST = (
    "tests/test_demo.py",
    "tests/worker/test_cost_bound.py",
    "tests/pipeline/test_layouts.py",
    "tests/worker/test_runtime_local.py",
    "tests/pipeline/test_post_training_engine.py",
    "tests/pipeline/test_replica_groups.py",
    "tests/worker/test_initial_weights_runtime.py",
    "tests/server/test_api_fuzz.py",
    "tests/pipeline/test_fault_tolerance.py",
    "tests/pipeline/test_initial_weights.py",
    "tests/pipeline/test_checkpoint_trust.py",
    "tests/worker/test_ladder_run.py",
    "tests/pipeline/test_pretrain_engine.py",
)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    rank = {module: i for i, module in enumerate(LONGEST_FIRST)}

    def key(item: pytest.Item) -> int:
        module = item.nodeid.split("::", 1)[0]
        return rank.get(module, len(LONGEST_FIRST))

    items.sort(key=key)  # stable: the rest keep their order
