"""Resolving a manifest's initial weights (``model.revision``, DESIGN §7.6) at plan, confirm and
create — beside gate 5's pure checks, because it needs the store and perhaps the file system.

``run:<run_id>@<step>``: the run must be this account's (another tenant's answers exactly as a
missing one), of the same family and size, with the same tokenizer reference; a checkpoint at
that step must have been reported committed, not deleted by cleanup nor pruned (``keep_last`` of
the source's manifest), with its digest reported; and the source's checkpoint storage must lie
inside the new booking's storage (what its worker can read). ``hf:<dir>@sha256:<hex>``: the
directory must lie inside the booking's storage; when this server can read it there (no link
out of it), its ``config.json`` — a regular file, opened without blocking, at most
:data:`MAX_CONFIG_BYTES` — must describe the manifest's architecture. The digest of
``model.safetensors`` is the engine's to verify before step 0, as it reads the file once (the
plan says so: ``verified_by_engine``); the server never hashes a tenant's file inside a
request, nor waits on one (a FIFO, a device, a sparse 16 GiB file).

Any refusal is ``revision_unresolvable`` (:func:`ito.core.revisions.unresolvable`); what was
resolved is recorded on the new run (its estimate's ``initial_weights``) for the worker.
"""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path
from urllib.parse import unquote, urlsplit

from sqlalchemy import select
from sqlalchemy.orm import Session

from ito.core.errors import ItoError
from ito.core.gates import BookingView
from ito.core.manifest import Manifest
from ito.core.model_sizes import SIZES
from ito.core.revisions import (
    HfRevision,
    InitialWeights,
    RunRevision,
    architecture_mismatch,
    parse_revision,
    storage_parts,
    unresolvable,
)
from ito.core.storage import contained_storage_uri
from ito.server.services.manifest_cache import parsed_manifest
from ito.server.services.manifests import find_manifest
from ito.server.store.runtime_tables import CheckpointRow
from ito.server.store.tables import Run, RunEvent

__all__ = ["resolve_revision"]

MAX_CONFIG_BYTES = 1 << 20
"""The largest ``config.json`` the server reads (a real one is a few kilobytes)."""


def resolve_revision(
    session: Session, account_id: str, manifest: Manifest, booking: BookingView
) -> InitialWeights | None:
    """The manifest's initial weights, resolved for a run of ``account_id`` on ``booking``
    (``None`` for ``scratch``), or ``revision_unresolvable``."""
    revision = parse_revision(manifest.model.revision)
    if revision is None:
        return None
    if isinstance(revision, RunRevision):
        return _resolve_run(session, account_id, manifest, booking, revision)
    return _resolve_hf(manifest, booking, revision)


def _resolve_run(
    session: Session,
    account_id: str,
    manifest: Manifest,
    booking: BookingView,
    revision: RunRevision,
) -> InitialWeights:
    source = session.scalar(
        select(Run).where(Run.id == revision.run_id, Run.account_id == account_id)
    )
    row = find_manifest(session, account_id, source.manifest_digest) if source is not None else None
    if source is None or row is None:
        raise unresolvable("run_not_found", "no run of this account has that id")
    theirs = parsed_manifest(row.content, row.digest)
    if (theirs.model.family, theirs.model.size) != (manifest.model.family, manifest.model.size):
        raise unresolvable(
            "architecture_mismatch",
            f"the run trained a {theirs.model.family} {theirs.model.size} model, the manifest "
            f"asks for {manifest.model.family} {manifest.model.size}",
        )
    if _tokenizer(theirs) != _tokenizer(manifest):
        raise unresolvable(
            "tokenizer_mismatch", "the manifest names another tokenizer than the run trained with"
        )
    rows = list(
        session.scalars(
            select(CheckpointRow).where(
                CheckpointRow.run_id == source.id, CheckpointRow.account_id == account_id
            )
        )
    )
    at_step = [r for r in rows if r.step == revision.step]
    if not at_step:
        raise unresolvable(
            "checkpoint_not_committed", "the run reported no committed checkpoint at that step"
        )
    # The engine keeps the newest keep_last committed steps (over every stage) and deletes the
    # rest; cleanup deletes them all.
    live_steps = sorted({r.step for r in rows if r.deleted_at is None})
    kept = live_steps[-theirs.checkpoint.keep_last :]
    if (
        source.cleanup_state == "cleaned"
        or all(r.deleted_at is not None for r in at_step)
        or revision.step not in kept
    ):
        raise unresolvable("checkpoint_deleted", "the checkpoint at that step has been deleted")
    checkpoint = max(at_step, key=lambda r: r.id)
    digest = _reported_digest(session, source, revision.step)
    if digest is None:
        raise unresolvable(
            "digest_unknown", "the run did not report that checkpoint's digest (an older engine)"
        )
    if not booking.storage_uri:
        raise unresolvable("outside_booking_storage", "the booking has no storage")
    try:
        contained_storage_uri(source.checkpoint_uri, booking.storage_uri)
    except ItoError:
        raise unresolvable(
            "outside_booking_storage", "the run's checkpoints are outside the booking's storage"
        ) from None
    return InitialWeights(
        kind="run",
        sha256=digest,
        revision=manifest.model.revision,
        run_id=source.id,
        stage=checkpoint.stage,
        step=revision.step,
        checkpoint_uri=source.checkpoint_uri,
    )


def _tokenizer(manifest: Manifest) -> str | None:
    """The tokenizer a manifest names (its digest), or ``None``: trained on the run's data."""
    return manifest.model.tokenizer.sha256 if manifest.model.tokenizer is not None else None


def _reported_digest(session: Session, run: Run, step: int) -> str | None:
    events = session.scalars(
        select(RunEvent)
        .where(
            RunEvent.run_id == run.id,
            RunEvent.account_id == run.account_id,
            RunEvent.kind == "checkpoint",
        )
        .order_by(RunEvent.id.desc())
    )
    for event in events:
        data = event.data or {}
        if data.get("step") == step and isinstance(data.get("sha256"), str):
            return str(data["sha256"])
    return None


def _resolve_hf(manifest: Manifest, booking: BookingView, revision: HfRevision) -> InitialWeights:
    parts = storage_parts(revision.path, booking.storage_uri)
    weights = InitialWeights(
        kind="hf",
        sha256=revision.sha256,
        revision=manifest.model.revision,
        path=revision.path,
        verified_by_engine="sha256 of model.safetensors, as it loads it, before step 0",
    )
    assert booking.storage_uri is not None  # storage_parts refuses a booking without one
    root = Path(unquote(urlsplit(booking.storage_uri).path))
    directory = root.joinpath(*parts)
    # Read only what really lies inside the booking's storage (no link out of it): a manifest
    # must not learn anything of this host's other files.
    real_root = os.path.realpath(root)
    if not directory.is_dir() or not os.path.realpath(directory).startswith(real_root + "/"):
        return weights  # not on this host: the engine checks it before step 0
    # The server never waits on a tenant's file: config.json is opened without following a
    # link and without blocking (a FIFO answers at once), must be a regular file and is read
    # up to a bound. The weights' digest is the engine's to verify, as it reads them (one
    # read, however large the file): nothing here hashes gigabytes inside a request.
    config = _read_config(directory / "config.json")
    wrong = (
        architecture_mismatch(config, SIZES[manifest.model.size])
        if isinstance(config, dict)
        else "config"
    )
    if wrong is not None:
        raise unresolvable(
            "architecture_mismatch", f"config.json's {wrong} is not the manifest's model's"
        )
    return weights


def _read_config(path: Path) -> object:
    unreadable = unresolvable(
        "weights_unreadable", "the directory has no readable config.json (a regular file)"
    )
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError:
        raise unreadable from None
    st = os.fstat(fd)
    if not stat.S_ISREG(st.st_mode) or st.st_size > MAX_CONFIG_BYTES:
        os.close(fd)
        raise unreadable
    with os.fdopen(fd, "rb") as handle:
        data = handle.read(MAX_CONFIG_BYTES + 1)
    if len(data) > MAX_CONFIG_BYTES:
        raise unreadable
    try:
        return json.loads(data)
    except ValueError:
        raise unreadable from None
