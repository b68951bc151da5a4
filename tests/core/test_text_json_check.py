"""``json_text_may_be_unsafe`` never answers False for JSON text that holds a refused string."""

from __future__ import annotations

import json

from hypothesis import given, settings
from hypothesis import strategies as st

from ito.core.text import json_text_may_be_unsafe, unsafe_json_paths

_CHARS = st.sampled_from(
    [
        "a",
        "u",
        "0",
        "\\",
        '"',
        "/",
        "\x00",
        "\t",
        "\n",
        "\b",
        "\x0c",
        "\x1f",
        "\x7f",
        "\x85",
        "\u202e",
        "\u2066",
        "\ud800",
        "\u00e9",
    ]
)
_TEXT = st.lists(_CHARS, max_size=10).map("".join)


@settings(max_examples=400, deadline=None)
@given(_TEXT, st.booleans())
def test_never_misses_a_refused_string(text: str, ascii_only: bool) -> None:
    raw = json.dumps({text: [text, {"k": text}]}, ensure_ascii=ascii_only)
    if unsafe_json_paths(json.loads(raw)):
        assert json_text_may_be_unsafe(raw)


def test_escaped_backslashes_are_not_escapes() -> None:
    assert not json_text_may_be_unsafe(r'{"k": "\\u0000 \\b \\f \\\\u202e"}')
    assert json_text_may_be_unsafe(r'{"k": "\\\u0000"}')
    assert json_text_may_be_unsafe(r'{"k": "\b"}')
    assert json_text_may_be_unsafe('{"k": "\x7f"}')
    assert json_text_may_be_unsafe('{"k": "é\u202e"}')
    assert not json_text_may_be_unsafe('{"k": "é\\n\\t\\u0041\\u00e9"}')
