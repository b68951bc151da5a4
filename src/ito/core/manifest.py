"""The training manifest, schema ``ito.training.manifest.v1`` (DESIGN §5.3).

Strict: unknown fields are rejected, types are not coerced, duplicate JSON keys are refused (a
reviewer and the parser must never see two different documents in the same bytes). The digest is
``sha256:`` of the exact bytes a human reviewed — the document is never re-serialised.

:func:`parse_manifest` is the one entry point: size bound → JSON → secret scan → schema →
cross-field checks, each failure an :class:`ItoError` with the JSON path of every problem.
"""

from __future__ import annotations

import hashlib
import json
import math
import re
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from ito.core.errors import ItoError
from ito.core.hardware import ACCELERATORS, FABRICS
from ito.core.model_sizes import SIZES
from ito.core.revisions import REVISION_PATTERN
from ito.core.rewards import REWARDS
from ito.core.secret_scan import scan_document
from ito.core.text import json_text_may_be_unsafe, unsafe_json_paths

__all__ = [
    "ACCURACY_EVALS",
    "LOSS_EVALS",
    "MANIFEST_MAX_BYTES",
    "MAX_BATTERIES",
    "MAX_DATA_REFS",
    "MAX_EVALS_PER_BATTERY",
    "MAX_IDS_PER_LIST",
    "MAX_LICENSES",
    "MAX_SUITES",
    "SCHEMA_ID",
    "EvalSpec",
    "Manifest",
    "ParallelismPins",
    "battery_gates",
    "manifest_digest",
    "manifest_json_schema",
    "manifest_summary",
    "parse_manifest",
    "post_stage_seq_len",
]

SCHEMA_ID = "ito.training.manifest.v1"
MANIFEST_MAX_BYTES = 256 * 1024
"""Size bound of a manifest, on the client and on the server (256 KiB: sixty times the demo's
manifest, and small enough that validating the largest valid one costs a few tens of
milliseconds of CPU, ``bench/manifest_validation.py``)."""

# Bounds on every list and map, so that validating a manifest is linear in a small, fixed
# maximum however the bytes are arranged (a document of 40 000 ids must not be valid).
MAX_DATA_REFS = 256
"""Data references in one manifest."""
MAX_IDS_PER_LIST = 256
"""Data ids one curriculum stage or post-training recipe names."""
MAX_SUITES = 32
"""Eval suites one data reference was decontaminated against."""
MAX_BATTERIES = 32
"""Eval batteries in one manifest."""
MAX_EVALS_PER_BATTERY = 32
"""Evals in one battery."""
MAX_LICENSES = 64
"""Licences a data policy allows."""
MAX_OBJECT_KEYS = MAX_BATTERIES
"""Keys of any JSON object (the largest is ``eval_batteries``)."""
MAX_ARRAY_ITEMS = max(MAX_DATA_REFS, MAX_IDS_PER_LIST)
"""Items of any JSON array."""
MAX_GPUS_PER_NODE = 64
MAX_WORLD = 4096 * MAX_GPUS_PER_NODE
"""Most accelerators a manifest can ask for (``nodes × gpus_per_node``)."""
MAX_ERRORS = 50
"""Schema errors reported at most (one is enough to refuse)."""

Sha256Hex = Annotated[str, Field(pattern=r"^[0-9a-f]{64}$")]
Ident = Annotated[str, Field(max_length=64, pattern=r"^[a-z0-9][a-z0-9_.-]{0,63}$")]
DataIds = Annotated[list[Ident], Field(min_length=1, max_length=MAX_IDS_PER_LIST)]
Accel = Literal["a100", "h100", "h200", "b200", "cpu"]
Fabric = Literal["nvlink", "infiniband", "roce", "ethernet"]
DataRole = Literal["pretrain", "midtrain", "sft", "dpo", "rlvr", "eval"]
StageName = Literal["pretrain", "midtrain", "long_context"]
SizeName = Literal["tiny", "150m", "1b", "8b"]
RewardName = Literal["exact_match_arith", "exact_match", "format_integer"]

STAGE_ORDER: tuple[str, ...] = ("pretrain", "midtrain", "long_context")
assert set(REWARDS) == {"exact_match_arith", "exact_match", "format_integer"}
assert set(ACCELERATORS) == {"a100", "h100", "h200", "b200", "cpu"}
assert set(FABRICS) == {"nvlink", "infiniband", "roce", "ethernet"}
assert set(SIZES) == {"tiny", "150m", "1b", "8b"}


_PLAIN_KEY = re.compile(r"[A-Za-z_][A-Za-z0-9_.-]{0,63}")


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True, frozen=True, allow_inf_nan=False)


class TokenizerRef(_Strict):
    uri: Annotated[str, Field(min_length=2, max_length=2048, pattern=r"^((file|s3|gs|https)://|/)")]
    """Where the Hugging Face ``tokenizers`` ``tokenizer.json`` is: a ``file://`` URI or an
    absolute path on the training node (the other schemes are refused at plan:
    :mod:`ito.core.runtime_support`)."""
    sha256: Sha256Hex
    """Digest of the file's bytes; verified by data preparation before any use."""


class ModelRef(_Strict):
    family: Literal["llama"]
    """Architecture family. Only the Llama decoder exists in v1."""
    size: SizeName
    """A named size of the family's size table."""
    revision: Annotated[
        str,
        Field(
            max_length=2100,
            pattern=REVISION_PATTERN,
            description="Initial weights: 'scratch' (seeded random initialisation); "
            "'run:<run_id>@<step>' (the committed checkpoint at that global step of an earlier "
            "run of the same account, in storage the booking can read); or "
            "'hf:<absolute directory>@sha256:<64 hex>' (a local Hugging Face directory, "
            "config.json and model.safetensors, the sha256 being model.safetensors'). Resolved "
            "and checked at plan, confirm and create (revision_unresolvable).",
        ),
    ]
    """Initial weights: ``scratch`` (seeded random initialisation), ``run:<run_id>@<step>`` (a
    committed checkpoint of an earlier run of the same account) or
    ``hf:<absolute directory>@sha256:<hex>`` (a local Hugging Face directory whose
    ``model.safetensors`` has that sha256); see :mod:`ito.core.revisions`. Resolved and checked
    by the server at plan, confirm and create; the engine re-verifies the digest before use."""
    tokenizer: TokenizerRef | None = None
    """The tokenizer to train with; absent, data preparation trains one on the run's data."""


class ParallelismPins(_Strict):
    """Parallelism choices pinned by the manifest: each one given is validated by the planner
    (DESIGN §7.2) instead of chosen; the ones left out are the planner's to choose. The same
    keys as :class:`ito.core.planner.Parallelism`."""

    dp_replicate: Annotated[int, Field(ge=1, le=MAX_WORLD)] | None = None
    """Replicas of the model (HSDP's replicate degree)."""
    dp_shard: Annotated[int, Field(ge=1, le=MAX_WORLD)] | None = None
    """Ranks each replica's parameters are sharded over (FSDP2)."""
    tp: Annotated[int, Field(ge=1, le=MAX_GPUS_PER_NODE)] | None = None
    """Tensor-parallel degree (inside one node)."""
    pp: Annotated[int, Field(ge=1, le=1024)] | None = None
    """Pipeline stages."""
    cp: Annotated[int, Field(ge=1, le=1024)] | None = None
    """Context-parallel degree."""
    micro_batch: Annotated[int, Field(ge=1, le=4096)] | None = None
    """Sequences per micro-batch on one data-parallel rank."""
    activation_checkpointing: Literal["none", "selective", "full"] | None = None


class Resources(_Strict):
    accelerators: Annotated[list[Accel], Field(min_length=1, max_length=len(ACCELERATORS))]
    """Accelerator types this run accepts; the booking's must be one of them."""
    nodes: Annotated[int, Field(ge=1, le=4096)]
    """Nodes the run needs."""
    gpus_per_node: Annotated[int, Field(ge=1, le=MAX_GPUS_PER_NODE)]
    """Accelerators (or CPU worker processes) per node the run needs."""
    fabrics: Annotated[list[Fabric], Field(min_length=1, max_length=len(FABRICS))]
    """Fabrics this run accepts between nodes (inside a node any)."""
    replica_groups: Annotated[int, Field(ge=1, le=64)] = 1
    """Replica groups the accelerators split into (HSDP's replicate degree). Each group holds a
    full FSDP2-sharded copy of the model; with more than one, the groups average gradients every
    step through torchft, and a group that dies is dropped from the step while the others go
    on, then heals from a live peer when it comes back (DESIGN §7.3)."""
    parallelism: ParallelismPins | None = None
    """Degrees pinned instead of chosen by the planner (optional)."""


class Decontamination(_Strict):
    eval_suites: Annotated[list[Ident], Field(min_length=1, max_length=MAX_SUITES)]
    """Ids of the eval data this data was decontaminated against."""
    method: Literal["ngram"]
    """Overlap method; n-gram overlap is the one v1 knows."""
    n: Annotated[int, Field(ge=8, le=64)]
    """N-gram size (13 by default in published practice: GPT-3 paper, appendix C)."""
    report_sha256: Sha256Hex
    """Digest of the decontamination report the human reviewed."""


class DataRef(_Strict):
    id: Ident
    """Name this data is referred to by elsewhere in the manifest."""
    uri: Annotated[str, Field(min_length=1, max_length=2048, pattern=r"^(file|s3|gs|https)://")]
    """Where the bytes are. Never with credentials in it."""
    sha256: Sha256Hex
    """Digest of the bytes; verified before use."""
    role: DataRole
    """What the data is for."""
    license: Annotated[str, Field(min_length=1, max_length=64)]
    """SPDX-style licence id, checked against the data policy."""
    custom: bool = False
    """Buyer-supplied data that must win its place in the ladder decision (§7.4)."""
    decontamination: Decontamination | None = None
    """Provenance of decontamination; required for training data by the data policy."""


class CurriculumStage(_Strict):
    stage: StageName
    data: DataIds
    tokens: Annotated[int, Field(ge=1, le=10**14)]
    """Token budget of the stage."""
    seq_len: Annotated[int, Field(ge=8, le=1 << 20)]
    battery: Ident
    """The fixed eval battery that gates the stage."""
    rope_base_scale: Annotated[float, Field(ge=1, le=1000, allow_inf_nan=False)] = 1.0
    """``long_context`` only: the RoPE base (θ) is multiplied by this for the stage and its
    gate — adjusted base frequency (Xiong et al. 2023, "Effective Long-Context Scaling of
    Foundation Models"; Llama 3 trains with θ = 500,000). 1: the model's own base."""


class SftRecipe(_Strict):
    data: DataIds
    epochs: Annotated[int, Field(ge=1, le=100)]
    max_tokens: Annotated[int, Field(ge=1, le=10**13)]
    """Upper bound of tokens processed, used for the cost estimate and enforced at run time."""
    battery: Ident
    seq_len: Annotated[int, Field(ge=8, le=1 << 20)] | None = None
    """Length every example is padded (or its prompt cut) to; absent: the last curriculum
    stage's. At most that stage's (the context the model was trained on)."""


class DpoRecipe(_Strict):
    data: DataIds
    beta: Annotated[float, Field(gt=0, le=10)]
    max_tokens: Annotated[int, Field(ge=1, le=10**13)]
    battery: Ident
    seq_len: Annotated[int, Field(ge=8, le=1 << 20)] | None = None
    """Length every example is padded (or its prompt cut) to; absent: the last curriculum
    stage's. At most that stage's (the context the model was trained on)."""
    rpo_alpha: Annotated[float, Field(ge=0, le=10)] = 0.0
    """Weight of the chosen completions' negative log-likelihood (per token) added to the DPO
    loss (RPO, Pang et al. 2024; TRL's ``rpo_alpha``): plain DPO lowers the chosen
    completions' likelihood along with the rejected ones', which a small model pays for in
    greedy accuracy. 0: plain DPO."""


class Overlong(_Strict):
    max_tokens: Annotated[int, Field(ge=1, le=1 << 20)]
    soft_tokens: Annotated[int, Field(ge=0, le=1 << 20)]
    """Length of the linear penalty band before ``max_tokens`` (DAPO, Yu et al. 2025, §3.4)."""


class Dapo(_Strict):
    clip_low: Annotated[float, Field(gt=0, lt=1)]
    clip_high: Annotated[float, Field(gt=0, lt=1)]
    dynamic_sampling: bool
    token_level_loss: bool
    overlong: Overlong
    max_generation_rounds: Annotated[int, Field(ge=1, le=64)] = 8
    """Generation rounds dynamic sampling may take to fill one step's batch; past them the step
    trains on the informative groups it found (a step with none is skipped, no optimizer step
    taken)."""
    expected_generation_rounds: Annotated[float, Field(ge=1, le=64, allow_inf_nan=False)] = 1.0
    """Generation rounds a step is expected to take (what a recipe measured on its data): the
    expected RLVR time is priced with it, the upper bound with ``max_generation_rounds``. At
    most ``max_generation_rounds``."""
    max_empty_steps: Annotated[int, Field(ge=1, le=10_000)] = 8
    """Steps in a row without an informative group after which the stage ends early, as
    completed, and its gate decides (the policy solves the prompts it samples). If no step of
    the stage ever had one and the rewards were never all at the top, the stage fails
    ``dynamic_sampling_exhausted`` instead."""


class RlvrRecipe(_Strict):
    algorithm: Literal["grpo"]
    data: DataIds
    rewards: Annotated[list[RewardName], Field(min_length=1, max_length=len(REWARDS))]
    group_size: Annotated[int, Field(ge=2, le=1024)]
    temperature: Annotated[float, Field(gt=0, le=2)] = 1.0
    """Sampling temperature of the rollouts. The policy RLVR samples and optimises is
    ``softmax(logits / temperature)``: the ratio's and the loss's log-probabilities are that
    distribution's, as TRL and verl compute them. Below 1, groups of answers the model already
    gives are all right and dropped by dynamic sampling, and the steps train on the prompts
    whose likeliest answers compete: those that greedy decoding gets wrong or nearly so."""
    max_staleness: Annotated[int, Field(ge=0, le=64)]
    """Largest allowed version lag of a rollout behind the trainer (0 = on-policy)."""
    max_tokens: Annotated[int, Field(ge=1, le=10**13)]
    battery: Ident
    dapo: Dapo
    seq_len: Annotated[int, Field(ge=8, le=1 << 20)] | None = None
    """Prompt plus completion (``dapo.overlong.max_tokens``); absent: the last curriculum
    stage's. At most that stage's."""


class PostTraining(_Strict):
    sft: SftRecipe | None = None
    dpo: DpoRecipe | None = None
    rlvr: RlvrRecipe | None = None


EvalName = Literal[
    "heldout_loss", "perplexity", "exact_match", "sampled_exact_match", "multiple_choice"
]
LOSS_EVALS = frozenset({"heldout_loss", "perplexity"})
"""Evals where lower is better: gated by an upper bound (``max`` or ``max_ratio``)."""
ACCURACY_EVALS = frozenset({"exact_match", "sampled_exact_match", "multiple_choice"})
"""Evals where higher is better, in [0, 1]: gated by a lower bound (``min`` or ``min_ratio``)."""
Ratio = Annotated[float, Field(gt=0, le=1000)]


class EvalSpec(_Strict):
    """One eval of a battery and its gate: exactly one bound, absolute or relative to the
    untrained model's value of the same eval measured at step 0 (DESIGN §7.5)."""

    eval: EvalName
    data: Ident
    """The data it is measured on (held-out documents, or the eval items of an ``eval`` set)."""
    min: float | None = None
    """Accuracies: passes iff value ≥ min."""
    max: float | None = None
    """Losses: passes iff value ≤ max."""
    min_ratio: Ratio | None = None
    """Accuracies: passes iff value ≥ min_ratio × the step-0 value (not for ``exact_match`` or
    ``sampled_exact_match``, whose step-0 value is about 0)."""
    max_ratio: Ratio | None = None
    """Losses: passes iff value ≤ max_ratio × the step-0 value (0.6: the loss fell by 40 %)."""

    @property
    def relative(self) -> bool:
        """Whether its bound is relative to the step-0 value."""
        return self.min_ratio is not None or self.max_ratio is not None

    def threshold(self, initial: float | None) -> float | None:
        """The bound the value is compared with: absolute, or the ratio times ``initial``
        (``None`` when that is not known)."""
        if self.max is not None:
            return self.max
        if self.min is not None:
            return self.min
        ratio = self.max_ratio if self.max_ratio is not None else self.min_ratio
        if ratio is None or initial is None:
            return None
        return ratio * initial

    def passes(self, value: float | None, initial: float | None) -> bool:
        """Fail closed: a value or a relative bound that is not known (or not finite) fails."""
        bound = self.threshold(initial)
        if value is None or bound is None or not math.isfinite(value):
            return False
        return value <= bound if self.eval in LOSS_EVALS else value >= bound

    def describe(self) -> str:
        """The gate as a human reads it: ``heldout_loss(web) ≤ 0.6 × step 0``."""
        head = f"{self.eval}({self.data})"
        if self.max is not None:
            return f"{head} ≤ {self.max:g}"
        if self.min is not None:
            return f"{head} ≥ {self.min:g}"
        if self.max_ratio is not None:
            return f"{head} ≤ {self.max_ratio:g} × step 0"
        return f"{head} ≥ {self.min_ratio:g} × step 0"


class Ladder(_Strict):
    enabled: bool
    proxy_size: SizeName
    tokens: Annotated[int, Field(ge=1, le=10**13)]
    margin: Annotated[float, Field(ge=0, le=10)]
    """The custom data may lose by at most this much on the battery."""


class CheckpointPolicy(_Strict):
    every_steps: Annotated[int, Field(ge=1, le=10**7)]
    keep_last: Annotated[int, Field(ge=1, le=1000)]
    storage: Annotated[str, Field(min_length=1, max_length=2048)]
    """``booking`` (the booking's storage) or a URI inside it."""


class DataPolicy(_Strict):
    allowed_licenses: Annotated[
        list[Annotated[str, Field(min_length=1, max_length=64)]],
        Field(min_length=1, max_length=MAX_LICENSES),
    ]
    max_contamination: Annotated[float, Field(ge=0, le=1)]
    """Largest accepted fraction of eval items found in training data."""


class Budget(_Strict):
    ceiling_usd: Annotated[float, Field(gt=0, le=1e9)]
    """The run's whole cost may never cross this."""
    max_incremental_cost_usd: Annotated[float, Field(gt=0, le=1e9)]
    """Largest cost one approved action (the create, a restart) may add."""


class Manifest(_Strict):
    schema_: Literal["ito.training.manifest.v1"] = Field(alias="schema")
    name: Ident
    model: ModelRef
    resources: Resources
    data: Annotated[list[DataRef], Field(min_length=1, max_length=MAX_DATA_REFS)]
    curriculum: Annotated[list[CurriculumStage], Field(min_length=1, max_length=3)]
    post_training: PostTraining
    eval_batteries: Annotated[
        dict[
            Ident, Annotated[list[EvalSpec], Field(min_length=1, max_length=MAX_EVALS_PER_BATTERY)]
        ],
        Field(max_length=MAX_BATTERIES),
    ]
    ladder: Ladder
    checkpoint: CheckpointPolicy
    data_policy: DataPolicy
    budget: Budget

    model_config = ConfigDict(
        extra="forbid", strict=True, frozen=True, populate_by_name=False, allow_inf_nan=False
    )

    def data_by_id(self) -> dict[str, DataRef]:
        return {ref.id: ref for ref in self.data}


def manifest_digest(raw: bytes) -> str:
    return "sha256:" + hashlib.sha256(raw).hexdigest()


def post_stage_seq_len(m: Manifest, recipe: SftRecipe | DpoRecipe | RlvrRecipe) -> int:
    """The sequence length a post-training stage trains on: its own, else the last curriculum
    stage's."""
    return recipe.seq_len if recipe.seq_len is not None else m.curriculum[-1].seq_len


def manifest_json_schema() -> dict[str, Any]:
    schema = Manifest.model_json_schema(by_alias=True)
    schema["$id"] = SCHEMA_ID
    schema["$schema"] = "https://json-schema.org/draft/2020-12/schema"
    return schema


def parse_manifest(raw: bytes) -> Manifest:
    """Parse and validate manifest bytes, or raise the precise :class:`ItoError`."""
    if len(raw) > MANIFEST_MAX_BYTES:
        raise ItoError("manifest_too_large", max_bytes=MANIFEST_MAX_BYTES)
    try:
        return _parse(raw)
    except RecursionError:
        raise ItoError(
            "manifest_invalid",
            "the manifest nests too deeply",
            errors=[{"path": "$", "message": "nesting too deep"}],
        ) from None


def _parse(raw: bytes) -> Manifest:
    try:
        text = raw.decode("utf-8")
        document = json.loads(
            text, object_pairs_hook=_no_duplicate_keys, parse_constant=_no_constant
        )
    except _DuplicateKey:
        # The key itself is not echoed: it might be the very credential being smuggled.
        raise ItoError(
            "manifest_invalid",
            "the manifest repeats a JSON key",
            errors=[{"path": "$", "message": "duplicate key"}],
        ) from None
    except (UnicodeDecodeError, ValueError):
        raise ItoError(
            "manifest_invalid",
            "the manifest is not UTF-8 JSON",
            errors=[{"path": "$", "message": "not valid UTF-8 JSON"}],
        ) from None
    # Before anything else looks at the document: a credential anywhere (any key, any string,
    # any depth) is refused as such, and never reaches a schema error.
    findings = scan_document(document)
    if findings:
        raise ItoError(
            "manifest_contains_secret",
            "the manifest contains values that look like credentials; remove them and "
            "reference secrets out of band",
            findings=[{"path": f.path, "kind": f.kind} for f in findings],
        )
    # The walk of every string only when the text may hold one (its paths are then needed).
    unsafe = unsafe_json_paths(document) if json_text_may_be_unsafe(text) else []
    if unsafe:
        # JSON escapes (\u0000, \u202e) get past the parser's own refusal of raw controls; such
        # text cannot be stored (PostgreSQL) or shown to an approver as it is (ito.core.text).
        raise ItoError(
            "manifest_invalid",
            "the manifest carries a control, bidirectional override or other refused character",
            errors=[{"path": p, "message": "refused character"} for p in unsafe],
        )
    if not isinstance(document, dict):
        raise ItoError("manifest_invalid", errors=[{"path": "$", "message": "must be an object"}])
    oversized = _oversized_container(document)
    if oversized is not None:
        raise ItoError("manifest_invalid", errors=[oversized])
    try:
        manifest = Manifest.model_validate(document)
    except ValidationError as exc:
        raise ItoError("manifest_invalid", errors=_validation_errors(exc)) from None
    problems = _cross_field_problems(manifest)
    if problems:
        raise ItoError(
            "manifest_invalid", errors=[{"path": p, "message": m} for p, m in problems[:MAX_ERRORS]]
        )
    return manifest


def _oversized_container(document: dict[str, Any]) -> dict[str, str] | None:
    """The first object with more keys, or array with more items, than any in a valid manifest.

    Checked before the schema, whose errors would otherwise be built one per unknown key or
    per item (68 000 keys: half a second of CPU for errors that are then thrown away). The
    sizes are checked first without building any path (a path per container costs more than
    the check); the path of the first oversized container is found by a second walk."""
    stack: list[Any] = [document]
    while stack:
        value = stack.pop()
        if isinstance(value, dict):
            if len(value) > MAX_OBJECT_KEYS:
                return _oversized_path(document)
            stack += [child for child in value.values() if isinstance(child, dict | list)]
        elif len(value) > MAX_ARRAY_ITEMS:
            return _oversized_path(document)
        else:
            stack += [child for child in value if isinstance(child, dict | list)]
    return None


def _oversized_path(document: dict[str, Any]) -> dict[str, str] | None:
    stack: list[tuple[Any, str]] = [(document, "$")]
    while stack:
        value, path = stack.pop()
        if isinstance(value, dict):
            if len(value) > MAX_OBJECT_KEYS:
                return {"path": path, "message": f"more than {MAX_OBJECT_KEYS} keys"}
            stack.extend(
                (child, path + (f".{key}" if _PLAIN_KEY.fullmatch(key) else "[<key>]"))
                for key, child in value.items()
                if isinstance(child, dict | list)
            )
        elif isinstance(value, list):
            if len(value) > MAX_ARRAY_ITEMS:
                return {"path": path, "message": f"more than {MAX_ARRAY_ITEMS} items"}
            stack.extend(
                (child, f"{path}[{index}]")
                for index, child in enumerate(value)
                if isinstance(child, dict | list)
            )
    return None


class _DuplicateKey(ValueError):
    def __init__(self, key: str) -> None:
        super().__init__(key)
        self.key = key


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


def _no_duplicate_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    # Built in C; a repeated key shows as a dict shorter than the pairs, and only then is it
    # looked for (a loop over the pairs in Python costs more than the parse itself).
    result = dict(pairs)
    if len(result) == len(pairs):
        return result
    seen: set[str] = set()
    for key, _ in pairs:
        if key in seen:
            raise _DuplicateKey(key)
        seen.add(key)
    raise AssertionError("unreachable")


def _validation_errors(exc: ValidationError) -> list[dict[str, str]]:
    # Never the input: no value is echoed, and a key (an unknown field, a battery name) only
    # when it is a short plain name.
    errors = []
    for err in exc.errors(include_url=False, include_input=False)[:MAX_ERRORS]:
        path = "$"
        for part in err["loc"]:
            if isinstance(part, int):
                path += f"[{part}]"
            elif _PLAIN_KEY.fullmatch(part):
                path += f".{part}"
            else:
                path += "[<key>]"
        errors.append({"path": path, "message": err["msg"]})
    return errors


def _cross_field_problems(m: Manifest) -> list[tuple[str, str]]:
    # Linear in the size of the manifest: every id is looked up in a dict or set built once.
    problems: list[tuple[str, str]] = []
    by_id: dict[str, DataRef] = {}
    eval_ids = {d.id for d in m.data if d.role == "eval"}
    for i, ref in enumerate(m.data):
        if ref.id in by_id:
            problems.append((f"$.data[{i}].id", f"duplicate data id {ref.id!r}"))
        by_id[ref.id] = ref
        if ref.decontamination is not None:
            for j, suite in enumerate(ref.decontamination.eval_suites):
                if suite not in eval_ids:
                    problems.append(
                        (
                            f"$.data[{i}].decontamination.eval_suites[{j}]",
                            f"{suite!r} is not an eval data id",
                        )
                    )

    size = SIZES[m.model.size]
    seen_stages: list[str] = []
    for i, stage in enumerate(m.curriculum):
        path = f"$.curriculum[{i}]"
        if stage.stage in seen_stages:
            problems.append((f"{path}.stage", f"stage {stage.stage!r} appears twice"))
        elif seen_stages and STAGE_ORDER.index(stage.stage) < STAGE_ORDER.index(seen_stages[-1]):
            problems.append((f"{path}.stage", "stages must run pretrain → midtrain → long_context"))
        seen_stages.append(stage.stage)
        problems += _check_data(by_id, stage.data, {"pretrain", "midtrain"}, f"{path}.data")
        if stage.seq_len > size.max_seq_len:
            problems.append(
                (
                    f"{path}.seq_len",
                    f"exceeds the {m.model.size} model's {size.max_seq_len} positions",
                )
            )
        problems += _check_battery(m, stage.battery, f"{path}.battery")
        if stage.rope_base_scale != 1.0 and stage.stage != "long_context":
            problems.append(
                (f"{path}.rope_base_scale", "only the long_context stage scales the RoPE base")
            )
        earlier = [s.seq_len for s in m.curriculum[:i]]
        if stage.stage == "long_context" and earlier and stage.seq_len <= max(earlier):
            problems.append(
                (
                    f"{path}.seq_len",
                    "the long_context stage must train on longer sequences than every stage "
                    "before it",
                )
            )

    post = m.post_training
    for name, recipe, role in (
        ("sft", post.sft, "sft"),
        ("dpo", post.dpo, "dpo"),
        ("rlvr", post.rlvr, "rlvr"),
    ):
        if recipe is None:
            continue
        path = f"$.post_training.{name}"
        problems += _check_data(by_id, recipe.data, {role}, f"{path}.data")
        problems += _check_battery(m, recipe.battery, f"{path}.battery")
        context = m.curriculum[-1].seq_len
        if recipe.seq_len is not None and recipe.seq_len > context:
            problems.append(
                (
                    f"{path}.seq_len",
                    f"must be at most the last curriculum stage's seq_len ({context}): the "
                    "context the model was trained on",
                )
            )
    if post.rlvr is not None:
        dapo = post.rlvr.dapo
        if dapo.overlong.max_tokens >= post_stage_seq_len(m, post.rlvr):
            problems.append(
                (
                    "$.post_training.rlvr.dapo.overlong.max_tokens",
                    "must be smaller than the stage's seq_len (the prompt needs room)",
                )
            )
        if dapo.clip_low > dapo.clip_high:
            problems.append(("$.post_training.rlvr.dapo.clip_high", "must be ≥ clip_low"))
        if dapo.expected_generation_rounds > dapo.max_generation_rounds:
            problems.append(
                (
                    "$.post_training.rlvr.dapo.expected_generation_rounds",
                    "must be ≤ max_generation_rounds",
                )
            )
        if dapo.overlong.soft_tokens >= dapo.overlong.max_tokens:
            problems.append(
                (
                    "$.post_training.rlvr.dapo.overlong.soft_tokens",
                    "must be smaller than max_tokens",
                )
            )

    for name, battery in m.eval_batteries.items():
        for i, spec in enumerate(battery):
            path = f"$.eval_batteries.{name}[{i}]"
            allowed = {"eval"} if spec.eval in ACCURACY_EVALS else {"pretrain", "midtrain", "eval"}
            problems += [
                (f"{path}.data", why)  # one id, not a list
                for _, why in _check_data(by_id, [spec.data], allowed, f"{path}.data")
            ]
            problems += _threshold_problems(spec, path)

    problems += _ladder_problems(m)
    if m.budget.max_incremental_cost_usd > m.budget.ceiling_usd:
        problems.append(("$.budget.max_incremental_cost_usd", "must not exceed ceiling_usd"))
    if m.resources.nodes > 1 and m.resources.fabrics == ["nvlink"]:
        problems.append(("$.resources.fabrics", "nvlink does not join nodes"))
    res = m.resources
    if (res.nodes * res.gpus_per_node) % res.replica_groups:
        problems.append(
            ("$.resources.replica_groups", "must divide the accelerators (nodes × gpus_per_node)")
        )
    elif res.replica_groups > 1 and res.nodes > 1 and res.nodes % res.replica_groups:
        problems.append(
            (
                "$.resources.replica_groups",
                "across nodes, each replica group takes whole nodes: must divide nodes",
            )
        )
    problems += _parallelism_problems(res)
    return problems


def _ladder_problems(m: Manifest) -> list[tuple[str, str]]:
    """Custom data and the ladder decision job that judges it (DESIGN §7.4): the job compares
    the first curriculum stage that names custom data with and without it, so that stage needs
    a reference mix, and the proxy must take the stage's sequence length."""
    custom = {ref.id for ref in m.data if ref.custom}
    if custom and not m.ladder.enabled:
        return [("$.ladder.enabled", "custom data requires the ladder decision job")]
    if not m.ladder.enabled:
        return []
    stages = [(i, s) for i, s in enumerate(m.curriculum) if custom & set(s.data)]
    if not stages:
        return [
            (
                "$.ladder.enabled",
                "the ladder judges data marked custom, and no curriculum stage names any",
            )
        ]
    problems: list[tuple[str, str]] = []
    index, stage = stages[0]
    if all(d in custom for d in stage.data):
        problems.append(
            (
                f"$.curriculum[{index}].data",
                "custom data needs a reference mix beside it: the ladder compares the "
                "stage's other data with and without it",
            )
        )
    proxy = SIZES[m.ladder.proxy_size]
    if stage.seq_len > proxy.max_seq_len:
        problems.append(
            (
                "$.ladder.proxy_size",
                f"the {proxy.name} proxy takes sequences of at most {proxy.max_seq_len} "
                f"tokens; the {stage.stage} stage it is measured on uses {stage.seq_len}",
            )
        )
    return problems


_MESH_DEGREES = ("dp_replicate", "dp_shard", "tp", "pp", "cp")


def _parallelism_problems(res: Resources) -> list[tuple[str, str]]:
    """Pinned degrees that cannot describe the manifest's own accelerators. (The booked ones,
    the model and the memory are the planner's to check, at plan time and at create.)"""
    pins = res.parallelism
    if pins is None:
        return []
    path = "$.resources.parallelism"
    world = res.nodes * res.gpus_per_node
    degrees = {d: getattr(pins, d) for d in _MESH_DEGREES if getattr(pins, d) is not None}
    problems: list[tuple[str, str]] = []
    product = 1
    for value in degrees.values():
        product *= value
    if len(degrees) == len(_MESH_DEGREES) and product != world:
        problems.append(
            (path, f"the degrees multiply to {product}, not the {world} accelerators asked for")
        )
    elif world % product:
        problems.append(
            (path, f"the pinned degrees multiply to {product}, which does not divide {world}")
        )
    if pins.tp is not None and res.gpus_per_node % pins.tp:
        problems.append(
            (f"{path}.tp", "tensor parallelism stays inside a node: must divide gpus_per_node")
        )
    if (
        res.replica_groups > 1
        and pins.dp_replicate is not None
        and pins.dp_replicate != res.replica_groups
    ):
        problems.append(
            (f"{path}.dp_replicate", "must equal replica_groups (each group is one replica)")
        )
    return problems


def _check_data(
    by_id: dict[str, DataRef], ids: list[str], roles: set[str], path: str
) -> list[tuple[str, str]]:
    problems = []
    for j, data_id in enumerate(ids):
        ref = by_id.get(data_id)
        if ref is None:
            problems.append((f"{path}[{j}]", f"no data with id {data_id!r}"))
        elif ref.role not in roles:
            problems.append(
                (
                    f"{path}[{j}]",
                    f"data {data_id!r} has role {ref.role!r}, expected {sorted(roles)}",
                )
            )
    return problems


def _threshold_problems(spec: EvalSpec, path: str) -> list[tuple[str, str]]:
    """Exactly one bound per gate, on the side its eval improves towards: losses an upper one
    (``max`` or ``max_ratio``), accuracies a lower one (``min`` or ``min_ratio``)."""
    loss = spec.eval in LOSS_EVALS
    given = [
        name for name in ("min", "max", "min_ratio", "max_ratio") if getattr(spec, name) is not None
    ]
    allowed = ["max", "max_ratio"] if loss else ["min", "min_ratio"]
    if spec.eval in ("exact_match", "sampled_exact_match"):
        allowed = ["min"]  # an untrained model's exact match is about 0: a ratio says nothing
    if len(given) != 1 or given[0] not in allowed:
        return [
            (
                path,
                f"{spec.eval} gates take exactly one threshold, one of "
                + " or ".join(repr(a) for a in allowed),
            )
        ]
    if spec.min is not None and not 0 <= spec.min <= 1:
        return [(f"{path}.min", "must be within [0, 1]")]
    return []


def _check_battery(m: Manifest, battery: str, path: str) -> list[tuple[str, str]]:
    if battery not in m.eval_batteries:
        return [(path, f"no eval battery named {battery!r}")]
    return []


def manifest_summary(m: Manifest) -> dict[str, Any]:
    """What a human approving this manifest needs to see at a glance."""
    post = [name for name in ("sft", "dpo", "rlvr") if getattr(m.post_training, name) is not None]
    return {
        "name": m.name,
        "model": {
            "family": m.model.family,
            "size": m.model.size,
            "revision": m.model.revision,
            "parameters": SIZES[m.model.size].parameters,
            **({"tokenizer": m.model.tokenizer.model_dump()} if m.model.tokenizer else {}),
        },
        "resources": m.resources.model_dump(exclude_none=True),
        "stages": [s.stage for s in m.curriculum] + post,
        "curriculum_tokens": sum(s.tokens for s in m.curriculum),
        "data": [
            {"id": d.id, "role": d.role, "license": d.license, "custom": d.custom} for d in m.data
        ],
        "budget": m.budget.model_dump(),
        "checkpoint": m.checkpoint.model_dump(),
        "gates": battery_gates(m),
    }


def battery_gates(m: Manifest) -> list[dict[str, Any]]:
    """Every gate of every stage of the manifest, as the approval page and ``ito plan`` show
    them: stage, battery, eval, data, the bound (absolute or relative to step 0) and its
    reading (``heldout_loss(web) ≤ 0.6 × step 0``)."""
    stages: list[tuple[str, str]] = [(s.stage, s.battery) for s in m.curriculum]
    for name in ("sft", "dpo", "rlvr"):
        recipe = getattr(m.post_training, name)
        if recipe is not None:
            stages.append((name, recipe.battery))
    return [
        {
            "stage": stage,
            "battery": battery,
            "eval": spec.eval,
            "data": spec.data,
            **spec.model_dump(include={"min", "max", "min_ratio", "max_ratio"}),
            "gate": spec.describe(),
        }
        for stage, battery in stages
        for spec in m.eval_batteries.get(battery, [])
    ]
