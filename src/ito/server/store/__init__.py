"""Persistence: tables, engines and sessions, migrations.

Importing the package registers every table on ``Base.metadata`` (the control plane's in
``tables``, the runtime's in ``runtime_tables``), so migrations and schema checks see them all.
"""

from ito.server.store import runtime_tables, tables

__all__ = ["runtime_tables", "tables"]
