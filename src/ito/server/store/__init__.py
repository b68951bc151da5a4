"""Persistence: tables, engines and sessions, migrations."""
