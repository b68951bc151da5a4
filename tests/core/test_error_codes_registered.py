"""Every error code any module of ``src/ito`` can emit is in the one registry
(:mod:`ito.core.errors`) — scanned from the source with ``ast``, so a code added anywhere
without registering it fails here (issue 12, item 2).

A string counts as an emitted code where it is

* the code argument of :class:`~ito.core.errors.ItoError` or a subclass (first positional
  argument or ``code=``), or of the supervisor's ``Outcome`` (its second field);
* the value of a keyword argument, an assignment target or a dict key named ``code``,
  ``failure_code``, ``stop_code`` or ``error_code`` (events, worker outcomes, stop answers);
* compared with such a name (``refusal.code != "manifest_not_found"``): a code a module
  reacts to must exist too.

Only string constants count (directly, or as either branch of a conditional expression): a code
computed at run time comes from one of these or from the registry itself.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path
from typing import get_args

import pytest

from ito.core.errors import REGISTRY, ErrorCode, ItoError

SRC = Path(__file__).resolve().parents[2] / "src" / "ito"
CODE_NAMES = frozenset({"code", "failure_code", "stop_code", "error_code"})
POSITIONAL_CODE = {"ItoError": 0, "TransportFailure": 0, "Outcome": 1}
"""Callables that take a code positionally, and its position."""
NOT_ERRORS: dict[str, str] = {}
"""Codes in the source that are not errors (warnings), with why."""


def _strings(node: ast.AST | None) -> Iterator[str]:
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        yield node.value
    elif isinstance(node, ast.IfExp):
        yield from _strings(node.body)
        yield from _strings(node.orelse)


def _name(node: ast.AST) -> str | None:
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        return node.attr
    if isinstance(node, ast.Subscript):
        return next(_strings(node.slice), None)
    return None


def _emitted(tree: ast.AST) -> Iterator[tuple[str, int]]:
    for node in ast.walk(tree):
        if isinstance(node, ast.Call):
            callee = _name(node.func)
            position = POSITIONAL_CODE.get(callee or "")
            if position is not None and len(node.args) > position:
                for code in _strings(node.args[position]):
                    yield code, node.lineno
            for keyword in node.keywords:
                if keyword.arg in CODE_NAMES:
                    for code in _strings(keyword.value):
                        yield code, node.lineno
        elif isinstance(node, ast.Assign | ast.AnnAssign):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            for target in targets:
                if isinstance(target, ast.Tuple) and isinstance(node.value, ast.Tuple):
                    pairs = list(zip(target.elts, node.value.elts, strict=False))
                else:
                    pairs = [(target, node.value)] if node.value is not None else []
                for named, value in pairs:
                    if _name(named) in CODE_NAMES:
                        for code in _strings(value):
                            yield code, node.lineno
        elif isinstance(node, ast.Dict):
            for key, value in zip(node.keys, node.values, strict=True):
                if key is not None and next(_strings(key), None) in CODE_NAMES:
                    for code in _strings(value):
                        yield code, node.lineno
        elif isinstance(node, ast.Compare):
            sides = [node.left, *node.comparators]
            if any(_name(side) in CODE_NAMES for side in sides):
                for side in sides:
                    for code in _strings(side):
                        yield code, node.lineno


def _scan() -> dict[str, list[str]]:
    found: dict[str, list[str]] = {}
    for path in sorted(SRC.rglob("*.py")):
        for code, line in _emitted(ast.parse(path.read_text(), str(path))):
            found.setdefault(code, []).append(f"{path.relative_to(SRC.parent)}:{line}")
    return found


def test_every_code_a_module_emits_is_registered() -> None:
    unregistered = {
        code: where for code, where in _scan().items() if code not in REGISTRY | NOT_ERRORS
    }
    assert unregistered == {}


def test_the_scan_sees_the_supervisors_failure_codes_and_the_bridges_refusals() -> None:
    found = _scan()
    for code in ("eval_gate_failed", "pipeline_crashed", "capability_unavailable", "lease_lost"):
        assert code in found, code


def test_the_scan_catches_an_unregistered_code_in_each_form() -> None:
    source = """
ItoError("not_a_code_1", "m")
Outcome("failed", "not_a_code_2", "m")
DoneEvent(status="failed", code="not_a_code_3")
stop_code = "not_a_code_4"
{"failure_code": "not_a_code_5" if x else "not_a_code_6"}
if refusal.code == "not_a_code_7": pass
"""
    codes = {code for code, _ in _emitted(ast.parse(source))}
    assert codes == {f"not_a_code_{n}" for n in range(1, 8)}


def test_the_typed_codes_are_exactly_the_registry() -> None:
    assert set(get_args(ErrorCode)) == set(REGISTRY)


def test_an_unregistered_code_is_refused_at_construction() -> None:
    with pytest.raises(AssertionError):
        ItoError("no_such_code")  # type: ignore[arg-type]


def test_no_allowlisted_code_shadows_a_registered_one() -> None:
    assert not set(NOT_ERRORS) & set(REGISTRY)
