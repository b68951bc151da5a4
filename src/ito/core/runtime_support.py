"""What this runtime can do of what a valid manifest asks (DESIGN §5.8 gate 5, §7.4, §7.5).

The manifest schema (v1) is designed for the stages to come, so it accepts more than the runtime
does today: data at ``s3://``, ``gs://`` or ``https://`` URIs, and evals such as ``exact_match``.
A run asking for either would be created, charged for, and fail after its confirmation is spent
— so :func:`check_runtime_support` refuses it at plan, confirm and create alike
(``capability_unavailable``, with the JSON path of every unsupported part), before anything is
created or consumed.

Pure: the manifest in, a refusal out; no I/O.
"""

from __future__ import annotations

import posixpath
from urllib.parse import unquote, urlsplit

from ito.core.errors import ItoError
from ito.core.manifest import Manifest

__all__ = [
    "MEASURABLE_EVALS",
    "READABLE_SCHEMES",
    "check_runtime_support",
    "unsupported_parts",
]

READABLE_SCHEMES = frozenset({"file"})
"""URI schemes data preparation reads (``file://`` naming an absolute local path)."""
MEASURABLE_EVALS = frozenset({"heldout_loss", "perplexity"})
"""Evals the engine measures at a curriculum stage's gate (held-out loss on the named data)."""


def unsupported_parts(manifest: Manifest) -> list[dict[str, str]]:
    """Every part of ``manifest`` this runtime cannot carry out: ``path`` (JSON path),
    ``capability`` (``data_uri_scheme``, ``data_uri`` or ``eval``) and ``reason``."""
    found: list[dict[str, str]] = []
    # Data preparation reads every data reference of the manifest, whatever uses it.
    for i, ref in enumerate(manifest.data):
        parts = urlsplit(ref.uri)
        path = f"$.data[{i}].uri"
        if parts.scheme not in READABLE_SCHEMES:
            found.append(
                {
                    "path": path,
                    "capability": "data_uri_scheme",
                    "reason": f"this runtime reads data from file:// URIs only, not "
                    f"{parts.scheme}://",
                }
            )
        elif parts.netloc not in ("", "localhost") or not posixpath.isabs(unquote(parts.path)):
            found.append(
                {
                    "path": path,
                    "capability": "data_uri",
                    "reason": "a file:// URI must name an absolute path on the training node",
                }
            )
    # The batteries that gate a stage the runtime runs: the curriculum's. (Post-training stages
    # are not run by this runtime version; the plan says so in its warnings.)
    checked: set[str] = set()
    for stage in manifest.curriculum:
        if stage.battery in checked:
            continue
        checked.add(stage.battery)
        for j, spec in enumerate(manifest.eval_batteries.get(stage.battery, [])):
            if spec.eval not in MEASURABLE_EVALS:
                found.append(
                    {
                        "path": f"$.eval_batteries.{stage.battery}[{j}].eval",
                        "capability": "eval",
                        "reason": f"{spec.eval!r} cannot be measured at the {stage.stage} "
                        f"stage's gate by this runtime (it measures "
                        f"{', '.join(sorted(MEASURABLE_EVALS))}); the gate would always fail",
                    }
                )
    return found


def check_runtime_support(manifest: Manifest) -> None:
    """Refuse with ``capability_unavailable`` listing :func:`unsupported_parts`, if any."""
    found = unsupported_parts(manifest)
    if found:
        raise ItoError(
            "capability_unavailable",
            "this runtime cannot carry out part of the manifest: "
            + "; ".join(f"{f['path']}: {f['reason']}" for f in found[:5]),
            unsupported=found,
        )
