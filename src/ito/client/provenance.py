"""``ito runs provenance R`` for a human: the bound report's digest, then one row per data set
(rows in, removed per reason, rows out, shard digest), the tokenizer and the decontamination per
eval set.
``--json`` prints the whole report as the server answered it."""

from __future__ import annotations

from typing import Any

__all__ = ["render_provenance"]


def render_provenance(envelope: dict[str, Any]) -> None:
    from rich.console import Console
    from rich.table import Table

    console = Console()
    data = envelope["data"]
    report = data["report"]
    console.print(f"[green]✓[/green] {envelope['notice']}", highlight=False)
    console.print(
        f"bound to run {data['run_id']} by attempt {data['attempt']} at {data['created_at']}; "
        f"{data['bytes']} bytes",
        highlight=False,
        markup=False,
    )
    table = Table("data", "role", "in", "empty", "exact dup", "near dup", "contaminated", "out")
    table.add_column("shard sha256")
    for d in report["datasets"]:
        c = d["counts"]
        table.add_row(
            d["id"],
            d["role"],
            str(c["input"]),
            str(c["empty_removed"]),
            str(c["exact_dupes_removed"]),
            str(c["near_dupes_removed"]),
            str(c["contaminated_removed"]),
            str(c["output"]),
            d["output_sha256"][:16] + "…",
        )
    console.print(table)
    tokenizer = report.get("tokenizer")
    if tokenizer:
        origin = "named by the manifest" if tokenizer["source"] == "manifest" else "trained"
        console.print(
            f"tokenizer: {origin}, sha256 {tokenizer['sha256'][:16]}…, "
            f"vocabulary {tokenizer['vocab']}",
            highlight=False,
            markup=False,
        )
    limit = (report.get("parameters") or {}).get("max_contamination")
    for e in report["evals"]:
        console.print(
            f"eval {e['id']}: {e['contaminated']} of {e['items']} items found in the training "
            f"data as supplied ({e['fraction']:.1%}; policy limit {limit})",
            highlight=False,
            markup=False,
        )
        for match in e.get("matched") or []:
            console.print(f"  - {match}", highlight=False, markup=False)
