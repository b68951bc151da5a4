"""Manifests: validated, then stored immutable and content-addressed per account."""

from __future__ import annotations

from typing import Any

from sqlalchemy import select
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from ito.core.errors import ItoError
from ito.core.manifest import Manifest, manifest_digest, manifest_summary
from ito.server.services.manifest_cache import parsed_manifest
from ito.server.store.tables import ManifestRow

__all__ = ["find_manifest", "load_manifest", "manifest_dict", "store_manifest"]


def store_manifest(session: Session, account_id: str, raw: bytes) -> tuple[ManifestRow, bool]:
    """Validate and store; the same bytes again are a no-op. Returns (row, created).

    Two transactions storing the same new manifest at once (PostgreSQL; SQLite serialises
    writers) both miss it on the first look; the loser's insert then meets the unique
    constraint. It runs in a savepoint, so only the insert is undone and the winner's row
    (committed, hence visible under READ COMMITTED) is returned instead."""
    digest = manifest_digest(raw)
    existing = find_manifest(session, account_id, digest)
    if existing is not None:
        # Same digest, same bytes: already validated when first stored.
        return existing, False
    manifest = parsed_manifest(raw, digest)
    row = ManifestRow(
        account_id=account_id,
        digest=digest,
        content=raw,
        size_bytes=len(raw),
        summary=manifest_summary(manifest),
    )
    try:
        with session.begin_nested():
            session.add(row)
    except IntegrityError:
        existing = find_manifest(session, account_id, digest)
        if existing is None:
            raise
        return existing, False
    return row, True


def find_manifest(session: Session, account_id: str, digest: str) -> ManifestRow | None:
    return session.scalar(
        select(ManifestRow).where(
            ManifestRow.account_id == account_id, ManifestRow.digest == digest
        )
    )


def load_manifest(session: Session, account_id: str, digest: str) -> tuple[ManifestRow, Manifest]:
    row = find_manifest(session, account_id, digest)
    if row is None:
        raise ItoError("manifest_not_found", digest=digest)
    return row, parsed_manifest(row.content, row.digest)


def manifest_dict(row: ManifestRow) -> dict[str, Any]:
    return {
        "manifest_id": row.digest,
        "digest": row.digest,
        "size_bytes": row.size_bytes,
        "summary": row.summary,
        "created_at": row.created_at.isoformat(),
    }
