"""The package's layers, enforced: imports run downward only and no import circle exists.

The import graph comes from grimp (the library behind import-linter): it parses every module,
resolves relative imports and counts imports inside functions and ``if TYPE_CHECKING:`` blocks,
which a runtime check would miss. The policy (which layer sits where) is this file's
``LAYERS``, the same picture as ``docs/architecture.md``.
"""

from __future__ import annotations

from pathlib import Path

import grimp
import pytest

import rollout_checkpoint

PACKAGE = "rollout_checkpoint"

LAYERS: tuple[tuple[str, ...], ...] = (  # top to bottom; names in one tuple must not import each other
    ("cli",),
    ("demo", "integrations"),
    ("server",),
    ("coordinator",),
    ("reader", "retention"),
    ("participants", "registry"),
    ("protocol", "tokens"),
    ("format",),
    ("archive",),
    ("store",),
    ("ids", "telemetry"),
    ("errors", "_lazy", "_runtime"),
)
ROOT_MODULES = {"__init__", "errors", "_lazy"}  # the facade plus base modules; everything else is a package


@pytest.fixture(scope="module")
def graph() -> grimp.ImportGraph:
    return grimp.build_graph(PACKAGE, include_external_packages=False)


def _present(graph: grimp.ImportGraph) -> set[str]:
    return {m.split(".")[1] for m in graph.modules if m.count(".") >= 1}


def test_every_top_level_module_has_a_layer(graph: grimp.ImportGraph) -> None:
    placed = {name for layer in LAYERS for name in layer}
    assert _present(graph) <= placed, f"place these in LAYERS: {sorted(_present(graph) - placed)}"


def test_the_root_holds_only_the_facade_and_base_modules() -> None:
    root = Path(rollout_checkpoint.__file__).parent
    modules = {p.stem for p in root.glob("*.py")}
    assert modules <= ROOT_MODULES, f"move into a package: {sorted(modules - ROOT_MODULES)}"
    assert len(modules - {"__init__"}) + 1 <= 3  # at most three base modules (ids is a package)


def test_imports_run_downward_only(graph: grimp.ImportGraph) -> None:
    present = _present(graph)
    layers = [
        grimp.Layer(*(n for n in layer if n in present), independent=True)
        for layer in LAYERS
        if any(n in present for n in layer)
    ]
    illegal = graph.find_illegal_dependencies_for_layers(layers=layers, containers={PACKAGE})
    report = [
        f"{dep.importer} -> {dep.imported}: " + "; ".join(" -> ".join(_route(route)) for route in dep.routes)
        for dep in sorted(illegal, key=lambda d: (d.importer, d.imported))
    ]
    assert not report, "upward or sideways imports:\n" + "\n".join(report)


def _route(route: grimp.Route) -> list[str]:
    return [f"{'|'.join(sorted(route.heads))}", *route.middle, "|".join(sorted(route.tails))]


def test_no_import_circle(graph: grimp.ImportGraph) -> None:
    edges = {m: graph.find_modules_directly_imported_by(m) - {PACKAGE} for m in graph.modules}
    cycles = _strongly_connected(edges)
    assert not cycles, "import circles:\n" + "\n".join(" <-> ".join(sorted(c)) for c in cycles)


def _strongly_connected(edges: dict[str, set[str]]) -> list[set[str]]:
    """Tarjan's algorithm, iterative; returns the components with more than one module."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    on_stack: set[str] = set()
    stack: list[str] = []
    found: list[set[str]] = []
    counter = 0
    for start in sorted(edges):
        if start in index:
            continue
        work = [(start, iter(sorted(edges[start])))]
        index[start] = low[start] = counter
        counter += 1
        stack.append(start)
        on_stack.add(start)
        while work:
            node, children = work[-1]
            advanced = False
            for child in children:
                if child not in edges:
                    continue
                if child not in index:
                    index[child] = low[child] = counter
                    counter += 1
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(edges[child]))))
                    advanced = True
                    break
                if child in on_stack:
                    low[node] = min(low[node], index[child])
            if advanced:
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = set()
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.add(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.append(component)
    return found


def test_the_checker_catches_a_circle_and_an_upward_import() -> None:
    """The two checks above are not vacuous: a made-up graph with both faults fails them."""
    fake = grimp.ImportGraph()
    for module in (PACKAGE, f"{PACKAGE}.store", f"{PACKAGE}.store.a", f"{PACKAGE}.store.b", f"{PACKAGE}.cli"):
        fake.add_module(module)
    fake.add_import(importer=f"{PACKAGE}.store.a", imported=f"{PACKAGE}.store.b")
    fake.add_import(importer=f"{PACKAGE}.store.b", imported=f"{PACKAGE}.store.a")
    fake.add_import(importer=f"{PACKAGE}.store.a", imported=f"{PACKAGE}.cli")
    edges = {m: fake.find_modules_directly_imported_by(m) for m in fake.modules}
    assert _strongly_connected(edges) == [{f"{PACKAGE}.store.a", f"{PACKAGE}.store.b"}]
    illegal = fake.find_illegal_dependencies_for_layers(
        layers=[grimp.Layer("cli"), grimp.Layer("store")], containers={PACKAGE}
    )
    assert {(d.importer, d.imported) for d in illegal} == {(f"{PACKAGE}.store", f"{PACKAGE}.cli")}
