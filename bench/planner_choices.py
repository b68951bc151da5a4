"""The planner's choices for the sizes and topologies the issue asks to see (DESIGN §7.2):
``150m``, ``1b`` and ``8b`` on 1×8, 2×8 and 16×8 H100 over InfiniBand and Ethernet, each at the
size's default sequence length and global batch — the layout, memory per GPU, predicted step time
and MFU, or the refusal with its reason codes. Pure arithmetic (:mod:`ito.core.planner`), no
GPU; prints a Markdown table.

Usage: ``.venv/bin/python bench/planner_choices.py [--gpu h100] [--sizes 150m,1b,8b]``
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "src"))

from ito.client.planning import PlannerRequest, planner_envelope

TOPOLOGIES = ((1, 8), (2, 8), (16, 8))
FABRICS = ("infiniband", "ethernet")
GIB = 1 << 30


def _row(size: str, gpu: str, nodes: int, per_node: int, fabric: str) -> str:
    envelope = planner_envelope(
        PlannerRequest(gpu=gpu, nodes=nodes, gpus_per_node=per_node, fabric=fabric, size=size)
    )
    where = f"| {size} | {nodes}×{per_node} | {fabric} |"
    if not envelope["ok"]:
        codes = ", ".join(r["code"] for r in envelope["error"].get("reasons") or [])
        return f"{where} refused: {codes or envelope['error']['code']} | | | |"
    p = envelope["data"]["plan"]
    mesh = " ".join(f"{k}={v}" for k, v in p["mesh"].items() if v > 1) or "1 rank"
    layout = (
        f"{mesh}; micro-batch {p['micro_batch']} × accum {p['grad_accum']}; "
        f"AC {p['activation_checkpointing']}; {p['precision']['param_dtype']}"
    )
    mem = p["memory"]
    pred = p["predicted"]
    return (
        f"{where} {layout} | {mem['total'] / GIB:.1f} / {mem['capacity'] / GIB:.1f} GiB "
        f"| {pred['step_seconds']:.3g} s | {pred['mfu']:.1%} |"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--gpu", default="h100")
    parser.add_argument("--sizes", default="150m,1b,8b")
    args = parser.parse_args()
    print("| size | GPUs | fabric | layout | memory per GPU | step | MFU |")
    print("|---|---|---|---|---|---|---|")
    for size in args.sizes.split(","):
        for nodes, per_node in TOPOLOGIES:
            for fabric in FABRICS:
                print(_row(size, args.gpu, nodes, per_node, fabric))


if __name__ == "__main__":
    main()
