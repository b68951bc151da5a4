"""One definition of a row (``ito.data.rows``): the reader splits JSONL on ``\\n`` only,
Parquet and JSONL give the same rows and the same prepared shards, deduplication sees the text
training reads, and a row that does not fit its role is refused with ``data_invalid`` and where."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from ito.core.errors import ItoError
from ito.core.manifest import parse_manifest
from ito.data.rows import ROLE_SHAPES, data_format, read_rows
from ito.pipeline.data import read_documents
from ito.pipeline.data_prep import prepare_data, prepared_dir, shard_path
from ito.recipes import build_recipe

SEPARATORS = "\u2028\u2029\u0085\x0b\x0c\x1c\x1d\x1e\r"
"""Characters ``str.splitlines`` splits on besides ``\\n``; inside a JSON string they are text."""


def _jsonl(rows: list[dict[str, Any]]) -> bytes:
    return b"".join(json.dumps(r, ensure_ascii=False).encode() + b"\n" for r in rows)


def _parquet(rows: list[dict[str, Any]], path: Path) -> bytes:
    pq.write_table(pa.Table.from_pylist(rows), path)
    return path.read_bytes()


def _refused(raw: bytes, role: str) -> ItoError:
    with pytest.raises(ItoError) as info:
        read_rows(raw, role, data_id="d")
    return info.value


# --- the reader -------------------------------------------------------------------------------


def test_line_separators_inside_a_json_string_survive_the_reader() -> None:
    text = f"first{SEPARATORS}last"
    raw = _jsonl([{"text": text}, {"text": "second"}])
    assert len(raw.decode().splitlines()) > 2  # what the old reader split on
    rows = read_rows(raw, "pretrain", data_id="d")
    assert [r.text for r in rows] == [text, "second"]


def test_u2028_in_a_json_string_survives_preparation_and_reaches_training(tmp_path: Path) -> None:
    doc = _recipe(tmp_path)
    web = [{"text": f"line one\u2028line two of document {i} ."} for i in range(40)]
    _replace(doc, "web", _jsonl(web))
    manifest = parse_manifest(json.dumps(doc).encode())
    workdir = tmp_path / "work"
    # Unprepared, the training reader reads the raw file: the separator is still there.
    assert read_documents(manifest.data_by_id()["web"], workdir)[3] == (
        "line one\u2028line two of document 3 ."
    )
    prepare_data(manifest, workdir)
    docs = read_documents(manifest.data_by_id()["web"], workdir)
    # NFKC keeps U+2028; whitespace normalisation makes it one space, in every reader alike.
    assert docs == [f"line one line two of document {i} ." for i in range(40)]


def test_blank_lines_and_crlf_endings_are_read_and_extra_fields_ignored() -> None:
    raw = b'{"prompt": "1+2=", "completion": "3", "id": 7}\r\n\n  \n{"prompt":"a","completion":"b"}'
    rows = read_rows(raw, "sft", data_id="d")
    assert [r.to_dict() for r in rows] == [
        {"prompt": "1+2=", "completion": "3"},
        {"prompt": "a", "completion": "b"},
    ]


@pytest.mark.parametrize(
    ("line", "role", "reason", "field"),
    [
        (b"{not json", "pretrain", "not_json", None),
        (b'"a string"', "pretrain", "not_object", None),
        (b'{"text": ["a"]}', "pretrain", "wrong_type", "text"),
        (b'{"text": null}', "pretrain", "missing_field", "text"),
        (b'{"prompt": "1+2="}', "sft", "missing_field", "completion"),
        (b'{"prompt": "1+2=", "chosen": "3"}', "dpo", "missing_field", "rejected"),
        (b'{"prompt": "1+2=", "answer": 3}', "rlvr", "wrong_type", "answer"),
        (b'{"prompt": "1+2="}', "eval", "missing_field", "answer"),
        (b'{"question": "1+2="}', "eval", "missing_field", "prompt"),
        (b"\xc3\x28", "pretrain", "not_utf8", None),
        (b'{"text": Infinity}', "pretrain", "not_json", None),
    ],
)
def test_a_row_that_does_not_fit_its_role_is_refused_with_its_line(
    line: bytes, role: str, reason: str, field: str | None
) -> None:
    ok = {
        "pretrain": b'{"text": "fine"}',
        "sft": b'{"prompt": "a", "completion": "b"}',
        "dpo": b'{"prompt": "a", "chosen": "b", "rejected": "c"}',
        "rlvr": b'{"prompt": "a", "answer": "b"}',
        "eval": b'{"text": "fine"}',
    }[role]
    exc = _refused(ok + b"\n\n" + line + b"\n", role)
    assert exc.code == "data_invalid" and exc.status == 422
    assert (exc.details["data_id"], exc.details["line"], exc.details["reason"]) == ("d", 3, reason)
    assert exc.details.get("field") == field


def test_parquet_rows_are_refused_with_their_row_number(tmp_path: Path) -> None:
    raw = _parquet(
        [{"prompt": "a", "answer": "b"}, {"prompt": "c", "answer": None}], tmp_path / "p"
    )
    exc = _refused(raw, "rlvr")
    assert (exc.code, exc.details["row"], exc.details["reason"]) == (
        "data_invalid",
        2,
        "missing_field",
    )
    ints = _parquet([{"text": 1}], tmp_path / "q")
    assert _refused(ints, "pretrain").details["reason"] == "wrong_type"
    broken = b"PAR1" + b"\0" * 32 + b"PAR1"
    assert data_format(broken) == "parquet"
    assert _refused(broken, "pretrain").details["reason"] == "not_parquet"


def test_parquet_and_jsonl_give_the_same_rows_for_every_role(tmp_path: Path) -> None:
    examples: dict[str, list[dict[str, Any]]] = {
        "pretrain": [{"text": "a b\u2028c", "url": "x"}, {"text": "d"}],
        "midtrain": [{"text": "e"}],
        "sft": [{"prompt": "1+2=", "completion": "3", "weight": 1.0}],
        "dpo": [{"prompt": "1+2=", "chosen": "3", "rejected": "4"}],
        "rlvr": [{"prompt": "Q: 1+2?\nA:", "answer": " 3"}],
        "eval": [{"prompt": "5+5=", "answer": "10"}],
    }
    assert set(examples) == set(ROLE_SHAPES)
    for role, rows in examples.items():
        from_jsonl = read_rows(_jsonl(rows), role, data_id="d")
        parquet = _parquet(rows, tmp_path / f"{role}.parquet")
        assert data_format(parquet) == "parquet"
        assert read_rows(parquet, role, data_id="d") == from_jsonl, role


# --- the same rows and text everywhere --------------------------------------------------------


def _recipe(tmp_path: Path) -> dict[str, Any]:
    data = tmp_path / "data"
    data.mkdir()
    recipe = build_recipe("test", str(data))
    for name, content in recipe.files.items():
        (data / name).write_bytes(content)
    doc: dict[str, Any] = json.loads(json.dumps(recipe.manifest))
    return doc


def _replace(doc: dict[str, Any], data_id: str, raw: bytes, suffix: str = ".jsonl") -> None:
    ref = next(d for d in doc["data"] if d["id"] == data_id)
    path = Path(ref["uri"].removeprefix("file://")).with_suffix(suffix)
    path.write_bytes(raw)
    ref["uri"], ref["sha256"] = f"file://{path}", hashlib.sha256(raw).hexdigest()


def test_parquet_and_jsonl_data_prepare_into_the_same_shards(tmp_path: Path) -> None:
    doc = _recipe(tmp_path)
    jsonl_manifest = parse_manifest(json.dumps(doc).encode())
    for ref in doc["data"]:
        path = Path(ref["uri"].removeprefix("file://"))
        rows = [json.loads(line) for line in path.read_bytes().split(b"\n") if line]
        _replace(doc, ref["id"], _parquet(rows, tmp_path / "t.parquet"), ".parquet")
    parquet_manifest = parse_manifest(json.dumps(doc).encode())

    from_jsonl = prepare_data(jsonl_manifest, tmp_path / "a")
    from_parquet = prepare_data(parquet_manifest, tmp_path / "b")
    assert {d.input_format for d in from_parquet.datasets} == {"parquet"}
    assert {d.input_format for d in from_jsonl.datasets} == {"jsonl"}
    for a, b in zip(from_jsonl.datasets, from_parquet.datasets, strict=True):
        assert a.output_sha256 == b.output_sha256, a.id
        assert shard_path(tmp_path / "a", a.id).read_bytes() == (
            shard_path(tmp_path / "b", b.id).read_bytes()
        )
    assert from_jsonl.evals == from_parquet.evals
    assert sorted(p.name for p in prepared_dir(tmp_path / "b").iterdir())[0].endswith(".jsonl")


def test_deduplication_sees_the_text_training_reads(tmp_path: Path) -> None:
    doc = _recipe(tmp_path)
    sft = [
        {"prompt": "2+2=", "completion": "4"},
        {"prompt": "2+2", "completion": "=4"},  # other fields, the same text: a duplicate
        {"prompt": "Q: 2+3?\nA:", "completion": " 5"},
    ] + [{"prompt": f"{a}+{a}=", "completion": f"{2 * a}"} for a in range(30)]
    _replace(doc, "arith-sft", _jsonl(sft))
    manifest = parse_manifest(json.dumps(doc).encode())
    workdir = tmp_path / "work"
    report = prepare_data(manifest, workdir)

    assert report.dataset("arith-sft").near_dupes_removed == 1
    docs = read_documents(manifest.data_by_id()["arith-sft"], workdir)
    assert docs[:2] == ["2+2=4", "Q: 2+3? A: 5"]  # not "2+2= 4", as deduplication once saw it
    assert "2+2=4" in docs and docs.count("2+2=4") == 1


def test_an_eval_item_found_in_training_text_is_the_eval_text_training_would_read(
    tmp_path: Path,
) -> None:
    doc = _recipe(tmp_path)
    heldout = read_rows(
        Path(next(d for d in doc["data"] if d["id"] == "arith-heldout")["uri"][7:]).read_bytes(),
        "eval",
        data_id="arith-heldout",
    )
    item = heldout[5]
    web_path = Path(next(d for d in doc["data"] if d["id"] == "web")["uri"][7:])
    web = [json.loads(line) for line in web_path.read_bytes().split(b"\n") if line]
    web.append({"text": f"as noted, {item.get('prompt')} {item.get('answer')} holds ."})
    _replace(doc, "web", _jsonl(web))
    doc["data_policy"]["max_contamination"] = 0.01
    manifest = parse_manifest(json.dumps(doc).encode())
    workdir = tmp_path / "work"
    report = prepare_data(manifest, workdir)

    assert report.dataset("web").contaminated_removed == 1
    evals = read_documents(manifest.data_by_id()["arith-heldout"], workdir)
    assert item.text in evals  # the eval item as training/evaluation reads it: "a+b=c"
    assert item.text == item.get("prompt") + item.get("answer")
