"""Fixtures live in ``tests/support.py``; importing them here registers them with pytest."""

from tests.support import backend_url, other_tenant, server, tenant

__all__ = ["backend_url", "other_tenant", "server", "tenant"]
