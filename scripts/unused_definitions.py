"""Definitions of the package that nothing in the product uses (issue 36): top-level functions,
classes and constants of ``memprism_ray``, and methods of its classes, whose name appears
nowhere in the product's code (``memprism_ray/``, ``jobs/``, ``scripts/``, ``benchmarks/``, the
package's YAML and templates, ``configs/``) but where they are defined. A name used only by
``tests/`` is reported too: test tooling belongs under ``tests/``, or in
``memprism_ray/testing/`` (test doubles the benchmarks share), where a definition only tests use
is not reported.

By name, not by type: a name used anywhere counts as used (a false "used" is possible, a
false "unused" is what this lists). What is not a use: a docstring or a comment naming it, a
package ``__init__`` re-exporting it (its import and ``__all__``), and its own definition.
The allow-lists are explicit and short: overrides a library calls (:data:`PROTOCOL`), the
drills of :data:`DRILLS`, the entry points of :data:`API`, HTTP routes (:data:`HTTP_METHODS`);
dunder names are kept too. Prints
``path:line kind name (where used)`` per finding and exits 1 when there is any.

    python scripts/unused_definitions.py
"""

from __future__ import annotations

import ast
import re
import sys
from collections import Counter, defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PRODUCT = [ROOT / "memprism_ray", ROOT / "jobs", ROOT / "scripts", ROOT / "benchmarks", ROOT / "configs"]
TESTS = ROOT / "tests"
#: Test doubles shared with the benchmarks: a definition there that only tests use is in its place.
TESTING = ROOT / "memprism_ray" / "testing"
#: Overrides a library calls, never named in our code: torch's ``nn.Module.forward``, ALFWorld's
#: ``HandCodedTWAgent.get_task_policy``, ``html.parser.HTMLParser``'s handlers.
PROTOCOL = {"forward", "get_task_policy", "handle_starttag", "handle_endtag", "handle_data"}
#: Fault-injection hooks on live actors, the drills of docs/cluster.md "When a node dies or joins"
#: (a product actor's method: a test double cannot stand in for the actor whose death is drilled).
DRILLS = {"inject_crash", "inject_fault"}
#: Entry points for code outside the repository: a benchmark kept outside the package registers
#: itself (docs/architecture.md "Benchmarks"; the toy benchmark of tests/benchmark does).
API = {"register_benchmark"}
#: Decorators that register a method as an HTTP route (FastAPI's, memprism_ray/serve/app.py).
HTTP_METHODS = {"get", "post", "put", "patch", "delete"}
_IDENT = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
#: A string that names code: ``name``, ``a.b.c``, ``module:Class`` (prose has spaces).
_REFERENCE = re.compile(r"^[A-Za-z_][A-Za-z0-9_.:]*$")


def _route(fn: ast.FunctionDef | ast.AsyncFunctionDef) -> bool:
    """An HTTP route (``@api.get("/path")``, ``@api.post(...)``, ``@api.api_route(..., methods=[...])``):
    the web framework calls it."""
    return any(
        isinstance(d, ast.Call)
        and isinstance(d.func, ast.Attribute)
        and (d.func.attr in HTTP_METHODS or d.func.attr == "api_route")
        for d in fn.decorator_list
    )


def _definitions(tree: ast.Module) -> list[tuple[str, int, str]]:
    """(name, line, kind) of the module's top-level definitions and its classes' methods."""
    out = []
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            out.append((node.name, node.lineno, type(node).__name__))
        if isinstance(node, ast.ClassDef):
            for item in node.body:
                if isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef)) and not _route(item):
                    out.append((item.name, item.lineno, "method"))
        elif isinstance(node, (ast.Assign, ast.AnnAssign)):
            for t in node.targets if isinstance(node, ast.Assign) else [node.target]:
                if isinstance(t, ast.Name) and t.id.isupper():
                    out.append((t.id, node.lineno, "constant"))
    return out


def _uses(path: Path) -> Counter[str]:
    """How often each identifier is used in ``path``: names and attributes in code, imports
    (but a package ``__init__``'s, which re-export), and strings that are a reference rather
    than prose (``"module:Class"``, a ``getattr`` name). Docstrings, messages and comments
    naming a definition do not use it; nor does the definition itself."""
    text = path.read_text(errors="replace")
    if path.suffix != ".py":
        return Counter(_IDENT.findall(text))
    init = path.name == "__init__.py"
    tree = ast.parse(text)
    docs = {id(n.value) for n in ast.walk(tree) if isinstance(n, ast.Expr) and isinstance(n.value, ast.Constant)}
    words: Counter[str] = Counter()
    for node in ast.walk(tree):
        if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Load):  # an assignment is no use
            words[node.id] += 1
        elif isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Load):
            words[node.attr] += 1
        elif isinstance(node, ast.alias) and not init:
            words.update(node.name.split("."))
        elif isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docs:
            if _REFERENCE.match(node.value):
                words.update(_IDENT.findall(node.value))
        elif init and isinstance(node, ast.Assign) and any(getattr(t, "id", "") == "__all__" for t in node.targets):
            words.subtract(_IDENT.findall(ast.unparse(node.value)))  # re-exported, not used
    return +words


def _files(roots: list[Path], suffixes: tuple[str, ...]) -> list[Path]:
    files: list[Path] = []
    for root in roots:
        files += [p for p in root.rglob("*") if p.suffix in suffixes and "__pycache__" not in p.parts]
    return files


def findings() -> list[str]:
    """``path:line kind name (where used)`` of every definition the product does not use."""
    users: dict[str, set[Path]] = defaultdict(set)
    for f in _files(PRODUCT, (".py", ".yaml", ".txt", ".j2", ".sh")):
        if f != Path(__file__).resolve():  # this script's allow-lists name what they keep
            for w in _uses(f):
                users[w].add(f)
    tested: set[str] = set()
    for f in _files([TESTS], (".py",)):
        tested |= set(_uses(f))
    out = []
    for path in _files([ROOT / "memprism_ray"], (".py",)):
        for name, line, kind in _definitions(ast.parse(path.read_text())):
            if name.startswith("__") or name in PROTOCOL | DRILLS | API:
                continue
            if users[name]:
                continue
            if name in tested and TESTING in path.parents:
                continue
            where = "tests only" if name in tested else "nothing"
            out.append(f"{path.relative_to(ROOT)}:{line} {kind} {name} ({where})")
    return sorted(out)


def main() -> int:
    found = findings()
    for f in found:
        print(f)
    print(f"{len(found)} definition(s) used by tests only or by nothing", file=sys.stderr)
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main())
