"""Provenance served and bound (DESIGN §7.4): the worker holding a run's lease uploads the
data-preparation report; the server checks that it describes this run's manifest (the same data
ids, prepared from the bytes the manifest names; the tokenizer the manifest names, or one trained
on the data) and that its contamination is within the manifest's data policy, stores its exact
bytes and binds their digest to the run — once: a later upload must carry the same digest
(``provenance_mismatch`` otherwise, nothing written). The run's tenant reads it back; another
tenant's run answers like a missing one.
"""

from __future__ import annotations

from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from ito.core.errors import ItoError
from ito.core.provenance import (
    contamination_over,
    parse_provenance,
    provenance_digest,
    unbound_data,
    unbound_tokenizer,
)
from ito.server.services.credentials import AuthContext
from ito.server.services.leases import held_lease
from ito.server.services.manifests import load_manifest
from ito.server.services.run_events import record_event
from ito.server.services.runs import get_run
from ito.server.store.runtime_tables import RunProvenance

__all__ = ["bind_provenance", "provenance_of"]


def bind_provenance(
    session: Session, worker: AuthContext, run_id: str, attempt: int, raw: bytes
) -> dict[str, Any]:
    """Bind the report in ``raw`` to the run (see module doc); the answer names its digest."""
    run, _ = held_lease(session, worker, run_id, attempt)
    digest = provenance_digest(raw)
    if run.provenance_sha256 is not None:
        if run.provenance_sha256 != digest:
            raise ItoError(
                "provenance_mismatch",
                "this preparation differs from the report already bound to the run",
                bound=run.provenance_sha256,
                uploaded=digest,
            )
        return {"run_id": run.id, "sha256": digest, "bytes": len(raw), "replayed": True}
    report = parse_provenance(raw)
    _, manifest = load_manifest(session, run.account_id, run.manifest_digest)
    differing = unbound_data(report, {ref.id: ref.sha256 for ref in manifest.data})
    if differing:
        raise ItoError(
            "provenance_mismatch",
            "the report does not describe this run's manifest data",
            data_ids=differing[:16],
        )
    named = manifest.model.tokenizer
    if unbound_tokenizer(report, named.sha256 if named is not None else None):
        raise ItoError(
            "provenance_mismatch",
            "the report's tokenizer is not the one the manifest names"
            if named is not None
            else "the report's tokenizer was not trained on the run's data",
        )
    limit = manifest.data_policy.max_contamination
    over = contamination_over(report, limit)
    if over:
        raise ItoError(
            "data_policy_violation",
            "eval data found in the training data above the policy's limit",
            reason="contamination",
            eval_ids=over[:16],
            max_contamination=limit,
        )
    session.add(
        RunProvenance(
            run_id=run.id,
            account_id=run.account_id,
            sha256=digest,
            content=raw,
            bytes=len(raw),
            attempt=attempt,
        )
    )
    run.provenance_sha256 = digest
    removed = {d.id: d.counts.input - d.counts.output for d in report.datasets if d.role != "eval"}
    record_event(
        session,
        run,
        "provenance",
        f"data-preparation report bound ({digest[:19]}…)",
        data={
            "sha256": digest,
            "bytes": len(raw),
            "datasets": len(report.datasets),
            "rows_removed": removed,
            "eval_contaminated_fraction": report.eval_contaminated_fraction,
        },
    )
    return {"run_id": run.id, "sha256": digest, "bytes": len(raw), "replayed": False}


def provenance_of(session: Session, account_id: str, run_id: str) -> dict[str, Any]:
    """The report bound to this account's run, parsed, with its digest."""
    run = get_run(session, account_id, run_id)
    row = session.scalar(select(RunProvenance).where(RunProvenance.run_id == run.id))
    if row is None:
        raise ItoError("provenance_not_found", run_id=run.id)
    report = parse_provenance(row.content)
    return {
        "run_id": run.id,
        "sha256": row.sha256,
        "bytes": row.bytes,
        "attempt": row.attempt,
        "created_at": row.created_at.isoformat(),
        "report": report.model_dump(mode="json", by_alias=True),
    }
