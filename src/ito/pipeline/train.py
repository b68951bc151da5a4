"""The training engine: the curriculum stages of a run, each trained to its token budget and
gated by its eval battery, then its post-training stages (SFT, DPO, RLVR:
:mod:`ito.pipeline.post_training`) in the same loop, resumable from the newest committed
checkpoint.

Determinism is the point: the model init and data order are functions of the run id, the batch
of a step is computed from the step, and a checkpoint restores everything that changes between
steps, so an interrupted and resumed run repeats the uninterrupted run's losses step for step.
"""

from __future__ import annotations

import math
import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

import torch
import torch.distributed as dist
from tokenizers import Tokenizer

from ito.core.errors import ErrorCode, ItoError, is_error_code
from ito.core.ladder import ladder_plan, proxy_size
from ito.core.manifest import EvalSpec, post_stage_seq_len
from ito.core.model_sizes import SIZES, ModelSize
from ito.core.rl_batches import EmptySteps
from ito.core.spikes import SpikeDetector
from ito.data.rows import Row
from ito.pipeline.batteries import BATTERIES, EvalContext
from ito.pipeline.checkpoint import (
    Checkpointer,
    checkpoint_location,
    committed_checkpoints,
    load_checkpoint,
    remove_uncommitted,
    restore_rng,
)
from ito.pipeline.data import (
    PackedData,
    pack,
    prepared_tokenizer,
    read_data_rows,
    seed_from,
    split_heldout,
)
from ito.pipeline.data_prep import named_tokenizer
from ito.pipeline.dcp_files import remove_staged, stage_verified, staging_path
from ito.pipeline.events import EventWriter
from ito.pipeline.export import export_model
from ito.pipeline.grad_accum import accumulate
from ito.pipeline.initial_weights import load_initial_weights
from ito.pipeline.ladder import LadderJob
from ito.pipeline.layout import DEFAULT_MICRO_BATCH, EngineLayout, build_mesh, mesh_dims
from ito.pipeline.model import (
    PEAK_LR,
    build_model,
    build_optimizer,
    build_scheduler,
    llama_config,
    peak_flops,
    rope_base,
    set_rope_base,
)
from ito.pipeline.parallelize import clip_grad_norm
from ito.pipeline.pipeline_stages import PipelineRunner
from ito.pipeline.post_training import (
    LR_SCALE,
    POST_STAGES,
    DpoExamples,
    RlvrStep,
    dpo_reference,
    dpo_step,
    post_step_rows,
    sft_examples,
    sft_step,
)
from ito.pipeline.replicas import ReplicaSync, local, to_local_tree
from ito.pipeline.rollout_standby import Standby, lobby_path
from ito.pipeline.rollout_worker import RolloutClient, WorkerConfig, worker_supported
from ito.pipeline.spec import RunSpec
from ito.pipeline.storage_fs import proven_dir
from ito.pipeline.tokenizer import EOS, TOKENIZER_FILE, build_tokenizer, load_tokenizer

__all__ = ["MICRO_BATCH", "LossSpike", "Trainer"]

MICRO_BATCH = DEFAULT_MICRO_BATCH
"""Sequences per rank per step when the spec plans no layout."""
MAX_GRAD_NORM = 1.0
PAUSE_S = 300.0
"""How long ``pause_at_step`` hangs the ranks (the drill kills them well before)."""
REJOIN_HOLD_S = 300.0
"""Bound on a restarted replica group's wait under ``fail_at.rejoin_after_steps``."""


class LossSpike(Exception):
    """Raised on every rank alike (the loss is all-reduced) to stop for a human's decision."""


class StopRequested(Exception):
    """Raised on every rank alike (rank 0's flag rides the loss all-reduce) once the stage has
    committed a checkpoint at the step where the worker's stop was seen."""


class Rejoin(Exception):
    """Raised on a rank that torchft healed from a peer: the trainer continues from the peer's
    position (``args[0]``), whichever stage that is in."""


class LeaderEvents:
    """The events of a run with several replica groups: every group trains every step, only the
    quorum's leader reports it (logs come from every group, tagged with it)."""

    def __init__(self, events: EventWriter, replica_id: int, leading: Callable[[], bool]) -> None:
        self._events, self._replica_id, self._leading = events, replica_id, leading

    def emit(self, type_: str, **fields: object) -> None:
        if self._leading():
            self._events.emit(type_, **fields)

    def log(self, level: str, message: str) -> None:
        self._events.log(level, f"[replica {self._replica_id}] {message}")

    def close(self) -> None:
        self._events.close()


@dataclass
class PendingStep:
    """A step whose loss all-reduce is still in flight: its figures are read (and emitted) while
    the next step computes, so no step waits on the collective or a device sync."""

    step: int
    lr: float
    seconds: float
    reduced: torch.Tensor
    """``[loss summed over ranks, stop flag]`` once ``work`` completes."""
    work: dist.Work | None
    grad_norm: torch.Tensor
    tokens: int = 0
    """Tokens the step trained on, over every rank of every participating group."""
    replicas: int | None = None
    """Replica groups that took part (runs with several)."""
    extra: dict[str, float] | None = None
    """Post-training figures of the step (rewards, DPO margins, …), the same on every rank."""


@dataclass(frozen=True)
class StageConfig:
    """What the stage loop reads of a stage, curriculum or post-training."""

    stage: str
    data: tuple[str, ...]
    seq_len: int
    battery: str
    rope_base_scale: float
    """Post-training keeps the last curriculum stage's (the model's context as trained)."""
    tokens: int
    """The token budget (post-training: ``max_tokens``)."""
    eval_seq_len: int
    """What the gate's loss evals pack held-out text into: the stage's own length; after the
    curriculum, the last curriculum stage's (so post-training's gates measure what the
    curriculum's measured, on the context the model was trained for)."""

    @property
    def post(self) -> bool:
        return self.stage in POST_STAGES


@dataclass(frozen=True)
class StagePlan:
    config: StageConfig
    index: int
    """Position in the manifest's stages: curriculum, then sft, dpo, rlvr (seeds the stage's
    data order)."""
    steps: int
    first_step: int
    """Global step count before the stage's first step."""
    rows: int
    """Sequences (rows of ``seq_len``) one data-parallel rank trains on per step."""


@dataclass(frozen=True)
class PostData:
    """A post-training stage's examples and their seeded order (one of the three)."""

    order: PackedData
    """Example indices in the stage's order (:class:`PackedData` over ``arange(n)``)."""
    sft: torch.Tensor | None = None
    examples: DpoExamples | None = None
    prompts: list[Row] | None = None


class Trainer:
    def __init__(
        self,
        spec: RunSpec,
        events: EventWriter,
        device: torch.device,
        ckpt_group: dist.ProcessGroup,
        standby: Standby | None = None,
    ) -> None:
        self.spec = spec
        self.replica = spec.replica
        self.sync: ReplicaSync | None = None
        self.events: EventWriter | LeaderEvents = events
        if self.replica is not None:
            self.events = LeaderEvents(events, self.replica.id, self._leading)
        self.device = device
        self.rank, self.world = dist.get_rank(), dist.get_world_size()
        self.layout = EngineLayout.from_spec(spec.layout, self.world, self.device.type)
        self.mesh = build_mesh(device.type, self.layout)
        groups = self.replica.groups if self.replica else 1
        self.group_dp_rank, group_dp = self.layout.dp_coordinates(self.mesh)
        """Data-parallel rank and size inside this torchrun world (tensor-parallel peers share
        the rank: they read the same batch)."""
        self.dp_rank = self.group_dp_rank + (self.replica.id * group_dp if self.replica else 0)
        self.dp_world = group_dp * groups
        """Data-parallel rank and size over every replica group (each reads its own batches)."""
        self.in_quorum = False
        """Set while a healed rank re-enters its loop inside the quorum that healed it."""
        self.position: dict[str, object] | None = None
        """The trainer's state after its last committed step (what a healed peer continues)."""
        self.ckpt_group = ckpt_group
        self.size: ModelSize = SIZES[spec.manifest.model.size]
        self.seed = seed_from(spec.run_id)
        self.refs = spec.manifest.data_by_id()
        self._splits: dict[str, tuple[list[str], list[str]]] = {}
        self._rows: dict[str, list[Row]] = {}
        self.initial: dict[str, float | None] = {}
        """The untrained model's value of each eval of the run's batteries (keyed by
        :func:`_initial_key`), measured before the first step and carried by every
        checkpoint's trainer state: never measured again on a trained model."""
        self.tokenizer = self._tokenizer()
        self.plans = self._plans()
        self._report_mesh()
        self.model = build_model(self.size, self.seed, self.mesh, self.layout, device)
        self.pipeline = (
            PipelineRunner(self.model, self.mesh, self.layout, device)
            if self.layout.pp > 1
            else None
        )
        self.optimizer = build_optimizer(self.model, spec.manifest.model.size)
        self.checkpointer = Checkpointer(
            spec.checkpoint_storage,
            spec.manifest.checkpoint.keep_last,
            self.events,  # type: ignore[arg-type]
            ckpt_group,
            recorded=spec.recorded_checkpoints,
            journal=spec.events_path,
        )
        self.peak = peak_flops()
        self.fault_armed = False
        self.pause_armed = False
        self.spike_armed = False
        self.data_offset = 0
        """Batches skipped by approved restarts; the batch of stage step k is k + offset."""
        self.apply_restart = False
        self.detector = SpikeDetector()
        self.stage_state: dict[str, object] = {}
        """What a post-training stage carries in its checkpoints (DPO's reference scores)."""
        self.rollout: RolloutClient | None = None
        self.standby = standby
        """RLVR's rollout worker waiting for its stage (rank 0), until the stage takes it."""
        """RLVR's separate rollout worker, while an RLVR stage runs with one."""

    # ---- set-up -------------------------------------------------------------------------------

    def _report_mesh(self) -> None:
        layout = self.layout
        dims = mesh_dims(self.mesh)
        self.events.emit(
            "mesh",
            dims=dims,
            device=self.device.type,
            micro_batch=layout.micro_batch,
            grad_accum=layout.grad_accum,
            pp_microbatches=layout.pp_microbatches,
            activation_checkpointing=layout.activation_checkpointing,
            param_dtype=str(layout.param_dtype).removeprefix("torch."),
            reduce_dtype=str(layout.reduce_dtype).removeprefix("torch."),
            planned=layout.planned,
        )
        self.events.log(
            "info",
            "device mesh "
            + " × ".join(f"{name}={n}" for name, n in dims.items())
            + f" ({'planned' if layout.planned else 'default: FSDP over every rank'}), "
            f"micro-batch {layout.micro_batch} × {layout.grad_accum}, "
            f"activation checkpointing {layout.activation_checkpointing}",
        )

    def _tokenizer(self) -> Tokenizer:
        """The tokenizer data preparation wrote, refused unless its digest is the one the
        report lists (``provenance_mismatch``). Without a preparation: the one the manifest
        names, checked as preparation checks it, or one trained here as preparation would."""
        spec = self.spec
        prepared = prepared_tokenizer(spec.workdir, spec.provenance_sha256, self.size.vocab)
        if prepared is not None:
            return prepared
        named = named_tokenizer(spec.manifest)
        if named is not None:
            return named[1]
        # It lives beside the checkpoints: written and read through the proven directory.
        storage = self.spec.checkpoint_storage
        if self.rank == 0:
            with proven_dir(storage, create=True) as root:
                if TOKENIZER_FILE not in root.entries():
                    ids = list(
                        dict.fromkeys(d for s in self.spec.manifest.curriculum for d in s.data)
                    )
                    texts = (t for i in ids for t in self._split(i)[0])
                    build_tokenizer(texts, self.size.vocab, root.handle)
                    self.events.log(
                        "info",
                        f"tokenizer trained on {', '.join(ids)} (vocabulary {self.size.vocab})",
                    )
        dist.barrier(group=self.ckpt_group)
        with proven_dir(storage) as root:
            return load_tokenizer(root.handle)

    def _data_rows(self, data_id: str) -> list[Row]:
        if data_id not in self._rows:
            ref = self.refs[data_id]
            self._rows[data_id] = read_data_rows(
                ref, self.spec.workdir, self.spec.provenance_sha256
            )
        return self._rows[data_id]

    def _split(self, data_id: str) -> tuple[list[str], list[str]]:
        if data_id not in self._splits:
            docs = [row.text for row in self._data_rows(data_id)]
            self._splits[data_id] = split_heldout(docs, self.refs[data_id].role)
        return self._splits[data_id]

    def _plans(self) -> list[StagePlan]:
        manifest = self.spec.manifest
        curriculum = manifest.curriculum
        by_name: dict[str, tuple[int, StageConfig]] = {
            s.stage: (
                i,
                StageConfig(
                    s.stage,
                    tuple(s.data),
                    s.seq_len,
                    s.battery,
                    s.rope_base_scale,
                    s.tokens,
                    s.seq_len,
                ),
            )
            for i, s in enumerate(curriculum)
        }
        post = manifest.post_training
        for j, name in enumerate(POST_STAGES):
            recipe = getattr(post, name)
            if recipe is not None:
                by_name[name] = (
                    len(curriculum) + j,
                    StageConfig(
                        name,
                        tuple(recipe.data),
                        post_stage_seq_len(manifest, recipe),
                        recipe.battery,
                        curriculum[-1].rope_base_scale,
                        recipe.max_tokens,
                        curriculum[-1].seq_len,
                    ),
                )
        if self.layout.pp > 1 and any(name in POST_STAGES for name in self.spec.stages):
            # Refused at plan (ito.core.runtime_support); fail closed all the same.
            raise ItoError(
                "capability_unavailable", "post-training does not run under pipeline parallelism"
            )
        plans, first = [], 0
        for name in self.spec.stages:
            index, config = by_name[name]
            rows = self.layout.sequences_per_rank
            if config.post:
                group = post.rlvr.group_size if name == "rlvr" and post.rlvr else 1
                rows = post_step_rows(name, rows, group)
            steps = max(1, config.tokens // (rows * self.dp_world * config.seq_len))
            if name == "sft" and post.sft is not None:
                # Never more passes over the examples than the recipe's epochs.
                examples = len(self._post_rows(config.data))
                steps = min(steps, max(1, post.sft.epochs * examples // (rows * self.dp_world)))
            if self.spec.max_steps_per_stage is not None:
                steps = min(steps, self.spec.max_steps_per_stage)
            plans.append(StagePlan(config, index, steps, first, rows))
            first += steps
        return plans

    def _post_rows(self, data_ids: tuple[str, ...]) -> list[tuple[str, Row]]:
        """Every row of a post-training stage's data, with its data id (no held-out split:
        post-training is gated on eval data)."""
        return [(i, row) for i in data_ids for row in self._data_rows(i)]

    def _latest(self) -> tuple[str, int, Path, str] | None:
        """The checkpoint to resume from (stage, step, path, recorded digest): the newest the
        run recorded, or the one a human chose. A committed directory the run never recorded
        (planted, or of another run) is named in a warning and never read."""
        found: list[tuple[str, int, Path, str] | None] = [None]
        self.apply_restart = False
        if self.rank == 0:
            # With replica groups a live peer may be writing one of them right now: they are
            # only ever skipped (no COMMIT), never deleted from here.
            for path in (
                remove_uncommitted(self.spec.checkpoint_storage) if self.replica is None else []
            ):
                self.events.log("warning", f"ignored uncommitted checkpoint {path}")
            committed = self.checkpointer.recorded()
            recorded = {(c.stage, c.step) for c in committed}
            for c in committed_checkpoints(self.spec.checkpoint_storage):
                if (c.stage, c.step) not in recorded:
                    self.events.log(
                        "warning",
                        f"ignored checkpoint {c.stage}/step {c.step}: the run never recorded it",
                    )
            restart = self.spec.restart_from
            if restart is not None and not any(c.step > restart.step for c in committed):
                # A human chose this checkpoint: resume from it exactly. (Once the restarted
                # attempt has committed past it, a crash resumes from the newest as usual.)
                chosen = [c for c in committed if c.step == restart.step]
                if not chosen:
                    raise ValueError(f"restart: no committed checkpoint at step {restart.step}")
                committed = chosen
                self.apply_restart = True
            if committed:
                newest = committed[-1]
                assert newest.digest is not None  # recorded() keeps only known digests
                found[0] = (newest.stage, newest.step, newest.path, newest.digest)
        dist.broadcast_object_list(found, src=0, group=self.ckpt_group)
        return found[0]

    def _load_verified(
        self, stage: str, step: int, digest: str
    ) -> tuple[dict[str, object], bytes | None]:
        """Load the run's own checkpoint from a private copy that rank 0 verified against
        ``digest`` as it copied it (:func:`ito.pipeline.dcp_files.stage_verified`); a file
        changed since its commit ends the run ``checkpoint_storage_invalid``, on every rank."""
        verdict: list[object] = [None, None]
        if self.rank == 0:
            dest = staging_path(self.spec.workdir, f"{stage}-step_{step:08d}")
            try:
                with proven_dir(
                    checkpoint_location(self.spec.checkpoint_storage, stage, step)
                ) as step_dir:
                    stage_verified(step_dir, digest, dest)
                verdict[0] = str(dest)
            except ItoError as exc:
                verdict[1] = (exc.code, exc.message, dict(exc.details))
        dist.broadcast_object_list(verdict, src=0, group=self.ckpt_group)
        failure = cast("tuple[ErrorCode, str, dict[str, Any]] | None", verdict[1])
        if failure is not None:
            raise ItoError(failure[0], failure[1], **failure[2])
        dest = Path(str(verdict[0]))
        try:
            trainer_state, rng = load_checkpoint(dest, self.model, self.optimizer, self.ckpt_group)
        finally:
            dist.barrier(group=self.ckpt_group)
            if self.rank == 0:
                remove_staged(dest)
        return trainer_state, rng

    def _restart_applies(self) -> bool:
        flag = [self.apply_restart]
        dist.broadcast_object_list(flag, src=0, group=self.ckpt_group)
        return bool(flag[0])

    # ---- the run ------------------------------------------------------------------------------

    def run(self) -> str:
        """Train every stage; returns ``succeeded`` or ``gate_failed``. Rank 0 starts RLVR's
        rollout worker first, where the run will use one (:class:`Standby`), and stops it on
        the way out whatever happens."""
        if self.rank == 0:
            used = self._rollout_worker_used(warn=False)
            if self.standby is not None and not used:
                self.standby.close()  # the entry point's guess (see ito.pipeline.run)
                self.standby = None
            elif self.standby is None and used:
                self.standby = Standby.start(lobby_path(self.spec.workdir, self.spec.attempt))
        try:
            return self._run()
        finally:
            if self.standby is not None:
                self.standby.close()
                self.standby = None

    def _run(self) -> str:
        start_pos, stage_step, tokens_seen = 0, 0, 0
        trainer_state: dict[str, object] | None = None
        resumed_step = -1
        self._hold_rejoin()
        latest = self._latest()
        if latest is not None:
            stage_name, resumed_step, path, digest = latest
            names = [p.config.stage for p in self.plans]
            if stage_name not in names:
                raise ValueError(f"checkpoint {path} is of stage {stage_name!r}, not in this run")
            trainer_state, rng = self._load_verified(stage_name, resumed_step, digest)
            if rng is not None:
                restore_rng(rng)
            start_pos, stage_step, tokens_seen = self._resume_position(trainer_state)
            self.events.log("info", f"resumed from {path} (step {resumed_step})")
            if self.spec.restart_from is not None and self._restart_applies():
                self.data_offset += self.spec.restart_from.skip_steps
                self.events.log(
                    "info",
                    f"approved restart: skipping "
                    f"{self.spec.restart_from.skip_steps} batch(es) of data",
                )
        else:
            if self.spec.initial_weights is not None:
                self._load_initial_weights()
            if not self._ladder_passes():
                self.checkpointer.close()
                self.events.emit(
                    "done", status="gate_failed", stage="ladder", code="ladder_rejected"
                )
                return "gate_failed"
            self._measure_initial()
        self.fault_armed = self._fault_armed(resumed_step)
        self.pause_armed = (
            self.spec.pause_at_step is not None
            and self.spec.attempt == 1
            and os.environ.get("TORCHELASTIC_RESTART_COUNT", "0") == "0"
            and resumed_step < self.spec.pause_at_step
        )
        self.spike_armed = (
            self.spec.loss_spike_at is not None
            and self.spec.attempt == 1
            and resumed_step < self.spec.loss_spike_at
        )
        if self.replica is None:
            return self._run_stages(start_pos, stage_step, tokens_seen, trainer_state)
        self.position = trainer_state
        self.sync = ReplicaSync(
            replica_id=self.replica.id,
            lighthouse=self.replica.lighthouse,
            group=self.ckpt_group,
            state_dict=self._heal_state,
            load_state_dict=self._heal_load,
        )
        self.sync.set_step(max(resumed_step, 0))
        try:
            while True:
                try:
                    status = self._run_stages(start_pos, stage_step, tokens_seen, trainer_state)
                    # Every group logs what it ends with: equal digests, equal models.
                    self.events.log(
                        "info",
                        f"rank {self.rank} parameters digest "
                        f"{self._digest()} at step {self.sync.step}",
                    )
                    return status
                except Rejoin as rejoin:
                    trainer_state = rejoin.args[0]
                    start_pos, stage_step, tokens_seen = self._resume_position(trainer_state)
                    self.events.log(
                        "info",
                        f"healed from a live replica group at step "
                        f"{trainer_state['step']}; continuing with it",
                    )
        finally:
            self.sync.shutdown()

    def _load_initial_weights(self) -> None:
        """The manifest's ``model.revision`` instead of the random initialisation, verified
        first (:mod:`ito.pipeline.initial_weights`); only a run with no checkpoint of its own."""
        weights = self.spec.initial_weights
        assert weights is not None
        load_initial_weights(
            weights,
            self.model,
            size=self.size,
            tokenizer=self.tokenizer,
            storage_root=self.spec.storage_root,
            workdir=self.spec.workdir,
            group=self.ckpt_group,
        )
        self.events.log("info", f"initial weights loaded from {weights.revision}")

    def _ladder_passes(self) -> bool:
        """The ladder decision on the run's custom data (:mod:`ito.pipeline.ladder`); ``True``
        when the manifest has none."""
        manifest = self.spec.manifest
        plan = ladder_plan(manifest) if manifest.ladder.enabled else None
        if plan is None:
            return True
        job = LadderJob(
            manifest=manifest,
            plan=plan,
            size=proxy_size(manifest),
            tokenizer=self.tokenizer,
            heldout=lambda data_id: self._split(data_id)[1],
            train_docs=lambda data_id: self._split(data_id)[0],
            rows=self._data_rows,
            seed=self.seed,
            device=self.device,
            events=self.events,
            storage=self.spec.checkpoint_storage,
            group=self.ckpt_group,
            max_grad_norm=MAX_GRAD_NORM,
        )
        return job.decide()

    def _run_stages(
        self,
        start_pos: int,
        stage_step: int,
        tokens_seen: int,
        trainer_state: dict[str, object] | None,
    ) -> str:
        # On a crash the in-flight save is abandoned, not awaited: its peers may be gone, and
        # without its COMMIT it is never loaded.
        for pos in range(start_pos, len(self.plans)):
            plan = self.plans[pos]
            resume = trainer_state if pos == start_pos else None
            if resume is None:
                self.data_offset = 0  # a skipped window belongs to the stage it was in
            try:
                try:
                    tokens_seen, passed = self._stage(
                        plan, stage_step if resume else 0, tokens_seen, resume
                    )
                except BaseException:
                    self._stop_rollout(abandon=True)
                    raise
                self._stop_rollout()
            except LossSpike:
                self.checkpointer.close()
                self.events.emit("done", status="spike", stage=plan.config.stage)
                return "spike"
            except StopRequested as stop:
                self.checkpointer.close()
                self.events.emit(
                    "done", status="stopped", stage=plan.config.stage, step=stop.args[0]
                )
                return "stopped"
            if not passed:
                self.checkpointer.close()
                self.events.emit("done", status="gate_failed", stage=plan.config.stage)
                return "gate_failed"
        self.checkpointer.close()
        self.events.emit("done", status="succeeded")
        return "succeeded"

    def _resume_position(self, state: dict[str, object]) -> tuple[int, int, int]:
        """Plan index, stage step and tokens seen of a trainer record (a checkpoint's, or a
        healing peer's); sets the data offset it carries."""
        stages: list[str] = [p.config.stage for p in self.plans]
        self.data_offset = int(str(state.get("data_offset", 0)))
        initial = state.get("initial")
        self.initial = dict(initial) if isinstance(initial, dict) else {}
        return (
            stages.index(str(state["stage"])),
            int(str(state["stage_step"])),
            int(str(state["tokens_seen"])),
        )

    def _hold_rejoin(self) -> None:
        """Fault injection (``fail_at.rejoin_after_steps``): the killed replica group, restarted,
        waits for the survivor to commit that many steps past the newest commit it finds, before
        it loads anything or contacts the lighthouse. Bounded: past the deadline it goes on and
        says so."""
        fail = self.spec.fail_at
        replica = self.replica.id if self.replica else None
        if (
            fail is None
            or fail.rejoin_after_steps is None
            or replica != fail.replica
            or self.spec.attempt != 1
            or os.environ.get("TORCHELASTIC_RESTART_COUNT", "0") == "0"
        ):
            return
        if self.rank == 0:

            def newest() -> int:
                found = committed_checkpoints(self.spec.checkpoint_dir)
                return found[-1].step if found else 0

            target = newest() + fail.rejoin_after_steps
            deadline = time.monotonic() + REJOIN_HOLD_S
            while (reached := newest()) < target and time.monotonic() < deadline:
                time.sleep(0.2)
            if reached >= target:
                self.events.log(
                    "info", f"fault injection: rejoining after the commit at step {reached}"
                )
            else:
                self.events.log(
                    "warning",
                    f"fault injection: no commit at step {target} within "
                    f"{REJOIN_HOLD_S:.0f}s; rejoining anyway",
                )
        dist.barrier(group=self.ckpt_group)

    def _fault_armed(self, resumed_step: int) -> bool:
        fail = self.spec.fail_at
        replica = self.replica.id if self.replica else 0
        return (
            fail is not None
            and fail.rank == self.rank
            and fail.replica == replica
            and self.spec.attempt == 1
            and os.environ.get("TORCHELASTIC_RESTART_COUNT", "0") == "0"
            and resumed_step < fail.step
        )

    def _stage(
        self, plan: StagePlan, stage_step: int, tokens_seen: int, resume: dict[str, object] | None
    ) -> tuple[int, bool]:
        config = plan.config
        name = config.stage
        self.stage_state = dict(resume.get("post") or {}) if resume is not None else {}  # type: ignore[call-overload]
        data = (
            self._post_data(plan)
            if config.post
            else PackedData(self._packed(list(config.data), config.seq_len), self.seed, plan.index)
        )
        # Midtrain anneals its own mix linearly to zero (after the warmup every stage has).
        scheduler = build_scheduler(
            self.optimizer,
            plan.steps,
            anneal=name == "midtrain",
            scale=LR_SCALE.get(name, 1.0),
            peak=PEAK_LR[self.spec.manifest.model.size],
        )
        base = rope_base(llama_config(self.size)) * config.rope_base_scale
        set_rope_base(self.model, base)
        if config.rope_base_scale != 1.0 and resume is None:
            self.events.log("info", f"{name}: RoPE base {base:g} ({config.rope_base_scale:g}×)")
        if resume is not None:
            scheduler.load_state_dict(resume["scheduler"])  # type: ignore[arg-type]
            factor = scheduler.lr_lambdas[0](scheduler.last_epoch)
            for group, peak in zip(self.optimizer.param_groups, scheduler.base_lrs, strict=True):
                group["lr"] = peak * factor
        if not self.in_quorum:  # a healed rank re-enters a stage its leader already began
            self.events.emit("stage", stage=name, status="started", steps=plan.steps)
        rlvr = self._rlvr(plan) if name == "rlvr" else None
        if rlvr is not None:
            self._start_rollout(plan, rlvr, stage_step, base)
        if name == "dpo" and "dpo_reference" not in self.stage_state:
            # The reference policy is the policy at the start of DPO: scored once, here, and
            # carried by the stage's checkpoints.
            assert isinstance(data, PostData) and data.examples is not None
            reference = dpo_reference(
                self.model,
                data.examples,
                self.group_dp_rank,
                self.layout.dp,
                max(1, self.layout.micro_batch // 2),
                self.device,
            )
            self.stage_state["dpo_reference"] = reference.tolist()
        self.detector.reset()
        if resume is not None and isinstance(resume.get("spike_window"), list):
            self.detector.restore(resume["spike_window"])  # type: ignore[arg-type]
        every = self.spec.manifest.checkpoint.every_steps
        step_tokens = plan.rows * self.layout.dp * config.seq_len
        flops_per_token = self.size.flops_per_token(config.seq_len)
        pending: PendingStep | None = None
        if self.replica is not None and resume is None:
            self.position = self._trainer_state(name, 0, plan.first_step, tokens_seen, scheduler)
        empty = (
            EmptySteps.restore(
                self.stage_state.get("empty_steps"), rlvr.recipe.dapo.max_empty_steps
            )
            if rlvr is not None and rlvr.recipe.dapo.dynamic_sampling
            else None
        )
        ended_early = False
        k = stage_step
        while k < plan.steps:
            step = plan.first_step + k + 1
            fail = self.spec.fail_at
            if self.fault_armed and fail is not None and step >= fail.step:
                self.events.log(
                    "warning", f"fault injection: rank {self.rank} exits at step {step}"
                )
                os._exit(137)
            error = self.spec.error_at
            if error is not None and error.rank == self.rank and step >= error.step:
                code = error.code if is_error_code(error.code) else "internal_error"
                raise ItoError(code, f"fault injection: rank {self.rank} raises at step {step}")
            if (
                self.pause_armed
                and self.spec.pause_at_step is not None
                and step >= self.spec.pause_at_step
            ):
                self.pause_armed = False
                self.checkpointer.finish()  # what was saved is committed, then the hang
                self.events.log("warning", f"fault injection: hanging at step {step}")
                time.sleep(PAUSE_S)
            if self.sync is not None:
                if self.in_quorum:
                    # Healed at this step's quorum: this rank is already one of its
                    # participants and takes part in the step from the position it got.
                    self.in_quorum = False
                elif self.sync.start_step():
                    assert self.position is not None
                    self.in_quorum = True
                    raise Rejoin(self.position)
            start = time.perf_counter()
            lr = scheduler.get_last_lr()[0]
            extra: dict[str, float] | None = None
            if config.post:
                backward, extra, post_tokens = self._post_step(
                    plan, data, k + self.data_offset, rlvr
                )
            else:
                post_tokens = None
                batch = data.batch(  # type: ignore[union-attr]
                    k + self.data_offset,
                    self.dp_rank,
                    self.dp_world,
                    self.layout.sequences_per_rank,
                )
                if self.spike_armed and step == self.spec.loss_spike_at:
                    batch = torch.randint(
                        0,
                        self.size.vocab,
                        batch.shape,
                        generator=torch.Generator().manual_seed(step),
                    )
                backward = self._pretrain_backward(batch.to(self.device))
            informative = int(extra["informative_groups"]) if empty is not None and extra else -1
            current = self._train_step(backward, step, float(lr), skip=informative == 0)
            if current is None:
                continue  # a replica group failed during the step: retried with the others
            if empty is not None and extra is not None and rlvr is not None:
                # What the step's rollouts held: the empty ones are counted, and a stage whose
                # policy has nothing left to learn from its prompts ends early (or fails, if it
                # never had anything to learn: see ``EmptySteps``).
                wanted = rlvr.groups_per_rank * rlvr.dp_world
                verdict = empty.observe(
                    informative,
                    complete=informative == wanted,
                    solved=extra["solved_fraction"] >= 1.0,
                )
                self.stage_state["empty_steps"] = empty.state()
                extra["skipped_steps"] = float(empty.skipped)
                ended_early = verdict == "end"
            scheduler.step()
            current.extra = extra
            if self.sync is not None:
                current.replicas = self.sync.participants
                current.tokens = step_tokens // self.dp_world * self.layout.dp * current.replicas
            else:
                current.tokens = step_tokens if post_tokens is None else post_tokens
                if informative == 0:
                    current.tokens = 0  # generated, but nothing trained on
            tokens_seen += current.tokens
            if self.spec.min_step_seconds is not None:
                time.sleep(max(0.0, self.spec.min_step_seconds - (time.perf_counter() - start)))
            current.seconds = time.perf_counter() - start
            stop = pending is not None and self._report(name, pending, step_tokens, flops_per_token)
            pending = current
            k += 1
            saving = stop or step % every == 0 or k == plan.steps or ended_early
            if saving or self.replica is not None:
                # A committed step has its metrics out first (a crash after the commit must
                # not lose them: the resumed attempt starts after it). With replica groups
                # every step is read at once: the spike window is part of what a healed peer
                # continues, so it must hold this step's loss.
                stop = self._report(name, pending, step_tokens, flops_per_token) or stop
                pending = None
                saving = saving or stop
            if self.replica is not None:
                self.position = self._trainer_state(name, k, step, tokens_seen, scheduler)
            self.checkpointer.poll()
            if saving:
                if self._leading():
                    self.checkpointer.save(
                        stage=name,
                        step=step,
                        tokens_seen=tokens_seen,
                        model=self.model,
                        optimizer=self.optimizer,
                        trainer=self._trainer_state(name, k, step, tokens_seen, scheduler),
                    )
                if stop:
                    self.checkpointer.finish()
                    self.events.log(
                        "warning",
                        f"stop requested by the worker: checkpoint committed at step {step}",
                    )
                    raise StopRequested(step)
            if ended_early:
                break
        # The stage's last step is always saved, so nothing is pending here.
        assert pending is None
        last = plan.first_step + k
        early: dict[str, int] = {}
        if ended_early and empty is not None:
            early = {"steps_taken": k, "skipped_steps": empty.skipped}
            self.events.log(
                "info",
                f"{name}: ended early at step {k} of {plan.steps}: {empty.streak} step(s) in a "
                f"row gave no group whose rewards differ ({empty.skipped} skipped in the stage, "
                f"{empty.trained} trained, {empty.partial} of them on a partial batch); the "
                "stage's gate decides",
            )
        self._stop_rollout()
        results = [
            self._evaluate(spec, config.eval_seq_len)
            for spec in self.spec.manifest.eval_batteries[config.battery]
        ]
        self.checkpointer.finish()
        if self._leading():
            self._export(name, last, base)
        self.events.emit(
            "metric",
            stage=name,
            step=last,
            values={_metric_name(r["eval"], r["data"]): r["value"] for r in results},
        )
        passed = all(bool(r["passed"]) for r in results)
        self.events.emit("gate", stage=name, battery=config.battery, results=results, passed=passed)
        if passed:
            self.events.emit("stage", stage=name, status="completed", **early)
        return tokens_seen, passed

    def _export(self, stage: str, step: int, base: float) -> None:
        """The stage's final weights as a Hugging Face directory (:mod:`ito.pipeline.export`),
        written once its last checkpoint is committed."""
        done = export_model(
            model=self.model,
            size=self.size,
            rope_base=base,
            tokenizer=self.tokenizer,
            storage=self.spec.checkpoint_storage,
            stage=stage,
            step=step,
            pipelined=self.pipeline is not None,
            group=self.ckpt_group,
        )
        if done is not None:
            self.events.emit(
                "export",
                stage=done.stage,
                step=done.step,
                path=done.path,
                bytes=done.bytes,
                sha256=done.sha256,
                seconds=round(done.seconds, 3),
            )

    def _trainer_state(
        self,
        stage: str,
        stage_step: int,
        step: int,
        tokens_seen: int,
        scheduler: torch.optim.lr_scheduler.LRScheduler,
    ) -> dict[str, object]:
        state: dict[str, object] = {
            "stage": stage,
            "stage_step": stage_step,
            "step": step,
            "tokens_seen": tokens_seen,
            "scheduler": scheduler.state_dict(),
            "data_offset": self.data_offset,
            "initial": dict(self.initial),
        }
        if self.stage_state:
            state["post"] = dict(self.stage_state)
        if self.replica is not None:
            state["spike_window"] = self.detector.history()
        return state

    # ---- replica groups -----------------------------------------------------------------------

    def _leading(self) -> bool:
        """Whether this group reports (and checkpoints): rank 0 of the current quorum; before
        the first quorum, replica group 0."""
        if self.sync is None:
            return self.replica is None or self.replica.id == 0
        rank = self.sync.manager.participating_rank()
        return rank == 0 if rank is not None else self.replica is not None and self.replica.id == 0

    def _digest(self) -> str:
        import hashlib

        digest = hashlib.sha256()
        for param in self.model.parameters():
            digest.update(local(param).detach().float().contiguous().cpu().numpy().tobytes())
        return digest.hexdigest()[:16]

    def _heal_state(self) -> dict[str, object]:
        """What a peer that is behind copies from this rank (local shards, see replicas.py)."""
        return {
            "model": to_local_tree(dict(self.model.state_dict())),
            "optim": to_local_tree(self.optimizer.state_dict()),
            "position": self.position,
        }

    def _heal_load(self, state: dict[str, object]) -> None:
        from torch.distributed.tensor import DTensor

        tensors = dict(self.model.named_parameters()) | dict(self.model.named_buffers())
        model_state = state["model"]
        assert isinstance(model_state, dict)
        with torch.no_grad():
            for name, value in model_state.items():
                local(tensors[name]).copy_(value)
        optim = state["optim"]
        assert isinstance(optim, dict)
        params = [p for group in self.optimizer.param_groups for p in group["params"]]
        for index, entry in optim["state"].items():
            param = params[int(index)]
            restored: dict[str, object] = {}
            for key, value in entry.items():
                if key != "step" and isinstance(param, DTensor):
                    restored[key] = DTensor.from_local(
                        value,
                        param.device_mesh,
                        param.placements,
                        run_check=False,
                        shape=param.shape,
                        stride=param.stride(),
                    )
                else:
                    restored[key] = value
            self.optimizer.state[param] = restored
        for group, saved in zip(self.optimizer.param_groups, optim["param_groups"], strict=True):
            group.update({k: v for k, v in saved.items() if k != "params"})
        self.position = state["position"]  # type: ignore[assignment]

    # ---- per-step figures ---------------------------------------------------------------------

    def _report(
        self, stage: str, pending: PendingStep, step_tokens: int, flops_per_token: float
    ) -> bool:
        """Complete a step's all-reduce, emit its metrics, watch its loss for a spike; returns
        whether rank 0 had seen a stop request when the step ended (the same on every rank)."""
        if pending.work is not None:
            pending.work.wait()
        loss_sum, flag = pending.reduced.tolist()
        loss = loss_sum / (self.world // self.layout.pp)  # only last stages hold a loss
        tps = pending.tokens / pending.seconds
        devices = self.world * (pending.replicas or 1)
        mfu = None if self.peak is None else flops_per_token * tps / (self.peak * devices)
        self.events.emit(
            "metric",
            stage=stage,
            step=pending.step,
            values={
                "loss": loss,
                "lr": pending.lr,
                "grad_norm": float(pending.grad_norm.item()),
                "tokens_per_s": tps,
                "mfu": mfu,
                "step_seconds": pending.seconds,
                "tokens": float(pending.tokens),
                **({"replicas": pending.replicas} if pending.replicas is not None else {}),
                **(pending.extra or {}),
            },
        )
        # Spikes are watched in pre-training only: a post-training step's figure is not a
        # language-modelling loss (RLVR's is a signed policy-gradient surrogate, DPO's a
        # preference loss) and its small batches of short examples swing far more.
        z = None if stage in POST_STAGES else self.detector.observe(loss)
        if z is not None:
            self._propose_restart(stage, pending.step, loss, z)
        return bool(flag > 0)

    def _propose_restart(self, stage: str, step: int, loss: float, z: float) -> None:
        """Never act on a spike: make sure the last good state is committed, propose restarting
        from it with the spiking data window skipped, and stop for a human's decision.

        The spike is seen while the step after it computes, so a checkpoint of the spiking step
        itself may exist: the proposal is the newest one from before it."""
        self.checkpointer.finish()
        committed = [0]
        if self.rank == 0:
            found = [c for c in self.checkpointer.recorded() if c.step < step]
            committed[0] = found[-1].step if found else 0
        dist.broadcast_object_list(committed, src=0, group=self.ckpt_group)
        good = int(committed[0])
        self.events.emit(
            "spike",
            stage=stage,
            step=step,
            loss=loss,
            z=z if math.isfinite(z) else None,
            checkpoint_step=good,
            skip_steps=step - good,
        )
        raise LossSpike(step)

    def _packed(self, data_ids: list[str], seq_len: int) -> torch.Tensor:
        docs = [d for i in data_ids for d in self._split(i)[0]]
        return pack(self.tokenizer, docs, seq_len)

    def _pretrain_backward(self, batch: torch.Tensor) -> Callable[[], torch.Tensor]:
        if self.pipeline is not None:
            pipeline = self.pipeline
            return lambda: pipeline.train_step(batch)
        return lambda: accumulate(self.model, batch, self.layout)

    # ---- post-training ------------------------------------------------------------------------

    def _post_data(self, plan: StagePlan) -> PostData:
        config = plan.config
        rows = self._post_rows(config.data)
        eos = self.tokenizer.token_to_id(EOS)
        if eos is None:
            raise ValueError("the tokenizer has no end-of-text token")
        order = PackedData(torch.arange(len(rows)), self.seed, plan.index)
        if config.stage == "sft":
            return PostData(order, sft=sft_examples(self.tokenizer, rows, eos, config.seq_len))
        if config.stage == "dpo":
            return PostData(
                order, examples=DpoExamples.build(self.tokenizer, rows, eos, config.seq_len)
            )
        return PostData(order, prompts=[row for _, row in rows])

    def _rlvr(self, plan: StagePlan) -> RlvrStep:
        recipe = self.spec.manifest.post_training.rlvr
        assert recipe is not None
        rows = self._post_rows(plan.config.data)
        eos = self.tokenizer.token_to_id(EOS)
        assert eos is not None
        return RlvrStep(
            recipe=recipe,
            tokenizer=self.tokenizer,
            rows=[row for _, row in rows],
            eos=eos,
            seed=self.seed,
            stage_index=plan.index,
            dp_rank=self.group_dp_rank,
            dp_world=self.layout.dp,
            groups_per_rank=plan.rows // recipe.group_size,
            micro_batch=self.layout.micro_batch,
            device=self.device,
        )

    def _start_rollout(self, plan: StagePlan, rlvr: RlvrStep, stage_step: int, base: float) -> None:
        """Start RLVR's separate rollout worker where the engine uses one: by default when the
        recipe allows stale samples (``max_staleness`` ≥ 1: at 0 a separate worker could only
        wait for each step's weights, and the synchronous loop gives the same batches) and the
        layout is one the worker serves (:func:`worker_supported`); the spec's test hook
        ``rollout_worker`` forces either. Elsewhere the synchronous loop, with a warning when
        a worker was asked for."""
        recipe = self.spec.manifest.post_training.rlvr
        assert recipe is not None
        if not self._rollout_worker_used(warn=True):
            return
        lookahead = self.spec.rollout_lookahead
        if lookahead is None:
            lookahead = recipe.max_staleness
        config = WorkerConfig(
            rlvr=rlvr,
            size=self.spec.manifest.model.size,
            rope_base=base,
            world=self.world,
            first=stage_step + self.data_offset,
            end=plan.steps + self.data_offset,
            lookahead=lookahead,
            max_staleness=recipe.max_staleness,
        )
        lobby = lobby_path(self.spec.workdir, self.spec.attempt)
        self.rollout = RolloutClient(lobby / str(plan.index), config, self.rank)
        self.rollout.start(self.standby)
        self.standby = None  # the stage's client stops it now

    def _rollout_worker_used(self, *, warn: bool) -> bool:
        """Whether this run's RLVR stage, if it has one, uses the separate worker (see
        :meth:`_start_rollout`); with ``warn``, a worker asked for but unsupported is logged."""
        recipe = self.spec.manifest.post_training.rlvr
        if recipe is None or "rlvr" not in self.spec.stages:
            return False
        wanted = self.spec.rollout_worker
        if wanted is None:
            wanted = recipe.max_staleness > 0
        if not wanted:
            return False
        if not worker_supported(self.layout, self.device, self.replica is not None):
            if warn:
                self.events.log(
                    "warning",
                    "rlvr: the separate rollout worker does not serve this layout (tensor or "
                    "pipeline parallel, replica groups, low-precision parameters or an "
                    "accelerator); rollouts run in the synchronous loop, on-policy "
                    f"(max_staleness {recipe.max_staleness} unused)",
                )
            return False
        return True

    def _stop_rollout(self, *, abandon: bool = False) -> None:
        if self.rollout is not None:
            self.rollout.stop(abandon=abandon)
            self.rollout = None

    def _post_step(
        self, plan: StagePlan, data: PackedData | PostData, position: int, rlvr: RlvrStep | None
    ) -> tuple[Callable[[], torch.Tensor], dict[str, float] | None, int | None]:
        """The backward of a post-training step, its figures, and the tokens it trains on
        (every rank; ``None``: the stage's rows × ``seq_len``)."""
        assert isinstance(data, PostData)
        name = plan.config.stage
        micro = self.layout.micro_batch
        if name == "rlvr":
            assert rlvr is not None
            began = time.perf_counter()
            if self.rollout is not None:
                groups, rollout = self.rollout.batch(self.model, position)
            else:
                groups, rollout = rlvr.rollout(rlvr.gathered_round(self.model), position)
            # Generating (synchronous loop), or publishing the weights and waiting for the
            # worker's batch (separate worker).
            rollout["rollout_seconds"] = time.perf_counter() - began
            width = max(len(s.prompt) + len(s.completion) for g in groups for s in g.samples)
            tokens = sum(len(g.samples) for g in groups) * width
            return (lambda: rlvr.train(self.model, groups)), rollout, tokens
        if name == "dpo":
            pairs = plan.rows // 2
            index = data.order.batch(position, self.dp_rank, self.dp_world, pairs)
            assert data.examples is not None
            batch = data.examples.pairs[index].to(self.device)
            reference = torch.tensor(self.stage_state["dpo_reference"])[index]
            recipe = self.spec.manifest.post_training.dpo
            assert recipe is not None
            figures: dict[str, float] = {}

            def dpo() -> torch.Tensor:
                loss, found = dpo_step(
                    self.model, batch, reference, recipe.beta, micro, recipe.rpo_alpha
                )
                figures.update(self._mean_over_ranks(found))
                return loss

            return dpo, figures, None
        index = data.order.batch(position, self.dp_rank, self.dp_world, plan.rows)
        assert data.sft is not None
        sft_batch = data.sft[index].to(self.device)
        return (lambda: sft_step(self.model, sft_batch, micro)), None, None

    def _mean_over_ranks(self, values: dict[str, float]) -> dict[str, float]:
        """The mean of each figure over the ranks of this world (the same on each)."""
        names = sorted(values)
        reduced = torch.tensor([values[n] for n in names], dtype=torch.float64, device=self.device)
        dist.all_reduce(reduced)
        return {n: float(v) / self.world for n, v in zip(names, reduced.tolist(), strict=True)}

    def _train_step(
        self, backward: Callable[[], torch.Tensor], step: int, lr: float, *, skip: bool = False
    ) -> PendingStep | None:
        """One optimizer step over ``grad_accum`` micro-batches; ``None`` if the replica groups'
        quorum discarded it. ``skip`` (an RLVR step with nothing to learn from, the same on
        every rank; never with replica groups): no backward and no optimizer step — the
        weights and the optimizer's moments stay as they are — and no loss (``NaN``, reported
        as unknown)."""
        if skip:
            assert self.sync is None
            stop = 1.0 if self.rank == 0 and self.spec.stop_path.exists() else 0.0
            figures = torch.tensor([math.nan, stop], device=self.device)
            work = dist.all_reduce(figures, async_op=True)
            return PendingStep(
                step=step,
                lr=lr,
                seconds=0.0,
                reduced=figures,
                work=work,
                grad_norm=torch.zeros((), device=self.device),
            )
        loss = backward()
        stop = 1.0 if self.rank == 0 and self.spec.stop_path.exists() else 0.0
        figures = torch.stack([loss.detach().float(), torch.tensor(stop, device=loss.device)])
        if self.sync is not None:
            # Gradient shards, loss and stop flag averaged with the other groups at once.
            grads = [local(p.grad) for p in self.model.parameters() if p.grad is not None]
            if not self.sync.average([*grads, figures]):
                self.optimizer.zero_grad(set_to_none=True)
                self.events.log(
                    "warning",
                    f"step {step} discarded: a replica group failed "
                    "during it; retrying with the live ones",
                )
                return None
        norm = clip_grad_norm(
            list(self.model.parameters()),
            MAX_GRAD_NORM,
            self.pipeline.group if self.pipeline is not None else None,
        )
        # The state an in-flight checkpoint copies must not change under it.
        self.checkpointer.wait_staging()
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        work = dist.all_reduce(figures, async_op=True)
        return PendingStep(
            step=step, lr=lr, seconds=0.0, reduced=figures, work=work, grad_norm=norm.detach()
        )

    # ---- evals --------------------------------------------------------------------------------

    def _eval_context(self) -> EvalContext:
        return EvalContext(
            model=self.model,
            tokenizer=self.tokenizer,
            device=self.device,
            dp_rank=self.group_dp_rank,
            dp_world=self.layout.dp,
            # A pipeline's schedule splits each batch into its micro-batches.
            micro_batch=(
                self.layout.sequences_per_rank if self.pipeline else self.layout.micro_batch
            ),
            heldout=lambda data_id: self._split(data_id)[1],
            rows=self._data_rows,
            pipeline=self.pipeline,
        )

    def _measure_initial(self) -> None:
        """Every eval of the run's stages on the untrained model (or the initial weights),
        before the first step, each with the RoPE base of the first stage that gates on it, as
        that stage measures it (weights trained with a long-context base, then measured with
        the model's own, would not read their source's loss); a battery the layout cannot
        run, or eval data without items, is refused here, before any training."""
        specs = [
            (plan.config.eval_seq_len, plan.config.rope_base_scale, spec)
            for plan in self.plans
            for spec in self.spec.manifest.eval_batteries[plan.config.battery]
        ]
        if self.pipeline is not None:
            items = sorted({s.eval for _, _, s in specs if BATTERIES[s.eval].items})
            if items:
                raise ItoError(
                    "capability_unavailable",
                    f"{', '.join(items)} cannot be measured under pipeline parallelism",
                )
        ctx = self._eval_context()
        values: dict[str, float | None] = {}
        own_base = rope_base(llama_config(self.size))
        for seq_len, scale, spec in specs:
            key = _initial_key(spec, seq_len)
            if key not in self.initial:
                set_rope_base(self.model, own_base * scale)  # each stage sets its own again
                value = BATTERIES[spec.eval].measure(ctx, spec.data, seq_len)
                self.initial[key] = value if math.isfinite(value) else None
                values.setdefault(_metric_name(spec.eval, spec.data), self.initial[key])
        if not values:
            return
        first = self.plans[0]
        self.events.emit("metric", stage=first.config.stage, step=first.first_step, values=values)
        shown = [f"{k.removeprefix('eval/')} {v:.4g}" for k, v in values.items() if v is not None]
        self.events.log("info", "untrained model at step 0: " + ", ".join(shown))

    def _evaluate(self, spec: EvalSpec, seq_len: int) -> dict[str, object]:
        battery = BATTERIES.get(spec.eval)
        initial = self.initial.get(_initial_key(spec, seq_len))
        result: dict[str, object] = {
            "eval": spec.eval,
            "data": spec.data,
            "value": None,
            "initial": initial,
            "threshold": spec.threshold(initial),
            "rule": spec.describe(),
            "passed": False,
        }
        if battery is None or (battery.items and self.pipeline is not None):
            # Fail closed: a gate the engine cannot measure does not pass.
            self.events.log(
                "error", f"eval {spec.eval!r} cannot be measured on this layout; the gate fails"
            )
            return result
        if spec.relative and initial is None:
            self.events.log(
                "error",
                f"no step-0 value of {spec.eval}({spec.data}) in the trainer state; the gate "
                "relative to it fails",
            )
        value = battery.measure(self._eval_context(), spec.data, seq_len)
        result["value"] = value if math.isfinite(value) else None
        result["passed"] = spec.passes(value, initial)
        return result


def _initial_key(spec: EvalSpec, seq_len: int) -> str:
    """Loss evals depend on the sequence length they pack into; item evals do not."""
    return f"{spec.eval}:{spec.data}" + ("" if BATTERIES[spec.eval].items else f":{seq_len}")


def _metric_name(eval_name: object, data_id: object) -> str:
    """``eval/<eval>/<data>`` (cut to the 64 characters a metric name may have)."""
    return f"eval/{eval_name}/{data_id}"[:64]
