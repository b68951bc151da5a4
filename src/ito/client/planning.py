"""``ito planner``: the parallelism planner, computed on this machine (no server, no credential).

Turns the command's options into a :class:`~ito.core.planner.PlannerInput`, runs the planner and
returns the §4 envelope: ``data.plan`` (with ``data.input``, what was planned for), or
``error.code = plan_refused`` with ``error.reasons``. A malformed request (an unknown GPU, a
shape that does not add up) is ``invalid_arguments``. Nothing is ever sent.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from ito.core.envelope import error_envelope, ok_envelope
from ito.core.errors import ItoError
from ito.core.hardware import ACCELERATORS, FABRIC_LINKS
from ito.core.human_format import duration
from ito.core.model_sizes import SIZES
from ito.core.planner import ModelShape, Parallelism, PlannerInput, PlanRefused, plan

__all__ = [
    "DEFAULT_VOCAB",
    "PlannerRequest",
    "planner_envelope",
    "planner_input",
    "render_plan",
    "render_run_plan",
]

DEFAULT_VOCAB = 128256
"""Llama 3's tokenizer, assumed when an explicit shape gives no vocabulary."""
PARAMETER_TOLERANCE = 0.02
"""How far ``--params`` may be from the count the explicit shape gives."""


@dataclass(frozen=True)
class PlannerRequest:
    """The options of ``ito planner``, as given."""

    gpu: str
    nodes: int
    gpus_per_node: int
    fabric: str
    size: str | None = None
    params: int | None = None
    layers: int | None = None
    hidden: int | None = None
    heads: int | None = None
    kv_heads: int | None = None
    ffn: int | None = None
    vocab: int | None = None
    seq_len: int | None = None
    global_batch_tokens: int | None = None
    fp8: bool = False
    compile: bool = False
    """Plan as if the layers were ``torch.compile``-d. Off by default: this version's engine
    runs eager, and gate 5 plans a run so (:mod:`ito.core.run_plan`)."""
    parallelism: Parallelism = field(default_factory=Parallelism)
    allow_wasteful: bool = False


def _invalid(message: str, **details: Any) -> ItoError:
    return ItoError("invalid_arguments", message, **details)


def _shape(request: PlannerRequest) -> tuple[ModelShape, int, list[str]]:
    """The model shape, the sequence length, and what was assumed to get them."""
    explicit = {
        "params": request.params,
        "layers": request.layers,
        "hidden": request.hidden,
        "heads": request.heads,
        "kv_heads": request.kv_heads,
        "ffn": request.ffn,
        "vocab": request.vocab,
    }
    given = sorted(name for name, value in explicit.items() if value is not None)
    if request.size is not None:
        if given:
            raise _invalid("--size cannot be combined with an explicit shape", options=given)
        if request.size not in SIZES:
            raise _invalid(f"--size must be one of {sorted(SIZES)}")
        size = SIZES[request.size]
        return ModelShape.from_size(size), request.seq_len or size.max_seq_len, []
    layers, hidden, heads = request.layers, request.hidden, request.heads
    if layers is None or hidden is None or heads is None or request.seq_len is None:
        raise _invalid(
            "give --size, or --layers, --hidden, --heads, --seq-len and --ffn or --params"
        )
    assumed = []
    kv_heads = request.kv_heads or heads
    if request.kv_heads is None:
        assumed.append(f"kv_heads = heads = {heads} (no grouped-query attention)")
    vocab = request.vocab or DEFAULT_VOCAB
    if request.vocab is None:
        assumed.append(f"vocab = {DEFAULT_VOCAB} (Llama 3's tokenizer)")
    if request.ffn is not None:
        shape = ModelShape(layers, hidden, heads, kv_heads, request.ffn, vocab)
    elif request.params is not None:
        shape = ModelShape.with_parameters(
            request.params,
            layers=layers,
            hidden=hidden,
            heads=heads,
            kv_heads=kv_heads,
            vocab=vocab,
        )
        assumed.append(f"ffn = {shape.ffn}, solved from --params")
    else:
        raise _invalid("give --ffn or --params with an explicit shape")
    if request.params is not None:
        off = abs(shape.parameters - request.params) / request.params
        if off > PARAMETER_TOLERANCE:
            raise _invalid(
                f"the shape has {shape.parameters} parameters, --params says {request.params}",
                shape_parameters=shape.parameters,
            )
    return shape, request.seq_len, assumed


def planner_input(request: PlannerRequest) -> tuple[PlannerInput, list[str]]:
    if request.gpu not in ACCELERATORS:
        raise _invalid(f"--gpu must be one of {sorted(ACCELERATORS)}")
    if request.fabric not in FABRIC_LINKS:
        raise _invalid(f"--fabric must be one of {sorted(FABRIC_LINKS)}")
    try:
        shape, seq_len, assumed = _shape(request)
        inp = PlannerInput(
            model=shape,
            seq_len=seq_len,
            accelerator=ACCELERATORS[request.gpu],
            nodes=request.nodes,
            gpus_per_node=request.gpus_per_node,
            fabric=FABRIC_LINKS[request.fabric],
            global_batch_tokens=request.global_batch_tokens,
            fp8=request.fp8,
            pinned=request.parallelism,
            allow_wasteful=request.allow_wasteful,
            compile=request.compile,
        )
    except ValueError as exc:
        raise _invalid(str(exc)) from None
    return inp, assumed


def _described(inp: PlannerInput, request: PlannerRequest, assumed: list[str]) -> dict[str, Any]:
    return {
        "model": asdict(inp.model) | {"parameters": inp.model.parameters, "size": request.size},
        "seq_len": inp.seq_len,
        "gpu": request.gpu,
        "nodes": inp.nodes,
        "gpus_per_node": inp.gpus_per_node,
        "fabric": request.fabric,
        "global_batch_tokens": inp.global_batch_tokens,
        "fp8": inp.fp8,
        "compile": inp.compile,
        "pinned": inp.pinned.pinned,
        "allow_wasteful": inp.allow_wasteful,
        "assumed": assumed,
    }


def planner_envelope(request: PlannerRequest) -> dict[str, Any]:
    """The envelope ``ito planner`` prints; never raises for anything a user can type."""
    try:
        inp, assumed = planner_input(request)
    except ItoError as exc:
        return error_envelope(
            exc, "nothing was planned and nothing was sent", live_api_contacted=False
        )
    try:
        result = plan(inp)
    except PlanRefused as refused:
        return error_envelope(
            refused,
            "no acceptable layout for this model on this hardware; computed locally, nothing "
            "was sent",
            live_api_contacted=False,
        )
    return ok_envelope(
        {"plan": result.to_dict(), "input": _described(inp, request, assumed)},
        "planned locally; nothing was sent",
        live_api_contacted=False,
    )


def _gib(value: float) -> str:
    return f"{value / (1 << 30):.1f} GiB"


def render_plan(envelope: dict[str, Any]) -> None:
    """The plan for a human: layout, precision, memory, prediction, and why."""
    from rich.console import Console

    console = Console()
    data = envelope["data"]
    p, model = data["plan"], data["input"]["model"]
    console.print(f"[green]✓[/green] {envelope['notice']}")
    model_row = (
        f"{model['parameters'] / 1e9:.2f} B parameters, {model['layers']} layers, "
        f"hidden {model['hidden']}, seq {data['input']['seq_len']}"
    )
    console.print(f"[bold]{'model':>10}[/bold]  {model_row}", highlight=False)
    _print_layout(console, p)


def render_run_plan(envelope: dict[str, Any]) -> None:
    """``ito plan`` for a human: the answer, then its ``parallelism`` section spelled out."""
    from rich.console import Console
    from rich.pretty import Pretty

    console = Console()
    data = envelope["data"]
    console.print(f"[green]✓[/green] {envelope['notice']}")
    console.print(Pretty({k: v for k, v in data.items() if k != "parallelism"}))
    cost = data.get("cost") or {}
    if cost.get("upper_cost_usd"):
        console.print(
            f"[bold]cost[/bold] expected ${cost['cost_usd']:.2f} in {duration(cost['seconds'])}; "
            f"at most ${cost['upper_cost_usd']:.2f} in {duration(cost['upper_seconds'])} (an "
            "uncalibrated throughput, RLVR at its most generation rounds): by default the "
            "approver signs that upper figure as the run's spending limit"
            + (
                f"; time and cost both assume {cost['assumed_mfu']:.0%} of peak FLOP/s, "
                "uncalibrated"
                if cost.get("assumed_mfu")
                else ""
            ),
            highlight=False,
        )
    section = data.get("parallelism")
    if not section:
        return
    console.print("[bold]parallelism[/bold]")
    if not section["ok"]:
        error = section["error"]
        console.print(f"  [red]refused[/red] {error['code']}: {error['message']}", highlight=False)
        for reason in error.get("reasons") or []:
            console.print(
                f"  - {reason['code']}: {reason['message']}", highlight=False, markup=False
            )
        return
    applied = "applied as planned" if section["applied"] else "not applied by the engine"
    console.print(
        f"  {section['mode']}, planned at seq {section['seq_len']}; {applied}: {section['note']}",
        highlight=False,
        markup=False,
    )
    _print_layout(console, section["plan"])


def _print_layout(console: Any, p: dict[str, Any]) -> None:
    mem, pred, prec = p["memory"], p["predicted"], p["precision"]
    rows = [
        (
            "layout",
            " ".join(f"{dim}={degree}" for dim, degree in p["mesh"].items())
            + f" · micro-batch {p['micro_batch']} · grad accum {p['grad_accum']}"
            + f" · pp micro-batches {p['pp_microbatches']}"
            + f" · activation checkpointing {p['activation_checkpointing']}",
        ),
        (
            "precision",
            f"{prec['param_dtype']} compute, {prec['reduce_dtype']} reduction, "
            f"fp8 {'on' if prec['fp8'] else 'off'}, compile {'on' if p['compile'] else 'off'}",
        ),
        (
            "memory",
            f"{_gib(mem['total'])} of {_gib(mem['capacity'])} per GPU: parameters "
            f"{_gib(mem['parameters'])}, gradients {_gib(mem['gradients'])}, optimizer "
            f"{_gib(mem['optimizer_states'])}, activations {_gib(mem['activations'])}, "
            f"buffers {_gib(mem['buffers'])}, reserve {_gib(mem['runtime_reserve'])}",
        ),
        (
            "predicted",
            f"{pred['step_seconds']:.3g} s per step of {p['global_batch_tokens']} tokens, "
            f"{pred['tokens_per_second']:,.0f} tokens/s, MFU {pred['mfu']:.1%} (the planner's "
            "model to compare layouts, uncalibrated; the cost above assumes its own figure), "
            "exposed "
            f"communication {pred['exposed_communication_seconds']:.3g} s, bubble "
            f"{pred['bubble_fraction']:.0%}",
        ),
    ]
    for label, text in rows:
        console.print(f"[bold]{label:>10}[/bold]  {text}", highlight=False)
    console.print("[bold]       why[/bold]")
    for rule in p["rules"]:
        console.print(
            f"  {rule['choice']}={rule['value']}: {rule['why']}", highlight=False, markup=False
        )
    for warning in p["warnings"]:
        console.print(
            f"  [yellow]warning[/yellow] {warning['code']}: {warning['message']}", highlight=False
        )
