"""EB-ALFRED episodes and ALFRED training annotations (paper "Benchmarks"; appendix
"Training dataset setup": "The ALFRED path uses the official ALFRED training annotations
for learning and reserves EB-ALFRED episodes for evaluation").

An episode of an EmbodiedBench-format list (``{subset: [{"task", "repeat_idx", "instruction"}]}``)
is ``GameRef("<subset>/<index>")``, its position in the list, as EmbodiedBench's env walks it.
ALFRED's high-level PDDL plans become EB-ALFRED skills here. Nothing here imports AI2-THOR.
"""

from __future__ import annotations

import importlib.util
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from memprism_ray.benchmark.ebalfred.skills import (
    ALFRED_NAMES,
    PUT_DOWN,
    AlfredNameError,
    alfred_object,
    global_skills,
    is_alfred_name,
)
from memprism_ray.envs.base import GameRef
from memprism_ray.io_atomic import loads_json

#: EmbodiedBench's subset names, in the paper's order (Base, Common, Complex, Visual, Spatial, Long).
SUBSETS: tuple[str, ...] = (
    "base",
    "common_sense",
    "complex_instruction",
    "visual_appearance",
    "spatial",
    "long_horizon",
)

#: The key of ALFRED training episodes in an EmbodiedBench-format list (not an evaluation subset).
TRAIN_SUBSET = "alfred_train"

#: Environment variables naming local data (documented in docs/ebalfred.md).
SPLITS_ENV = "MEMPRISM_EBALFRED_SPLITS"
ALFRED_ENV = "MEMPRISM_ALFRED_DATA"

ALFRED_DOWNLOAD = "https://ai2-vision-alfred.s3-us-west-2.amazonaws.com/json_2.1.0.7z"


def check_subset(subset: str, key: str = "subset", *, train: bool = False) -> str:
    """``subset`` if valid (with ``train``, :data:`TRAIN_SUBSET` too); a one-line ``ValueError`` otherwise."""
    valid = (*SUBSETS, TRAIN_SUBSET) if train else SUBSETS
    if subset not in valid:
        raise ValueError(f"{key}={subset!r} is not an EB-ALFRED subset; valid subsets: {', '.join(valid)}")
    return subset


def game_ref(subset: str, index: int, source: str | Path = "") -> GameRef:
    """Episode ``index`` of ``subset``, played from ``source`` (the splits file it came from)."""
    check_subset(subset, train=True)
    if isinstance(index, bool) or not isinstance(index, int) or index < 0:
        raise ValueError(f"EB-ALFRED episode index must be a non-negative int, got {index!r}")
    return GameRef(f"{subset}/{index}", Path(source), subset, subset)


def parse_game_id(game_id: str) -> tuple[str, int]:
    """``"<subset>/<index>"`` -> ``(subset, index)``; a one-line ``ValueError`` otherwise."""
    subset, _, index = game_id.partition("/")
    if not index.isdigit():
        raise ValueError(f"EB-ALFRED game_id must look like '<subset>/<index>', got {game_id!r}")
    return check_subset(subset, "game_id subset", train=True), int(index)


def embodiedbench_path(*parts: str) -> Path | None:
    """``parts`` under the installed ``embodiedbench`` package, or ``None`` when it is not installed."""
    try:
        spec = importlib.util.find_spec("embodiedbench")
    except (ImportError, ValueError):
        spec = None
    if spec is None or not spec.submodule_search_locations:
        return None
    return Path(next(iter(spec.submodule_search_locations))).joinpath(*parts)


def default_splits_path() -> Path | None:
    """``$MEMPRISM_EBALFRED_SPLITS``, else the ``splits.json`` an installed EmbodiedBench ships."""
    env = os.environ.get(SPLITS_ENV, "")
    if env:
        return Path(env)
    return embodiedbench_path("envs", "eb_alfred", "data", "splits", "splits.json")


def load_splits(path: str | Path | None = None, subsets: Sequence[str] = SUBSETS) -> dict[str, list[dict[str, Any]]]:
    """``subsets`` of an EmbodiedBench-format ``splits.json``, each entry with its ``instruction``."""
    p = Path(path) if path else default_splits_path()
    if p is None or not p.is_file():
        where = f" (looked at {p})" if p is not None else ""
        raise FileNotFoundError(
            f"EB-ALFRED splits.json not found{where}: install EmbodiedBench (docs/ebalfred.md), or set "
            f"${SPLITS_ENV} to its embodiedbench/envs/eb_alfred/data/splits/splits.json, or build the "
            "test fixture with memprism_ray.benchmark.ebalfred.fixture.build_fixture"
        )
    data = loads_json(
        p.read_text(),
        str(p),
        "give EmbodiedBench's splits.json (docs/ebalfred.md), or write the ALFRED training list again with "
        "python -m memprism_ray.benchmark.ebalfred.training",
    )
    if not isinstance(data, Mapping):
        raise ValueError(f"{p}: expected a mapping of subset -> episodes, got {type(data).__name__}")
    missing = [s for s in subsets if s not in data]
    if missing:
        hint = (
            " (the ALFRED training list: memprism_ray.benchmark.ebalfred.training writes it; set ebalfred.train_splits)"
            if TRAIN_SUBSET in missing
            else ""
        )
        raise ValueError(f"{p}: missing subset(s) {', '.join(missing)}; expected all of {', '.join(subsets)}{hint}")
    out: dict[str, list[dict[str, Any]]] = {}
    for subset in subsets:
        episodes = data[subset]
        for i, ep in enumerate(episodes):
            if not isinstance(ep, Mapping) or not isinstance(ep.get("instruction"), str):
                raise ValueError(f"{p}: {subset}[{i}] has no 'instruction' string")
        out[subset] = [dict(ep) for ep in episodes]
    return out


def list_games(subsets: Sequence[str] = SUBSETS, path: str | Path | None = None, per_subset: int = 0) -> list[GameRef]:
    """Game references of ``subsets`` in file order (``per_subset`` > 0 keeps the first n)."""
    p = Path(path) if path else default_splits_path()
    for subset in subsets:
        check_subset(subset, train=True)
    splits = load_splits(p, tuple(subsets))
    games = []
    for subset in subsets:
        n = len(splits[subset]) if per_subset <= 0 else min(per_subset, len(splits[subset]))
        games.extend(game_ref(subset, i, p or "") for i in range(n))
    return games


#: PDDL verbs of ALFRED's high-level plan that act on their first argument.
_PDDL_SIMPLE = {
    "PickupObject": "pick up the {0}",
    "OpenObject": "open the {0}",
    "CloseObject": "close the {0}",
    "ToggleObject": "turn on the {0}",
    "SliceObject": "slice the {0}",
}
_CLEAN = ("put down the object in hand", "turn on the Faucet", "turn off the Faucet", "pick up the {0}")
_HEAT = (
    "open the Microwave", "put down the object in hand", "close the Microwave", "turn on the Microwave",
    "turn off the Microwave", "open the Microwave", "pick up the {0}", "close the Microwave",
)  # fmt: skip
_COOL = (
    "open the Fridge", "put down the object in hand", "close the Fridge", "open the Fridge", "pick up the {0}",
    "close the Fridge",
)  # fmt: skip
#: How ALFRED expands clean/heat/cool (the receptacle, then the interactions), for a plan
#: without ``low_actions``.
_PDDL_AT = {"CleanObject": ("Sink", _CLEAN), "HeatObject": ("Microwave", _HEAT), "CoolObject": ("Fridge", _COOL)}
#: ALFRED's low-level interactions (``plan.low_actions[*].api_action``) as skills; the object is
#: the type prefix of its ``objectId``, which is what ``ThorConnector.get_obj_id_from_name`` matches.
_LOW = {k: v for k, v in _PDDL_SIMPLE.items() if k != "ToggleObject"}
_LOW |= {"ToggleObjectOn": "turn on the {0}", "ToggleObjectOff": "turn off the {0}", "PutObject": PUT_DOWN}


@dataclass(frozen=True)
class PlanStep:
    """One skill of an expert plan and the ALFRED ``objectId`` of the instance it acts on (``""``
    when the annotation names none). The skill names the bare type (``find a Drawer``); which
    instance name it takes (``Drawer_2``) is decided against the scene at reset
    (:func:`resolve_plan`), as only the simulator knows how EmbodiedBench numbers them."""

    skill: str
    object_id: str = ""


class _Plan:
    """The steps written so far and ``ThorConnector``'s ``cur_receptacle`` after them: a
    ``find`` sets it (the instance found, when known), ``put down`` and ``open`` keep it, every
    other skill clears it, and ``put down the object in hand`` places the held object in it
    (drops it when cleared)."""

    def __init__(self) -> None:
        self.steps: list[PlanStep] = []
        self.receptacle: tuple[str, str] | None = None

    def add(self, skill: str, object_id: str = "") -> None:
        self.steps.append(PlanStep(skill, object_id))
        if skill.startswith("find a "):
            self.receptacle = (skill[len("find a ") :], object_id)
        elif not skill.startswith(("put down ", "open ")):
            self.receptacle = None

    def put(self, receptacle: str, object_id: str = "") -> None:
        """Put down into ``receptacle`` (the instance ``object_id``): ``find`` it first unless
        the plan is already there; two instances of one type are two places."""
        here = self.receptacle
        there = here is not None and here[0] == receptacle and (not object_id or not here[1] or here[1] == object_id)
        if not there:
            self.add(f"find a {receptacle}", object_id)
        self.add(PUT_DOWN)


def _low_by_step(low_actions: Sequence[Mapping[str, Any]]) -> dict[int, list[Mapping[str, Any]]]:
    """The interaction low actions (``api_action``) of each high-level step (``high_idx``)."""
    out: dict[int, list[Mapping[str, Any]]] = {}
    for la in low_actions:
        api = la.get("api_action", {}) if isinstance(la, Mapping) else {}
        if isinstance(api, Mapping) and api.get("action") in _LOW:
            out.setdefault(int(la.get("high_idx", -1)), []).append(api)
    return out


def _id_type(object_id: Any, verb: str) -> str:
    return alfred_object(str(object_id or "").split("|")[0], verb)


def _ids(acts: Sequence[Mapping[str, Any]], planner: Mapping[str, Any]) -> list[str]:
    """The objectIds a step acts on, in order: its low actions', then ALFRED's planner action's."""
    out = []
    for a in (*acts, planner):
        out += [str(a[k]) for k in ("objectId", "receptacleObjectId") if isinstance(a.get(k), str) and a.get(k)]
    return out


def _id_of(name: str, ids: Sequence[str]) -> str:
    """The first of ``ids`` whose type is the skill object ``name`` (``""`` if none is)."""
    for oid in ids:
        if ALFRED_NAMES.get(oid.split("|")[0].lower()) == name:
            return oid
    return ""


def plan_from_high_pddl(
    plan: Sequence[Mapping[str, Any]], low_actions: Sequence[Mapping[str, Any]] = ()
) -> list[PlanStep]:
    """EB-ALFRED skills (each one of the 162 global ones, else :class:`AlfredNameError`) for
    ALFRED's ``plan.high_pddl`` and, when given, its ``plan.low_actions``, each with the objectId
    of the instance it acts on (the low actions', else ALFRED's ``planner_action``'s).

    * ``GotoLocation X`` right before ``PickupObject O`` is ``find a O`` (that instance of O),
      as EmbodiedBench's own examples find the object they pick up (some receptacles have no
      ``find`` skill), unless the pickup first opens something; otherwise ``find a X``, the
      instance of X the next step acts on (the drawer it opens, the table it puts on).
    * A step's low-level interactions become one skill each (ALFRED opens and closes around a
      pickup or a put, which the high-level plan does not show; ``ThorConnector.put`` fails on
      a closed receptacle); without them, clean/heat/cool use ALFRED's fixed expansions.
    * ``find a R`` is added before a put when the plan is not already at that ``R``:
      ``ThorConnector`` puts down into the last found receptacle.
    * ``NoOp`` and unknown verbs are skipped, never guessed."""
    low = _low_by_step(low_actions)
    steps: list[tuple[str, list[str], list[Mapping[str, Any]], Mapping[str, Any]]] = []
    for k, step in enumerate(plan):
        da = step.get("discrete_action", {}) if isinstance(step, Mapping) else {}
        verb, args = str(da.get("action", "")), [str(a) for a in (da.get("args", []) or [])]
        planner = step.get("planner_action", {}) if isinstance(step, Mapping) else {}
        planner = planner if isinstance(planner, Mapping) else {}
        if verb in ("GotoLocation", "PutObject") or verb in _PDDL_SIMPLE or verb in _PDDL_AT:
            steps.append((verb, args, low.get(int(step.get("high_idx", k)), []), planner))
    out = _Plan()
    held: str | None = None
    for k, (verb, args, acts, planner) in enumerate(steps):
        first = args[0] if args else ""
        if verb == "GotoLocation":
            nxt = steps[k + 1] if k + 1 < len(steps) else None
            ahead = _ids(nxt[2], nxt[3]) if nxt is not None else []
            if nxt is not None and nxt[0] == "PickupObject" and not any(a["action"] == "OpenObject" for a in nxt[2]):
                if not is_alfred_name(first):  # skipped, but a damaged name is still an error
                    alfred_object(first, verb)
                obj = alfred_object(nxt[1][0] if nxt[1] else "", nxt[0])
                out.add(f"find a {obj}", _id_of(obj, ahead))
            else:
                target = alfred_object(first, verb)
                out.add(f"find a {target}", _id_of(target, ahead))
        elif acts:
            for a in acts:
                if a["action"] == "PutObject":
                    out.put(_id_type(a.get("receptacleObjectId"), verb), str(a.get("receptacleObjectId") or ""))
                else:
                    out.add(
                        _LOW[str(a["action"])].format(_id_type(a.get("objectId"), verb)), str(a.get("objectId") or "")
                    )
        elif verb == "PutObject":
            receptacle = alfred_object(args[1] if len(args) > 1 else "", verb)
            out.put(receptacle, _id_of(receptacle, [str(planner.get("receptacleObjectId") or "")]))
        elif verb in _PDDL_AT:
            receptacle, template = _PDDL_AT[verb]
            obj = alfred_object(first, verb) if first else held
            if obj is None:
                raise AlfredNameError(f"{verb} names no object and nothing was picked up before it", "", False)
            if out.receptacle is None or out.receptacle[0] != receptacle:
                out.add(f"find a {receptacle}")
            for t in template:
                out.add(t.format(obj))
        else:
            obj = alfred_object(first, verb)
            out.add(_PDDL_SIMPLE[verb].format(obj), _id_of(obj, _ids((), planner)))
        if verb == "PickupObject" or (verb in _PDDL_AT and first):
            held = alfred_object(first, verb)
    valid = set(global_skills())
    for step in out.steps:  # e.g. "turn on the Apple": a name with no skill of that verb
        if step.skill not in valid:
            raise AlfredNameError(f"ALFRED plan step {step.skill!r} is no EB-ALFRED skill", step.skill, True)
    return out.steps


def plan_from_trajectory(data: Mapping[str, Any]) -> list[PlanStep]:
    """The expert plan of an ALFRED ``traj_data.json`` as EB-ALFRED skills with their instances."""
    plan = data["plan"]
    return plan_from_high_pddl(plan["high_pddl"], plan.get("low_actions") or ())


#: Skills that name an instance of a type (``EBAlfEnv.step`` maps the name to its objectId).
INSTANCE_VERBS = ("find a ", "open the ", "close the ")


@dataclass(frozen=True)
class SceneInstances:
    """What a reset shows of the scene's instances: its objects (``objectId``, ``objectType``,
    ``receptacle``, ``pickupable``, in AI2-THOR's order), EmbodiedBench's ``id_to_name_dict`` and
    its full skill list."""

    objects: tuple[Mapping[str, Any], ...]
    names: Mapping[str, str]
    skills: tuple[str, ...]


def _physical(object_id: str) -> str:
    """The object an objectId belongs to: a slice (``Apple|..|AppleSliced_1``) or a basin
    (``Sink|..|SinkBasin``) is part of its first four fields' object."""
    return "|".join(object_id.split("|")[:4])


def resolve_step(step: PlanStep, scene: SceneInstances) -> tuple[str | None, str]:
    """The skill ``step`` is played as in ``scene`` (``None`` when its instance cannot be
    named) and why. A find/open/close of a type with one object in the scene keeps the bare
    name; with several, the name EmbodiedBench gives the annotation's instance (or the object
    it is part of): the bare name for the first, ``Type_k`` for the k-th."""
    skill = step.skill
    verb = next((v for v in INSTANCE_VERBS if skill.startswith(v)), None)
    if verb is None:
        return skill, "no instance"
    kind = skill[len(verb) :]
    same = {_physical(str(o.get("objectId", ""))) for o in scene.objects}
    same = {p for p in same if p.split("|")[0].casefold() == kind.casefold()}
    if len(same) <= 1:
        return skill, "one instance"
    if not step.object_id:
        return None, f"{skill!r}: {len(same)} {kind}s in the scene and the annotation names none of them"
    for oid in (step.object_id, _physical(step.object_id)):
        name = scene.names.get(oid)
        if name is not None and f"{verb}{name}" in scene.skills:
            return f"{verb}{name}", "named"
    return None, (
        f"{skill!r}: {len(same)} {kind}s in the scene and the annotation's {step.object_id} has no instance "
        "name at reset"
    )


def resolve_plan(plan: Sequence[PlanStep], scene: SceneInstances) -> tuple[list[str], list[str]]:
    """``plan`` as the skills played in ``scene`` and the reasons of the steps whose instance
    cannot be named (an empty list: the plan is resolved; none is ever guessed)."""
    skills, unresolved = [], []
    for step in plan:
        skill, why = resolve_step(step, scene)
        if skill is None:
            unresolved.append(why)
        else:
            skills.append(skill)
    return skills, unresolved


def default_alfred_root() -> Path | None:
    env = os.environ.get(ALFRED_ENV, "")
    return Path(env) if env else None
