"""Typed configuration trees: dataclasses <-> YAML, plus dotted command-line overrides.

Every setting is a dataclass field with a one-line help; presets are YAML files that set a
subset of fields, and ``--section.field VALUE`` overrides one leaf. Unknown keys are errors
that list the valid ones; an old key a dataclass lists in its ``RENAMED`` (old name -> new
dotted name under the same section, or ``/`` and the full dotted name where it moved to another
section) is a one-line error naming the new key. Values are coerced to the field's type
(``nan`` and infinity are never valid settings) and validated by each ``__post_init__``, the entries of a
``dict`` field that names a ``schema`` dataclass too.

A tree may also hold sections it does not declare itself (:func:`sections_field`: each
benchmark's own, from the registry): they read and write as top-level sections
(``--mind2web.eval_tasks``), and :func:`to_dict` writes them so.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import functools
import math
import re
import types
import typing
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, TypeVar, Union, get_args, get_origin, get_type_hints

T = TypeVar("T")

#: A seed setting: an integer from 0 to :data:`MAX_SEED`, refused otherwise when the config is
#: read. numpy's generators refuse a negative seed and ``torch.manual_seed`` one past 2**64 - 1:
#: ``--run.seed -1`` trained a whole run, then ended in the final evaluation's bootstrap.
Seed = typing.NewType("Seed", int)
MAX_SEED = 2**63 - 1


def field(
    default: Any = dataclasses.MISSING,
    *,
    help: str,
    default_factory: Any = dataclasses.MISSING,
    schema: type | None = None,
) -> Any:
    """A dataclass field with its one-line help text; ``schema``: for a ``dict`` field of keyword
    settings, the dataclass whose fields are the allowed keys (:func:`coerce_settings`)."""
    metadata: dict[str, Any] = {"help": help}
    if schema is not None:
        metadata["schema"] = schema
    if default_factory is not dataclasses.MISSING:
        return dataclasses.field(default_factory=default_factory, metadata=metadata)
    return dataclasses.field(default=default, metadata=metadata)


def check_device(value: str, key: str, *, auto: bool = False) -> None:
    """A torch device setting: ``cpu``, ``cuda`` or ``cuda:N`` (and ``auto`` where the setting
    takes it), refused when the config is read: a typo in ``encoder.device`` failed inside a D1
    labelling task, in a traceback, after the reference trajectories had been played."""
    ok = value in ("cpu", "cuda") or (value == "auto" and auto) or re.fullmatch(r"cuda:\d+", value) is not None
    if not ok:
        raise ValueError(f"{key} must be {'auto, ' if auto else ''}cpu, cuda or cuda:N, got {value!r}")


def sections_field(provider: Callable[[], Mapping[str, type | Exception]], *, help: str) -> Any:
    """A ``dict[str, section]`` field whose entries are top-level sections of the tree, named
    and typed by ``provider()`` (name -> section dataclass, or the error that stands for one
    that cannot be loaded here: raised only when the tree names that section)."""
    return dataclasses.field(default_factory=dict, metadata={"help": help, "sections": provider})


def _open_sections(cls: type) -> tuple[str, dict[str, type | Exception]] | None:
    """The :func:`sections_field` of ``cls`` and its sections (name -> type or error), if it has one."""
    for f in dataclasses.fields(cls):
        provider = f.metadata.get("sections")
        if provider is not None:
            return f.name, dict(provider())
    return None


def loadable_sections(provider: Callable[[], Mapping[str, type | Exception]]) -> dict[str, type]:
    """The sections ``provider`` could load (name -> section dataclass)."""
    return {k: tp for k, tp in provider().items() if isinstance(tp, type)}


def coerce_settings(schema: type, data: Mapping[str, Any], where: str) -> dict[str, Any]:
    """The entries of ``data`` (only those: the rest keep the consumer's defaults) coerced to the
    types of ``schema``'s fields and validated by it; a bad one raises naming ``where.key``."""
    if not isinstance(data, Mapping):
        raise ValueError(f"{where}: expected a mapping of settings, got {data!r}")
    hints = get_type_hints(schema)
    names = [f.name for f in dataclasses.fields(schema) if f.init]
    unknown = [k for k in data if k not in names]
    if unknown:
        raise ValueError(
            f"unknown setting(s) {', '.join(f'{where}.{k}' for k in unknown)}; valid keys under {where}: "
            f"{', '.join(names)}"
        )
    out = {k: _coerce(v, hints[k], f"{where}.{k}") for k, v in data.items()}
    try:
        schema(**out)
    except TypeError as exc:
        raise ValueError(f"{where}: {exc}") from None
    except ValueError as exc:
        raise _keyed(exc, schema, where) from None
    return out


def _keyed(exc: ValueError, cls: type, where: str) -> ValueError:
    """``exc`` from ``cls.__post_init__`` with the class's name (``GRPOConfig.iterations``: the
    core packages' configs know no section) written as the key a user sets (``grpo.iterations``)."""
    said = re.sub(rf"\b{re.escape(cls.__name__)}\b", where, str(exc)) if where else str(exc)
    return exc if said == str(exc) else ValueError(said)  # a message without the name keeps its type


def _is_dataclass_type(tp: Any) -> bool:
    return isinstance(tp, type) and dataclasses.is_dataclass(tp)


def _coerce(value: Any, tp: Any, where: str) -> Any:
    """Coerce a YAML/CLI value to annotation ``tp`` or raise ``ValueError`` naming ``where``."""
    origin = get_origin(tp)
    if tp is Any:
        return value
    if origin in (Union, types.UnionType):
        args = get_args(tp)
        is_null = value is None or (isinstance(value, str) and value.lower() in ("none", "null"))
        if is_null and type(None) in args:
            return None
        errors = []
        for arg in args:
            if arg is type(None):
                continue
            try:
                return _coerce(value, arg, where)
            except ValueError as exc:
                errors.append(str(exc))
        raise ValueError(errors[0] if errors else f"{where}: cannot accept {value!r}")
    if origin is typing.Literal:
        allowed = get_args(tp)
        for a in allowed:
            if value == a or (isinstance(value, str) and str(a) == value):
                return a
        raise ValueError(f"{where}: {value!r} is not one of {', '.join(map(repr, allowed))}")
    if _is_dataclass_type(tp):
        if isinstance(value, tp):
            return value
        if not isinstance(value, Mapping):
            raise ValueError(f"{where}: expected a mapping of settings, got {value!r}")
        return from_dict(tp, value, _where=where)
    if origin in (list, tuple, Sequence) or tp in (list, tuple):
        if isinstance(value, str):
            value = [v.strip() for v in value.split(",") if v.strip()] if value.strip() else []
        if not isinstance(value, (list, tuple)):
            raise ValueError(f"{where}: expected a list, got {value!r}")
        args = get_args(tp)
        inner = args[0] if args else Any
        items = [_coerce(v, inner, f"{where}[{i}]") for i, v in enumerate(value)]
        # Every list setting names things (conditions, splits, subsets): a split named twice ended
        # an evaluation after Ray had started, in "manifest episode ids must be unique".
        twice = next((x for i, x in enumerate(items) if isinstance(x, str) and x in items[:i]), None)
        if twice is not None:
            raise ValueError(f"{where}: {twice!r} is listed twice")
        return tuple(items) if (origin is tuple or tp is tuple) else items
    if origin is dict or tp is dict:
        if not isinstance(value, Mapping):
            raise ValueError(f"{where}: expected a mapping, got {value!r}")
        return dict(value)
    if tp is bool:
        if isinstance(value, bool):
            return value
        if isinstance(value, str) and value.lower() in ("true", "yes", "1", "on"):
            return True
        if isinstance(value, str) and value.lower() in ("false", "no", "0", "off"):
            return False
        raise ValueError(f"{where}: expected true/false, got {value!r}")
    if tp is Seed:
        number = _coerce(value, int, where)
        if not 0 <= number <= MAX_SEED:
            raise ValueError(f"{where}: a seed is an integer from 0 to 2**63 - 1, got {number}")
        return number
    if tp is int:
        if isinstance(value, bool):
            raise ValueError(f"{where}: expected an integer, got {value!r}")
        if isinstance(value, int):
            return value
        if isinstance(value, float) and value.is_integer():
            return int(value)
        if isinstance(value, str):
            with contextlib.suppress(ValueError):
                return int(value.replace("_", ""))
        raise ValueError(f"{where}: expected an integer, got {value!r}")
    if tp is float:
        number: float | None = None
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            number = float(value)
        elif isinstance(value, str):
            with contextlib.suppress(ValueError):
                number = float(value)
        if number is None or math.isnan(number):
            raise ValueError(f"{where}: expected a number, got {value!r}")
        if math.isinf(number):  # no setting means "unbounded" by infinity; 1e400 reads as inf
            raise ValueError(f"{where}: expected a finite number, got {value!r}")
        return number
    if tp is str:
        if isinstance(value, (str, int, float)) and not isinstance(value, bool):
            return str(value)
        raise ValueError(f"{where}: expected a string, got {value!r}")
    if tp is Path:
        return Path(value)
    return value


def _renamed_to(prefix: str, new: str) -> str:
    """A ``RENAMED`` value as a dotted key: ``/agent.max_steps`` is absolute, else under ``prefix``."""
    return new[1:] if new.startswith("/") else f"{prefix}{new}"


def _section_moves(sections: Mapping[str, type | Exception], prefix: str) -> dict[str, str]:
    """``{old dotted key: new dotted key}`` of the keys open sections took over from others
    (a section's ``MOVED_FROM``: old dotted key -> its own key)."""
    return {
        f"{prefix}{old}": f"{prefix}{name}.{new}"
        for name, tp in sections.items()
        if isinstance(tp, type)
        for old, new in getattr(tp, "MOVED_FROM", {}).items()
    }


def get_nested(data: Mapping[str, Any], key: str) -> Any:
    """``data[a][b]`` for ``key`` ``"a.b"``; None where a step is missing or not a mapping."""
    node: Any = data
    for part in key.split("."):
        if not isinstance(node, Mapping):
            return None
        node = node.get(part)
    return node


def moved_keys(cls: type, prefix: str = "") -> dict[str, str]:
    """Every key of the tree ``cls`` that moved to another section (a ``RENAMED`` entry to an
    absolute key, or an open section's ``MOVED_FROM``), as ``{old dotted key: new dotted key}``
    (for reading what an older version recorded)."""
    out = {f"{prefix}{old}": new[1:] for old, new in getattr(cls, "RENAMED", {}).items() if new.startswith("/")}
    opened = _open_sections(cls)
    if opened is not None:
        out.update(_section_moves(opened[1], prefix))
    hints = get_type_hints(cls)
    for f in dataclasses.fields(cls):
        if _is_dataclass_type(hints.get(f.name)):
            out.update(moved_keys(hints[f.name], f"{prefix}{f.name}."))
    return out


def from_dict(cls: type[T], data: Mapping[str, Any], *, _where: str = "") -> T:
    """Build dataclass ``cls`` from a (possibly partial) nested mapping."""
    if not isinstance(data, Mapping):
        raise ValueError(f"{_where or cls.__name__}: expected a mapping, got {type(data).__name__}")
    hints = get_type_hints(cls)
    fields = {f.name: f for f in dataclasses.fields(cls) if f.init}
    opened = _open_sections(cls)
    extra: dict[str, type] = {}
    if opened is not None:
        fields.pop(opened[0])
        for k, tp in opened[1].items():
            if isinstance(tp, Exception) and k in data:
                raise ValueError(f"{k}: {tp}") from None
        for old, new in _section_moves(opened[1], f"{_where}." if _where else "").items():
            section, _, key = old.rpartition(".")
            node = get_nested(data, section)
            if isinstance(node, Mapping) and key in node:
                raise ValueError(f"{old} was renamed {new}")
        extra = {k: tp for k, tp in opened[1].items() if k not in fields and isinstance(tp, type)}
    unknown = [k for k in data if k not in fields and k not in extra]
    if unknown:
        prefix = f"{_where}." if _where else ""
        renamed = getattr(cls, "RENAMED", {})
        if any(k in renamed for k in unknown):  # an old key: say its new name, not the whole list
            raise ValueError(
                "; ".join(f"{prefix}{k} was renamed {_renamed_to(prefix, renamed[k])}" for k in unknown if k in renamed)
            )
        raise ValueError(
            f"unknown setting(s) {', '.join(prefix + k for k in unknown)}; "
            f"valid keys{' under ' + _where if _where else ''}: {', '.join([*fields, *extra])}"
        )
    kwargs: dict[str, Any] = {}
    if opened is not None:
        kwargs[opened[0]] = {
            k: from_dict(extra[k], v, _where=f"{_where}.{k}" if _where else k) for k, v in data.items() if k in extra
        }
    for name, value in data.items():
        if name in extra:
            continue
        where = f"{_where}.{name}" if _where else name
        schema = fields[name].metadata.get("schema")
        if schema is not None and isinstance(value, Mapping):
            kwargs[name] = coerce_settings(schema, value, where)
        else:
            kwargs[name] = _coerce(value, hints[name], where)
    try:
        return cls(**kwargs)
    except TypeError as exc:
        raise ValueError(f"{_where or cls.__name__}: {exc}") from None
    except ValueError as exc:
        raise _keyed(exc, cls, _where) from None


def to_dict(obj: Any) -> Any:
    """Plain nested dict of a config tree (tuples become lists, Paths strings)."""
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        out = {}
        for f in dataclasses.fields(obj):
            if "sections" in f.metadata:  # written as the tree's own top-level sections
                out.update({k: to_dict(v) for k, v in getattr(obj, f.name).items()})
            else:
                out[f.name] = to_dict(getattr(obj, f.name))
        return out
    if isinstance(obj, (list, tuple)):
        return [to_dict(v) for v in obj]
    if isinstance(obj, dict):
        return {k: to_dict(v) for k, v in obj.items()}
    if isinstance(obj, Path):
        return str(obj)
    return obj


def flat_settings(tree: Any, prefix: str = "") -> dict[str, Any]:
    """A config tree (:func:`to_dict`) as ``{"section.key": value}``."""
    if not isinstance(tree, dict):
        return {prefix[:-1]: tree}
    return {key: value for k, v in tree.items() for key, value in flat_settings(v, f"{prefix}{k}.").items()}


def merge(base: Mapping[str, Any], update: Mapping[str, Any]) -> dict[str, Any]:
    """Recursive dict merge; ``update`` wins on leaves."""
    out = dict(base)
    for k, v in update.items():
        if isinstance(v, Mapping) and isinstance(out.get(k), Mapping):
            out[k] = merge(out[k], v)
        else:
            out[k] = v
    return out


def load_yaml(path: str | Path, _chain: tuple[Path, ...] = ()) -> dict[str, Any]:
    """A preset as a mapping, the presets its ``base:`` names (a file beside it) merged under
    it; every problem one ``ValueError`` naming the file (a user's edited preset, issue 40)."""
    import yaml

    path = Path(path)
    if path.resolve() in _chain:
        loop = " -> ".join(str(p) for p in (*_chain, path.resolve()))
        raise ValueError(f"config file {_chain[-1]}: its base chain comes back to a preset it started from ({loop})")
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ValueError(f"config file {path} does not exist") from None
    except UnicodeDecodeError as exc:
        raise ValueError(f"config file {path} is not UTF-8 text (byte {exc.start}: {exc.reason})") from None
    except OSError as exc:  # a directory, no permission
        raise ValueError(f"config file {path} cannot be read: {exc.strerror or exc}") from None
    try:
        data = yaml.load(text, Loader=_unique_keys_loader()) or {}  # a SafeLoader: plain data only
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
        problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
        raise ValueError(f"config file {path} is not valid YAML{where}: {problem}") from None
    if not isinstance(data, dict):
        raise ValueError(f"config file {path} must hold a mapping at the top level")
    base = data.pop("base", None)
    if base is not None:
        if not isinstance(base, str) or not base.strip():
            raise ValueError(f"config file {path}: base must name a preset file beside it, got {base!r}")
        if not (path.parent / base).exists():
            raise ValueError(f"config file {path}: its base {path.parent / base} does not exist")
        data = merge(load_yaml(path.parent / base, (*_chain, path.resolve())), data)
    return data


@functools.cache
def _unique_keys_loader() -> type:
    """PyYAML's SafeLoader refusing a key given twice in one mapping (it keeps the last one
    silently: a preset edited by adding ``lr:`` under a section that had one lost a setting)."""
    import yaml

    class UniqueKeyLoader(yaml.SafeLoader):
        def construct_mapping(self, node: Any, deep: bool = False) -> dict[Any, Any]:
            seen: dict[str, int] = {}
            for key_node, _ in node.value:
                if isinstance(key_node, yaml.ScalarNode):
                    if key_node.value in seen:
                        raise yaml.constructor.ConstructorError(
                            None, None, f"key {key_node.value!r} is given twice (first at line {seen[key_node.value]})",
                            key_node.start_mark,
                        )  # fmt: skip
                    seen[key_node.value] = key_node.start_mark.line + 1
            return super().construct_mapping(node, deep)

    return UniqueKeyLoader


def int_at_least(minimum: int, maximum: int | None = None) -> Callable[[str], int]:
    """An argparse type: an integer >= ``minimum`` (and <= ``maximum``) (a count of 0 ended the
    benchmark scripts in a ``KeyError`` or ``StatisticsError`` traceback); ALFWorld's commands
    and benchmarks/ use it, and :data:`seed_arg`."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected an integer, got {text!r}") from None
        if value < minimum or (maximum is not None and value > maximum):
            span = f">= {minimum}" if maximum is None else f"from {minimum} to {maximum}"
            raise argparse.ArgumentTypeError(f"expected an integer {span}, got {value}")
        return value

    return parse


#: An argparse type of a ``--seed``: the range of a :data:`Seed` setting.
seed_arg = int_at_least(0, MAX_SEED)


def parse_overrides(args: Sequence[str]) -> dict[str, Any]:
    """``["--grpo.lr", "1e-6", "--run.name=x"]`` -> ``{"grpo": {"lr": "1e-6"}, "run": {"name": "x"}}``
    (values stay strings; :func:`from_dict` coerces them). A key given again takes the later
    value, as argparse options do (a script's overrides, then the user's)."""
    out: dict[str, Any] = {}
    i = 0
    args = list(args)
    while i < len(args):
        arg = args[i]
        if not arg.startswith("--") or len(arg) <= 2:
            raise ValueError(f"expected a --section.key override, got {arg!r}")
        key = arg[2:]
        if "=" in key:
            key, value = key.split("=", 1)
            i += 1
        else:
            if i + 1 >= len(args):
                raise ValueError(f"override {arg} has no value")
            value = args[i + 1]
            i += 2
        try:
            set_path(out, key.replace("-", "_"), value)
        except ValueError:
            raise ValueError(f"override {arg} conflicts with an earlier one") from None
    return out


def set_path(data: dict[str, Any], key: str, value: Any) -> None:
    """``data[a][b][c] = value`` for ``key`` ``"a.b.c"``; a ``ValueError`` when a section on the way holds a value."""
    node = data
    *sections, leaf = key.split(".")
    for section in sections:
        node = node.setdefault(section, {})
        if not isinstance(node, dict):
            raise ValueError(f"{key}: {section} holds a value, not a section")
    node[leaf] = value


def get_path(config: Any, key: str) -> Any:
    """``config.a.b.c`` for ``key`` ``"a.b.c"`` (a config dataclass tree)."""
    for part in key.split("."):
        config = getattr(config, part)
    return config


def describe(cls: type, prefix: str = "") -> list[tuple[str, str, str]]:
    """``(dotted name, default, help)`` for every leaf of a config tree (for ``--help``)."""
    rows = []
    hints = get_type_hints(cls)
    for f in dataclasses.fields(cls):
        name = f"{prefix}{f.name}"
        if "sections" in f.metadata:
            for section, tp in loadable_sections(f.metadata["sections"]).items():
                rows.extend(describe(tp, f"{prefix}{section}."))
            continue
        tp = hints[f.name]
        if _is_dataclass_type(tp):
            rows.extend(describe(tp, name + "."))
            continue
        if f.metadata.get("schema") is not None:
            rows.extend(describe(f.metadata["schema"], name + "."))
            continue
        if f.default is not dataclasses.MISSING:
            default = repr(f.default)
        elif f.default_factory is not dataclasses.MISSING:
            default = repr(f.default_factory())
        else:
            default = "(required)"
        rows.append((name, default, f.metadata.get("help", "")))
    return rows
