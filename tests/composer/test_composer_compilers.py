"""The four compilers and the view-specific gamma behaviour (appendix E.2 view teacher)."""

from __future__ import annotations

import itertools
from collections import Counter

from hypothesis import given, settings
from hypothesis import strategies as st

from memprism_ray.composer import SelectedEvent, compose, select
from memprism_ray.composer.compilers import compile_dependency, compile_effect, compile_state, compile_temporal
from memprism_ray.composer.structures import (
    ActionEffect,
    DependencyChain,
    EntityState,
    LinkKind,
    TemporalTrace,
    TraceGap,
    TraceRun,
)
from memprism_ray.recorder import EventStream, Outcome, RawEvent
from memprism_ray.testing.synthetic_streams import alfworld_like_stream, random_stream
from memprism_ray.view_space import FILTERS, TAUS, WINDOWS, ViewAction

EXC, UPD, NOC = Outcome.EXCEPTION, Outcome.STATE_UPDATE, Outcome.NO_OBSERVED_CHANGE
scopes = st.tuples(st.sampled_from(WINDOWS), st.sampled_from(FILTERS))
goals = st.sampled_from(["put a clean mug in cabinet", "", "open the drawer"])


def selection(n: int, seed: int, tau: str, scope: tuple[str, str], goal: str, gamma: str = "fine"):
    return select(random_stream(n, seed), ViewAction(tau, scope[0], scope[1], gamma), goal)


def covered_ts(entries) -> list[int]:
    """Every event an entry stands for, in entry order."""
    out: list[int] = []
    for e in entries:
        if isinstance(e, SelectedEvent):
            out.append(e.event.t)
        elif isinstance(e, TraceRun):
            out.extend(range(e.first.t, e.first.t + e.count))
        else:
            out.extend(range(e.first_t, e.first_t + e.count))
    return out


@settings(max_examples=120, deadline=None)
@given(n=st.integers(0, 50), seed=st.integers(0, 5000), scope=scopes, goal=goals)
def test_temporal_trace_gammas(n: int, seed: int, scope: tuple[str, str], goal: str) -> None:
    sel = selection(n, seed, "TemporalTrace", scope, goal)
    items = sel.items
    fine, medium, coarse = (compile_temporal(sel, g) for g in ("fine", "medium", "coarse"))
    assert fine.entries == items
    assert len(fine.entries) >= len(medium.entries) >= len(coarse.entries)
    pos = {it.event.t: k for k, it in enumerate(items)}
    for trace in (medium, coarse):
        # Every selected event is represented exactly once, in time order (runs/gaps stand
        # for consecutive selected events).
        flat: list[int] = []
        for e in trace.entries:
            if isinstance(e, SelectedEvent):
                flat.append(pos[e.event.t])
            elif isinstance(e, TraceRun):
                assert e.count >= 2 and pos[e.last.t] - pos[e.first.t] + 1 == e.count
                assert all(items[k].event.outcome is e.outcome for k in range(pos[e.first.t], pos[e.last.t] + 1))
                flat.extend(range(pos[e.first.t], pos[e.last.t] + 1))
            else:
                assert isinstance(e, TraceGap) and e.count >= 2
                first = pos[e.first_t]
                flat.extend(range(first, first + e.count))
                assert dict(e.histogram) == Counter(items[k].event.outcome for k in range(first, first + e.count)) | {
                    o: 0
                    for o in (EXC, UPD, NOC)
                    if o not in {items[k].event.outcome for k in range(first, first + e.count)}
                }
        assert flat == list(range(len(items)))
    # medium keeps every state_update and exception as its own entry; runs are no-change only
    shown = {e.event.t for e in medium.entries if isinstance(e, SelectedEvent)}
    assert {it.event.t for it in items if it.event.outcome is not NOC} <= shown
    assert all(e.outcome is NOC for e in medium.entries if isinstance(e, TraceRun))
    assert not any(isinstance(e, TraceGap) for e in medium.entries)
    # coarse keeps the first and latest events, outcome transitions and first distinct failures
    if items:
        kept = [e.event.t for e in coarse.entries if isinstance(e, SelectedEvent)]
        runs = [e for e in coarse.entries if isinstance(e, TraceRun)]
        first_last = {items[0].event.t, items[-1].event.t}
        for t in first_last:
            assert t in kept or any(r.first.t == t or r.last.t == t for r in runs)
        for k in range(1, len(items)):
            if items[k].event.outcome is not items[k - 1].event.outcome:
                t = items[k].event.t
                assert t in kept or any(r.first.t == t for r in runs)
        failed = {it.event.action for it in items if it.event.outcome is EXC}
        shown_failures = {
            e.event.action for e in coarse.entries if isinstance(e, SelectedEvent) and e.event.outcome is EXC
        }
        assert failed == shown_failures


@settings(max_examples=120, deadline=None)
@given(n=st.integers(0, 50), seed=st.integers(0, 5000), scope=scopes, goal=goals)
def test_action_effect_gammas(n: int, seed: int, scope: tuple[str, str], goal: str) -> None:
    sel = selection(n, seed, "ActionEffect", scope, goal)
    by_key: dict[tuple[str, str], list[SelectedEvent]] = {}
    for it in sel.items:
        by_key.setdefault((it.event.act, it.event.entity), []).append(it)
    views = {g: compile_effect(sel, g) for g in ("coarse", "medium", "fine")}
    for gamma, view in views.items():
        assert {(g.act, g.entity) for g in view.groups} == set(by_key)
        assert [g.latest_t for g in view.groups] == sorted(g.latest_t for g in view.groups)
        for g in view.groups:
            its = by_key[(g.act, g.entity)]
            assert g.count == len(its)
            assert dict(g.histogram) == {o: sum(1 for it in its if it.event.outcome is o) for o in (EXC, UPD, NOC)}
            assert [its[k - 1] for k in g.numbers] == list(g.attempts)
            nums = set(g.numbers)
            outcomes = [it.event.outcome for it in its]
            must = {1, len(its)}
            must |= {outcomes.index(o) + 1 for o in (UPD, EXC) if o in outcomes}
            assert must <= nums
            if gamma == "medium":
                assert {k + 1 for k in range(1, len(its)) if outcomes[k] is not outcomes[k - 1]} <= nums
                assert {len(its), max(1, len(its) - 1)} <= nums
            if gamma == "fine":
                assert nums == set(range(1, len(its) + 1))
    for gc, gm, gf in zip(views["coarse"].groups, views["medium"].groups, views["fine"].groups, strict=False):
        assert set(gc.numbers) <= set(gm.numbers) <= set(gf.numbers)
    assert views["fine"].entry_count >= views["medium"].entry_count >= views["coarse"].entry_count


@settings(max_examples=120, deadline=None)
@given(n=st.integers(0, 50), seed=st.integers(0, 5000), scope=scopes, goal=goals)
def test_entity_state_gammas(n: int, seed: int, scope: tuple[str, str], goal: str) -> None:
    sel = selection(n, seed, "EntityState", scope, goal)
    updates: dict[str, list[tuple[str, int]]] = {}
    owner: dict[str, str] = {}
    for it in sel.items:
        for d in it.event.deltas:
            updates.setdefault(d.key, []).append((d.value, it.event.t))
            owner[d.key] = d.entity
    views = {g: compile_state(sel, g) for g in ("coarse", "medium", "fine")}
    for gamma, view in views.items():
        chains = {c.key: (r.entity, c) for r in view.rows for c in r.chains}
        assert set(chains) == set(updates)
        assert len({r.entity for r in view.rows}) == len(view.rows)
        for key, (entity, chain) in chains.items():
            assert entity == owner[key]
            full = updates[key]
            assert chain.total == len(full)
            got = [(v.value, v.t) for v in chain.values]
            distinct = [full[0]] + [u for p, u in itertools.pairwise(full) if u[0] != p[0]]
            if gamma == "fine":
                assert got == full  # every update, in time order, with its source step
            elif gamma == "medium":
                assert got == distinct
            else:
                assert got[0] == distinct[0] and got[-1] == distinct[-1] and set(got) <= set(distinct)
                assert chain.elided == len(distinct) - len(got) and len(got) <= 4
    for rc, rm, rf in zip(views["coarse"].rows, views["medium"].rows, views["fine"].rows, strict=False):
        for cc, cm, cf in zip(rc.chains, rm.chains, rf.chains, strict=False):
            assert set(cc.values) <= set(cm.values) <= set(cf.values)
    assert views["fine"].entry_count >= views["medium"].entry_count >= views["coarse"].entry_count


@settings(max_examples=150, deadline=None)
@given(n=st.integers(0, 60), seed=st.integers(0, 5000), scope=scopes, goal=goals)
def test_dependency_chain(n: int, seed: int, scope: tuple[str, str], goal: str) -> None:
    stream = random_stream(n, seed)
    sel = select(stream, ViewAction("DependencyChain", scope[0], scope[1], "fine"), goal)
    chains = {g: compile_dependency(sel, g) for g in ("coarse", "medium", "fine")}
    for gamma, cap in (("coarse", 6), ("medium", 8), ("fine", 10)):
        chain = chains[gamma]
        assert chain.cap == cap and len(chain.links) <= cap
        if n == 0:
            assert chain.links == ()
            continue
        kinds = [lk.kind for lk in chain.links]
        assert kinds[0] is LinkKind.ANCHOR and chain.links[0].item.event.t == n
        if n >= 2:
            assert kinds[1] is LinkKind.PREVIOUS and chain.links[1].item.event.t == n - 1
        anchor = chain.links[0].item.event.link_entities
        rest = chain.links[2:] if n >= 2 else chain.links[1:]
        linked = [lk for lk in rest if lk.kind in (LinkKind.SAME_ENTITY, LinkKind.SHARED_KEY)]
        context = [lk for lk in rest if lk.kind is LinkKind.CONTEXT]
        assert rest == (*linked, *context), "linked events come before plain context"
        assert all(set(lk.via) == set(lk.item.event.link_entities & anchor) and lk.via for lk in linked)
        assert all(not (lk.item.event.link_entities & anchor) for lk in context)
        for group in (linked, context):
            ts = [lk.item.event.t for lk in group]
            assert ts == sorted(ts, reverse=True), "most recent first within a tier"
        # Nothing that should have been linked was passed over for a lower-priority event.
        candidates = [it for it in sel.items if it.event.t < (n - 1 if n >= 2 else n)]
        linkable = [it for it in candidates if it.event.link_entities & anchor]
        assert len(linked) == min(len(linkable), cap - (2 if n >= 2 else 1))
        assert [lk.item.event.t for lk in linked] == sorted((it.event.t for it in linkable), reverse=True)[
            : len(linked)
        ]
        assert chain.candidates == len(candidates)
        expected = min(cap, len(candidates) + (2 if n >= 2 else 1))
        assert len(chain.links) == expected
    assert [lk.item for lk in chains["coarse"].links] == [lk.item for lk in chains["fine"].links][:6]
    assert chains["fine"].entry_count >= chains["medium"].entry_count >= chains["coarse"].entry_count


def test_shared_entities_and_shared_agent_keys_link() -> None:
    """Paper "Composer", DependencyChain: "Composer retrieves events that share entities,
    state keys, or nearby time steps"; appendix D: "same-entity or shared
    state/delta-key-prefix events". Events that share only ``agent.*`` keys with the
    anchor link too."""
    s = EventStream()

    def step(action: str, entity: str, delta: list[tuple[str, str]], failed: bool = False) -> None:
        s.record(RawEvent("o", action, "f"), entity=entity, act=action.split()[0], delta=delta, failed=failed)

    step("go to cabinet 1", "cabinet 1", [("agent.location", "cabinet 1"), ("cabinet 1.state", "closed")])  # 1
    step("take mug 1 from countertop 1", "mug 1", [("agent.holding", "mug 1"), ("mug 1.location", "agent")])  # 2
    step("go to drawer 2", "drawer 2", [("agent.location", "drawer 2")])  # 3
    step("examine drawer 2", "drawer 2", [])  # 4
    step("go to cabinet 1", "cabinet 1", [("agent.location", "cabinet 1")])  # 5
    step("put mug 1 in cabinet 1", "mug 1", [("cabinet 1.contents", "mug 1")], failed=True)  # 6 anchor
    chain = compose(s, "DependencyChain/all/all/fine", "").body
    assert isinstance(chain, DependencyChain)
    got = [(lk.item.event.t, lk.kind, lk.via) for lk in chain.links]
    # The anchor has no agent key: agent-only events stay context.
    assert got == [
        (6, LinkKind.ANCHOR, ()),
        (5, LinkKind.PREVIOUS, ()),
        (2, LinkKind.SAME_ENTITY, ("mug 1",)),
        (1, LinkKind.SHARED_KEY, ("cabinet 1",)),
        (4, LinkKind.CONTEXT, ()),
        (3, LinkKind.CONTEXT, ()),
    ]
    step("examine cabinet 3", "cabinet 3", [])  # 7
    step("go to sinkbasin 1", "sinkbasin 1", [("agent.location", "sinkbasin 1")])  # 8 anchor
    chain = compose(s, "DependencyChain/all/all/fine", "").body
    assert isinstance(chain, DependencyChain)
    got = [(lk.item.event.t, lk.kind, lk.via) for lk in chain.links]
    assert got == [
        (8, LinkKind.ANCHOR, ()),
        (7, LinkKind.PREVIOUS, ()),
        (5, LinkKind.SHARED_KEY, ("agent",)),
        (3, LinkKind.SHARED_KEY, ("agent",)),
        (2, LinkKind.SHARED_KEY, ("agent",)),
        (1, LinkKind.SHARED_KEY, ("agent",)),
        (6, LinkKind.CONTEXT, ()),
        (4, LinkKind.CONTEXT, ()),
    ]


def test_every_view_type_compiles_on_a_long_stream() -> None:
    stream = alfworld_like_stream(400, 3)
    types = {"TemporalTrace": TemporalTrace, "ActionEffect": ActionEffect, "EntityState": EntityState}
    types["DependencyChain"] = DependencyChain
    for tau in TAUS:
        counts = []
        for gamma in ("coarse", "medium", "fine"):
            view = compose(stream, ViewAction(tau, "all", "all", gamma))
            assert isinstance(view.body, types[tau])
            assert view.n_stream == 400 and view.n_selected == 400 and view.goal == stream.meta["goal"]
            counts.append(view.entry_count)
            assert compose(stream, ViewAction(tau, "all", "all", gamma)) == view  # deterministic
        assert counts[0] <= counts[1] <= counts[2]
        if tau != "DependencyChain":
            assert counts[0] < counts[2], f"{tau}: coarse should compress a 400-event history"
