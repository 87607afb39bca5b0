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


def scene_extra_skills(objects: Iterable[Mapping[str, Any]]) -> list[str]:
    """The per-scene skills ``generate_additional_action_space`` appends after the 162."""
    recep: dict[str, int] = {}
    pick: dict[str, int] = {}
    for obj in objects:
        table = recep if obj.get("receptacle") else pick if obj.get("pickupable") else None
        if table is not None:
            table[str(obj["objectType"])] = table.get(str(obj["objectType"]), 0) + 1
    findable = sorted({f"{k}_{i}" for k, n in recep.items() if n >= 2 for i in range(2, n + 1)})
    pickable = sorted({f"{k}_{i}" for k, n in pick.items() if n >= 2 for i in range(2, n + 1)})
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
    """``skills`` whose object (instance names count as their type) is in the scene, order kept."""
    present = {str(o.get("objectId", o.get("objectType", ""))).split("|")[0].casefold() for o in objects}
    out = []
    for skill in skills:
        name = skill_object(skill)
        if name is None or name.split("_")[0].casefold() in present:
            out.append(skill)
    return out


def check_mode(mode: str, key: str = "ebalfred.skills") -> str:
    if mode not in SKILL_MODES:
        raise ValueError(f"{key}={mode!r}; valid values: {', '.join(SKILL_MODES)} (scene: the paper's list)")
    return mode


def is_skill_string(action: str) -> bool:
    """Whether ``ThorConnector.llm_skill_interact`` dispatches ``action`` at all."""
    return action.startswith(SKILL_PREFIXES)
