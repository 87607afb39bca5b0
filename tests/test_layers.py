"""The package's import graph (issue 29, item 6): an ``ast`` walk of every import statement of
every module of ``memprism_ray`` (top-level and inside functions alike, relative imports
resolved) finds no cycle between packages and none between modules, no import that runs back
up the layer order, and no ray import in the core (docs/architecture.md "Layers")."""

from __future__ import annotations

import ast
from collections import defaultdict
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "memprism_ray"
#: The layer order, low to high (docs/architecture.md "Layers"): a package imports only from its
#: own layer or a lower one.
LAYERS = (
    ("io_atomic", "formats", "llm_client", "config_tree", "registry", "progress"),
    ("view_space",),
    ("recorder",),
    ("composer",),
    ("render",),
    ("views",),
    ("policy",),
    ("router",),
    ("envs",),
    ("baselines",),
    ("agent",),
    ("adapter",),
    ("eval",),
    ("config",),
    ("benchmark",),
    ("memory",),
    ("cluster",),
    ("actors",),
    ("trainer",),
    ("serve",),
    ("cli", "__main__"),
    ("testing",),  # test doubles and fixture generators: nothing in the product imports them
)
CORE = (
    "view_space",
    "recorder",
    "router",
    "composer",
    "render",
    "adapter",
    "envs",
    "policy",
    "agent",
    "formats",
    "memory",
)


def _modules() -> dict[str, Path]:
    mods = {}
    for path in PACKAGE.rglob("*.py"):
        parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        mods[name] = path
    return mods


def _imports(name: str, path: Path, mods: dict[str, Path]) -> set[str]:
    """Every module of the package ``name`` imports, anywhere in its body, plus ``"ray"``."""
    out: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        targets: list[str] = []
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                pkg = name.split(".") if path.name == "__init__.py" else name.split(".")[:-1]
                pkg = pkg[: len(pkg) - node.level + 1]
                base = ".".join(pkg + ([base] if base else []))
            targets = [f"{base}.{a.name}" for a in node.names] + [base]
        for t in targets:
            if t == "ray" or t.startswith("ray."):
                out.add("ray")
            while t and t not in mods:
                t = t.rpartition(".")[0]
            if t and t != name:
                out.add(t)
    return out


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one node (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in graph.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                found.append(sorted(comp))

    for v in sorted(set(graph) | {w for ws in graph.values() for w in ws}):
        if v not in index:
            visit(v)
    return found


def _graph() -> dict[str, set[str]]:
    mods = _modules()
    return {name: _imports(name, path, mods) for name, path in mods.items()}


def _package(module: str) -> str:
    return ".".join(module.split(".")[:2])


def test_no_import_cycle_between_modules() -> None:
    graph = {m: {t for t in ts if t != "ray"} for m, ts in _graph().items()}
    assert _cycles(graph) == []


def test_no_import_cycle_between_packages() -> None:
    packages: dict[str, set[str]] = defaultdict(set)
    for module, targets in _graph().items():
        packages[_package(module)] |= {_package(t) for t in targets if t != "ray" and _package(t) != _package(module)}
    assert _cycles(packages) == []


def test_no_import_runs_back_up_the_layers() -> None:
    rank = {f"memprism_ray.{p}": i for i, layer in enumerate(LAYERS) for p in layer} | {"memprism_ray": -1}
    upward = sorted(
        (module, target)
        for module, targets in _graph().items()
        for target in targets
        if target != "ray" and rank[_package(target)] > rank[_package(module)]
    )
    assert upward == []


def test_the_core_never_imports_ray() -> None:
    core = {f"memprism_ray.{c}" for c in CORE}
    offenders = sorted(m for m, targets in _graph().items() if _package(m) in core and "ray" in targets)
    assert offenders == []


def test_the_walk_sees_imports_inside_functions(tmp_path: Path) -> None:
    """The check would be blind if function-level imports were skipped: they are the usual way
    a layer reaches up (``def f(): from memprism_ray.actors import x``)."""
    mods = {"memprism_ray.a": tmp_path / "a.py", "memprism_ray.b": tmp_path / "b.py"}
    mods["memprism_ray.a"].write_text("def f():\n    from memprism_ray.b import g\n    import ray\n")
    assert _imports("memprism_ray.a", mods["memprism_ray.a"], mods) == {"memprism_ray.b", "ray"}
    assert _cycles({"x": {"y"}, "y": {"x"}, "z": {"x"}}) == [["x", "y"]]
