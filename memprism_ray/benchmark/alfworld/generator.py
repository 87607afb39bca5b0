"""ALFWorld-style games from the layouts packaged in the ``alfworld`` wheel (issue 3, item 1).

Games of the official structure (a ``game.tw-pddl`` with domain, grammar and PDDL problem, and
a ``traj_data.json``), written offline: receptacles with a vetted pose (``-openable.json``),
objects placed where ALFRED's ``VAL_RECEPTACLE_OBJECTS`` allows, properties from
``VAL_ACTION_OBJECTS``, goals from ALFRED's ``goal_library`` (templates picked by a local seeded
generator), the agent on a reachable floor point. Task constraints follow ALFRED's sampler
(``get_filter_crit``, ``GOALS_VALID``); look-at uses a DeskLamp (FloorLamps have no parent
receptacle, so the look-at goal cannot hold); the target receptacle type never holds the target
object at the start (the pick-two rule, for all tasks: no game is won at reset); the object to
clean / heat / cool never starts in the sink / microwave / fridge.

Not the ALFWorld benchmark: only the official download has THOR's real placements, every
receptacle instance, the human goal annotations and the fixed splits.
"""

from __future__ import annotations

import functools
import json
import random
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from memprism_ray.benchmark.alfworld.layouts import SceneLayout, load_scene, receptacle_type

#: ALFWorld's six task types, in the order of its ``TASK_TYPES`` ids 1..6.
TASK_TYPES: tuple[str, ...] = (
    "pick_and_place_simple",
    "look_at_obj_in_light",
    "pick_clean_then_place_in_recep",
    "pick_heat_then_place_in_recep",
    "pick_cool_then_place_in_recep",
    "pick_two_obj_and_place",
)

#: Room types each task may use (ALFRED ``constants.GOALS_VALID``).
TASK_ROOMS: dict[str, frozenset[str]] = {
    "pick_and_place_simple": frozenset({"Kitchen", "LivingRoom", "Bathroom", "Bedroom"}),
    "pick_two_obj_and_place": frozenset({"Kitchen", "LivingRoom", "Bathroom", "Bedroom"}),
    "look_at_obj_in_light": frozenset({"LivingRoom", "Bedroom"}),
    "pick_clean_then_place_in_recep": frozenset({"Kitchen", "Bathroom"}),
    "pick_heat_then_place_in_recep": frozenset({"Kitchen"}),
    "pick_cool_then_place_in_recep": frozenset({"Kitchen"}),
}

#: The receptacle type whose action a task needs, and which the target object must not start in.
TASK_APPLIANCE: dict[str, str] = {
    "pick_clean_then_place_in_recep": "SinkBasin",
    "pick_heat_then_place_in_recep": "Microwave",
    "pick_cool_then_place_in_recep": "Fridge",
}

#: Object property a task's target must have (ALFRED ``VAL_ACTION_OBJECTS`` key).
TASK_PROPERTY: dict[str, str] = {
    "pick_clean_then_place_in_recep": "Cleanable",
    "pick_heat_then_place_in_recep": "Heatable",
    "pick_cool_then_place_in_recep": "Coolable",
}

#: Where a DeskLamp may stand. ALFRED has no placement table for lamps (THOR places them);
#: these are the furniture types desk lamps stand on in the THOR bedrooms and living rooms.
LAMP = "DeskLamp"
LAMP_RECEPTACLES: frozenset[str] = frozenset({"Desk", "SideTable", "Dresser", "Shelf", "CoffeeTable", "DiningTable"})

#: Movable receptacles are objects in the ALFWorld domain (``isReceptacleObject``).
OPENABLE_RECEPTACLES: frozenset[str] = frozenset({"Fridge", "Cabinet", "Microwave", "Drawer", "Safe"})

#: Probability of 1, 2, 3 instances of a non-target object type.
_INSTANCE_WEIGHTS: tuple[float, float, float] = (0.6, 0.3, 0.1)

#: Goal sentence and trial-folder conventions of the official games.
SPLIT_DIRS: dict[str, str] = {
    "train": "train",
    "eval_in_distribution": "valid_seen",
    "eval_out_of_distribution": "valid_unseen",
}


@dataclass(frozen=True)
class Catalog:
    """ALFRED's object/receptacle tables, read once from ``alfworld.gen.constants``."""

    placements: Mapping[str, frozenset[str]]  # static receptacle type -> object types it may hold
    properties: Mapping[str, frozenset[str]]  # "Cleanable" ... -> object types
    movable_receptacles: frozenset[str]
    static_receptacles: frozenset[str]

    def can_hold(self, rtype: str, otype: str) -> bool:
        if otype == LAMP:
            return rtype in LAMP_RECEPTACLES
        return otype in self.placements.get(rtype, frozenset())

    def is_placeable(self, otype: str) -> bool:
        return otype == LAMP or any(otype in objs for objs in self.placements.values())


@functools.lru_cache(maxsize=1)
def catalog() -> Catalog:
    import alfworld.gen.constants as c

    movable = frozenset(c.MOVABLE_RECEPTACLES)
    static = frozenset(r for r in c.RECEPTACLES if r not in movable)
    known = set(c.OBJECTS)
    placements = {
        r: frozenset(o for o in objs if o in known and not o.endswith("Sliced"))
        for r, objs in c.VAL_RECEPTACLE_OBJECTS.items()
        if r in static
    }
    properties = {k: frozenset(v) for k, v in c.VAL_ACTION_OBJECTS.items()}
    return Catalog(placements, properties, movable, static)


@dataclass(frozen=True, order=True)
class TaskSpec:
    """One (task type, object, target, scene) combination; ``target`` is the parent receptacle
    type, or the toggle object (DeskLamp) for ``look_at_obj_in_light``."""

    task_type: str
    object_target: str
    target: str
    scene_num: int

    def __post_init__(self) -> None:
        if self.task_type not in TASK_TYPES:
            raise ValueError(f"unknown ALFWorld task type {self.task_type!r}; valid: {', '.join(TASK_TYPES)}")

    @property
    def parent_target(self) -> str:
        return "" if self.task_type == "look_at_obj_in_light" else self.target

    @property
    def toggle_target(self) -> str:
        return self.target if self.task_type == "look_at_obj_in_light" else ""

    @property
    def task_folder(self) -> str:
        """The official folder name, e.g. ``pick_and_place_simple-SprayBottle-None-Toilet-422``."""
        return f"{self.task_type}-{self.object_target}-None-{self.target}-{self.scene_num}"


def _forbidden_starts(spec: TaskSpec) -> frozenset[str]:
    """Receptacle types an instance of the target object type may not start in."""
    return frozenset(t for t in (spec.parent_target, TASK_APPLIANCE.get(spec.task_type)) if t)


def _scene_object_types(scene: SceneLayout) -> list[str]:
    cat = catalog()
    out = []
    for otype in scene.object_types:
        if otype in cat.static_receptacles or not cat.is_placeable(otype):
            continue
        if any(cat.can_hold(r, otype) for r in scene.receptacle_types):
            out.append(otype)
    return out


def task_specs_for_scene(scene: SceneLayout) -> list[TaskSpec]:
    """Every valid combination in one scene, sorted."""
    cat = catalog()
    objects = [o for o in _scene_object_types(scene) if o != LAMP]
    receps = sorted(r for r in scene.receptacle_types if r in cat.static_receptacles)
    specs: list[TaskSpec] = []
    for task in TASK_TYPES:
        if scene.room_type not in TASK_ROOMS[task]:
            continue
        appliance = TASK_APPLIANCE.get(task)
        if appliance and appliance not in scene.receptacle_types:
            continue
        prop = TASK_PROPERTY.get(task)
        for obj in objects:
            if prop and obj not in cat.properties[prop]:
                continue
            if task == "look_at_obj_in_light":
                lamp_ok = LAMP in scene.object_types and any(r in LAMP_RECEPTACLES for r in receps)
                if lamp_ok and _has_start(scene, TaskSpec(task, obj, LAMP, scene.scene_num)):
                    specs.append(TaskSpec(task, obj, LAMP, scene.scene_num))
                continue
            for recep in receps:
                if recep == appliance or not cat.can_hold(recep, obj):
                    continue
                spec = TaskSpec(task, obj, recep, scene.scene_num)
                if _has_start(scene, spec):
                    specs.append(spec)
    return sorted(specs)


def _has_start(scene: SceneLayout, spec: TaskSpec) -> bool:
    banned = _forbidden_starts(spec)
    cat = catalog()
    return any(cat.can_hold(r, spec.object_target) and r not in banned for r in scene.receptacle_types)


def enumerate_task_specs(scene_nums: Iterable[int]) -> list[TaskSpec]:
    """All valid (task, object, target, scene) combinations over ``scene_nums``, sorted."""
    specs: list[TaskSpec] = []
    for n in sorted(set(scene_nums)):
        specs.extend(task_specs_for_scene(load_scene(n)))
    return specs


_PDDL_CHARS = {"-": "_minus_", "|": "_bar_", "+": "_plus_", ".": "_dot_", ",": "_comma_"}


def pddl_name(thor_id: str) -> str:
    """ALFRED's ``fix_pddl_str_chars``: ``"Mug|+00.10|..." -> "Mug_bar__plus_00_dot_10_bar_..."``."""
    return "".join(_PDDL_CHARS.get(ch, ch) for ch in thor_id)


def _location_id(x: float, z: float, rotation_deg: int, horizon: int) -> str:
    # ALFRED's grid: 0.25 m steps, rotation in quarter turns.
    return f"loc|{round(x / 0.25)}|{round(z / 0.25)}|{(int(rotation_deg) // 90) % 4}|{int(horizon)}"


@dataclass(frozen=True)
class GeneratedGame:
    """The two files of one game, ready to write."""

    spec: TaskSpec
    goal: str
    pddl_problem: str
    traj_data: dict[str, Any]

    def game_json(self, domain: str, grammar: str, walkthrough: list[str] | None = None) -> dict[str, Any]:
        """The ``game.tw-pddl`` content (same keys as ``alfworld-generate`` writes)."""
        return {
            "pddl_domain": domain,
            "grammar": grammar.replace("UNKNOWN GOAL", self.goal),
            "pddl_problem": self.pddl_problem,
            "solvable": walkthrough is not None,
            "walkthrough": walkthrough,
        }


def goal_sentence(spec: TaskSpec, rng: random.Random) -> str:
    import alfworld.gen.goal_library as glib

    template = rng.choice(glib.gdict[spec.task_type]["templates"])
    return template.format(
        obj=spec.object_target.lower(), recep=spec.parent_target.lower(), toggle=spec.toggle_target.lower(), mrecep=""
    )


def _goal_pddl(spec: TaskSpec) -> str:
    import alfworld.gen.goal_library as glib

    text = glib.gdict[spec.task_type]["pddl"].format(
        obj=spec.object_target, recep=spec.parent_target, toggle=spec.toggle_target, mrecep=""
    )
    return text.replace("#", "-")


def generate_game(spec: TaskSpec, seed: int, trial: str) -> GeneratedGame:
    """Sample one game for ``spec``, a function of ``(spec, seed)``; ``ValueError`` if the scene cannot host it."""
    rng = random.Random(f"{seed}:{spec.task_type}:{spec.object_target}:{spec.target}:{spec.scene_num}")
    scene = load_scene(spec.scene_num)
    cat = catalog()
    rec_pose = dict(scene.receptacles)
    rec_ids = sorted(rec_pose)

    # Object instances: how many of each type and where they start.
    object_types = _scene_object_types(scene)
    if spec.object_target not in object_types:
        raise ValueError(f"scene {spec.scene_num} has no placeable {spec.object_target}")
    banned = _forbidden_starts(spec)
    placements: list[tuple[str, str]] = []  # (object type, receptacle id)
    for otype in object_types:
        if otype == LAMP:
            if spec.task_type != "look_at_obj_in_light" and rng.random() < 0.5:
                continue  # lamps only matter to look-at; keep some as furniture elsewhere
            count = 1
        elif otype == spec.object_target:
            count = rng.randint(2, 3) if spec.task_type == "pick_two_obj_and_place" else rng.randint(1, 3)
        else:
            count = rng.choices((1, 2, 3), weights=_INSTANCE_WEIGHTS)[0]
        hosts = [r for r in rec_ids if cat.can_hold(receptacle_type(r), otype)]
        if otype == spec.object_target:
            hosts = [r for r in hosts if receptacle_type(r) not in banned]
        if not hosts:
            if otype in (spec.object_target, spec.toggle_target):
                raise ValueError(f"no receptacle in scene {spec.scene_num} may hold {otype}")
            continue
        placements.extend((otype, rng.choice(hosts)) for _ in range(count))
    if spec.task_type == "look_at_obj_in_light" and not any(o == LAMP for o, _ in placements):
        raise ValueError(f"scene {spec.scene_num} has no receptacle for a {LAMP}")

    # THOR-style instance ids near the host's pose; unique by construction.
    used: set[str] = set()
    objects: list[tuple[str, str, str]] = []  # (object id, type, host receptacle id)
    for otype, host in placements:
        x, z, _, _ = rec_pose[host]
        while True:
            oid = (
                f"{otype}|{x + rng.uniform(-0.6, 0.6):+06.2f}|{rng.uniform(0.1, 1.8):+06.2f}|"
                f"{z + rng.uniform(-0.6, 0.6):+06.2f}"
            )
            if oid not in used:
                break
        used.add(oid)
        objects.append((oid, otype, host))

    rec_loc = {r: _location_id(*rec_pose[r]) for r in rec_ids}
    taken = set(rec_loc.values())
    while True:
        px, pz = rng.choice(scene.floor_points)
        agent_loc = _location_id(px, pz, rng.choice((0, 90, 180, 270)), 30)
        if agent_loc not in taken:
            break

    goal = goal_sentence(spec, rng)
    problem = _problem_text(spec, trial, rec_ids, rec_loc, objects, agent_loc)
    traj = {
        "task_id": trial,
        "task_type": spec.task_type,
        "pddl_params": {
            "object_target": spec.object_target,
            "object_sliced": False,
            "parent_target": spec.parent_target,
            "toggle_target": spec.toggle_target,
            "mrecep_target": "",
        },
        "scene": {"floor_plan": scene.floor_plan, "scene_num": spec.scene_num, "random_seed": seed},
        "template": {"task_desc": goal},
        "memprism": {
            "generator": "memprism_ray.benchmark.alfworld.generator",
            "note": "ALFWorld-style game generated from the layouts packaged in alfworld; not an official game",
        },
    }
    return GeneratedGame(spec, goal, problem, traj)


def _problem_text(
    spec: TaskSpec,
    trial: str,
    rec_ids: list[str],
    rec_loc: Mapping[str, str],
    objects: list[tuple[str, str, str]],
    agent_loc: str,
) -> str:
    cat = catalog()
    otypes = sorted({t for _, t, _ in objects})
    rtypes = sorted({receptacle_type(r) for r in rec_ids})
    locations = sorted(set(rec_loc.values()) | {agent_loc})
    n = pddl_name
    decl = ["agent1 - agent"]
    decl += [f"{t}Type - otype" for t in otypes]
    decl += [f"{t}Type - rtype" for t in rtypes]
    decl += [f"{n(o)} - object" for o, _, _ in objects]
    decl += [f"{n(r)} - receptacle" for r in rec_ids]
    decl += [f"{n(loc)} - location" for loc in locations]

    init = ["(= (total-cost) 0)"]
    init += [f"(receptacleType {n(r)} {receptacle_type(r)}Type)" for r in rec_ids]
    init += [f"(objectType {n(o)} {t}Type)" for o, t, _ in objects]
    init += [f"(canContain {r}Type {o}Type)" for r in rtypes for o in otypes if o != LAMP and cat.can_hold(r, o)]
    props = cat.properties
    for o, t, _ in objects:
        if t != LAMP:
            init.append(f"(pickupable {n(o)})")
        if t in cat.movable_receptacles:
            init.append(f"(isReceptacleObject {n(o)})")
        for prop in ("Cleanable", "Heatable", "Coolable", "Sliceable", "Toggleable"):
            if t in props.get(prop, ()):
                init.append(f"({prop.lower()} {n(o)})")
    init += [f"(openable {n(r)})" for r in rec_ids if receptacle_type(r) in OPENABLE_RECEPTACLES]
    init.append(f"(atLocation agent1 {n(agent_loc)})")
    init += [f"(inReceptacle {n(o)} {n(host)})" for o, _, host in objects]
    init += [f"(receptacleAtLocation {n(r)} {n(rec_loc[r])})" for r in rec_ids]
    init += [f"(objectAtLocation {n(o)} {n(rec_loc[host])})" for o, _, host in objects]

    lines = [f"(define (problem plan_{n(trial)})", "    (:domain alfred)", "    (:objects"]
    lines += [f"        {d}" for d in decl]
    lines += ["    )", "    (:init"]
    lines += [f"        {f}" for f in init]
    lines += ["    )"]
    # goal_library's formula closes the define block itself.
    return "\n".join(lines) + "\n" + _goal_pddl(spec).strip() + "\n"


def write_json(path: Path, data: Mapping[str, Any]) -> None:
    """Canonical bytes for a game file (sorted keys, so SHA-256 digests are reproducible)."""
    path.write_bytes(json.dumps(data, sort_keys=True, indent=1).encode())
