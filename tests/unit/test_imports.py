"""The import graph of `jetstream/`: no cycles, and the layers point one way.

The graph is read from the source with `ast` (nothing is imported), and it counts every
import, those under `if TYPE_CHECKING:` too: a cycle hidden from the interpreter is still
two modules that cannot be understood, tested or moved one without the other.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "jetstream"

#: Pure layers and what they must never import (first-party packages or third-party roots).
FORBIDDEN: dict[str, frozenset[str]] = {
    "jetstream.stream": frozenset({
        "jetstream.server", "jetstream.client", "jetstream.raft_meta", "jetstream.isr",
        "jetstream.compaction", "jetstream.cli", "jetstream.cli_client",
        "asyncio", "nats", "pysyncobj", "fastapi", "uvicorn", "lmdb",
    }),
    "jetstream.protocol": frozenset({
        "jetstream.server", "jetstream.client", "jetstream.raft_meta", "jetstream.cli",
        "jetstream.cli_client", "asyncio", "nats", "pysyncobj", "fastapi", "uvicorn",
    }),
    "jetstream.isr": frozenset({
        "jetstream.server", "jetstream.client", "jetstream.raft_meta", "jetstream.cli",
        "jetstream.cli_client", "nats", "pysyncobj", "fastapi", "uvicorn",
    }),
    "jetstream.raft_meta": frozenset({
        "jetstream.server", "jetstream.client", "jetstream.cli", "jetstream.cli_client",
        "nats", "fastapi", "uvicorn",
    }),
    "jetstream.client": frozenset({
        "jetstream.server", "jetstream.raft_meta", "jetstream.cli", "jetstream.cli_client",
        "pysyncobj", "fastapi", "uvicorn", "lmdb",
    }),
    "jetstream.offsets": frozenset({
        "jetstream.server", "jetstream.client", "jetstream.raft_meta", "jetstream.stream",
        "jetstream.cli", "jetstream.cli_client", "asyncio", "nats", "pysyncobj", "fastapi",
        "uvicorn", "lmdb",
    }),
    # The guard is pure; its replay reads a Log (jetstream.stream) and nothing else.
    "jetstream.idempotence": frozenset({
        "jetstream.server", "jetstream.client", "jetstream.raft_meta", "jetstream.isr",
        "jetstream.compaction", "jetstream.cli", "jetstream.cli_client", "asyncio", "nats",
        "pysyncobj", "fastapi", "uvicorn", "lmdb", "time",
    }),
    "jetstream.server": frozenset({"jetstream.cli", "jetstream.cli_client"}),
    # The scheduler's heap of due times: no IO, no clock (its shell is server.scheduler).
    "jetstream.server.schedule": frozenset({
        "jetstream.stream", "jetstream.isr", "jetstream.client", "jetstream.raft_meta",
        "asyncio", "nats", "pysyncobj", "fastapi", "uvicorn", "lmdb", "time", "os",
    }),
    # Bytes in, Arrow out: no files, no network (jetstream.spark.segment_reader does IO).
    "jetstream.spark.arrow_decode": frozenset({
        "jetstream.server", "jetstream.client", "jetstream.raft_meta", "jetstream.isr",
        "jetstream.compaction", "jetstream.cli", "jetstream.cli_client",
        "jetstream.spark.segment_reader", "asyncio", "nats", "pysyncobj", "fastapi",
        "uvicorn", "lmdb", "fsspec", "pyspark", "os", "io", "pathlib",
    }),
}


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def all_modules() -> dict[str, Path]:
    return {module_name(p): p for p in sorted(PACKAGE.rglob("*.py"))}


def imported_names(path: Path, name: str) -> Iterator[str]:
    """Every module name `path` imports, absolute (relative imports resolved)."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield alias.name
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[:len(base) - node.level + 1]
                prefix = ".".join([*base, node.module] if node.module else base)
            else:
                assert node.module is not None
                prefix = node.module
            yield prefix
            for alias in node.names:  # `from jetstream.x import y` may import module x.y
                yield f"{prefix}.{alias.name}"


def graph() -> dict[str, set[str]]:
    modules = all_modules()
    edges: dict[str, set[str]] = {}
    for name, path in modules.items():
        targets = {t for t in imported_names(path, name) if t in modules and t != name}
        # Importing jetstream.a.b runs jetstream/__init__ too, but the package's own lazy
        # namespace is not a dependency of its modules: only real module edges count.
        targets.discard("jetstream")
        edges[name] = targets
    return edges


def cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for target in sorted(edges[node]):
            if target not in index:
                visit(target)
                low[node] = min(low[node], low[target])
            elif target in on_stack:
                low[node] = min(low[node], index[target])
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

    for node in sorted(edges):
        if node not in index:
            visit(node)
    return found


def test_the_graph_is_read() -> None:
    edges = graph()
    assert "jetstream.server.broker" in edges
    assert "jetstream.stream.format" in edges["jetstream.stream.log"]


def test_no_import_cycles() -> None:
    assert cycles(graph()) == []


def test_the_cycle_finder_finds_cycles() -> None:
    edges = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert cycles(edges) == [["a", "b", "c"]]


@pytest.mark.parametrize("layer", sorted(FORBIDDEN))
def test_layers_point_one_way(layer: str) -> None:
    forbidden = FORBIDDEN[layer]
    offences = [
        f"{name} imports {target}"
        for name, path in all_modules().items()
        if name == layer or name.startswith(layer + ".")
        for target in imported_names(path, name)
        if any(target == banned or target.startswith(banned + ".") for banned in forbidden)
    ]
    assert offences == []
