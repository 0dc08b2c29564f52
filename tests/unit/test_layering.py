"""The house: rooms in layers, every import pointing down, no cycle between modules.

The layers are read from docs/architecture.md (the block under "Who may import whom"),
so the document and this test cannot disagree: a module may import its own room, the
rooms of lower layers, `telemetry` and the root modules (`rdurack`, `rdurack.errors`,
`rdurack.config`). Imports under `TYPE_CHECKING` and inside functions count too.
"""

from __future__ import annotations

import ast
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
ROOT = REPO / "rdurack"
ARCHITECTURE = REPO / "docs" / "architecture.md"
GENERATED = "rdurack.v1"
BASE = frozenset({"rdurack", "rdurack.errors", "rdurack.config"})
EVERYONE = "telemetry"  # any room may open spans or count metrics

# Pure rooms: the hardware model, the workloads and the orchestrator's core run in the
# predictor and in tests without Ray, gRPC or generated code, and open spans through the
# OpenTelemetry API only (the SDK is set up by the processes).
IMPURE = ("grpc", "ray", GENERATED, "opentelemetry.sdk")
PURE = ("rack", "workloads", "orchestrator", "security")
PURE_ALLOWS = {"security": ("grpc",)}  # TLS and tokens are gRPC credentials


def _layers() -> list[set[str]]:
    """The rooms of each layer, from the top down, as docs/architecture.md draws them."""
    text = ARCHITECTURE.read_text(encoding="utf-8")
    block = re.search(r"## Who may import whom.*?```text\n(.*?)```", text, re.S)
    assert block, f"{ARCHITECTURE}: no ```text block under '## Who may import whom'"
    layers = []
    for line in block.group(1).splitlines():
        rooms = line.split("#")[0].split()
        if rooms:
            layers.append({r.rstrip("/") for r in rooms})
    return layers


def _module(path: Path) -> str:
    parts = list(path.relative_to(REPO).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _sources() -> dict[str, Path]:
    return {
        _module(p): p for p in sorted(ROOT.rglob("*.py")) if p.relative_to(ROOT).parts[0] != "v1"
    }


def _imported(module: str, path: Path, known: set[str]) -> Iterator[str]:
    """Every module `module` imports, TYPE_CHECKING and function-level imports included;
    `from package import name` counts as importing package.name when that is a module."""
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
        if isinstance(node, ast.Import):
            yield from (a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*anchor, base] if base else anchor)
            for a in node.names:
                yield f"{base}.{a.name}" if f"{base}.{a.name}" in known else base


def _room(module: str) -> str:
    """The room of an rdurack module: its first package under rdurack, or the module."""
    return module if module in BASE else module.split(".")[1]


@pytest.fixture(scope="module")
def graph() -> dict[str, set[str]]:
    """Each rdurack module and the rdurack modules it imports."""
    sources = _sources()
    return {
        m: {i for i in _imported(m, p, set(sources)) if i.startswith("rdurack")}
        for m, p in sources.items()
    }


def test_every_room_is_in_a_layer(graph: dict[str, set[str]]) -> None:
    placed = set().union(*_layers())
    rooms = {_room(m) for m in graph if m not in BASE}
    assert rooms - placed == set(), "rooms docs/architecture.md does not place"
    assert placed - rooms - {EVERYONE} == set(), "docs/architecture.md places rooms that are gone"


def upward(graph: dict[str, set[str]], layers: list[set[str]]) -> list[str]:
    """The imports that do not point down the layers (own room, telemetry and the root
    modules aside)."""
    level = {room: len(layers) - i for i, rooms in enumerate(layers) for room in rooms}
    bad = []
    for module, imports in graph.items():
        if module in BASE:
            bad += [f"{module} -> {i}" for i in imports if i not in BASE]
            continue
        room = _room(module)
        for i in imports:
            if i in BASE or i.startswith(GENERATED):
                continue
            other = _room(i)
            if other == room or (other == EVERYONE and room != EVERYONE):
                continue
            if room == EVERYONE or level[other] >= level[room]:
                bad.append(f"{module} -> {i}  ({room} may not import {other})")
    return sorted(bad)


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Tarjan's strongly connected components of a module graph that are cycles: more
    than one module, or one that imports itself."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph[v] & graph.keys()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1 or v in graph[v]:
                found.append(sorted(component))

    sys.setrecursionlimit(max(sys.getrecursionlimit(), 10 * len(graph)))
    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def test_every_import_points_down_the_layers(graph: dict[str, set[str]]) -> None:
    bad = upward(graph, _layers())
    assert not bad, "\n".join(bad)


def test_no_import_cycle_between_modules(graph: dict[str, set[str]]) -> None:
    found = cycles(graph)
    assert not found, "import cycles:\n" + "\n".join(" <-> ".join(c) for c in found)


def test_the_checks_see_an_upward_arrow_and_a_cycle(graph: dict[str, set[str]]) -> None:
    """The checks above pass on an empty graph too: show them failing on a bad one, and
    that the graph holds the imports the code has."""
    layers = [{"cli"}, {"orchestrator"}, {"rack"}]
    bad = {
        "rdurack.rack.spec": {"rdurack.errors", "rdurack.orchestrator.jobs"},
        "rdurack.orchestrator.jobs": {"rdurack.rack.spec", "rdurack.telemetry.names"},
        "rdurack.cli.main": {"rdurack.orchestrator.jobs", "rdurack.rack.spec"},
    }
    assert upward(bad, layers) == [
        "rdurack.rack.spec -> rdurack.orchestrator.jobs  (rack may not import orchestrator)"
    ]
    assert cycles(bad) == [["rdurack.orchestrator.jobs", "rdurack.rack.spec"]]
    assert "rdurack.rack.spec" in graph["rdurack.rack.presets"]
    assert "rdurack.errors" in graph["rdurack.rack.memory"]


@pytest.mark.parametrize("room", PURE)
def test_pure_rooms_import_no_grpc_ray_or_generated_code(room: str) -> None:
    allowed = PURE_ALLOWS.get(room, ())
    bad = [
        f"{module} imports {name}"
        for module, path in _sources().items()
        if module.startswith(f"rdurack.{room}")
        for name in sorted(set(_imported(module, path, set())))
        if any(name == f or name.startswith(f + ".") for f in IMPURE if f not in allowed)
    ]
    assert not bad, "\n".join(bad)


def test_importing_the_predictor_loads_no_grpc_or_ray() -> None:
    code = (
        "import sys, rdurack.workloads.paper, rdurack.rack.whatif;"
        "bad = sorted(m for m in sys.modules if m.split('.')[0] in ('grpc', 'ray'));"
        "print(bad); sys.exit(1 if bad else 0)"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert done.returncode == 0, done.stdout + done.stderr
