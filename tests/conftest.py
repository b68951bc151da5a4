"""Fixtures live in ``tests/support.py``; importing them here registers them with pytest."""

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
