"""Persistence: tables, engines and sessions, migrations.

Importing the package registers every table on ``Base.metadata`` (the control plane's in
``tables``, the runtime's in ``runtime_tables``, the operator's in ``operator_tables``), so
migrations and schema checks see them all.
"""

from ito.server.store import operator_tables, runtime_tables, tables

__all__ = ["operator_tables", "runtime_tables", "tables"]
