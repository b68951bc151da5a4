"""Fixtures live in ``tests/support.py``; importing them here registers them with pytest."""

import pytest

from tests.support import backend_url, other_tenant, server, tenant
from tests.worker.slurm_support import slurm_cluster

__all__ = ["backend_url", "other_tenant", "server", "slurm_cluster", "tenant"]


@pytest.hookimpl(tryfirst=True)  # before xdist's own hook reads the groups
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    # Under pytest-xdist (``--dist loadgroup``) every test on the two-node Slurm cluster runs in
    # one worker: the cluster's slurmd ports are fixed, so two workers cannot each start one.
    for item in items:
        if "slurm_cluster" in getattr(item, "fixturenames", ()):
            item.add_marker(pytest.mark.xdist_group("slurm"))
