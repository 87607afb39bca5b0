"""The real ALFWorld engine (TextWorld's ``PddlEnv`` + fast-downward), made fast by caching.

The stock engine repeats pure work on every call:

* every step derives each admissible command's template and feedback rule with the text
  grammar, and every derivation re-parses its template with TatSu
  (``textworld.envs.pddl.textgen._parse_and_convert``); every grammar condition is
  re-parsed as a conjunctive query (``textworld.logic._parse_and_convert``);
* every ``load`` re-parses the whole grammar document
  (``textworld.envs.pddl.logic._parse_and_convert``);
* the PDDL problem is translated by ``fast_downward.pddl2sas`` twice per ``load`` and twice
  again per ``reset``;
* every derivation step copies its context with ``textgen.copy_context``, which deep-copies
  the entity records (``EntityInfo``) and the immutable ``Placeholder``/``Variable`` keys;
  this copying is most of a step's time in large rooms.

:func:`install_engine_caches` wraps exactly those five functions. The three parsers keep
the TatSu parse (the expensive part) keyed by the input text and run the engine's own
converter on every call, so callers still get fresh objects they may mutate. The
translation is keyed by the SHA-256 of domain and problem text, so two games never share a
result unless their PDDL is byte-identical; the translated task is only read by
``PddlState``. The context copy keeps the engine's dict copies but shares the entity
records, which derivation only reads (``EvalSymbol`` evaluates ``o.name``-style
expressions; nothing assigns to an ``EntityInfo`` after ``load``). Transcripts are therefore
identical to the stock engine's
(``benchmarks/bench_env.py`` checks this against an unpatched process).

``fast_downward.pddl2sas`` swaps ``sys.argv``/``sys.stdout`` and is not thread-safe: use one
engine per process (the corpus builder and the Ray env workers do).
"""

from __future__ import annotations

import functools
import hashlib
import threading
from collections import OrderedDict
from collections.abc import Callable
from pathlib import Path
from typing import Any

_LOCK = threading.Lock()
_ORIGINALS: dict[str, Callable[..., Any]] = {}
_STATS = {"parse_hits": 0, "parse_misses": 0, "translate_hits": 0, "translate_misses": 0}


class _TranslationCache:
    """Bounded LRU of ``pddl2sas`` results keyed by content digest."""

    def __init__(self, original: Callable[..., Any], max_entries: int) -> None:
        self.original = original
        self.max_entries = max_entries
        self.entries: OrderedDict[tuple[str, bool], Any] = OrderedDict()

    def __call__(self, domain: str, problem: str, verbose: bool = False, optimize: bool = False) -> Any:
        digest = hashlib.sha256(domain.encode() + b"\x00" + problem.encode()).hexdigest()
        key = (digest, bool(optimize))
        hit = self.entries.get(key)
        if hit is not None:
            self.entries.move_to_end(key)
            _STATS["translate_hits"] += 1
            return hit
        _STATS["translate_misses"] += 1
        result = self.original(domain, problem, verbose=verbose, optimize=optimize)
        self.entries[key] = result
        while len(self.entries) > self.max_entries:
            self.entries.popitem(last=False)
        return result


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

    parse_and_convert.cache = parse  # type: ignore[attr-defined]
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


def install_engine_caches(max_translations: int = 128) -> None:
    """Install the caches (idempotent). ``max_translations`` bounds the kept translations
    (two per game); older games are translated again when they come back."""
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
        textgen._parse_and_convert = _caching_parse(textgen._PARSER, textgen._Converter, 4096)
        tw_logic._parse_and_convert = _caching_parse(tw_logic._PARSER, tw_logic._ModelConverter, 4096)
        pddl_logic._parse_and_convert = _caching_parse(pddl_logic._PARSER, pddl_logic._ModelConverter, 64)
        fast_downward.pddl2sas = _TranslationCache(_ORIGINALS["pddl2sas"], max_translations)
        textgen.copy_context = _copy_context


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


def engine_caches_installed() -> bool:
    return bool(_ORIGINALS)


def engine_cache_stats() -> dict[str, int]:
    """Hit/miss counters since the process started (for benchmarks and logs)."""
    return dict(_STATS)


def packaged_logic() -> tuple[Path, Path]:
    """The PDDL domain and text grammar shipped in the alfworld wheel.

    Located from the package folder rather than ``alfworld.info``, whose import sets
    ``ALFWORLD_DATA`` to ``~/.cache/alfworld`` in the process environment as a side effect.
    """
    import alfworld

    data = Path(alfworld.__file__).parent / "data"
    return data / "alfred.pddl", data / "alfred.twl2"


def make_engine(*, facts: bool = False, expert: bool = False) -> Any:
    """One stock wrapper stack, as ``AlfredTWEnv.init_env`` builds it for a single game:
    ``PddlEnv`` -> ``AlfredDemangler(shuffle=False)`` -> ``AlfredInfos`` [-> expert].

    ``expert=True`` adds the handcoded expert with the move/put fix
    (:class:`~memprism_ray.envs.alfworld.expert.FixedAlfredExpert`), which needs ``facts``.
    The gym batching, step ``Limit`` and ``Filter`` wrappers of the stock path only shape
    return values; the agent loop enforces the step limit.
    """
    import textworld
    from alfworld.agents.environment.alfred_tw_env import AlfredDemangler, AlfredInfos
    from textworld.envs.pddl import PddlEnv

    infos = textworld.EnvInfos(won=True, admissible_commands=True, extras=["gamefile"], facts=facts or expert)
    env: Any = PddlEnv(infos)
    env = AlfredDemangler(env, shuffle=False)
    env = AlfredInfos(env)
    if expert:
        from memprism_ray.envs.alfworld.expert import FixedAlfredExpert

        env = FixedAlfredExpert(env)
    return env
