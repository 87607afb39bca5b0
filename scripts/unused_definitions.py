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
Names reached by protocol rather than by name are kept (:data:`PROTOCOL`: methods Python or a
framework calls), as are dunder names and the drills of :data:`DRILLS`. Prints
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
#: Names reached by protocol, not by a reference in code (methods Python or a framework calls).
PROTOCOL = {
    "main", "setup", "forward", "step", "reset", "close", "act", "extract", "render", "load",
    "to_dict", "from_dict", "post_init", "handle_starttag", "handle_endtag", "handle_data", "get_task_policy",
}  # fmt: skip
#: Fault-injection hooks on live actors, called by the fault tests and the drills of
#: docs/cluster.md "When a node dies or joins" (a product actor's method: a test double cannot
#: stand in for the actor whose death is being drilled).
DRILLS = {"inject_crash", "inject_fault"}
_IDENT = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
#: A string that names code: ``name``, ``a.b.c``, ``module:Class`` (prose has spaces).
_REFERENCE = re.compile(r"^[A-Za-z_][A-Za-z0-9_.:]*$")


def _definitions(tree: ast.Module) -> list[tuple[str, int, str]]:
    """(name, line, kind) of the module's top-level definitions and its classes' methods."""
    out = []
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            out.append((node.name, node.lineno, type(node).__name__))
        if isinstance(node, ast.ClassDef):
            for item in node.body:
                if isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef)):
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
    words: Counter[str] = Counter()
    for node in ast.walk(ast.parse(text)):
        if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Load):  # an assignment is no use
            words[node.id] += 1
        elif isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Load):
            words[node.attr] += 1
        elif isinstance(node, ast.alias) and not init:
            words.update(node.name.split("."))
        elif isinstance(node, ast.Constant) and isinstance(node.value, str) and _REFERENCE.match(node.value):
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
    uses: dict[Path, Counter[str]] = {f: _uses(f) for f in _files(PRODUCT, (".py", ".yaml", ".txt", ".j2", ".sh"))}
    users: dict[str, set[Path]] = defaultdict(set)
    for f, words in uses.items():
        for w in words:
            users[w].add(f)
    tested: set[str] = set()
    for f in _files([TESTS], (".py",)):
        tested |= set(_uses(f))
    out = []
    for path in _files([ROOT / "memprism_ray"], (".py",)):
        for name, line, kind in _definitions(ast.parse(path.read_text())):
            if name.startswith("__") or name in PROTOCOL or name in DRILLS:
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
