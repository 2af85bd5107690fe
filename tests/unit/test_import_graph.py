"""The arrows between osmosis's rooms, read from every module's imports (ast, lazy ones too).

Allowed, as `docs/architecture.md` draws them: `cli` → `client` → `wire`; `cli` → `eval`;
`platform` → `eval`, `wire`; `eval` → `rollout`. The SDK (`osmosis.rollout`) imports nothing
of ours above it; the engine knows no client, platform or command line; the client and the
command line see the platform only through its public face (`osmosis.platform`) and the wire
package. No module reaches itself again through its imports.
"""

from __future__ import annotations

import ast
from functools import cache
from pathlib import Path

import pytest

import osmosis

PACKAGE = Path(osmosis.__file__).parent


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


@cache
def modules() -> dict[str, Path]:
    found = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        if "templates" in path.relative_to(PACKAGE).parts[:1]:
            continue  # files copied into users' workspaces, not our modules
        found[_module_name(path)] = path
    return found


def _resolve(module: str, level: int, name: str | None, importer: str, is_package: bool) -> str:
    if level:
        base = importer.split(".")
        if not is_package:
            base = base[:-1]
        base = base[: len(base) - (level - 1)]
        module = ".".join([*base, module] if module else base)
    if name and f"{module}.{name}" in modules():
        return f"{module}.{name}"
    return module


@cache
def imports() -> dict[str, frozenset[str]]:
    graph = {}
    for name, path in modules().items():
        targets = set()
        tree = ast.parse(path.read_text(), str(path))
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                targets.update(alias.name for alias in node.names)
            elif isinstance(node, ast.ImportFrom):
                is_package = path.name == "__init__.py"
                for alias in node.names:
                    targets.add(
                        _resolve(node.module or "", node.level, alias.name, name, is_package)
                    )
        graph[name] = frozenset(t for t in targets if t == "osmosis" or t.startswith("osmosis."))
    return graph


def _cycles(graph: dict[str, frozenset[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for target in graph.get(node, ()):
            if target not in graph:
                continue
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
            if len(component) > 1 or node in graph.get(node, ()):
                found.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


def _in(module: str, room: str) -> bool:
    """`room` and everything under it; a room written with a trailing dot: only what is under it."""
    if room.endswith("."):
        return module.startswith(room)
    return module == room or module.startswith(room + ".")


def _edges(source_room: str, allowed: tuple[str, ...], forbidden: tuple[str, ...]) -> list[str]:
    bad = []
    for module, targets in imports().items():
        if not _in(module, source_room):
            continue
        for target in sorted(targets):
            if any(_in(target, room) for room in forbidden) and not any(
                target == ok or _in(target, ok) for ok in allowed
            ):
                bad.append(f"{module} -> {target}")
    return bad


def test_the_graph_sees_lazy_imports_and_every_room():
    graph = imports()
    assert {"osmosis.eval.engine", "osmosis.platform.app", "osmosis.cli.main"} <= set(graph)
    # `cli.main` builds its command groups lazily, inside a function: those edges count too.
    assert any(_in(t, "osmosis.cli.eval") for t in graph["osmosis.cli.main"])


def test_no_module_reaches_itself_through_its_imports():
    assert _cycles(imports()) == []


@pytest.mark.parametrize(
    ("room", "allowed", "forbidden"),
    [
        # the SDK runs inside rollouts' environments: nothing of ours above it
        ("osmosis.rollout", ("osmosis._version",), ("osmosis",)),
        ("osmosis.eval", (), ("osmosis.client", "osmosis.platform", "osmosis.cli")),
        ("osmosis.wire", (), ("osmosis.client", "osmosis.platform", "osmosis.cli", "osmosis.eval")),
        ("osmosis.client", ("osmosis.wire",), ("osmosis.platform", "osmosis.cli", "osmosis.eval")),
        # the command line may start a server, but only through the platform's public face
        ("osmosis.cli", (), ("osmosis.platform.",)),
    ],
)
def test_imports_point_one_way(room, allowed, forbidden):
    if room == "osmosis.rollout":
        bad = [
            edge
            for edge in _edges(room, allowed, forbidden)
            if not _in(edge.split(" -> ")[1], "osmosis.rollout")
        ]
    else:
        bad = _edges(room, allowed, forbidden)
    assert bad == []


def test_the_cycle_finder_finds_a_circle():
    graph = {"a": frozenset({"b"}), "b": frozenset({"c"}), "c": frozenset({"a"}), "d": frozenset()}
    assert _cycles(graph) == [["a", "b", "c"]]
