"""EB-ALFRED's skill list: the real shape (EmbodiedBench's ``EBAlfEnv.language_skill_set`` at
``b247936``: 162 global skills, then the scene's instance skills), and the scene-filtered list
the prompt gets (paper appendix E.4: "EB-ALFRED returns one exact name from the scene-filtered
skill list"; docs/ebalfred.md "Skill list"). The object tables are copied from
``embodiedbench/envs/eb_alfred/utils.py`` in upstream order, so that action ids match
EmbodiedBench's. A skill whose object is not in the scene can never succeed, so filtering
removes no successful action.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

#: ``embodiedbench/envs/eb_alfred/utils.py`` ``alfred_objs`` (80 findable objects).
ALFRED_OBJS: tuple[str, ...] = (
    "Cart", "Potato", "Faucet", "Ottoman", "CoffeeMachine", "Candle", "CD", "Pan", "Watch",
    "HandTowel", "SprayBottle", "BaseballBat", "CellPhone", "Kettle", "Mug", "StoveBurner", "Bowl",
    "Toilet", "DiningTable", "Spoon", "TissueBox", "Shelf", "Apple", "TennisRacket", "SoapBar",
    "Cloth", "Plunger", "FloorLamp", "ToiletPaperHanger", "CoffeeTable", "Spatula", "Plate", "Bed",
    "Glassbottle", "Knife", "Tomato", "ButterKnife", "Dresser", "Microwave", "CounterTop",
    "GarbageCan", "WateringCan", "Vase", "ArmChair", "Safe", "KeyChain", "Pot", "Pen", "Cabinet",
    "Desk", "Newspaper", "Drawer", "Sofa", "Bread", "Book", "Lettuce", "CreditCard", "AlarmClock",
    "ToiletPaper", "SideTable", "Fork", "Box", "Egg", "DeskLamp", "Ladle", "WineBottle", "Pencil",
    "Laptop", "RemoteControl", "BasketBall", "DishSponge", "Cup", "SaltShaker", "PepperShaker",
    "Pillow", "Bathtub", "SoapBottle", "Statue", "Fridge", "Sink",
)  # fmt: skip
#: ``alfred_pick_obj`` (53 pickable objects).
PICK_OBJS: tuple[str, ...] = (
    "KeyChain", "Potato", "Pot", "Pen", "Candle", "CD", "Pan", "Watch", "Newspaper", "HandTowel",
    "SprayBottle", "BaseballBat", "Bread", "CellPhone", "Book", "Lettuce", "CreditCard", "Mug",
    "AlarmClock", "Kettle", "ToiletPaper", "Bowl", "Fork", "Box", "Egg", "Spoon", "TissueBox",
    "Apple", "TennisRacket", "Ladle", "WineBottle", "Cloth", "Plunger", "SoapBar", "Pencil",
    "Laptop", "RemoteControl", "BasketBall", "DishSponge", "Cup", "Spatula", "SaltShaker",
    "Plate", "PepperShaker", "Pillow", "Glassbottle", "SoapBottle", "Knife", "Statue", "Tomato",
    "ButterKnife", "WateringCan", "Vase",
)  # fmt: skip
#: ``alfred_open_obj``.
OPEN_OBJS: tuple[str, ...] = ("Safe", "Laptop", "Fridge", "Box", "Microwave", "Cabinet", "Drawer")
#: ``alfred_toggle_obj``.
TOGGLE_OBJS: tuple[str, ...] = ("Microwave", "DeskLamp", "FloorLamp", "Faucet")
#: ``alfred_slice_obj``.
SLICE_OBJS: tuple[str, ...] = ("Potato", "Lettuce", "Tomato", "Apple", "Bread")

#: ALFRED object types (``gen/constants.py`` ``OBJECTS`` and ``RECEPTACLES``) that no EB-ALFRED
#: skill names: a plan that needs one cannot be played.
ALFRED_ONLY_OBJS: tuple[str, ...] = (
    "Blinds", "Boots", "Chair", "Curtains", "Footstool", "HandTowelHolder", "HousePlant", "LaundryHamper",
    "LaundryHamperLid", "LightSwitch", "Mirror", "Painting", "PaintingHanger", "PaperTowel", "PaperTowelRoll",
    "Poster", "ScrubBrush", "ShowerDoor", "ShowerGlass", "StoveKnob", "TVStand", "TeddyBear", "Television",
    "Toaster", "ToiletPaperRoll", "Towel", "TowelHolder", "Window",
)  # fmt: skip

#: The one table from ALFRED's (lower-case) object names to those of EB-ALFRED's skills. ALFRED's
#: basins are parts of ``Sink``/``Bathtub`` (what ``ThorConnector.get_obj_id_from_name`` matches);
#: a slice is named by its whole object (``ThorConnector`` picks a slice once one was sliced).
ALFRED_NAMES: dict[str, str] = {
    **{o.lower(): o for o in ALFRED_OBJS},
    **{f"{o}Sliced".lower(): o for o in SLICE_OBJS},
    "sinkbasin": "Sink",
    "bathtubbasin": "Bathtub",
}


class AlfredNameError(ValueError):
    """An ALFRED plan argument that names no EB-ALFRED skill object; ``known``: a real ALFRED type
    the skills leave out (the plan cannot be played), not a damaged name."""

    def __init__(self, message: str, name: str, known: bool) -> None:
        super().__init__(message)
        self.name, self.known = name, known


_ALFRED_ONLY = {o.lower(): o for o in ALFRED_ONLY_OBJS}


def alfred_object(name: str, context: str = "") -> str:
    """The skill object name of ALFRED's ``name``, case-insensitive; :class:`AlfredNameError`
    otherwise. Never guessed from the spelling: ``capitalize()`` would give ``Diningtable``."""
    low = name.strip().lower()
    if low in ALFRED_NAMES:
        return ALFRED_NAMES[low]
    where = f" in {context}" if context else ""
    if low in _ALFRED_ONLY:
        raise AlfredNameError(
            f"ALFRED object {name!r}{where} ({_ALFRED_ONLY[low]}) has no EB-ALFRED skill: EmbodiedBench's skill "
            "list names none of skills.ALFRED_ONLY_OBJS, so this plan cannot be played",
            name,
            True,
        )
    raise AlfredNameError(
        f"{name!r}{where} is not an ALFRED object name (skills.ALFRED_NAMES holds the {len(ALFRED_NAMES)} names "
        "EB-ALFRED's skills use)",
        name,
        False,
    )


def is_alfred_name(name: str) -> bool:
    """Whether ``name`` is any ALFRED object type (with or without an EB-ALFRED skill)."""
    low = name.strip().lower()
    return low in ALFRED_NAMES or low in _ALFRED_ONLY


PUT_DOWN = "put down the object in hand"
DROP = "drop the object in hand"
#: Skills that name no object: always in the scene-filtered list.
OBJECT_FREE: frozenset[str] = frozenset({PUT_DOWN, DROP})

#: ``ThorConnector.llm_skill_interact``'s dispatch, in its order: a string that starts with
#: none of these hits ``assert False, 'instruction not supported'`` (thor_connector.py).
SKILL_PREFIXES: tuple[str, ...] = (
    "find ", "pick up ", "put down ", "open ", "close ", "turn on ", "turn off ", "slice ", "drop",
)  # fmt: skip

SKILL_MODES: tuple[str, ...] = ("scene", "full")


def global_skills() -> list[str]:
    """EmbodiedBench's ``get_global_action_space()``: the 162 skills of every scene."""
    skills = [f"find a {o}" for o in ALFRED_OBJS]
    skills += [f"pick up the {o}" for o in PICK_OBJS]
    skills += [PUT_DOWN, DROP]
    for o in OPEN_OBJS:
        skills += [f"open the {o}", f"close the {o}"]
    for o in TOGGLE_OBJS:
        skills += [f"turn on the {o}", f"turn off the {o}"]
    skills += [f"slice the {o}" for o in SLICE_OBJS]
    return skills


def _instance_tables(objects: Iterable[Mapping[str, Any]]) -> tuple[dict[str, list[str]], dict[str, list[str]]]:
    """``generate_additional_action_space``'s two tables, ``type -> objectIds`` in the order of the
    scene's objects: receptacles, and pickable objects that are no receptacle (a Bowl is a receptacle)."""
    recep: dict[str, list[str]] = {}
    pick: dict[str, list[str]] = {}
    for obj in objects:
        table = recep if obj.get("receptacle") else pick if obj.get("pickupable") else None
        if table is not None:
            table.setdefault(str(obj["objectType"]), []).append(str(obj.get("objectId", "")))
    return recep, pick


def instance_names(objects: Iterable[Mapping[str, Any]]) -> dict[str, str]:
    """``EBAlfEnv.id_to_name_dict`` after a reset into a scene with ``objects`` (AI2-THOR's
    ``metadata["objects"]``, in its order): for every type of either table with two or more
    instances, ``objectId -> name``, the first instance keeping the bare type name (``Cabinet``),
    the k-th named ``Cabinet_k``. ``EBAlfEnv.step`` maps a find/open/close name back to its
    objectId, so the bare name acts on the first instance (issue 41 item 1)."""
    names: dict[str, str] = {}
    for table in _instance_tables(objects):
        for kind, ids in table.items():
            if len(ids) >= 2:
                names.update((oid, kind if k == 1 else f"{kind}_{k}") for k, oid in enumerate(ids, start=1))
    return names


def scene_extra_skills(objects: Iterable[Mapping[str, Any]]) -> list[str]:
    """The per-scene skills ``generate_additional_action_space`` appends after the 162."""
    recep, pick = _instance_tables(objects)
    findable = sorted({f"{k}_{i}" for k, ids in recep.items() if len(ids) >= 2 for i in range(2, len(ids) + 1)})
    pickable = sorted({f"{k}_{i}" for k, ids in pick.items() if len(ids) >= 2 for i in range(2, len(ids) + 1)})
    extra = [f"find a {o}" for o in findable]
    for o in findable:
        if o.split("_")[0] in OPEN_OBJS:
            extra += [f"open the {o}", f"close the {o}"]
    extra += [f"find a {o}" for o in pickable if o.split("_")[0] in PICK_OBJS]
    return extra


def language_skill_set(objects: Sequence[Mapping[str, Any]]) -> list[str]:
    """``EBAlfEnv.language_skill_set`` after a reset into a scene with ``objects``."""
    return global_skills() + scene_extra_skills(objects)


def skill_object(skill: str) -> str | None:
    """The object a skill names (``"open the Cabinet_2"`` -> ``"Cabinet_2"``), else ``None``."""
    if skill in OBJECT_FREE:
        return None
    return skill.rsplit(" ", 1)[-1]


def scene_filter(skills: Sequence[str], objects: Iterable[Mapping[str, Any]]) -> list[str]:
    """``skills`` whose object (instance names count as their type) is in the scene, order kept:
    a name matches an ``objectId`` type prefix (what ``ThorConnector`` matches: ``Sink`` for a
    ``Sink|...|SinkBasin``) or an ``objectType`` (what instance names are built from:
    ``SinkBasin_2``), case-folded. Every instance skill is kept, so the list ends with all of
    the scene's (:func:`upstream_ids` relies on it)."""
    present: set[str] = set()
    for o in objects:
        present.add(str(o.get("objectId", o.get("objectType", ""))).split("|")[0].casefold())
        present.add(str(o.get("objectType", "")).casefold())
    out = []
    for skill in skills:
        name = skill_object(skill)
        if name is None or name.split("_")[0].casefold() in present:
            out.append(skill)
    return out


#: Each global skill's id: its position in every scene's full list (EmbodiedBench's examples use them).
GLOBAL_IDS: dict[str, int] = {s: i for i, s in enumerate(global_skills())}


def upstream_ids(listed: Sequence[str]) -> list[int]:
    """Each skill of ``listed``'s id in EmbodiedBench's full list (``EBAlfEnv.language_skill_set``,
    the list its planner numbers; issue 41 item 4). ``listed`` is that full list or the
    scene-filtered one, which keeps the order and every instance skill, so the full list is the
    162 global skills followed by the instance skills of ``listed`` in their order."""
    ids, extra = [], len(GLOBAL_IDS)
    for skill in listed:
        if skill in GLOBAL_IDS:
            ids.append(GLOBAL_IDS[skill])
        else:
            ids.append(extra)
            extra += 1
    return ids


def full_list_size(listed: Sequence[str]) -> int:
    """The length of EmbodiedBench's full list behind ``listed`` (see :func:`upstream_ids`)."""
    return len(GLOBAL_IDS) + sum(1 for s in listed if s not in GLOBAL_IDS)


def check_mode(mode: str, key: str = "ebalfred.skills") -> str:
    if mode not in SKILL_MODES:
        raise ValueError(f"{key}={mode!r}; valid values: {', '.join(SKILL_MODES)} (scene: the paper's list)")
    return mode


def is_skill_string(action: str) -> bool:
    """Whether ``ThorConnector.llm_skill_interact`` dispatches ``action`` at all."""
    return action.startswith(SKILL_PREFIXES)
