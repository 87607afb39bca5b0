"""View space: eq. (A.1) bijection, aliases, serialisation and the structural cost."""

from __future__ import annotations

import itertools
import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from memprism_ray.view_space import (
    ALL_ACTIONS,
    FILTERS,
    GAMMAS,
    NUM_ACTIONS,
    TAU_ALIASES,
    TAUS,
    WINDOWS,
    ViewAction,
    cost,
    cost_vector,
    decision_cost_vector,
)

indices = st.integers(min_value=0, max_value=NUM_ACTIONS - 1)


def decision_cost(action: ViewAction, outcomes: list[str]) -> float:
    """``C^_t(a)`` of one action: its entry of the vector D1 records."""
    return decision_cost_vector(outcomes)[action.index]


def test_space_has_144_actions_in_index_order() -> None:
    assert NUM_ACTIONS == 144 == len(ALL_ACTIONS)
    assert [a.index for a in ALL_ACTIONS] == list(range(144))
    assert len(set(ALL_ACTIONS)) == 144
    # The enumeration order of E.4: tau, window, filter, gamma (gamma fastest).
    expected = [ViewAction(*combo) for combo in itertools.product(TAUS, WINDOWS, FILTERS, GAMMAS)]
    assert list(ALL_ACTIONS) == expected


@given(indices)
def test_index_bijection(i: int) -> None:
    a = ViewAction.from_index(i)
    assert a.index == i
    assert ViewAction.from_index(a.index) == a


@given(st.sampled_from(TAUS), st.sampled_from(WINDOWS), st.sampled_from(FILTERS), st.sampled_from(GAMMAS))
def test_index_formula(tau: str, window: str, filt: str, gamma: str) -> None:
    i_t, i_w, i_c, i_g = TAUS.index(tau), WINDOWS.index(window), FILTERS.index(filt), GAMMAS.index(gamma)
    assert ViewAction(tau, window, filt, gamma).index == ((i_t * 3 + i_w) * 4 + i_c) * 3 + i_g


def test_known_indices() -> None:
    assert ViewAction("TemporalTrace", "recent_short", "all", "coarse").index == 0
    assert ViewAction("TemporalTrace", "recent_short", "all", "fine").index == 2
    assert ViewAction("TemporalTrace", "recent_short", "exception", "coarse").index == 3
    assert ViewAction("TemporalTrace", "recent_long", "all", "coarse").index == 12
    assert ViewAction("ActionEffect", "recent_short", "all", "coarse").index == 36
    assert ViewAction("DependencyChain", "all", "no_observed_change", "fine").index == 143


@given(indices, st.sampled_from(sorted(TAU_ALIASES)))
def test_alias_read_canonical_write(i: int, alias: str) -> None:
    base = ViewAction.from_index(i)
    data = base.to_dict() | {"tau": alias}
    read = ViewAction.from_dict(data)
    assert read.tau == TAU_ALIASES[alias]
    assert read.to_dict()["tau"] in TAUS
    assert alias not in read.to_json()


@given(indices)
def test_json_round_trip(i: int) -> None:
    a = ViewAction.from_index(i)
    assert ViewAction.from_json(a.to_json()) == a
    assert ViewAction.parse(a.name) == a
    assert ViewAction.parse(str(i)) == a
    assert json.loads(a.to_json()) == {"tau": a.tau, "window": a.window, "filter": a.filter, "gamma": a.gamma}


@pytest.mark.parametrize(
    ("kwargs", "fragment"),
    [
        ({"tau": "Timeline2"}, "valid tau names: TemporalTrace, ActionEffect, EntityState, DependencyChain"),
        ({"window": "recent"}, "valid window names: recent_short, recent_long, all"),
        ({"filter": "errors"}, "valid filter names: all, exception, state_update, no_observed_change"),
        ({"gamma": "ultra"}, "valid gamma names: coarse, medium, fine"),
    ],
)
def test_unknown_names_list_valid_ones(kwargs: dict[str, str], fragment: str) -> None:
    fields = {"tau": "TemporalTrace", "window": "all", "filter": "all", "gamma": "fine"} | kwargs
    with pytest.raises(ValueError) as err:
        ViewAction(**fields)
    assert fragment in str(err.value)
    assert repr(next(iter(kwargs.values()))) in str(err.value)


def test_bad_index_and_dict_errors() -> None:
    with pytest.raises(ValueError, match="out of range"):
        ViewAction.from_index(144)
    with pytest.raises(ValueError, match="out of range"):
        ViewAction.from_index(-1)
    with pytest.raises(ValueError, match="missing"):
        ViewAction.from_dict({"tau": "TemporalTrace", "window": "all", "filter": "all"})
    with pytest.raises(ValueError, match="unexpected"):
        ViewAction.from_dict({"tau": "TemporalTrace", "window": "all", "filter": "all", "gamma": "fine", "x": 1})
    with pytest.raises(ValueError, match="not valid JSON"):
        ViewAction.from_json("{tau")


def test_cost_follows_teacher_tie_break_order() -> None:
    costs = cost_vector()
    assert len(costs) == 144 and min(costs) == 0.0 and max(costs) == 1.0
    for a, b in itertools.product(ALL_ACTIONS, repeat=2):
        wa, wb = WINDOWS.index(a.window), WINDOWS.index(b.window)
        fa, fb = int(a.filter == "all"), int(b.filter == "all")
        ga, gb = GAMMAS.index(a.gamma), GAMMAS.index(b.gamma)
        # Lexicographic: window first, then selective < all, then granularity.
        assert (cost(a) < cost(b)) == ((wa, fa, ga) < (wb, fb, gb))
    # tau never changes the cost
    for i in range(36):
        assert {cost(ALL_ACTIONS[i + 36 * k]) for k in range(4)} == {cost(ALL_ACTIONS[i])}


def test_selective_filters_cost_the_same() -> None:
    base = dict(tau="EntityState", window="recent_long", gamma="medium")
    assert cost(ViewAction(filter="exception", **base)) == cost(ViewAction(filter="no_observed_change", **base))
    assert cost(ViewAction(filter="exception", **base)) < cost(ViewAction(filter="all", **base))


def _history(n: int, seed: int = 0) -> list[str]:
    import random

    rng = random.Random(seed)
    return [rng.choice(["exception", "state_update", "no_observed_change"]) for _ in range(n)]


def test_decision_cost_is_per_decision() -> None:
    """C^_t(a) (eq. sft-loss): a range costs what it covers at this decision."""
    base = dict(tau="TemporalTrace", filter="all", gamma="medium")
    short, long_, every = (ViewAction(window=w, **base) for w in WINDOWS)
    early = _history(4)
    # With 4 events recorded every window covers the same 4: none is larger than needed.
    assert decision_cost(short, early) == decision_cost(long_, early) == decision_cost(every, early)
    late = _history(40)
    assert decision_cost(short, late) < decision_cost(long_, late) < decision_cost(every, late)
    # The same action costs more once the history has grown.
    assert decision_cost(every, early) < decision_cost(every, late)
    # A selective filter costs less than all by the events it leaves out; one that leaves
    # nothing out costs the same.
    only_exc = ["exception"] * 8
    exc = ViewAction("EntityState", "all", "exception", "fine")
    assert decision_cost(exc, only_exc) == decision_cost(ViewAction("EntityState", "all", "all", "fine"), only_exc)
    upd = ViewAction("EntityState", "all", "state_update", "fine")
    assert decision_cost(upd, only_exc) == 0.5  # scope empty: only the granularity term
    mixed = ["exception", "state_update"] * 10
    assert decision_cost(exc, mixed) == 0.5 * 10 / 50 + 0.5
    # Granularity orders coarse < medium < fine at equal scope.
    g = [decision_cost(ViewAction("ActionEffect", "recent_long", "all", gm), late) for gm in GAMMAS]
    assert g[0] < g[1] < g[2]


def test_decision_cost_vector_bounds_and_index_order() -> None:
    for n in (0, 1, 6, 7, 10, 50, 120):
        hist = _history(n, n)
        vec = decision_cost_vector(hist)
        assert len(vec) == 144 and all(0.0 <= c <= 1.0 for c in vec)
        for i in range(36):  # tau never changes the cost
            assert {vec[i + 36 * k] for k in range(4)} == {vec[i]}
    assert max(decision_cost_vector(_history(200))) == 1.0
    assert decision_cost_vector([]) == [0.25 * GAMMAS.index(a.gamma) for a in ALL_ACTIONS]


def test_decision_cost_rejects_bad_histories() -> None:
    with pytest.raises(ValueError, match="outcomes\\[1\\] is 'maybe'; valid outcome names"):
        decision_cost_vector(["exception", "maybe"])
    with pytest.raises(ValueError, match="sequence of outcome names"):
        decision_cost_vector("exception")
    with pytest.raises(ValueError, match="horizon must be an int >= 1"):
        decision_cost_vector([], horizon=0)
