"""Seeded ALFWorld-like event streams for tests and benchmarks (no environment needed).

A tiny household simulator whose steps are recorded with the delta keys an ALFWorld rule
extractor emits, so outcomes are classified by the real Recorder. Same ``(n_events, seed)``,
same stream."""

from __future__ import annotations

import random

from memprism_ray.recorder.events import RawEvent, StateDelta
from memprism_ray.recorder.stream import EventStream

RECEPTACLES: tuple[str, ...] = (
    "cabinet 1", "cabinet 2", "cabinet 3", "cabinet 4", "countertop 1", "countertop 2", "drawer 1",
    "drawer 2", "drawer 3", "fridge 1", "microwave 1", "sinkbasin 1", "shelf 1", "shelf 2",
    "stoveburner 1", "garbagecan 1", "coffeemachine 1", "diningtable 1",
)  # fmt: skip
OPENABLE: frozenset[str] = frozenset(
    {"cabinet 1", "cabinet 2", "cabinet 3", "cabinet 4", "drawer 1", "drawer 2", "drawer 3", "fridge 1", "microwave 1"}
)
OBJECTS: tuple[str, ...] = (
    "mug 1", "mug 2", "apple 1", "knife 1", "bread 1", "egg 1", "cup 1", "plate 1", "spatula 1",
    "tomato 1", "lettuce 1", "potato 1", "saltshaker 1", "soapbottle 1", "fork 1", "pan 1",
)  # fmt: skip
GOALS: tuple[str, ...] = (
    "put a clean mug in cabinet",
    "put a hot apple in countertop",
    "put a cool tomato in diningtable",
    "put two egg in fridge",
    "put a clean plate in shelf",
    "heat some potato and put it in garbagecan",
)


def _listing(items: list[str]) -> str:
    if not items:
        return "nothing"
    words = [f"a {o}" for o in items]
    return words[0] if len(words) == 1 else ", ".join(words[:-1]) + f", and {words[-1]}"


def alfworld_like_stream(n_events: int, seed: int = 0, goal: str | None = None) -> EventStream:
    """A deterministic ALFWorld-like stream of ``n_events`` recorded steps."""
    if n_events < 0:
        raise ValueError(f"n_events must be >= 0, got {n_events}")
    rng = random.Random(seed)
    goal = goal if goal is not None else rng.choice(GOALS)
    stream = EventStream({"goal": goal, "benchmark": "alfworld", "task_id": f"synthetic-{seed}"})
    where: dict[str, str] = {o: rng.choice(RECEPTACLES) for o in OBJECTS}
    opened: dict[str, bool] = dict.fromkeys(OPENABLE, False)
    location = "middle of room"
    holding = "nothing"
    obs = f"You are in the middle of a room. Your task is to: {goal}."
    last: tuple[str, str, str] | None = None

    def contents(r: str) -> list[str]:
        return sorted(o for o, at in where.items() if at == r)

    for _ in range(n_events):
        roll = rng.random()
        here = contents(location) if location in RECEPTACLES else []
        is_open = location not in OPENABLE or opened[location]
        if last is not None and roll < 0.10:
            kind, target, extra = last  # the agent repeats itself (loops happen)
        elif roll < 0.25:
            # A careless command: often inadmissible here ("Nothing happens.").
            kind = rng.choice(("open", "close", "take", "put", "clean", "heat", "cool", "invalid"))
            target, extra = rng.choice(RECEPTACLES), rng.choice(OBJECTS)
        else:
            options = ["go", "go", "go", "go", "look"]
            if location in RECEPTACLES:
                options.append("examine")
            if location in OPENABLE:
                options.append("close" if opened[location] else "open")
            if holding == "nothing" and here and is_open:
                options += ["take", "take"]
            if holding != "nothing":
                options += ["put", "put"] if is_open and location in RECEPTACLES else []
                options.append({"sinkbasin 1": "clean", "microwave 1": "heat", "fridge 1": "cool"}.get(location, "go"))
            kind = rng.choice(options)
            target, extra = location, holding
            if kind == "go":
                target = rng.choice([r for r in RECEPTACLES if r != location])
            elif kind == "take":
                extra = rng.choice(here)
        last = (kind, target, extra)
        delta: list[StateDelta] = []
        failed = False
        if kind == "go":
            action, entity = f"go to {target}", target
            delta.append(StateDelta("agent.location", target))
            location = target
            if target in OPENABLE and not opened[target]:
                feedback = f"You arrive at {target}. The {target} is closed."
                delta.append(StateDelta(f"{target}.state", "closed"))
            else:
                found = contents(target)
                feedback = f"You arrive at {target}. On the {target}, you see {_listing(found)}."
                delta.append(StateDelta(f"{target}.contents", ", ".join(found) or "nothing"))
                delta.extend(StateDelta(f"{o}.location", target) for o in found)
        elif kind in ("open", "close"):
            action, entity = f"{kind} {target}", target
            if target != location or target not in OPENABLE or opened[target] == (kind == "open"):
                failed = True
            else:
                opened[target] = kind == "open"
                delta.append(StateDelta(f"{target}.state", "open" if kind == "open" else "closed"))
                if kind == "open":
                    found = contents(target)
                    delta.append(StateDelta(f"{target}.contents", ", ".join(found) or "nothing"))
                    delta.extend(StateDelta(f"{o}.location", target) for o in found)
            feedback = "Nothing happens." if failed else f"You {kind} the {target}."
        elif kind == "take":
            action, entity = f"take {extra} from {target}", extra
            ok = holding == "nothing" and target == location and where.get(extra) == target
            ok = ok and (target not in OPENABLE or opened[target])
            if ok:
                holding = extra
                where[extra] = "agent"
                delta += [StateDelta("agent.holding", extra), StateDelta(f"{extra}.location", "agent")]
                feedback = f"You pick up the {extra} from the {target}."
            else:
                failed, feedback = True, "Nothing happens."
        elif kind == "put":
            action, entity = f"move {extra} to {target}", extra
            ok = holding == extra and target == location and (target not in OPENABLE or opened[target])
            if ok:
                holding = "nothing"
                where[extra] = target
                delta += [StateDelta("agent.holding", "nothing"), StateDelta(f"{extra}.location", target)]
                feedback = f"You move the {extra} to the {target}."
            else:
                failed, feedback = True, "Nothing happens."
        elif kind in ("clean", "heat", "cool"):
            action, entity = f"{kind} {extra} with {target}", extra
            if holding == extra and target == location:
                state = {"clean": "clean", "heat": "hot", "cool": "cool"}[kind]
                delta.append(StateDelta(f"{extra}.state", state))
                feedback = f"You {kind} the {extra} using the {target}."
            else:
                failed, feedback = True, "Nothing happens."
        elif kind == "examine":
            action, entity = f"examine {target}", target
            found = contents(target)
            feedback = f"On the {target}, you see {_listing(found)}."
            if target == location:
                delta.append(StateDelta(f"{target}.contents", ", ".join(found) or "nothing"))
        elif kind == "look":
            action, entity = "look", "agent"
            feedback = f"You are facing the {location}. Next to it, you see nothing."
        else:
            action, entity = f"slice {extra} with knife 1", extra
            failed, feedback = True, "Nothing happens."
        raw = RawEvent(o_pre=obs, action=action, feedback=feedback, meta={"step": stream.next_t})
        stream.record(raw, entity=entity, act=action.split(" ", 1)[0], delta=delta, failed=failed)
        obs = feedback
    return stream


def random_stream(n_events: int, seed: int = 0, goal: str = "put a clean mug in cabinet") -> EventStream:
    """A deterministic stream over a tiny vocabulary for property tests: links, repeats, every
    outcome, forced outcomes and empty deltas are common."""
    if n_events < 0:
        raise ValueError(f"n_events must be >= 0, got {n_events}")
    rng = random.Random(seed)
    entities = ("mug 1", "mug 2", "cabinet 1", "cabinet 2", "drawer 1", "apple 1", "agent", "")
    acts = ("go", "take", "put", "open", "clean", "look")
    attrs = ("location", "state", "holding", "contents")
    values = ("cabinet 1", "drawer 1", "open", "closed", "clean", "mug 1", "nothing", "countertop 1")
    stream = EventStream({"goal": goal, "task_id": f"random-{seed}"})
    for _ in range(n_events):
        entity = rng.choice(entities)
        act = rng.choice(acts)
        delta = []
        for _ in range(rng.choice((0, 0, 1, 1, 2, 3))):
            owner = rng.choice((entity or "agent", "agent", rng.choice(entities) or "mug 1"))
            delta.append(StateDelta(f"{owner}.{rng.choice(attrs)}", rng.choice(values)))
        target = entity or "room"
        raw = RawEvent(o_pre="obs", action=f"{act} {target}", feedback="ok", meta={"step": stream.next_t})
        roll = rng.random()
        outcome = None if roll < 0.7 else rng.choice(("exception", "state_update", "no_observed_change"))
        stream.record(raw, entity=entity, act=act, delta=delta, failed=roll < 0.15, outcome=outcome)
    return stream
