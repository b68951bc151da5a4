"""What this runtime can do of what a valid manifest asks (DESIGN §5.8 gate 5, §7.4, §7.5).

The manifest schema (v1) is designed for the stages to come, so it accepts more than the runtime
does today: post-training on a pipeline-parallel layout or with several replica groups, data
or a tokenizer at ``s3://``, ``gs://`` or ``https://`` URIs, evals on data or layouts it cannot
measure them with, and custom data the ladder decision job cannot judge. A run asking for any of
them would be created, charged for, and fail (or skip what it asked) after its confirmation is
spent — so :func:`check_runtime_support` refuses it at plan, confirm and create alike
(``capability_unavailable``, with the JSON path of every unsupported part), before anything is
created or consumed.

What is checked of an eval here is what the manifest says: that the engine has the battery
(:mod:`ito.pipeline.batteries`) and that the planned layout can run it. Generation
(``exact_match``) and per-option scoring (``multiple_choice``) need the whole model in each
forward, which a pipeline-parallel layout (``pp`` > 1) does not have. Validation already
requires their data to be ``eval`` data (the role whose rows may hold ``prompt``, ``answer``,
``options``); whether its rows really are items of that shape is read by the engine before its
first training step (``data_invalid``): the server never holds the data. Nor the tokenizer file
the manifest names: its digest and its vocabulary (against the model's) are checked by data
preparation, before anything is tokenized (``tokenizer_invalid``).

Initial weights (``model.revision``) are not judged here: whether they resolve needs the
store (an earlier run's committed checkpoint) or the file system, so the server resolves them
beside this check (:mod:`ito.server.services.revisions`, ``revision_unresolvable``).

Pure: the manifest in, a refusal out; no I/O.
"""

from __future__ import annotations

import posixpath
from urllib.parse import unquote, urlsplit

from ito.core.errors import ItoError
from ito.core.ladder import ladder_plan
from ito.core.manifest import Manifest

__all__ = [
    "ITEM_EVALS",
    "MEASURABLE_EVALS",
    "READABLE_SCHEMES",
    "check_runtime_support",
    "unsupported_parts",
]

READABLE_SCHEMES = frozenset({"file"})
"""URI schemes data preparation reads (``file://`` naming an absolute local path; a tokenizer
may also be named by the absolute path itself)."""
MEASURABLE_EVALS = frozenset(
    {"heldout_loss", "perplexity", "exact_match", "sampled_exact_match", "multiple_choice"}
)
"""Evals the engine measures at a curriculum stage's gate (the batteries of
:mod:`ito.pipeline.batteries`)."""
ITEM_EVALS = frozenset({"exact_match", "sampled_exact_match", "multiple_choice"})
"""Evals over eval items (greedy or sampled generation, per-option log-likelihood): ``eval``
data only, and not under pipeline parallelism."""


def unsupported_parts(
    manifest: Manifest, pipeline_stages: int = 1, rollout_worker_served: bool = True
) -> list[dict[str, str]]:
    """Every part of ``manifest`` this runtime cannot carry out on a layout with
    ``pipeline_stages`` pipeline stages, where the separate rollout worker can
    (``rollout_worker_served``) or cannot serve the planned layout: ``path`` (JSON path),
    ``capability`` (``post_training``, ``rollout_worker``, ``data_uri_scheme``, ``data_uri``,
    ``tokenizer_uri_scheme``, ``tokenizer_uri``, ``eval``, ``eval_layout`` or ``ladder``) and
    ``reason``."""
    found: list[dict[str, str]] = []
    post = manifest.post_training
    if post.rlvr is not None and post.rlvr.max_staleness > 0 and not rollout_worker_served:
        # Staleness ≥ 1 asks for rollouts from the separate worker, which serves unsharded
        # fp32 copies on CPU (FSDP over one mesh dimension): elsewhere it would silently become
        # the synchronous loop, which is not what was approved.
        found.append(
            {
                "path": "$.post_training.rlvr.max_staleness",
                "capability": "rollout_worker",
                "reason": "max_staleness ≥ 1 needs RLVR's separate rollout worker, which serves "
                "only CPU layouts with FSDP over one mesh dimension; set max_staleness 0 for "
                "on-policy rollouts in the training ranks",
            }
        )
    for name in ("sft", "dpo", "rlvr"):
        if getattr(post, name) is None:
            continue
        # Post-training runs on the engine's own FSDP/TP layouts inside one torchrun world:
        # generation and per-example losses need the whole model in each forward, and its
        # batches are gathered over that world only.
        if pipeline_stages > 1:
            found.append(
                {
                    "path": f"$.post_training.{name}",
                    "capability": "post_training",
                    "reason": f"{name} needs the whole model in each forward; the planned "
                    f"layout splits it into {pipeline_stages} pipeline stages",
                }
            )
        if manifest.resources.replica_groups > 1:
            found.append(
                {
                    "path": f"$.post_training.{name}",
                    "capability": "post_training",
                    "reason": f"this runtime runs {name} inside one torchrun world, not with "
                    "several replica groups",
                }
            )
    found += _ladder_parts(manifest)
    # Data preparation reads every data reference of the manifest, whatever uses it, and the
    # tokenizer the manifest names.
    for i, ref in enumerate(manifest.data):
        found += _uri_parts(ref.uri, f"$.data[{i}].uri", "data")
    tokenizer = manifest.model.tokenizer
    if tokenizer is not None and not tokenizer.uri.startswith("/"):
        found += _uri_parts(tokenizer.uri, "$.model.tokenizer.uri", "tokenizer")
    # The batteries that gate a stage the runtime runs: the curriculum's and post-training's.
    checked: set[str] = set()
    gated = [(s.stage, s.battery) for s in manifest.curriculum] + [
        (name, recipe.battery)
        for name in ("sft", "dpo", "rlvr")
        if (recipe := getattr(post, name)) is not None
    ]
    for stage_name, battery in gated:
        if battery in checked:
            continue
        checked.add(battery)
        for j, spec in enumerate(manifest.eval_batteries.get(battery, [])):
            if spec.eval not in MEASURABLE_EVALS:
                found.append(
                    {
                        "path": f"$.eval_batteries.{battery}[{j}].eval",
                        "capability": "eval",
                        "reason": f"{spec.eval!r} cannot be measured at the {stage_name} "
                        f"stage's gate by this runtime (it measures "
                        f"{', '.join(sorted(MEASURABLE_EVALS))}); the gate would always fail",
                    }
                )
            elif spec.eval in ITEM_EVALS and pipeline_stages > 1:
                found.append(
                    {
                        "path": f"$.eval_batteries.{battery}[{j}].eval",
                        "capability": "eval_layout",
                        "reason": f"{spec.eval!r} needs the whole model in each forward; the "
                        f"planned layout splits it into {pipeline_stages} pipeline stages",
                    }
                )
    return found


def _uri_parts(uri: str, path: str, what: str) -> list[dict[str, str]]:
    """``uri`` (of the data or the tokenizer) if this runtime cannot read it."""
    parts = urlsplit(uri)
    if parts.scheme not in READABLE_SCHEMES:
        return [
            {
                "path": path,
                "capability": f"{what}_uri_scheme",
                "reason": f"this runtime reads the {what} from file:// URIs only, not "
                f"{parts.scheme}://",
            }
        ]
    if parts.netloc not in ("", "localhost") or not posixpath.isabs(unquote(parts.path)):
        return [
            {
                "path": path,
                "capability": f"{what}_uri",
                "reason": "a file:// URI must name an absolute path on the training node",
            }
        ]
    return []


def _ladder_parts(manifest: Manifest) -> list[dict[str, str]]:
    """What the ladder job (:mod:`ito.pipeline.ladder`) cannot judge: it compares one curriculum
    stage with and without its custom data, inside one torchrun world."""
    if not manifest.ladder.enabled:
        return []
    found: list[dict[str, str]] = []
    plan = ladder_plan(manifest)
    judged = set(plan.custom) if plan is not None else set()
    later = {d for s in manifest.curriculum for d in s.data}
    post = manifest.post_training
    for recipe in (post.sft, post.dpo, post.rlvr):
        later |= set(recipe.data) if recipe is not None else set()
    for i, ref in enumerate(manifest.data):
        if ref.custom and ref.id in later and ref.id not in judged:
            found.append(
                {
                    "path": f"$.data[{i}].custom",
                    "capability": "ladder",
                    "reason": f"the ladder judges the custom data of one curriculum stage "
                    f"(the first that names custom data); {ref.id!r} is used elsewhere "
                    "without being judged",
                }
            )
    if manifest.resources.replica_groups > 1:
        found.append(
            {
                "path": "$.ladder.enabled",
                "capability": "ladder",
                "reason": "the ladder job runs inside one torchrun world; this runtime does "
                "not run it with several replica groups",
            }
        )
    return found


def check_runtime_support(
    manifest: Manifest, pipeline_stages: int = 1, rollout_worker_served: bool = True
) -> None:
    """Refuse with ``capability_unavailable`` listing :func:`unsupported_parts`, if any."""
    found = unsupported_parts(manifest, pipeline_stages, rollout_worker_served)
    if found:
        raise ItoError(
            "capability_unavailable",
            "this runtime cannot carry out part of the manifest: "
            + "; ".join(f"{f['path']}: {f['reason']}" for f in found[:5]),
            unsupported=found,
        )
