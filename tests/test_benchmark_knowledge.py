"""Benchmark knowledge lives with its benchmark (issue 36 item 1): an ``ast`` walk of every module
of ``memprism_ray`` outside the benchmark modules finds no table or branch keyed by a benchmark's
name. A benchmark's modules are ``memprism_ray/benchmark/**`` and the modules and packages named
for it (``benchmark/alfworld/``, ``benchmark/mind2web/contract.py``, ``benchmark/ebalfred/phi.py``, ...), which the
shared code reaches only through the :class:`~memprism_ray.benchmark.Benchmark` object.

Counted, in the shared modules, with a registered name as a string literal:

* a dict display keyed by it (``{"alfworld": ...}``: a table);
* a comparison with it (``x == "ebalfred"``, ``x in ("alfworld", "mind2web")``: a branch);
* a ``match`` case on it;
* a tuple, list or set display holding it (``("alfworld", "ebalfred")``: a table of names);
* a call with a keyword argument named for it (``dict(alfworld=...)``).

Before this issue: 24 by this count (in policy/base, policy/prompts, policy/parsing,
policy/scripted, recorder/phi/factory, recorder/phi/llm, recorder/phi/prompt, router/teacher,
adapter/grpo_update, adapter/sft and pipeline/jobs); the issue counted 13 by coarser units.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

from memprism_ray.benchmark import BENCHMARKS

PACKAGE = Path(__file__).resolve().parents[1] / "memprism_ray"
NAMES = frozenset(BENCHMARKS)


def is_benchmark_module(rel: Path) -> bool:
    """``memprism_ray/benchmark/**``, a module or package named for a benchmark, or the registry
    (``memprism_ray/registry.py``: the one table of the benchmarks and the default)."""
    parts = rel.with_suffix("").parts
    return parts[0] in ("benchmark", "registry") or any(p.startswith(tuple(NAMES)) for p in parts)


def _names_in(node: ast.AST) -> bool:
    if isinstance(node, ast.Constant):
        return node.value in NAMES
    if isinstance(node, (ast.Tuple, ast.List, ast.Set)):
        return any(isinstance(e, ast.Constant) and e.value in NAMES for e in node.elts)
    return False


def knowledge_sites(tree: ast.AST) -> list[tuple[int, str]]:
    """``(line, what)`` of each table or branch keyed by a benchmark name in ``tree``."""
    out: list[tuple[int, str]] = []
    compared: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Dict) and any(k is not None and _names_in(k) for k in node.keys):
            out.append((node.lineno, "dict keyed by a benchmark name"))
        elif isinstance(node, ast.Compare) and any(_names_in(o) for o in (node.left, *node.comparators)):
            out.append((node.lineno, "comparison with a benchmark name"))
            compared.update(id(n) for n in ast.walk(node))
        elif isinstance(node, ast.match_case) and any(
            isinstance(p, ast.MatchValue) and _names_in(p.value) for p in ast.walk(node.pattern)
        ):
            out.append((node.pattern.lineno, "match case on a benchmark name"))
        elif isinstance(node, ast.Call) and any(k.arg in NAMES for k in node.keywords):
            out.append((node.lineno, "keyword named for a benchmark"))
    for node in ast.walk(tree):
        if isinstance(node, (ast.Tuple, ast.List, ast.Set)) and id(node) not in compared and _names_in(node):
            out.append((node.lineno, "collection of benchmark names"))
    return out


def shared_knowledge() -> list[str]:
    """Every site in the shared modules, as ``path:line: what``."""
    found = []
    for path in sorted(PACKAGE.rglob("*.py")):
        rel = path.relative_to(PACKAGE)
        if is_benchmark_module(rel):
            continue
        for line, what in knowledge_sites(ast.parse(path.read_text(encoding="utf-8"))):
            found.append(f"memprism_ray/{rel}:{line}: {what}")
    return found


def test_no_shared_module_holds_a_table_or_branch_keyed_by_a_benchmark_name() -> None:
    found = shared_knowledge()
    assert found == [], "benchmark knowledge outside the benchmark modules:\n" + "\n".join(found)


def test_the_check_finds_each_kind_of_site() -> None:
    """The walk itself: each kind of site counts once, a name used as data (a default, a stream's
    meta value, a log line) does not."""
    source = """
TABLE = {"alfworld": 1, "mind2web": 2}
NAMES = ("alfworld", "ebalfred")
ONE = ["mind2web"]
if benchmark == "ebalfred": pass
if benchmark in ("alfworld", "mind2web"): pass
match benchmark:
    case "alfworld": pass
ROWS = dict(alfworld=1)
DEFAULT = "alfworld"
def f(benchmark: str = "alfworld") -> None: ...
META = {"benchmark": "alfworld"}
print(f"rule:{DEFAULT}")
"""
    kinds = [what for _, what in knowledge_sites(ast.parse(source))]
    assert sorted(kinds) == sorted(
        [
            "dict keyed by a benchmark name",
            "collection of benchmark names",
            "collection of benchmark names",
            "comparison with a benchmark name",
            "comparison with a benchmark name",
            "match case on a benchmark name",
            "keyword named for a benchmark",
        ]
    )
    assert is_benchmark_module(Path("benchmark/alfworld/env.py")) and is_benchmark_module(
        Path("benchmark/mind2web/contract.py")
    )
    assert not is_benchmark_module(Path("policy/prompts.py"))


def _docstrings(tree: ast.AST) -> set[int]:
    out = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and node.body:
            first = node.body[0]
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant):
                out.add(id(first.value))
    return out


def naming_sites(tree: ast.AST) -> list[tuple[int, str]]:
    """``(line, what)`` where code names a benchmark: an import of one of its modules, or a
    string that is its name, one of its module paths or one of its settings (``alfworld.x``).
    Prose (docstrings, help text) that mentions one is not counted."""
    names = "|".join(sorted(NAMES))
    module = re.compile(rf"(^|\.)({names})(\.|$)")
    data = re.compile(rf"^/?({names})(\.\w+)?$|memprism_ray\.(\w+\.)*({names})\b")
    skip = _docstrings(tree)
    out: list[tuple[int, str]] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            imported = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            imported = [node.module or "", *(f"{node.module}.{a.name}" for a in node.names)]
        else:
            imported = []
        if any(module.search(m) for m in imported):
            out.append((node.lineno, "imports a benchmark's module"))
        is_code_text = isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in skip
        if is_code_text and data.search(node.value):
            out.append((node.lineno, f"names a benchmark: {node.value[:60]!r}"))
    return out


def test_only_the_registry_names_a_benchmark() -> None:
    """Issue 42's target: outside the benchmarks' folders (and the test doubles), no module
    imports a benchmark's module or names one in code, but the registry, which names the
    benchmarks and the default once (f519d3d: 11 modules)."""
    found = []
    for path in sorted(PACKAGE.rglob("*.py")):
        rel = path.relative_to(PACKAGE)
        if rel.parts[0] == "testing" or (rel.parts[0] == "benchmark" and len(rel.parts) > 2):
            continue
        for line, what in naming_sites(ast.parse(path.read_text(encoding="utf-8"))):
            found.append(f"memprism_ray/{rel}:{line}: {what}")
    assert {f.split(":")[0] for f in found} == {"memprism_ray/registry.py"}, "\n".join(found)
    source = """
\"\"\"ALFWorld is mentioned here, in prose.\"\"\"
from memprism_ray.benchmark.alfworld.data import list_games
import memprism_ray.benchmark.mind2web.report
KEY = "alfworld.eval_split"
TARGET = "memprism_ray.benchmark.ebalfred.benchmark:EbAlfred"
DEFAULT = "alfworld"
HELP = "an ALFWorld split"
"""
    assert [line for line, _ in naming_sites(ast.parse(source))] == [3, 4, 5, 6, 7]


def test_the_actors_and_the_trainer_are_handed_the_benchmark() -> None:
    """Issue 42 item 6: the benchmark object is built from its name once, by the job entries
    (``trainer/fit.py``), and handed down: no actor, task, trainer or cluster module looks one
    up by name, but a policy replica started on its own (tests, ``benchmarks/``) takes the
    registry's default (e56c0bf's parent: 9 lookups by ``corpus.benchmark`` there)."""
    lookups = []
    for package in ("actors", "trainer", "cluster"):
        for path in sorted((PACKAGE / package).rglob("*.py")):
            if path.name == "fit.py":
                continue
            for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
                called = getattr(node, "func", None)
                if getattr(called, "id", getattr(called, "attr", "")) not in ("get_benchmark", "benchmark_class"):
                    continue
                if [ast.unparse(a) for a in node.args] != ["DEFAULT_BENCHMARK"]:
                    lookups.append(f"{path.relative_to(PACKAGE)}:{node.lineno}: {ast.unparse(node)}")
    assert lookups == [], "\n".join(lookups)
