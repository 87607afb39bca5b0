"""The package holds the product (issue 36 item 4): no definition of ``memprism_ray`` is used
by tests only or by nothing (``scripts/unused_definitions.py``; about 34 when the issue was
filed), and the script's allow-lists name definitions that exist."""

from __future__ import annotations

import ast
import importlib.util
from pathlib import Path
from types import ModuleType

ROOT = Path(__file__).resolve().parents[1]


def _script() -> ModuleType:
    spec = importlib.util.spec_from_file_location("unused_definitions", ROOT / "scripts" / "unused_definitions.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_every_definition_is_used_by_the_product() -> None:
    assert _script().findings() == []


def test_the_allow_lists_name_definitions_of_the_package() -> None:
    script = _script()
    defined = {
        name
        for path in (ROOT / "memprism_ray").rglob("*.py")
        for name, _, _ in script._definitions(ast.parse(path.read_text()))
    }
    assert defined >= script.PROTOCOL | script.DRILLS | script.API


def test_docs_comments_messages_and_reexports_are_not_uses(tmp_path: Path) -> None:
    """What would hide an unused definition: its name in a docstring, a comment, an error
    message, or a package ``__init__`` importing it and listing it in ``__all__``."""
    script = _script()
    module = tmp_path / "m.py"
    module.write_text(
        '"""See :func:`helper`."""\n'
        "# helper is kept for\n"
        "def f(x):\n"
        '    """helper"""\n'
        '    raise ValueError(f"helper needs {x}")\n'
        "CONST = 1\n"
        'g = getattr(x, "used_by_name")\n'
        "h = obj.attribute_use\n"
    )
    assert {"helper", "CONST", "f"}.isdisjoint(script._uses(module))
    assert {"used_by_name", "attribute_use", "getattr"} <= set(script._uses(module))
    init = tmp_path / "__init__.py"
    init.write_text('from pkg.m import helper\n__all__ = ["helper"]\n')
    assert "helper" not in script._uses(init)
    (tmp_path / "user.py").write_text("from pkg.m import helper\n")
    assert "helper" in script._uses(tmp_path / "user.py")
