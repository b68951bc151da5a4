"""The layering the folders promise (CONVENTIONS "Layout"), checked on the source with ``ast``.

* ``ito.core`` imports nothing of ours outside ``ito.core`` and no I/O library;
* ``ito.pipeline`` (the code that runs on training nodes) never imports the server or the client
  side (``ito.server``, ``ito.client``, ``ito.bridge``, ``ito.mcp``);
* ``ito.worker`` never imports the client side either: what both need to reach the API
  (``ito.connection``, ``ito.transport``, ``ito.settings``) lies beside them;
* ``ito.recipes`` (data and manifests a client writes) never imports the engine: what both need
  to know about data (rows, the held-out split, decontamination) is ``ito.data``, which imports
  nothing of ours but ``ito.core``;
* no two modules of ours import each other, directly or round a longer circle;
* a router (``ito.server.routers``) holds no SQL: it imports nothing of SQLAlchemy but the
  ``Session`` type (to annotate what it hands to a service), imports no table class, and calls no
  query method — the services run the SQL.

Every import counts, also one inside a function or under ``TYPE_CHECKING``: a layer boundary is
about what a module knows, not about when it loads it.
"""

from __future__ import annotations

import ast
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[1] / "src"

CORE_IO_DENY = frozenset(
    {
        "os",
        "subprocess",
        "socket",
        "socketserver",
        "ssl",
        "select",
        "selectors",
        "signal",
        "sqlite3",
        "sqlalchemy",
        "alembic",
        "psycopg",
        "psycopg2",
        "httpx",
        "httpcore",
        "requests",
        "urllib3",
        "aiohttp",
        "fastapi",
        "starlette",
        "uvicorn",
        "torch",
        "torchft",
        "transformers",
        "tokenizers",
        "shutil",
        "io",
        "tempfile",
        "glob",
        "fcntl",
        "mmap",
        "asyncio",
        "anyio",
        "threading",
        "multiprocessing",
        "concurrent",
        "urllib.request",
        "http.client",
        "http.server",
        "keyring",
        "logging",
        "pickle",
        "shelve",
        "dbm",
        "webbrowser",
        "ctypes",
        "pty",
        "pathlib",
        "platform",
        "getpass",
        "importlib",
        "sys",
        "time",
        "random",
        "secrets",
        "uuid",
    }
)
"""Modules whose use means I/O, a clock, randomness or process state. ``pathlib`` is denied
whole (its pure half, ``PurePosixPath``, is not needed: core uses ``posixpath``), as are the clock
(``time``) and randomness (``random``, ``secrets``, ``uuid``): core functions take ``now`` and ids
as arguments so they stay deterministic. ``datetime`` is allowed: core does date arithmetic on
values it is given."""

CORE_THIRD_PARTY_ALLOWED = frozenset({"pydantic", "detect_secrets"})
"""The only libraries core may import besides the standard library. ``detect_secrets``: core's
secret scan uses its detector classes, which are compiled regular expressions and entropy
arithmetic over strings given to them (no file, network or process access on import or use)."""

PIPELINE_DENY = ("ito.server", "ito.client", "ito.bridge", "ito.mcp")
WORKER_DENY = ("ito.client", "ito.bridge", "ito.mcp")
RECIPES_DENY = ("ito.pipeline", "ito.worker", "ito.server")
DATA_DENY = (
    "ito.pipeline",
    "ito.worker",
    "ito.server",
    "ito.client",
    "ito.bridge",
    "ito.mcp",
    "ito.recipes",
)

ROUTER_SQLALCHEMY_ALLOWED = frozenset({("sqlalchemy.orm", "Session")})
"""A router may name the ``Session`` type to annotate what it passes to a service."""

ROUTER_QUERY_METHODS = frozenset(
    {
        "execute",
        "scalar",
        "scalars",
        "query",
        "flush",
        "add_all",
        "merge",
        "refresh",
        "bulk_save_objects",
        "bulk_insert_mappings",
        "bulk_update_mappings",
    }
)
"""Calls that run SQL on any receiver; ``add``, ``delete`` and ``get`` also count when called on
something named like a session (they are common names on sets and dicts)."""
ROUTER_SESSION_METHODS = frozenset({"add", "delete", "get"})


@dataclass(frozen=True)
class Import:
    module: str
    """The imported module (``from a import b`` → ``a``), relative imports resolved."""
    name: str | None
    """The imported name for ``from`` imports, else None."""
    line: int


def module_name(path: Path) -> str:
    parts = list(path.relative_to(SRC).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def imports(tree: ast.AST, module: str, is_package: bool) -> Iterator[Import]:
    package = module if is_package else module.rpartition(".")[0]
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield Import(alias.name, None, node.lineno)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[: len(base) - (node.level - 1)]
                target = ".".join([*base, node.module] if node.module else base)
            else:
                target = node.module or ""
            for alias in node.names:
                yield Import(target, alias.name, node.lineno)


def within(module: str, prefix: str) -> bool:
    return module == prefix or module.startswith(prefix + ".")


def core_violations(source: str, module: str, is_package: bool = False) -> list[str]:
    found = []
    for imp in imports(ast.parse(source), module, is_package):
        full = f"{imp.module}.{imp.name}" if imp.name else imp.module
        top = imp.module.split(".")[0]
        if top == "ito":
            if not within(imp.module, "ito.core"):
                found.append(f"{module}:{imp.line} imports {imp.module} (outside ito.core)")
        elif any(within(imp.module, d) or within(full, d) for d in CORE_IO_DENY):
            found.append(f"{module}:{imp.line} imports {full} (I/O library)")
        elif top in CORE_THIRD_PARTY_ALLOWED:
            continue
        elif top not in STDLIB:
            found.append(f"{module}:{imp.line} imports {imp.module} (third party, not allowed)")
    return found


def pipeline_violations(source: str, module: str, is_package: bool = False) -> list[str]:
    return [
        f"{module}:{imp.line} imports {imp.module}"
        for imp in imports(ast.parse(source), module, is_package)
        if any(within(imp.module, d) for d in PIPELINE_DENY)
    ]


def _denied(deny: tuple[str, ...]) -> Callable[[str, str, bool], list[str]]:
    def violations(source: str, module: str, is_package: bool = False) -> list[str]:
        return [
            f"{module}:{imp.line} imports {imp.module}"
            for imp in imports(ast.parse(source), module, is_package)
            if any(within(imp.module, d) for d in deny)
        ]

    return violations


worker_violations = _denied(WORKER_DENY)
recipes_violations = _denied(RECIPES_DENY)
data_violations = _denied(DATA_DENY)


def router_violations(source: str, module: str, is_package: bool = False) -> list[str]:
    tree = ast.parse(source)
    found = []
    for imp in imports(tree, module, is_package):
        if (
            within(imp.module, "sqlalchemy")
            and (imp.module, imp.name) not in ROUTER_SQLALCHEMY_ALLOWED
        ):
            found.append(f"{module}:{imp.line} imports {imp.module}.{imp.name or ''}")
        if within(imp.module, "ito.server.store.tables") and (imp.name or "x")[:1].isupper():
            found.append(f"{module}:{imp.line} imports the table {imp.name}")
        if imp.module == "ito.server.store" and imp.name == "tables":
            found.append(f"{module}:{imp.line} imports the tables module")
    for node in ast.walk(tree):
        if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)):
            continue
        method, receiver = node.func.attr, node.func.value
        named = (
            receiver.id
            if isinstance(receiver, ast.Name)
            else receiver.attr
            if isinstance(receiver, ast.Attribute)
            else ""
        )
        if method in ROUTER_QUERY_METHODS or (
            method in ROUTER_SESSION_METHODS and "session" in named.lower()
        ):
            found.append(f"{module}:{node.lineno} calls .{method}() (SQL belongs in a service)")
    return found


STDLIB = frozenset(__import__("sys").stdlib_module_names) | {"__future__"}


def sources(package: str) -> list[tuple[Path, str]]:
    root = SRC.joinpath(*package.split("."))
    return [(p, module_name(p)) for p in sorted(root.rglob("*.py"))]


def check(package: str, rule: object) -> list[str]:
    assert callable(rule)
    found: list[str] = []
    for path, module in sources(package):
        found += rule(path.read_text(), module, path.name == "__init__.py")
    return found


def test_core_imports_nothing_of_ours_outside_core_and_no_io_library() -> None:
    assert sources("ito.core"), "no core modules found: the test would pass vacuously"
    assert check("ito.core", core_violations) == []


def test_pipeline_never_imports_the_server_or_the_client() -> None:
    assert sources("ito.pipeline")
    assert check("ito.pipeline", pipeline_violations) == []


def test_the_worker_never_imports_the_client_side() -> None:
    assert sources("ito.worker")
    assert check("ito.worker", worker_violations) == []


def test_recipes_never_import_the_engine_and_data_imports_only_core() -> None:
    assert sources("ito.recipes") and sources("ito.data")
    assert check("ito.recipes", recipes_violations) == []
    assert check("ito.data", data_violations) == []


def import_graph() -> dict[str, set[str]]:
    """Each module of ours → the modules of ours it imports (a ``from`` import of a submodule
    counts as that submodule; importing a package counts as its ``__init__``)."""
    paths = {module_name(p): p for p in sorted(SRC.rglob("*.py"))}
    graph: dict[str, set[str]] = {}
    for module, path in paths.items():
        deps = set()
        for imp in imports(ast.parse(path.read_text()), module, path.name == "__init__.py"):
            for candidate in (f"{imp.module}.{imp.name}" if imp.name else "", imp.module):
                if candidate in paths and candidate != module:
                    deps.add(candidate)
                    break
        graph[module] = deps
    return graph


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan, iteratively)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    for root in graph:
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph[child]))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.append(sorted(component))
    return found


def test_no_module_imports_itself_round_a_circle() -> None:
    graph = import_graph()
    assert len(graph) > 100
    assert circles(graph) == []


def test_a_circle_is_found() -> None:
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}, "e": {"e"}}
    assert circles(graph) == [["a", "b", "c"]]


def test_routers_hold_no_sql() -> None:
    assert sources("ito.server.routers")
    assert check("ito.server.routers", router_violations) == []


@pytest.mark.parametrize(
    ("rule", "source"),
    [
        (core_violations, "import os\n"),
        (core_violations, "from pathlib import Path\n"),
        (core_violations, "def f():\n    import subprocess\n"),
        (core_violations, "from ito.server.settings import ServerSettings\n"),
        (core_violations, "from ..server import app\n"),
        (core_violations, "from urllib.request import urlopen\n"),
        (core_violations, "import numpy\n"),
        (pipeline_violations, "from ito.client.transport import ApiClient\n"),
        (pipeline_violations, "import ito.server.app\n"),
        (worker_violations, "def f():\n    from ito.client.config import build\n"),
        (worker_violations, "from ito.mcp import server\n"),
        (recipes_violations, "from ito.pipeline.rows import read_rows\n"),
        (data_violations, "from ito.pipeline.tokenizer import EOS\n"),
        (router_violations, "from sqlalchemy import select\n"),
        (router_violations, "from ito.server.store.tables import Run\n"),
        (router_violations, "def f(session):\n    session.execute('DELETE FROM runs')\n"),
        (router_violations, "def f(session):\n    session.add(object())\n"),
    ],
)
def test_each_rule_catches_a_violation(rule: object, source: str) -> None:
    assert callable(rule)
    assert rule(source, "ito.core.example"), f"not caught: {source!r}"


@pytest.mark.parametrize(
    ("rule", "source"),
    [
        (core_violations, "from ito.core.errors import ItoError\nfrom . import text\nimport re\n"),
        (core_violations, "from pydantic import BaseModel\nfrom urllib.parse import urlsplit\n"),
        (
            router_violations,
            "from sqlalchemy.orm import Session\n"
            "from ito.server.store.tables import utcnow\nseen = set()\nseen.add(1)\n",
        ),
        (worker_violations, "from ito.connection import build\nfrom ito.pipeline import spec\n"),
    ],
)
def test_what_each_rule_allows(rule: object, source: str) -> None:
    assert callable(rule)
    assert rule(source, "ito.core.example") == []
