"""Normalised terms for goal matching (paper appendix D.3: Composer "restores events whose
normalized terms directly match the task goal").

Goals and event text are folded the same way (instance numbers dropped, plurals folded), so
even an imperfect stem matches itself; goal terms also drop stopwords and generic verbs.

Nothing here is cached: an lru cache on ``text_terms`` bought 1.09-1.16x of a whole
decision's compose + render at 10-50 events (``benchmarks/bench_views.py`` docstring).
"""

from __future__ import annotations

import re

_TOKEN = re.compile(r"[a-z0-9]+")


def _words(text: str) -> frozenset[str]:
    return frozenset(text.split())


STOPWORDS: frozenset[str] = _words(
    """
    a an the some any this that these those it its them they their there here your you my our his her
    of in on into onto to from at by with without for and or then than under over inside outside near
    next up down out off is are be been being was were am all both each every other another same
    one two three four five six seven eight nine ten first second third few several
    task please can could should would will shall must may might do does did done not no
    """
)

GENERIC_VERBS: frozenset[str] = _words(
    """
    put place move take get find go pick bring carry look examine check use make set keep leave drop
    give grab see locate search walk need want try turn select click type choose open close
    """
)

_IRREGULAR: dict[str, str] = dict(
    pair.split(":")  # type: ignore[misc]
    for pair in _words(
        "knives:knife leaves:leaf shelves:shelf loaves:loaf halves:half people:person children:child "
        "mice:mouse feet:foot teeth:tooth shoes:shoe"
    )
)


def fold(token: str) -> str:
    """Fold a lower-case token to its singular stem (see the module docstring)."""
    if token in _IRREGULAR:
        return _IRREGULAR[token]
    n = len(token)
    if n > 3 and token.endswith("ies"):
        return token[:-3] + "y"
    if n > 3 and token.endswith(("sses", "xes", "zzes", "ches", "shes", "oes")):
        return token[:-2]
    if n > 2 and token.endswith("s") and not token.endswith(("ss", "us", "is")):
        return token[:-1]
    return token


def text_terms(text: str) -> frozenset[str]:
    """Folded content tokens of ``text`` with instance numbers stripped (stopwords kept:
    goal terms never contain them, so they cannot cause a match)."""
    return frozenset(fold(tok) for tok in _TOKEN.findall(text.lower()) if not tok.isdigit())


def goal_terms(goal: str) -> frozenset[str]:
    """The normalised terms of a task goal: folded tokens minus stopwords, generic verbs
    and instance numbers. ``goal_terms("put a clean mug in cabinet 2") == {"clean", "mug",
    "cabinet"}``."""
    out = set()
    for tok in _TOKEN.findall(goal.lower()):
        if tok.isdigit() or tok in STOPWORDS or tok in GENERIC_VERBS:
            continue
        folded = fold(tok)
        if folded in STOPWORDS or folded in GENERIC_VERBS:
            continue
        out.add(folded)
    return frozenset(out)
