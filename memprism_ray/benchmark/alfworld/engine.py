"""The real ALFWorld engine (TextWorld's ``PddlEnv`` + fast-downward), made fast by caching.

The stock engine repeats pure work on every call: TatSu re-parses templates, conditions and
grammars; ``pddl2sas`` translates a problem twice per ``load`` and again per ``reset``;
``copy_context`` deep-copies read-only entity records; every step derives every admissible
command afresh. :func:`install_engine_caches` wraps exactly those six functions: parses are
memoised (the engine's converter still runs every call), translations are kept in memory and as
SAS text on disk (keyed by content and translator version), and the command memo answers only
a template it can prove reads nothing outside its key. Transcripts are identical to the stock
engine's (``benchmarks/bench_env.py`` checks this against an unpatched process).

``fast_downward.pddl2sas`` swaps ``sys.argv``/``sys.stdout`` and is not thread-safe: use one
engine per process (the corpus builder and the Ray env workers do).
"""

from __future__ import annotations

import ast
import functools
import hashlib
import json
import threading
import weakref
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from memprism_ray.envs.base import cache_base

_LOCK = threading.Lock()
_ORIGINALS: dict[str, Callable[..., Any]] = {}
#: Hit/miss counters since the process started (the engine tests read them: each cache answers).
_STATS = {f"{what}_{kind}": 0 for what in ("parse", "translate", "command") for kind in ("hits", "misses")}
_STATS |= {"translate_disk_hits": 0, "translate_disk_errors": 0}


_SAS_FORMAT = 1


def default_sas_dir() -> Path:
    """Where translations are kept across processes, beside the embedded corpus."""
    return cache_base() / "alfworld-sas"


@functools.cache
def _translator_version() -> str:
    """Part of a translation's key: an upgraded translator never reads an older one's files."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("fast-downward-textworld")
    except PackageNotFoundError:
        return "unknown"


def _parsed_task(domain: str, problem: str) -> Any:
    """The PDDL task as ``pddl2sas`` returns it, without translating it: parsed and normalised
    (``PddlState`` reads its actions, types, objects and initial atoms, which translation does
    not change; ``tests/benchmark/alfworld/test_alfworld_engine.py`` compares them on every test game)."""
    import sys

    # The translator's ``options`` module parses ``sys.argv`` when first imported (as in
    # ``pddl2sas``, which sets it to these arguments); the caller's argv is restored.
    argv, sys.argv = sys.argv, ["translate.py", "domain", "task"]
    try:
        from fast_downward.translate import normalize
        from fast_downward.translate.pddl_parser import lisp_parser, parsing_functions
    finally:
        sys.argv = argv
    task = parsing_functions.parse_task(
        lisp_parser.parse_nested_list(domain.split("\n")), lisp_parser.parse_nested_list(problem.split("\n"))
    )
    normalize.normalize(task)
    return task


class _LRU(OrderedDict):
    """A bounded LRU whose hits count in ``_STATS[<stat>_hits]``."""

    def __init__(self, max_entries: int, stat: str) -> None:
        super().__init__()
        self.max_entries, self.hit_key = max_entries, f"{stat}_hits"

    def hit(self, key: Any) -> Any:
        value = self.get(key)
        if value is not None:
            self.move_to_end(key)
            _STATS[self.hit_key] += 1
        return value

    def put(self, key: Any, value: Any) -> Any:
        self[key] = value
        while len(self) > self.max_entries:
            self.popitem(last=False)
        return value


class _TranslationCache:
    """Bounded LRU of ``pddl2sas`` results keyed by content digest, backed by SAS text files in
    ``disk_dir`` (``None``: memory only) so that a process does not translate a game another
    process already translated. A file that does not read back whole (JSON with the SAS text
    and its SHA-256) is translated again and replaced (counted in ``translate_disk_errors``)."""

    def __init__(self, original: Callable[..., Any], max_entries: int, disk_dir: Path | None = None) -> None:
        self.original = original
        self.disk_dir = disk_dir
        self.entries = _LRU(max_entries, "translate")

    def _read(self, path: Path | None) -> str | None:
        if path is None or not path.exists():
            return None
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
            sas = data["sas"]
            if data.get("format") != _SAS_FORMAT or hashlib.sha256(sas.encode()).hexdigest() != data["sha256"]:
                raise ValueError("format or checksum mismatch")
            return sas
        except (OSError, ValueError, KeyError, TypeError, AttributeError):
            _STATS["translate_disk_errors"] += 1
            return None

    def _write(self, path: Path | None, sas: str) -> None:
        if path is None:
            return
        from memprism_ray.io_atomic import atomic_write_text

        record = {"format": _SAS_FORMAT, "sha256": hashlib.sha256(sas.encode()).hexdigest(), "sas": sas}
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            atomic_write_text(path, json.dumps(record), overwrite=True)
        except OSError:  # a read-only cache only costs the next process a translation
            _STATS["translate_disk_errors"] += 1

    def __call__(self, domain: str, problem: str, verbose: bool = False, optimize: bool = False) -> Any:
        digest = hashlib.sha256("\x00".join((domain, problem, _translator_version())).encode()).hexdigest()
        key = (digest, bool(optimize))
        hit = self.entries.hit(key)
        if hit is not None:
            return hit
        kind = "optimized" if optimize else "plain"
        path = None if self.disk_dir is None else self.disk_dir / f"{digest}-{kind}.json"
        sas = self._read(path)
        if sas is not None:
            _STATS["translate_disk_hits"] += 1
            result = (_parsed_task(domain, problem), sas)
        else:
            _STATS["translate_misses"] += 1
            result = self.original(domain, problem, verbose=verbose, optimize=optimize)
            self._write(path, result[1])
        return self.entries.put(key, result)


def _caching_parse(parser: Any, converter: Callable[[], Any], maxsize: int) -> Callable[..., Any]:
    """A drop-in ``_parse_and_convert`` that memoises ``parser.parse`` and converts afresh."""

    @functools.lru_cache(maxsize=maxsize)
    def parse(args: tuple[Any, ...], kwargs: tuple[tuple[str, Any], ...]) -> Any:
        _STATS["parse_misses"] += 1
        return parser.parse(*args, **dict(kwargs))

    def parse_and_convert(*args: Any, **kwargs: Any) -> Any:
        try:
            key = (args, tuple(sorted(kwargs.items())))
            hash(key)
        except TypeError:  # unhashable input: behave exactly like the stock function
            return converter().walk(parser.parse(*args, **kwargs))
        before = parse.cache_info().misses
        model = parse(*key)
        if parse.cache_info().misses == before:
            _STATS["parse_hits"] += 1
        return converter().walk(model)

    return parse_and_convert


def _copy_context(context: dict[str, Any]) -> dict[str, Any]:
    """``textgen.copy_context`` with shallow copies of ``variables`` and ``mapping``: their keys
    are strings / immutable placeholders and their values read-only entity records or
    immutable variables, so a deep copy is only slower."""
    return {
        "state": context["state"],
        "facts": context["facts"],
        "variables": dict(context["variables"]),
        "mapping": dict(context["mapping"]),
        "entity_infos": context["entity_infos"],
    }


_LIST_RULES = ("list_empty", "list_separator", "list_last_separator")
_UNCACHEABLE = object()


@dataclass(frozen=True)
class _TemplatePlan:
    """What a command template's derivation reads besides the grammar's list separators."""

    names: frozenset[str]  # variables its ``{...}`` expressions and queries name
    predicates: frozenset[str]  # predicates its queries read (with their ``not_`` twins)
    queries: bool  # a query rebinds variables from the mapping's entity records
    lists: bool  # ``[...]`` joins with the list separator rules


def _plan_symbols(symbols: list[Any], textgen: Any, tw_logic: Any, acc: dict[str, Any]) -> bool:
    """Walk a parsed template; False when it holds anything whose output the plan cannot bound."""
    for sym in symbols:
        if isinstance(sym, textgen.TerminalSymbol):
            continue
        if isinstance(sym, textgen.EvalSymbol):
            try:
                tree = ast.parse(str(sym.expression), mode="eval")
            except SyntaxError:
                return False
            acc["names"] |= {n.id for n in ast.walk(tree) if isinstance(n, ast.Name)}
        elif isinstance(sym, textgen.ListSymbol):
            acc["lists"] = True
            if not _plan_symbols([sym.symbol], textgen, tw_logic, acc):
                return False
        elif isinstance(sym, textgen.ConditionalSymbol):
            if sym.given:
                rule = tw_logic.Rule.parse_conjunctive_query(sym.given)
                ours = {ph.name for ph in rule.placeholders}
                acc["names"] |= ours
                acc["queries"] = True
                for pred in rule.preconditions:
                    base = pred.name.removeprefix("not_")
                    acc["predicates"] |= {base, "not_" + base}
            if not _plan_symbols([sym.expression], textgen, tw_logic, acc):
                return False
        else:  # a #rule# (conditions on any fact) or an unknown symbol
            return False
    return True


_INFO_SLOTS = ["id", "type", "name", "noun", "adj", "desc", "room_type", "definite", "indefinite", "synonyms"]


def _info_key(info: Any, info_type: type | None) -> Any:
    """An entity record as a hashable value (``None`` stays ``None``); ``_UNCACHEABLE`` for
    anything that is not ``info_type`` (``EntityInfo``, or ``None`` when its slots are not the
    ones this module knows)."""
    if info is None:
        return None
    if info_type is None or type(info) is not info_type:
        return _UNCACHEABLE
    values = [getattr(info, slot) for slot in _INFO_SLOTS]
    if isinstance(values[-1], list):  # synonyms
        values[-1] = tuple(values[-1])
    return tuple(values)


class _CommandMemo:
    """``ContextSensitiveGrammar.derive`` memoised for command templates; grammars and templates
    it cannot bound go to the stock derivation."""

    def __init__(self, original: Callable[..., str], max_entries: int) -> None:
        from textworld.generator.game import EntityInfo

        self.original = original
        # Checked once, not per key: a TextWorld whose records hold other fields is not keyed.
        self.info_type = EntityInfo if list(EntityInfo.__slots__) == _INFO_SLOTS else None
        self.entries = _LRU(max_entries, "command")
        self.plans: dict[str, _TemplatePlan | None] = {}
        self.lists: weakref.WeakKeyDictionary[Any, tuple[str, ...] | None] = weakref.WeakKeyDictionary()
        # One object per distinct fact set, so that thousands of keys share the (mostly
        # static: receptacles do not move) facts of a game instead of each holding a copy.
        self.fact_sets: dict[frozenset[Any], frozenset[Any]] = {}

    def plan(self, start: str) -> _TemplatePlan | None:
        if start not in self.plans:
            import textworld.envs.pddl.textgen as textgen
            import textworld.logic as tw_logic

            acc: dict[str, Any] = {"names": set(), "predicates": set(), "queries": False, "lists": False}
            try:
                symbols = textgen._parse_and_convert(start, rule_name="symbols")
                ok = _plan_symbols(list(symbols), textgen, tw_logic, acc)
            except Exception:  # the stock derivation raises its own error for this template
                ok = False
            self.plans[start] = (
                _TemplatePlan(frozenset(acc["names"]), frozenset(acc["predicates"]), acc["queries"], acc["lists"])
                if ok
                else None
            )
        return self.plans[start]

    def list_texts(self, grammar: Any) -> tuple[str, ...] | None:
        """The list separators' text when each is one unconditional rule of terminals."""
        if grammar not in self.lists:
            import textworld.envs.pddl.textgen as textgen

            texts: list[str] | None = []
            for name in _LIST_RULES:
                rules = grammar._rules.get(name) or []
                first = rules[0] if rules else None
                if (
                    first is None
                    or first.condition
                    or any(not isinstance(x, textgen.TerminalSymbol) for x in first.rhs)
                ):
                    texts = None
                    break
                texts.append("".join(map(str, first.rhs)))
            self.lists[grammar] = tuple(texts) if texts is not None else None
        return self.lists[grammar]

    def key(self, grammar: Any, start: str, context: dict[str, Any]) -> Any:
        plan = self.plan(start)
        if plan is None or not context:
            return None
        lists = self.list_texts(grammar) if plan.lists else ()
        if lists is None:
            return None
        variables, mapping, infos = context["variables"], context["mapping"], context["entity_infos"]
        named = tuple((n, _info_key(variables.get(n), self.info_type)) for n in sorted(plan.names))
        if plan.queries:
            # the query's assignments carry the whole mapping, and rebind every placeholder's
            # variable to its entity record: both are read
            bound = tuple((ph, var, _info_key(infos.get(var.name), self.info_type)) for ph, var in mapping.items())
            state = context["state"]
            found = frozenset(f for sig, fs in state._facts.items() if sig.name in plan.predicates for f in fs)
            if len(self.fact_sets) > 4 * self.entries.max_entries:
                self.fact_sets.clear()
            facts = self.fact_sets.setdefault(found, found)
        else:
            bound, facts = (), frozenset()
        if any(k is _UNCACHEABLE for _, k in named) or any(k is _UNCACHEABLE for *_, k in bound):
            return None
        return (start, lists, named, bound, facts)

    def __call__(self, grammar: Any, start: str, context: dict[str, Any] | None = None) -> str:
        context = context or {}
        try:
            key = self.key(grammar, start, context)
            if key is not None:
                hash(key)
        except (KeyError, AttributeError, TypeError):
            key = None
        if key is None:
            return self.original(grammar, start, context)
        hit = self.entries.hit(key)
        if hit is not None:
            return hit
        _STATS["command_misses"] += 1
        return self.entries.put(key, self.original(grammar, start, context))


# A game's commands differ by the agent's place (``go to`` binds it): 12 games x 8 random
# 25-step episodes left 4,163 entries (about 350 a game, 92% hits, 6.7 MB deep size with the
# shared engine objects counted), so 16384 hold the 48 training games in under 27 MB.
_MEMO_ENTRIES = 16384
_MEMO: _CommandMemo | None = None


def install_engine_caches(
    max_translations: int = 128, *, command_memo: bool = True, sas_dir: str | Path | None = "default"
) -> None:
    """Install the caches (idempotent). ``max_translations`` bounds the translations kept in
    memory (two per game); ``sas_dir`` keeps them on disk for other processes
    (``"default"``: :func:`default_sas_dir`; ``None``: memory only). ``command_memo=False``
    leaves command derivation stock (``benchmarks/bench_env.py`` measures the memo with it);
    the memo's entries outlive an uninstall, as they stay valid."""
    global _MEMO
    import fast_downward
    import textworld.envs.pddl.logic as pddl_logic
    import textworld.envs.pddl.textgen as textgen
    import textworld.logic as tw_logic

    with _LOCK:
        if _ORIGINALS:
            return
        _ORIGINALS["textgen"] = textgen._parse_and_convert
        _ORIGINALS["tw_logic"] = tw_logic._parse_and_convert
        _ORIGINALS["pddl_logic"] = pddl_logic._parse_and_convert
        _ORIGINALS["pddl2sas"] = fast_downward.pddl2sas
        _ORIGINALS["copy_context"] = textgen.copy_context
        _ORIGINALS["derive"] = textgen.ContextSensitiveGrammar.derive
        textgen._parse_and_convert = _caching_parse(textgen._PARSER, textgen._Converter, 4096)
        tw_logic._parse_and_convert = _caching_parse(tw_logic._PARSER, tw_logic._ModelConverter, 4096)
        pddl_logic._parse_and_convert = _caching_parse(pddl_logic._PARSER, pddl_logic._ModelConverter, 64)
        disk = default_sas_dir() if sas_dir == "default" else (Path(sas_dir) if sas_dir is not None else None)
        fast_downward.pddl2sas = _TranslationCache(_ORIGINALS["pddl2sas"], max_translations, disk)
        textgen.copy_context = _copy_context
        if command_memo:
            if _MEMO is None:
                _MEMO = _CommandMemo(_ORIGINALS["derive"], _MEMO_ENTRIES)
            memo = _MEMO
            textgen.ContextSensitiveGrammar.derive = lambda self, start, context={}: memo(self, start, context)


def uninstall_engine_caches() -> None:
    """Restore the stock functions (used by tests and the benchmark's control arm)."""
    import fast_downward
    import textworld.envs.pddl.logic as pddl_logic
    import textworld.envs.pddl.textgen as textgen
    import textworld.logic as tw_logic

    with _LOCK:
        if not _ORIGINALS:
            return
        textgen._parse_and_convert = _ORIGINALS.pop("textgen")
        tw_logic._parse_and_convert = _ORIGINALS.pop("tw_logic")
        pddl_logic._parse_and_convert = _ORIGINALS.pop("pddl_logic")
        fast_downward.pddl2sas = _ORIGINALS.pop("pddl2sas")
        textgen.copy_context = _ORIGINALS.pop("copy_context")
        textgen.ContextSensitiveGrammar.derive = _ORIGINALS.pop("derive")


def packaged_logic() -> tuple[Path, Path]:
    """The PDDL domain and text grammar shipped in the alfworld wheel (found from the package
    folder: importing ``alfworld.info`` sets ``ALFWORLD_DATA`` as a side effect)."""
    import alfworld

    data = Path(alfworld.__file__).parent / "data"
    return data / "alfred.pddl", data / "alfred.twl2"


def make_engine(*, facts: bool = False, expert: bool = False, expert_seed: int = 0) -> Any:
    """One stock wrapper stack, as ``AlfredTWEnv.init_env`` builds it for a single game:
    ``PddlEnv`` -> ``AlfredDemangler(shuffle=False)`` -> ``AlfredInfos`` [-> the handcoded
    expert with the move/put fix, which needs ``facts``]. The gym batching, step ``Limit`` and
    ``Filter`` wrappers of the stock path only shape return values."""
    import textworld
    from alfworld.agents.environment.alfred_tw_env import AlfredDemangler, AlfredInfos
    from textworld.envs.pddl import PddlEnv

    infos = textworld.EnvInfos(won=True, admissible_commands=True, extras=["gamefile"], facts=facts or expert)
    env: Any = PddlEnv(infos)
    env = AlfredDemangler(env, shuffle=False)
    env = AlfredInfos(env)
    if expert:
        from memprism_ray.benchmark.alfworld.expert import FixedAlfredExpert

        env = FixedAlfredExpert(env, seed=expert_seed)
    return env
