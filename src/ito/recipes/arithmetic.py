"""The arithmetic recipes: a synthetic "web" corpus, SFT/DPO/RLVR data on integer addition, and a
held-out evaluation set kept disjoint from all training data. ``demo`` and ``post`` ask for
SFT → DPO → RLVR after the curriculum; the others list and prepare that data without training
on it.

Generation is pure and seeded; :func:`build_recipe` returns file contents and the manifest
document, and the caller writes them. The decontamination report is real: it records, for every
training file, the rows that data preparation's own 13-gram decontamination finds overlapping
the held-out set — zero by construction, and checked here.
"""

from __future__ import annotations

import hashlib
import json
import random
from dataclasses import dataclass, replace
from pathlib import PurePosixPath
from typing import Any

from ito.data.decontam import EvalIndex
from ito.data.heldout import split_heldout
from ito.data.rows import read_rows

__all__ = ["RECIPES", "Recipe", "build_recipe"]

NGRAM = 13


@dataclass(frozen=True)
class Budgets:
    pretrain_tokens: int
    midtrain_tokens: int
    long_context_tokens: int
    sft_tokens: int
    dpo_tokens: int
    rlvr_tokens: int
    web_docs: int
    every_steps: int
    gate_ratio: float
    """Each curriculum stage's gate: its held-out loss at most this × the untrained model's
    (measured at step 0), so an untrained or broken model fails it."""
    ladder: str | None = None
    """``helpful`` or ``harmful``: custom data in the pretrain stage, judged by the ladder
    decision job (DESIGN §7.4) — written sums, in the domain of the held-out sums the stage's
    battery measures; or shuffled-token noise (the web corpus's words in random order, three
    times its size) against a battery of held-out web text."""
    ladder_tokens: int = 0
    """Tokens each of the ladder's two proxy runs trains on."""
    post_training: bool = False
    """Whether the manifest asks for SFT → DPO → RLVR on the arithmetic data after the
    curriculum, each gated by held-out exact match."""
    post_gates: tuple[float, float, float] = (0.0, 0.0, 0.0)
    """The minimum held-out exact match after SFT, DPO and RLVR."""
    post_sampled_min: float | None = None
    """The minimum held-out accuracy sampled at temperature 1 (``sampled_exact_match``) after
    each post-training stage, if the recipe gates on it."""
    rlvr_rounds: tuple[int, float] = (64, 1.0)
    """RLVR's ``max_generation_rounds`` and ``expected_generation_rounds``."""
    post_web_ratio: float = 0.95
    """Post-training's regression gate: held-out web loss at most this × the untrained
    model's (fine-tuning on sums costs some of the language; a collapse fails)."""
    sft_carry_slips: float = 0.0
    """The fraction of the SFT demonstrations of a sum with a carry (``57+8=``) that drop the
    carry (``55``): demonstrations written by hand, imperfect as such data is. SFT copies the
    slip; RLVR's exact verifier, on the same prompts, corrects it."""
    rlvr_temperature: float = 0.7
    """RLVR's rollout temperature."""


RECIPES: dict[str, Budgets] = {
    "demo": Budgets(
        pretrain_tokens=400_000,
        # The written sums' own stage: at 60,000 tokens one CI seed's SFT stopped at 0.285 (it
        # had to learn the sums almost from nothing); at 300,000 the same seed read 0.695 /
        # 0.78 / 0.88 after SFT / DPO / RLVR, reward 0.66 → 0.80 (1.2 M SFT tokens also lifted
        # its SFT to 0.695, at three times the cost).
        midtrain_tokens=300_000,
        long_context_tokens=60_000,
        sft_tokens=800_000,
        dpo_tokens=20_000,
        # 1,250 RLVR steps of two groups (figures below; 625 raised the reward by 0.08–0.12).
        rlvr_tokens=320_000,
        web_docs=3000,
        every_steps=50,
        gate_ratio=0.5,
        post_training=True,
        # Why the demonstrations slip. With every demonstration right, SFT left held-out greedy
        # exact match at 0.72–0.995 (mostly above 0.9): RLVR started where nothing was left to
        # learn, its reward rose by 0.03–0.07 and exact match after it moved by −0.02 to +0.01.
        # The curriculum does not teach the sums (greedy 0 after it: "10+4=" → "1 . the
        # batch"); SFT does, and how well depends on the noise. Engine-alone runs, as held-out
        # greedy exact match after SFT / DPO / RLVR and RLVR's reward from the first tenth of
        # the stage to the last (rollouts at temperature 1, 1,250 steps at 0.05 of the peak
        # rate): 30 % of the carries dropped, three seeds: SFT 0.745 / 0.84 / 0.845, reward
        # 0.52 → 0.64; 0.76 / 0.86 / 0.905, 0.60 → 0.80; 0.77 / 0.885 / 0.945, 0.66 → 0.83.
        # At 40 %, SFT spread
        # 0.285–0.635 over four seeds (0.285 failed the SFT gate in CI; the others: RLVR 0.65,
        # 0.78, 0.84 from DPO 0.515, 0.73, 0.77, reward +0.13 to +0.17), and 1.2 M SFT tokens
        # did not narrow it (0.45, 0.705, 0.815; one RLVR fell 0.78 → 0.76). At 60 % two of four
        # seeds' SFT never learnt the sums (0.06, 0.15); slips on every sum at 30 % failed both
        # seeds tried; RLVR prompts restricted to the carries raised the reward 0.48 → 0.80 but
        # taught carrying everywhere (exact match 0.73 → 0.56).
        sft_carry_slips=0.3,
        post_gates=(0.3, 0.3, 0.3),
        # Sampled at temperature 1 (what RLVR's reward measures): 0.45–0.63 after SFT and DPO
        # at 30 % slips (0.26–0.40 at 40 %), 0.76 after RLVR.
        post_sampled_min=0.15,
        # Fine-tuning on short rows (32 tokens) costs much of the held-out web loss measured on
        # the curriculum's 256-token windows: 1.4 → 3.9–5.4 after SFT over the seeds above and
        # before (5.40 the highest). Per position from a document's start it is ~2 over the
        # first 10 tokens and worse past them, where no SFT row's text reaches (1.3–1.6 before
        # SFT). This bound, 5.8, catches a collapse towards the untrained model (6.27), not
        # that loss.
        post_web_ratio=0.93,
        # Groups whose eight rewards are all equal carry nothing and are sampled again: 1.2–2.3
        # rounds a step in those runs (more where the model is more often right). At most 8
        # rounds, then the step trains on the groups it found (a step with none is skipped):
        # the estimate prices 2, its upper bound all 8.
        rlvr_rounds=(8, 2.0),
        # At 1 the sums whose answers compete are sampled both ways more often; the reward
        # starts lower and rises further (figures above).
        rlvr_temperature=1.0,
    ),
    "test": Budgets(
        pretrain_tokens=20_000,
        midtrain_tokens=4_000,
        long_context_tokens=4_000,
        sft_tokens=4_000,
        dpo_tokens=4_000,
        rlvr_tokens=4_000,
        web_docs=300,
        every_steps=10,
        gate_ratio=0.95,
    ),
}
RECIPES["post"] = replace(
    RECIPES["test"], post_training=True, sft_tokens=2_048, dpo_tokens=2_048, rlvr_tokens=2_048
)
for _kind in ("helpful", "harmful"):
    RECIPES[f"ladder-{_kind}"] = replace(RECIPES["test"], ladder=_kind, ladder_tokens=20_000)


@dataclass(frozen=True)
class Recipe:
    manifest: dict[str, Any]
    files: dict[str, bytes]
    """File name (relative to the output directory) → bytes."""


_SUBJECTS = [
    "the model",
    "a student",
    "the engineer",
    "our cluster",
    "the scheduler",
    "a careful reader",
    "the checkpoint",
    "the optimizer",
    "a tokenizer",
    "the batch",
]
_VERBS = [
    "adds",
    "counts",
    "writes",
    "reads",
    "checks",
    "stores",
    "sorts",
    "learns",
    "measures",
    "repeats",
]
_OBJECTS = [
    "small numbers",
    "long sentences",
    "every token",
    "the loss curve",
    "two digits",
    "a short story",
    "the gradient",
    "many shards",
    "the eval battery",
    "its own notes",
]


def _sentence(rng: random.Random) -> str:
    a, b = rng.randint(0, 499), rng.randint(0, 499)
    if rng.random() < 0.35:
        return f"we know that {a} plus {b} makes {a + b} ."
    return f"{rng.choice(_SUBJECTS)} {rng.choice(_VERBS)} {rng.choice(_OBJECTS)} ."


def _post_training(budgets: Budgets) -> dict[str, Any]:
    """SFT → DPO → RLVR on the sums: examples of at most 16 tokens (``a+b=`` and the sum)."""
    return {
        "sft": {
            "data": ["arith-sft"],
            "epochs": 20,
            "max_tokens": budgets.sft_tokens,
            "battery": "arith-sft",
            "seq_len": 32,
        },
        "dpo": {
            "data": ["arith-prefs"],
            "beta": 0.1,
            # Plain DPO lowered held-out exact match below SFT's (0.84 → 0.78 in a run of
            # the demo): it pushed the chosen sums' likelihood down with the rejected ones'.
            "rpo_alpha": 1.0,
            "max_tokens": budgets.dpo_tokens,
            "battery": "arith-dpo",
            "seq_len": 16,
        },
        "rlvr": {
            "algorithm": "grpo",
            "data": ["arith-prompts"],
            "rewards": ["exact_match_arith"],
            "group_size": 8,
            "temperature": budgets.rlvr_temperature,
            "max_staleness": 0,
            "max_tokens": budgets.rlvr_tokens,
            "battery": "arith-rlvr",
            "seq_len": 16,
            "dapo": {
                "clip_low": 0.2,
                "clip_high": 0.28,
                "dynamic_sampling": True,
                "token_level_loss": True,
                "overlong": {"max_tokens": 6, "soft_tokens": 2},
                "max_generation_rounds": budgets.rlvr_rounds[0],
                "expected_generation_rounds": budgets.rlvr_rounds[1],
            },
        },
    }


def _jsonl(rows: list[dict[str, Any]]) -> bytes:
    return b"".join(json.dumps(row, sort_keys=True).encode() + b"\n" for row in rows)


def build_recipe(name: str, out_dir: str) -> Recipe:
    """The recipe ``name`` with data URIs pointing into the absolute directory ``out_dir``."""
    budgets = RECIPES[name]
    rng = random.Random(20261202)
    # The skill: a number below 100 plus a digit. The held-out sums are 200 of the 1,000 such
    # pairs, never written in any training file (in any form).
    pairs = [(a, b) for a in range(100) for b in range(10)]
    # Two-digit first operands only: "a+b=s" then is never inside another pair's text (a
    # one-digit "8+1=9" is inside "98+1=99"), so decontamination finds nothing by construction.
    heldout = sorted(random.Random(7).sample([p for p in pairs if p[0] >= 10], 200))
    held = set(heldout)

    def train_pair() -> tuple[int, int]:
        while True:
            pair = rng.randint(0, 99), rng.randint(0, 9)
            if pair not in held:
                return pair

    web = [
        {"text": " ".join(_sentence(rng) for _ in range(rng.randint(4, 12)))}
        for _ in range(budgets.web_docs)
    ]
    # Midtrain's own mix: the web's kind of sentences with sums written out between them, the
    # skill the held-out set measures (operands below 500; the held-out set's are at or above:
    # disjoint by construction). Each document mixes both, so every batch is alike and the web
    # text is not forgotten.
    mid = []
    for _ in range(400):
        parts = []
        for _ in range(rng.randint(4, 10)):
            if rng.random() < 0.5:
                a, b = train_pair()
                parts.append(f"{a}+{b}={a + b} .")
            else:
                parts.append(_sentence(rng))
        mid.append({"text": " ".join(parts)})
    # Each training pair once (exact deduplication would drop repeats), in a seeded order.
    train_pairs = [pair for pair in pairs if pair not in held]
    rng.shuffle(train_pairs)
    slips = random.Random(11)

    def demonstrated(a: int, b: int) -> int:
        if a % 10 + b >= 10 and slips.random() < budgets.sft_carry_slips:
            return a + b - 10
        return a + b

    sft = [{"prompt": f"{a}+{b}=", "completion": f"{demonstrated(a, b)}"} for a, b in train_pairs]
    prefs = []
    for a, b in train_pairs[:300]:
        wrong = a + b + rng.choice([-10, -1, 1, 10])
        prefs.append({"prompt": f"{a}+{b}=", "chosen": f"{a + b}", "rejected": f"{wrong}"})
    # RLVR's prompts are every training pair. On a subset (300 of the 800) RL raised the reward
    # on its own prompts but lowered held-out greedy exact match as often as it raised it. The
    # model lost carries into a round ten ("63+7=" → 60) on sums no prompt asked. Measured
    # from four DPO models (greedy 0.985, 0.955, 0.975, 0.975), RLVR runs of other seeds:
    # on the subset 0.975 1.0 | 0.925 0.935 0.955 | 0.97 0.965 0.98 | 0.985 0.975 0.98; on all
    # 800, 0.99 | 0.96 0.955 | 0.98 0.985 | 0.99 0.985 (sampled accuracy about the same or higher).
    prompts = [{"prompt": f"{a}+{b}=", "answer": f"{a + b}"} for a, b in train_pairs]
    evals = [{"prompt": f"{a}+{b}=", "answer": f"{a + b}"} for a, b in heldout]
    custom: list[dict[str, Any]] = []
    if budgets.ladder == "helpful":
        for _ in range(400):
            sums = (train_pair() for _ in range(rng.randint(4, 10)))
            custom.append({"text": " ".join(f"{a}+{b}={a + b} ." for a, b in sums)})
    elif budgets.ladder == "harmful":
        words = [word for doc in web for word in doc["text"].split()] * 3
        rng.shuffle(words)
        for start in range(0, len(words), 64):
            custom.append({"text": " ".join(words[start : start + 64])})

    files = {
        "web.jsonl": _jsonl(web),
        "arith-mid.jsonl": _jsonl(mid),
        "arith-sft.jsonl": _jsonl(sft),
        "arith-prefs.jsonl": _jsonl(prefs),
        "arith-prompts.jsonl": _jsonl(prompts),
        "arith-heldout.jsonl": _jsonl(evals),
    }
    if custom:
        files["custom.jsonl"] = _jsonl(custom)
    if budgets.post_training:
        # General text beside the sums, so fine-tuning on sums does not wipe out the language
        # (the post-training gates check web text too): the start of a training document as
        # the prompt, its next words as the completion. Never a held-out web document. The
        # space between them opens the completion: the joined text then tokenizes as the
        # document did in pre-training, the prompt's tokens a prefix of it (a prompt ending in
        # the space left a lone space token and the completion's first word split into
        # characters, a text the model never saw).
        train_docs, _ = split_heldout([doc["text"] for doc in web], "pretrain")
        files["web-sft.jsonl"] = _jsonl(
            [
                {"prompt": " ".join(words[:6]), "completion": " " + " ".join(words[6:12])}
                for words in (text.split() for text in train_docs[:800])
                if len(words) >= 12
            ]
        )
    # The report is what data preparation itself would find: the same rows (ito.data.rows)
    # and the same n-gram matching (ito.data.decontam).
    roles = {
        "web.jsonl": "pretrain",
        "arith-mid.jsonl": "midtrain",
        "arith-sft.jsonl": "sft",
        "arith-prefs.jsonl": "dpo",
        "arith-prompts.jsonl": "rlvr",
    }
    if custom:
        roles["custom.jsonl"] = "pretrain"
    if budgets.post_training:
        roles["web-sft.jsonl"] = "sft"
    items = read_rows(files["arith-heldout.jsonl"], "eval", data_id="arith-heldout")
    index = EvalIndex([row.text for row in items], NGRAM)
    report_rows = []
    for fname, role in roles.items():
        rows = read_rows(files[fname], role, data_id=fname)
        contaminated = sum(1 for row in rows if index.matches(row.text))
        assert contaminated == 0, "generated training data overlaps the held-out set"
        report_rows.append(
            {
                "file": fname,
                "sha256": hashlib.sha256(files[fname]).hexdigest(),
                "contaminated_rows": contaminated,
            }
        )
    report = {
        "method": "ngram",
        "n": NGRAM,
        "eval_suites": ["arith-heldout"],
        "eval_sha256": hashlib.sha256(files["arith-heldout.jsonl"]).hexdigest(),
        "files": report_rows,
    }
    files["decontamination-report.json"] = json.dumps(report, indent=2).encode() + b"\n"
    report_sha = hashlib.sha256(files["decontamination-report.json"]).hexdigest()

    base = PurePosixPath(out_dir)
    deco: dict[str, Any] = {
        "eval_suites": ["arith-heldout"],
        "method": "ngram",
        "n": NGRAM,
        "report_sha256": report_sha,
    }

    def ref(data_id: str, fname: str, role: str, license_: str, with_deco: bool) -> dict[str, Any]:
        item: dict[str, Any] = {
            "id": data_id,
            "uri": f"file://{base / fname}",
            "sha256": hashlib.sha256(files[fname]).hexdigest(),
            "role": role,
            "license": license_,
            "custom": False,
        }
        if with_deco:
            item["decontamination"] = {**deco, "eval_suites": list(deco["eval_suites"])}
        return item

    manifest: dict[str, Any] = {
        "schema": "ito.training.manifest.v1",
        "name": f"{name}-arithmetic",
        "model": {"family": "llama", "size": "tiny", "revision": "scratch"},
        "resources": {
            "accelerators": ["cpu"],
            "nodes": 1,
            "gpus_per_node": 2,
            "fabrics": ["ethernet", "infiniband", "roce"],
        },
        "data": [
            ref("web", "web.jsonl", "pretrain", "cc-by-4.0", True),
            ref("arith-mid", "arith-mid.jsonl", "midtrain", "mit", True),
            ref("arith-sft", "arith-sft.jsonl", "sft", "mit", True),
            ref("arith-prefs", "arith-prefs.jsonl", "dpo", "mit", True),
            ref("arith-prompts", "arith-prompts.jsonl", "rlvr", "mit", True),
            ref("arith-heldout", "arith-heldout.jsonl", "eval", "mit", False),
        ],
        "curriculum": [
            {
                "stage": "pretrain",
                "data": ["web"],
                "tokens": budgets.pretrain_tokens,
                "seq_len": 128,
                "battery": "core",
            },
            {
                "stage": "midtrain",
                "data": ["arith-mid"],
                "tokens": budgets.midtrain_tokens,
                "seq_len": 128,
                "battery": "mid",
            },
            {
                "stage": "long_context",
                "data": ["web"],
                "tokens": budgets.long_context_tokens,
                "seq_len": 256,
                "rope_base_scale": 4.0,
                "battery": "core",
            },
        ],
        "post_training": _post_training(budgets) if budgets.post_training else {},
        "eval_batteries": {
            "core": [{"eval": "heldout_loss", "data": "web", "max_ratio": budgets.gate_ratio}],
            "mid": [
                {"eval": "heldout_loss", "data": "web", "max_ratio": budgets.gate_ratio},
                {"eval": "heldout_loss", "data": "arith-mid", "max_ratio": budgets.gate_ratio},
            ],
            "arith": [{"eval": "exact_match", "data": "arith-heldout", "min": 0.5}],
        },
        "ladder": {"enabled": False, "proxy_size": "tiny", "tokens": 10_000, "margin": 0.01},
        "checkpoint": {"every_steps": budgets.every_steps, "keep_last": 2, "storage": "booking"},
        "data_policy": {
            "allowed_licenses": ["cc-by-4.0", "mit", "apache-2.0"],
            "max_contamination": 0.0,
        },
        "budget": {"ceiling_usd": 5.0, "max_incremental_cost_usd": 2.0},
    }
    if budgets.post_training:
        manifest["data"].append(ref("web-sft", "web-sft.jsonl", "sft", "cc-by-4.0", True))
        manifest["post_training"]["sft"]["data"] = ["arith-sft", "web-sft"]
        # Long context keeps the sums in its mix: post-training starts from a model that still
        # writes them.
        manifest["curriculum"][2]["data"] = ["web", "arith-mid"]
        for stage, gate in zip(("sft", "dpo", "rlvr"), budgets.post_gates, strict=True):
            manifest["eval_batteries"][f"arith-{stage}"] = [
                {"eval": "exact_match", "data": "arith-heldout", "min": gate},
                # Post-training must not undo what pre-training learned.
                {"eval": "heldout_loss", "data": "web", "max_ratio": budgets.post_web_ratio},
            ]
            if budgets.post_sampled_min is not None:
                manifest["eval_batteries"][f"arith-{stage}"].append(
                    {
                        "eval": "sampled_exact_match",
                        "data": "arith-heldout",
                        "min": budgets.post_sampled_min,
                    }
                )
    if custom:
        item = ref("custom", "custom.jsonl", "pretrain", "cc-by-4.0", True)
        item["custom"] = True
        manifest["data"].insert(1, item)
        manifest["curriculum"][0]["data"] = ["web", "custom"]
        if budgets.ladder == "helpful":
            # The stage's battery measures held-out sums: the custom data's domain.
            manifest["curriculum"][0]["battery"] = "sums"
            manifest["eval_batteries"]["sums"] = [
                {"eval": "heldout_loss", "data": "arith-heldout", "max_ratio": budgets.gate_ratio}
            ]
        manifest["ladder"] = {
            "enabled": True,
            "proxy_size": "tiny",
            "tokens": budgets.ladder_tokens,
            "margin": 0.01,
        }
    return Recipe(manifest=manifest, files=files)
