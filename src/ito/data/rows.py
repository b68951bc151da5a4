"""What a data row is for each data role, and the one reader of data files (DESIGN §7.4).

Every part of the pipeline that looks at rows — preparation (normalisation, exact and near
deduplication, decontamination), tokenizer training, packing for training and evaluation — reads
them with :func:`read_rows` and takes their text from :attr:`Row.text`, so all of them see the
same text for the same row: ``{"prompt": "2+2=", "completion": "4"}`` is ``"2+2=4"`` everywhere.

A row is a JSON object (a JSONL line, or a Parquet record) holding the string fields of its role;
other fields are ignored and never reach a prepared shard:

========== ================================== =============================================
role       fields                             text
========== ================================== =============================================
pretrain   ``text``                           ``text``
midtrain   ``text``                           ``text``
sft        ``prompt``, ``completion``         ``prompt + completion``
dpo        ``prompt``, ``chosen``,            ``prompt + chosen``, newline,
           ``rejected``                       ``prompt + rejected``
rlvr       ``prompt``, ``answer``             ``prompt + answer``
eval       ``prompt``, ``options``,           ``prompt + answer``
           ``answer`` — or ``prompt``,
           ``answer`` — or ``text``           — or ``text``
========== ================================== =============================================

``options`` (multiple-choice eval items) is the one field that is not a string: a list of 2 to
``MAX_OPTIONS`` strings, each an answer as it would follow the prompt, ``answer`` being exactly
one of them (after normalisation). Its text is the prompt and the right answer, so
decontamination looks for the item as a model would have seen it solved.

A prompt is joined to its answer as it is: the separator, if any, is the data's (``"Q: …\\nA:"``
then ``" 4"``). JSONL is split on ``\\n`` only — never ``str.splitlines``, which also splits on
U+2028 and other characters that may stand inside a JSON string. A Parquet file is recognised by
its magic bytes, whatever its name. A row that does not fit its role is refused with
``data_invalid`` naming the data, the line (JSONL) or row (Parquet), and the field.
"""

from __future__ import annotations

import json
import unicodedata
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Literal

from ito.core.errors import ItoError

__all__ = [
    "MAX_OPTIONS",
    "ROLE_SHAPES",
    "Row",
    "data_format",
    "normalise_text",
    "read_rows",
    "row_from_mapping",
    "rows_to_jsonl",
]

ROLE_SHAPES: dict[str, tuple[tuple[str, ...], ...]] = {
    "pretrain": (("text",),),
    "midtrain": (("text",),),
    "sft": (("prompt", "completion"),),
    "dpo": (("prompt", "chosen", "rejected"),),
    "rlvr": (("prompt", "answer"),),
    "eval": (("prompt", "answer", "options"), ("prompt", "answer"), ("text",)),
}
"""The field sets a row of each role may have. A row takes the first shape all of whose fields
it holds; else the first whose first field it holds (an eval row with a ``prompt`` is an item,
multiple-choice with ``options``), else the first shape."""
MAX_OPTIONS = 26
"""Options a multiple-choice item may have at most."""

_PROMPTS = frozenset({"prompt"})
_RESPONSES = frozenset({"completion", "chosen", "rejected", "answer"})

DataFormat = Literal["jsonl", "parquet"]
_PARQUET_MAGIC = b"PAR1"


def normalise_text(text: str, *, keep_start: bool = False, keep_end: bool = False) -> str:
    """Unicode NFKC, every run of whitespace collapsed to one space, stripped — except at the
    start (``keep_start``) or end (``keep_end``), where one space is kept if there was any, so
    that a prompt and its answer join as the data meant (``"A:" + " 4"``)."""
    text = unicodedata.normalize("NFKC", text)
    core = " ".join(text.split())
    if not core:
        return " " if (keep_start or keep_end) and text else ""
    if keep_start and text[:1].isspace():
        core = " " + core
    if keep_end and text[-1:].isspace():
        core = core + " "
    return core


@dataclass(frozen=True)
class Row:
    """One row of one data role: exactly the fields its role defines, each a string."""

    role: str
    fields: tuple[tuple[str, str], ...]
    """(field, value) of its string fields, in the order of :data:`ROLE_SHAPES`."""
    options: tuple[str, ...] = ()
    """A multiple-choice eval item's options (one of them its ``answer``); else empty."""

    def get(self, name: str) -> str:
        for key, value in self.fields:
            if key == name:
                return value
        raise KeyError(name)

    @property
    def sequences(self) -> tuple[str, ...]:
        """The texts this row trains or evaluates on: one, or two for a DPO pair."""
        names = [k for k, _ in self.fields]
        if names == ["text"]:
            return (self.get("text"),)
        prompt = self.get("prompt")
        return tuple(prompt + value for key, value in self.fields if key != "prompt")

    @property
    def text(self) -> str:
        """The row's text: what deduplication, decontamination, the tokenizer, training and
        evaluation all see (a DPO pair's two sequences joined by a newline)."""
        return "\n".join(self.sequences)

    @property
    def is_blank(self) -> bool:
        """Whether any of its fields is empty or only whitespace (it contributes nothing
        whole: an SFT row with no completion trains no answer)."""
        return any(not value.strip() for _, value in self.fields) or any(
            not option.strip() for option in self.options
        )

    def normalised(self) -> Row:
        """Each field normalised (:func:`normalise_text`): a prompt keeps one space at its end,
        an answer one at its start, where the data has whitespace there."""
        return Row(
            self.role,
            tuple(
                (
                    key,
                    normalise_text(value, keep_end=key in _PROMPTS, keep_start=key in _RESPONSES),
                )
                for key, value in self.fields
            ),
            tuple(normalise_text(option, keep_start=True) for option in self.options),
        )

    def to_dict(self) -> dict[str, str | list[str]]:
        found: dict[str, str | list[str]] = dict(self.fields)
        if self.options:
            found["options"] = list(self.options)
        return found

    def to_json(self) -> str:
        """Canonical JSON: sorted keys, no ASCII escaping, one line."""
        return json.dumps(self.to_dict(), sort_keys=True, ensure_ascii=False)


def _invalid(data_id: str, where: dict[str, int], reason: str, why: str, **extra: Any) -> ItoError:
    ((unit, number),) = where.items()
    return ItoError(
        "data_invalid",
        f"data {data_id!r} {unit} {number}: {why}",
        data_id=data_id,
        reason=reason,
        **where,
        **extra,
    )


def row_from_mapping(value: object, role: str, *, data_id: str, where: dict[str, int]) -> Row:
    """The :class:`Row` of ``role`` in a decoded JSON object or Parquet record, or
    ``data_invalid``. ``where`` is ``{"line": n}`` or ``{"row": n}`` (1-based)."""
    if not isinstance(value, Mapping):
        raise _invalid(data_id, where, "not_object", "not a JSON object")
    shapes = ROLE_SHAPES[role]
    shape = next(
        (s for s in shapes if all(value.get(f) is not None for f in s)),
        next((s for s in shapes if value.get(s[0]) is not None), shapes[0]),
    )
    fields = []
    options: tuple[str, ...] = ()
    for name in shape:
        field_value = value.get(name)
        if field_value is None:
            expected = " or ".join("+".join(s) for s in shapes)
            raise _invalid(
                data_id,
                where,
                "missing_field",
                f"no {name!r} field (a {role} row holds {expected})",
                field=name,
            )
        if name == "options":
            options = _options(field_value, data_id, where)
            continue
        if not isinstance(field_value, str):
            raise _invalid(data_id, where, "wrong_type", f"{name!r} is not a string", field=name)
        fields.append((name, field_value))
    row = Row(role, tuple(fields), options)
    if options:
        answer = normalise_text(row.get("answer"), keep_start=True)
        if answer not in {normalise_text(o, keep_start=True) for o in options}:
            raise _invalid(
                data_id,
                where,
                "answer_not_an_option",
                "'answer' is none of 'options'",
                field="answer",
            )
    return row


def _options(value: object, data_id: str, where: dict[str, int]) -> tuple[str, ...]:
    if (
        not isinstance(value, list | tuple)
        or not 2 <= len(value) <= MAX_OPTIONS
        or not all(isinstance(o, str) for o in value)
    ):
        raise _invalid(
            data_id,
            where,
            "wrong_type",
            f"'options' is not a list of 2 to {MAX_OPTIONS} strings",
            field="options",
        )
    return tuple(value)


def data_format(raw: bytes) -> DataFormat:
    """``parquet`` for bytes framed by Parquet's magic number, else ``jsonl``."""
    if len(raw) >= 8 and raw[:4] == _PARQUET_MAGIC and raw[-4:] == _PARQUET_MAGIC:
        return "parquet"
    return "jsonl"


def read_rows(raw: bytes, role: str, *, data_id: str) -> list[Row]:
    """Every row of a JSONL or Parquet file, in file order (blank JSONL lines skipped)."""
    if role not in ROLE_SHAPES:
        raise ValueError(f"unknown data role {role!r}")
    if data_format(raw) == "parquet":
        return _parquet_rows(raw, role, data_id)
    return list(_jsonl_rows(raw, role, data_id))


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


def _jsonl_rows(raw: bytes, role: str, data_id: str) -> Iterable[Row]:
    # b"\n" only: U+2028, U+0085 or a form feed inside a JSON string is part of the string.
    for number, line in enumerate(raw.split(b"\n"), start=1):
        if not line.strip():
            continue
        where = {"line": number}
        try:
            text = line.decode("utf-8")
        except UnicodeDecodeError:
            raise _invalid(data_id, where, "not_utf8", "not UTF-8") from None
        try:
            value = json.loads(text, parse_constant=_no_constant)
        except ValueError:
            raise _invalid(data_id, where, "not_json", "not a JSON value") from None
        yield row_from_mapping(value, role, data_id=data_id, where=where)


def _parquet_rows(raw: bytes, role: str, data_id: str) -> list[Row]:
    import pyarrow as pa
    import pyarrow.parquet as pq

    try:
        table = pq.read_table(pa.BufferReader(raw))
    except (pa.ArrowException, OSError, ValueError):
        raise ItoError(
            "data_invalid",
            f"data {data_id!r} is not a readable Parquet file",
            data_id=data_id,
            reason="not_parquet",
        ) from None
    wanted = {name for shape in ROLE_SHAPES[role] for name in shape}
    columns = [name for name in table.column_names if name in wanted]
    records = table.select(columns).to_pylist()
    return [
        row_from_mapping(record, role, data_id=data_id, where={"row": number})
        for number, record in enumerate(records, start=1)
    ]


def rows_to_jsonl(rows: Iterable[Row]) -> bytes:
    """Rows as canonical JSONL, one ``\\n``-terminated line each (a prepared shard)."""
    return b"".join(row.to_json().encode() + b"\n" for row in rows)
