"""The house's layout, pinned: which package may import which (docs/architecture.md).

The graph counts module-level imports only (what runs when a module loads): imports under
``if TYPE_CHECKING:`` and inside functions are deliberate late bindings and are left out of
the circle check (but for the driver, which has none that close one), not out of the layer
checks, which read every import.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent

#: The driver's wings, lowest first: a wing imports its own modules and the wings below it.
#: ``transfer``, ``interactive`` and ``setup`` are peers at the top and never import each other.
WING_LEVELS = {"core": 0, "commands": 1, "leases": 2, "transfer": 3, "interactive": 3, "setup": 3}
#: The worker's packages apart from the driver, and the packages each must not import.
FORBIDDEN = {
    "provider.rpc": ("provider.createos", "provider.driver", "provider.emulator"),
    "provider.createos": ("provider.rpc", "provider.driver", "provider.emulator"),
    "provider.emulator": (
        "provider.rpc",
        "provider.driver",
        "provider.createos",
        "provider.config",
        "provider.errors",
        "provider.doctor",
        "provider.shell",
    ),
}
#: The only worker modules that import httpx (the HTTP client and its error translation).
HTTPX_MODULES = {"provider.createos.core", "provider.createos.errors", "provider.createos.pool"}
WORKER_PACKAGES = ("provider.rpc", "provider.driver", "provider.createos")


@dataclass
class Module:
    name: str
    path: Path
    eager: set[str] = field(default_factory=set)  # module-level imports
    every: set[str] = field(default_factory=set)  # every import, late ones included
    external: set[str] = field(default_factory=set)  # top-level names of outside packages


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _walk(body: list[ast.stmt], late: bool) -> Iterator[tuple[ast.AST, bool]]:
    for node in body:
        deferred = isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef) or (
            isinstance(node, ast.If) and "TYPE_CHECKING" in ast.dump(node.test)
        )
        yield from ((child, late or deferred) for child in ast.walk(node))


def load_modules(package: str = "provider") -> dict[str, Module]:
    """Every module of the top-level ``package`` and its imports of that package's modules."""
    found = (ROOT / package).rglob("*.py")
    modules = {_module_name(p): Module(_module_name(p), p) for p in found}
    for module in modules.values():
        home = module.name if module.path.name == "__init__.py" else module.name.rpartition(".")[0]
        for node, late in _walk(ast.parse(module.path.read_text()).body, late=False):
            targets: list[str] = []
            if isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    anchor = home.split(".")[: len(home.split(".")) - node.level + 1]
                    base = ".".join([*anchor, base] if base else anchor)
                submodules = [f"{base}.{alias.name}" for alias in node.names]
                targets = [t for t in submodules if t in modules] or [base]
            for target in targets:
                if target.partition(".")[0] != package:
                    module.external.add(target.partition(".")[0])
                    continue
                while target not in modules and "." in target:
                    target = target.rpartition(".")[0]
                if target in modules and target != module.name:
                    module.every.add(target)
                    if not late:
                        module.eager.add(target)
    return modules


MODULES = load_modules()


def wing_of(name: str) -> str | None:
    parts = name.split(".")
    if len(parts) >= 3 and parts[:2] == ["provider", "driver"] and parts[2] in WING_LEVELS:
        return parts[2]
    return None


def test_every_driver_module_but_the_verb_edge_lives_in_a_wing() -> None:
    loose = sorted(m for m in MODULES if m.startswith("provider.driver.") and wing_of(m) is None)
    # The verb edge: the lazy method table, the service, the verb table and the context its
    # handlers share (the leased call joins leases and interactive, so it sits above them).
    assert loose == [
        "provider.driver.context",
        "provider.driver.methods",
        "provider.driver.service",
        "provider.driver.verb_table",
    ], "a new driver module belongs in a wing (docs/architecture.md, 'The driver's wings')"


@pytest.mark.parametrize("name", sorted(m for m in MODULES if wing_of(m) is not None))
def test_a_wing_imports_only_itself_and_the_wings_below(name: str) -> None:
    wing = wing_of(name)
    assert wing is not None
    for target in MODULES[name].every:
        if not target.startswith("provider.driver"):
            continue
        other = wing_of(target)
        assert other is not None, f"{name} imports {target}, the verb edge above every wing"
        assert other == wing or WING_LEVELS[other] < WING_LEVELS[wing], (
            f"{name} ({wing}) imports {target} ({other}): wings import only downward"
        )


@pytest.mark.parametrize("package", sorted(FORBIDDEN))
def test_the_layers_do_not_reach_across(package: str) -> None:
    crossing = sorted(
        f"{name} -> {target}"
        for name, module in MODULES.items()
        if name == package or name.startswith(package + ".")
        for target in module.every
        if any(target == f or target.startswith(f + ".") for f in FORBIDDEN[package])
    )
    assert crossing == []


def test_only_the_createos_client_touches_httpx() -> None:
    users = {
        name
        for name, module in MODULES.items()
        if name.startswith(WORKER_PACKAGES) and "httpx" in module.external
    }
    assert users == HTTPX_MODULES


def _circles(edges: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    for root in sorted(edges):
        if root in index:
            continue
        work = [(root, iter(sorted(edges[root])))]
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
                    work.append((child, iter(sorted(edges[child]))))
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


def test_no_import_circles() -> None:
    eager = {name: {t for t in m.eager if t != "provider"} for name, m in MODULES.items()}
    assert _circles(eager) == []
    # Inside the driver not even a late import closes a circle: shared types live below.
    driver = {
        name: {t for t in m.every if t.startswith("provider.driver.")}
        for name, m in MODULES.items()
        if name.startswith("provider.driver.")
    }
    assert _circles(driver) == []


def test_the_circle_finder_finds_a_circle() -> None:
    assert _circles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def test_the_loader_sees_imports() -> None:
    """The checks above are only as good as the graph: known arrows must be in it (a loader that
    saw no import at all would pass every layer rule)."""
    assert "provider.driver.context" in MODULES["provider.driver.service"].eager
    assert "provider.driver.commands.streamed" in MODULES["provider.driver.commands.execute"].every
    assert "provider.createos.core" in MODULES["provider.createos.sandboxes"].eager
    assert "httpx" in MODULES["provider.createos.core"].external
    assert "provider" not in MODULES["provider.createos.core"].external
