"""The three layers keep one direction of dependency, and no module of ``daemon/`` needs
another that needs it back (issue 13): eventlog <- replay <- daemon, read from the imports."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).parents[1]


def imports(package: str) -> dict[str, set[str]]:
    """Module -> the project modules it imports (at any place in the file)."""
    graph: dict[str, set[str]] = {}
    for path in sorted((ROOT / package).rglob("*.py")):
        module = ".".join(path.relative_to(ROOT).with_suffix("").parts).removesuffix(".__init__")
        found: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                names = [node.module, *(f"{node.module}.{a.name}" for a in node.names)]
            elif isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            else:
                continue
            found |= {n for n in names if n.split(".")[0] in ("daemon", "eventlog", "replay")}
        graph[module] = found - {module}
    return graph


def test_layers_depend_one_way() -> None:
    for package, forbidden in (("eventlog", ("replay", "daemon")), ("replay", ("daemon",))):
        for module, deps in imports(package).items():
            bad = sorted(d for d in deps if d.split(".")[0] in forbidden)
            assert not bad, f"{module} imports {bad}: {package} must not depend on them"
        assert imports(package), f"no modules found in {package}"


def test_no_import_cycle_in_daemon() -> None:
    graph = imports("daemon")
    modules = set(graph)
    edges = {m: {d for d in deps if d in modules} for m, deps in graph.items()}
    visiting: list[str] = []
    done: set[str] = set()

    def visit(module: str) -> None:
        if module in done:
            return
        assert module not in visiting, f"import cycle: {' -> '.join([*visiting, module])}"
        visiting.append(module)
        for dep in sorted(edges[module]):
            visit(dep)
        visiting.pop()
        done.add(module)

    for module in sorted(modules):
        visit(module)


def test_the_pure_model_never_imports_gc() -> None:
    """The garbage collector is process-wide state: pausing it during a fold is the daemon's
    (daemon/gc_tuning.py, issue 35), never the pure model's."""
    for path in sorted((ROOT / "replay").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ImportFrom) and node.level == 0:
                names = [node.module or ""]
            elif isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            else:
                continue
            bad = [n for n in names if n.split(".")[0] == "gc"]
            assert not bad, f"{path.relative_to(ROOT)} imports gc"


#: The engine's modules, each importing only modules before it (issue 35): one direction.
ENGINE_ORDER = ["pacing", "chain", "followers", "poller", "intake", "spooling", "supervisor"]


def test_the_engine_depends_one_way_and_knows_nothing_of_its_edges() -> None:
    graph = {m: deps for m, deps in imports("daemon").items() if m.startswith("daemon.engine")}
    assert {m.rsplit(".", 1)[1] for m in graph} - {"engine"} == set(ENGINE_ORDER)
    for module, deps in graph.items():
        edges = sorted(
            d
            for d in deps
            if d.startswith(("daemon.api", "daemon.commands", "daemon.cli", "daemon.mcp"))
            or d == "daemon.supervisor"
        )
        assert not edges, f"{module} imports {edges}: the engine is composed, not composing"
        name = module.rsplit(".", 1)[1]
        if name == "engine":
            continue
        allowed = {f"daemon.engine.{m}" for m in ENGINE_ORDER[: ENGINE_ORDER.index(name)]}
        inner = {".".join(d.split(".")[:3]) for d in deps if d.startswith("daemon.engine.")}
        assert inner <= allowed, f"{module} imports {sorted(inner - allowed)}: see ENGINE_ORDER"
