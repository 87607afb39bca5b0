"""The recorded-transcript fixture of EB-ALFRED (issue 13 item 5; docs/ebalfred.md "Tests
without the simulator: the fixture"): small Pillow-drawn PNG frames, EmbodiedBench-style
feedback, goal-condition progress, all six subsets, a few episodes each, written from a handful
of ALFRED task families. Layout::

    splits.json        EmbodiedBench format: {subset: [{"task", "repeat_idx", "instruction"}]}
    alfred_train.json  the same format, key "alfred_train": training episodes (other tasks)
    examples/          in-context example files shaped as EmbodiedBench's (.examples)
    json_2.1.0/        ALFRED annotations of every episode (valid_seen/ and train/<task>/traj_data.json)
    transcripts.json   {"version", "resolution", "episodes": {"<subset>/<i>": episode}}
    frames/<subset>/<i>/<step>.png

Each recorded state holds the ground-truth boxes of the visible objects on a 0-1000 scale, so a
scripted vision model can answer the grounding stage exactly in tests.
"""

from __future__ import annotations

import json
import zlib
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from PIL import Image, ImageDraw

from memprism_ray.benchmark.ebalfred.data import INSTANCE_VERBS, SUBSETS, TRAIN_SUBSET
from memprism_ray.benchmark.ebalfred.examples import EXAMPLE_FILES
from memprism_ray.benchmark.ebalfred.fixture_format import FIXTURE_VERSION
from memprism_ray.benchmark.ebalfred.skills import (
    ALFRED_NAMES,
    PICK_OBJS,
    global_skills,
    instance_names,
    language_skill_set,
    scene_filter,
)

SUCCESS_FEEDBACK = "Last action executed successfully."
INVALID_PREFIX = "Last action is invalid."
TRAIN_FILE = "alfred_train.json"
#: The fixture's ALFRED annotations (``$MEMPRISM_ALFRED_DATA`` layout: ``<split>/<task>/traj_data.json``).
ALFRED_DIR = "json_2.1.0"

#: Receptacle types of the fixture's scenes (AI2-THOR's ``receptacle`` flag).
RECEPTACLES = frozenset(
    {
        "Desk",
        "Drawer",
        "CounterTop",
        "Sink",
        "DiningTable",
        "Bowl",
        "Microwave",
        "Fridge",
        "GarbageCan",
        "Cabinet",
        "Bed",
    }
)


@dataclass(frozen=True)
class _Step:
    action: str
    visible: tuple[str, ...]
    held: str | None
    conds: int


@dataclass(frozen=True)
class _Family:
    task_type: str
    objects: tuple[str, ...]
    colour: tuple[int, int, int]
    initial_visible: tuple[str, ...]
    conds_total: int
    steps: tuple[_Step, ...]
    instructions: dict[str, str]
    instances: tuple[tuple[str, int], ...] = ()
    """types with several instances in the scene (their extra skills: ``find a Drawer_2``...)"""
    name: str = ""
    """the family's key in :data:`_ALFRED_PLANS` (default: its task type)"""

    @property
    def key(self) -> str:
        return self.name or self.task_type


def _s(action: str, visible: str, held: str | None, conds: int) -> _Step:
    return _Step(action, tuple(v for v in visible.split(",") if v), held, conds)


_FAMILIES: tuple[_Family, ...] = (
    _Family(
        "pick_and_place_simple",
        ("Mug", "Pen", "Desk", "Book", "Drawer"),
        (164, 142, 110),
        ("Desk", "Drawer"),
        1,
        (
            _s("find a Mug", "Mug,Pen,Desk", None, 0),
            _s("pick up the Mug", "Pen,Desk", "Mug", 0),
            _s("find a Desk", "Desk,Book", "Mug", 0),
            _s("put down the object in hand", "Desk,Book,Mug", None, 1),
        ),
        {
            "base": "Put a mug on the desk.",
            "common_sense": "Put something you drink coffee from on the desk.",
            "complex_instruction": "Although there is a pen next to it, move the mug onto the desk.",
            "visual_appearance": "Put the white ceramic cup on the desk.",
            "spatial": "Take the mug to the left of the pen and put it on the desk.",
            "long_horizon": "Put a mug on the desk.",
        },
        (("Drawer", 3), ("Pen", 2)),
    ),
    _Family(
        "pick_clean_then_place_in_recep",
        ("Ladle", "CounterTop", "Sink", "Faucet", "DiningTable", "Bowl", "Cabinet"),
        (120, 150, 170),
        ("CounterTop", "Bowl"),
        2,
        (
            _s("find a Ladle", "Ladle,CounterTop", None, 0),
            _s("pick up the Ladle", "CounterTop", "Ladle", 0),
            _s("find a Sink", "Sink,Faucet", "Ladle", 0),
            _s("put down the object in hand", "Sink,Faucet,Ladle", None, 0),
            _s("turn on the Faucet", "Sink,Faucet,Ladle", None, 1),
            _s("turn off the Faucet", "Sink,Faucet,Ladle", None, 1),
            _s("pick up the Ladle", "Sink,Faucet", "Ladle", 1),
            _s("find a DiningTable", "DiningTable,Bowl", "Ladle", 1),
            _s("put down the object in hand", "DiningTable,Bowl,Ladle", None, 2),
        ),
        {
            "base": "Rinse off a ladle and move it to the table.",
            "common_sense": "Rinse off something for serving soup and move it to the table.",
            "complex_instruction": (
                "Although there's a bowl in the cupboard, rinse off a ladle and move it to the table."
            ),
            "visual_appearance": "Wash the long metal spoon with a deep bowl and put it on the table.",
            "spatial": "Wash the ladle beside the counter edge and put it back on the table.",
            "long_horizon": "Rinse off a ladle and move it to the table.",
        },
        (("Cabinet", 4), ("CounterTop", 2)),
    ),
    _Family(
        "pick_heat_then_place_in_recep",
        ("Apple", "CounterTop", "Microwave", "Fridge", "GarbageCan", "Knife", "Cabinet"),
        (150, 120, 140),
        ("CounterTop", "Fridge"),
        2,
        (
            _s("find a Apple", "Apple,CounterTop,Knife", None, 0),
            _s("pick up the Apple", "CounterTop,Knife", "Apple", 0),
            _s("find a Microwave", "Microwave", "Apple", 0),
            _s("open the Microwave", "Microwave", "Apple", 0),
            _s("put down the object in hand", "Microwave,Apple", None, 0),
            _s("close the Microwave", "Microwave", None, 0),
            _s("turn on the Microwave", "Microwave", None, 1),
            _s("turn off the Microwave", "Microwave", None, 1),
            _s("open the Microwave", "Microwave,Apple", None, 1),
            _s("pick up the Apple", "Microwave", "Apple", 1),
            _s("close the Microwave", "Microwave", "Apple", 1),
            _s("find a GarbageCan", "GarbageCan", "Apple", 1),
            _s("put down the object in hand", "GarbageCan,Apple", None, 2),
        ),
        {
            "base": "Put a heated apple in the garbage can.",
            "common_sense": "Warm up a red fruit and throw it away.",
            "complex_instruction": "Although the fridge is closer, warm the apple in the microwave and bin it.",
            "visual_appearance": "Heat the round red fruit and put it in the bin.",
            "spatial": "Heat the apple near the knife and put it in the garbage can on the right.",
            "long_horizon": "Warming up an apple and put it in a garbagecan.",
        },
        (("Cabinet", 2),),
    ),
    _Family(
        "look_at_obj_in_light",
        ("CD", "Desk", "DeskLamp", "Book", "Drawer"),
        (110, 120, 150),
        ("Desk", "Book"),
        2,
        (
            _s("find a CD", "CD,Desk,Book", None, 0),
            _s("pick up the CD", "Desk,Book", "CD", 1),
            _s("find a DeskLamp", "DeskLamp,Desk", "CD", 1),
            _s("turn on the DeskLamp", "DeskLamp,Desk", "CD", 2),
        ),
        {
            "base": "Examine a CD under the desk lamp.",
            "common_sense": "Look at a music disc in the light of a lamp.",
            "complex_instruction": "Although the book is on the desk, pick up the CD and look at it under the lamp.",
            "visual_appearance": "Look at the shiny round disc under the lamp.",
            "spatial": "Take the CD next to the book and look at it under the desk lamp.",
            "long_horizon": "Examine a CD under the desk lamp.",
        },
        (("Drawer", 2),),
    ),
    # Two instances of one type (issue 41 item 1): only the instance names EmbodiedBench gives the
    # scene's objects reach the second book and the second drawer; training episodes only.
    _Family(
        "pick_two_obj_and_place",
        ("Book", "Bed", "Desk"),
        (140, 130, 120),
        ("Bed", "Desk"),
        2,
        (
            _s("find a Book", "Book,Bed", None, 0),
            _s("pick up the Book", "Bed,Book", "Book", 0),
            _s("find a Desk", "Desk", "Book", 0),
            _s("put down the object in hand", "Desk,Book", None, 1),
            _s("find a Book_2", "Book,Bed", None, 1),
            _s("pick up the Book", "Bed", "Book", 1),
            _s("find a Desk", "Desk,Book", "Book", 1),
            _s("put down the object in hand", "Desk,Book", None, 2),
        ),
        {},
        (("Book", 2),),
    ),
    _Family(
        "pick_and_place_simple",
        ("CD", "Drawer", "Desk"),
        (120, 140, 130),
        ("Desk", "Drawer"),
        1,
        (
            _s("find a Drawer_2", "Drawer", None, 0),
            _s("open the Drawer_2", "Drawer,CD", None, 0),
            _s("pick up the CD", "Drawer", "CD", 0),
            _s("close the Drawer_2", "Drawer", "CD", 0),
            _s("find a Desk", "Desk", "CD", 0),
            _s("put down the object in hand", "Desk,CD", None, 1),
        ),
        {},
        (("Drawer", 2),),
        name="pick_and_place_from_drawer",
    ),
)
#: The families of the evaluation subsets and the in-context examples (the first four).
_EVAL_FAMILIES = _FAMILIES[:4]

#: Each family's ALFRED annotation: the high-level PDDL plan with ALFRED's lower-case object names
#: and, per step, its low-level interactions (api action, object, receptacle of a put; an object is
#: named as EmbodiedBench names the scene's instances: ``Book_2`` is the second book); translated
#: (``data.plan_from_trajectory``) and resolved in the scene (``data.resolve_plan``) they give the
#: recorded steps.
_ALFRED_PLANS: dict[str, tuple[tuple[str, tuple[str, ...], tuple[tuple[str, str, str], ...]], ...]] = {
    "pick_and_place_simple": (
        ("GotoLocation", ("desk",), ()),
        ("PickupObject", ("mug",), (("PickupObject", "Mug", ""),)),
        ("GotoLocation", ("desk",), ()),
        ("PutObject", ("mug", "desk"), (("PutObject", "Mug", "Desk"),)),
    ),
    "pick_clean_then_place_in_recep": (
        ("GotoLocation", ("countertop",), ()),
        ("PickupObject", ("ladle",), (("PickupObject", "Ladle", ""),)),
        ("GotoLocation", ("sinkbasin",), ()),
        (
            "CleanObject",
            ("ladle",),
            (
                ("PutObject", "Ladle", "SinkBasin"),
                ("ToggleObjectOn", "Faucet", ""),
                ("ToggleObjectOff", "Faucet", ""),
                ("PickupObject", "Ladle", ""),
            ),
        ),
        ("GotoLocation", ("diningtable",), ()),
        ("PutObject", ("ladle", "diningtable"), (("PutObject", "Ladle", "DiningTable"),)),
    ),
    "pick_heat_then_place_in_recep": (
        ("GotoLocation", ("countertop",), ()),
        ("PickupObject", ("apple",), (("PickupObject", "Apple", ""),)),
        ("GotoLocation", ("microwave",), ()),
        (
            "HeatObject",
            ("apple",),
            (
                ("OpenObject", "Microwave", ""),
                ("PutObject", "Apple", "Microwave"),
                ("CloseObject", "Microwave", ""),
                ("ToggleObjectOn", "Microwave", ""),
                ("ToggleObjectOff", "Microwave", ""),
                ("OpenObject", "Microwave", ""),
                ("PickupObject", "Apple", ""),
                ("CloseObject", "Microwave", ""),
            ),
        ),
        ("GotoLocation", ("garbagecan",), ()),
        ("PutObject", ("apple", "garbagecan"), (("PutObject", "Apple", "GarbageCan"),)),
    ),
    "look_at_obj_in_light": (
        ("GotoLocation", ("desk",), ()),
        ("PickupObject", ("cd",), (("PickupObject", "CD", ""),)),
        ("GotoLocation", ("desklamp",), ()),
        ("ToggleObject", ("desklamp",), (("ToggleObjectOn", "DeskLamp", ""),)),
    ),
    "pick_two_obj_and_place": (
        ("GotoLocation", ("bed",), ()),
        ("PickupObject", ("book",), (("PickupObject", "Book", ""),)),
        ("GotoLocation", ("desk",), ()),
        ("PutObject", ("book", "desk"), (("PutObject", "Book", "Desk"),)),
        ("GotoLocation", ("bed",), ()),
        ("PickupObject", ("book",), (("PickupObject", "Book_2", ""),)),
        ("GotoLocation", ("desk",), ()),
        ("PutObject", ("book", "desk"), (("PutObject", "Book_2", "Desk"),)),
    ),
    "pick_and_place_from_drawer": (
        ("GotoLocation", ("drawer",), ()),
        (
            "PickupObject",
            ("cd",),
            (("OpenObject", "Drawer_2", ""), ("PickupObject", "CD", ""), ("CloseObject", "Drawer_2", "")),
        ),
        ("GotoLocation", ("desk",), ()),
        ("PutObject", ("cd", "desk"), (("PutObject", "CD", "Desk"),)),
    ),
}

#: The training episodes' instructions (other wording than every evaluation subset's).
_TRAIN_INSTRUCTIONS = {
    "pick_and_place_simple": "Place the coffee mug onto the desk.",
    "pick_clean_then_place_in_recep": "Clean the ladle in the sink and leave it on the dining table.",
    "pick_heat_then_place_in_recep": "Microwave the apple, then throw it in the bin.",
    "look_at_obj_in_light": "Hold the CD under the light of the desk lamp.",
    "pick_two_obj_and_place": "Move the two books from the bed to the desk.",
    "pick_and_place_from_drawer": "Take the CD out of the second drawer and put it on the desk.",
}


def scene_objects(fam: _Family) -> list[dict[str, Any]]:
    """The family's scene as AI2-THOR ``metadata["objects"]`` entries, one per instance."""
    counts = dict(fam.instances)
    out = []
    for t in fam.objects:
        for k in range(counts.get(t, 1)):
            h = zlib.crc32(f"{t}|{k}".encode())
            pos = "|".join(f"{((h >> s) % 400 - 200) / 100:+.2f}" for s in (0, 9, 18))
            kind = {"receptacle": t in RECEPTACLES, "pickupable": t in PICK_OBJS}
            out.append({"objectType": t, "objectId": f"{t}|{pos}", **kind})
    return out


def object_names(objects: Sequence[dict[str, Any]]) -> list[str]:
    """The names a skill may use in this scene: each type, then EmbodiedBench's instance names
    (``Drawer_2``...; ``formats.ebalfred_skills.instance_names``)."""
    types = list(dict.fromkeys(str(o["objectType"]) for o in objects))
    return types + [n for n in instance_names(objects).values() if n not in types]


def name_ids(objects: Sequence[dict[str, Any]]) -> dict[str, str]:
    """``name -> objectId`` as ``EBAlfEnv.step`` maps a find/open/close name (its
    ``name_to_id_dict``), and a type of one instance to that object."""
    out = {str(o["objectType"]): str(o["objectId"]) for o in reversed(objects)}  # the first instance
    out.update((name, oid) for oid, name in instance_names(objects).items())
    return out


def object_box(name: str, size: int) -> tuple[int, int, int, int]:
    """Pixel box of ``name`` in a frame of ``size``: a fixed slot chosen by a stable hash."""
    h = zlib.crc32(name.encode())
    cell = size // 4
    col, row = h % 4, (h // 4) % 3
    pad = max(1, cell // 8)
    return col * cell + pad, row * cell + pad, (col + 1) * cell - pad, (row + 1) * cell - pad


def _colour(name: str) -> tuple[int, int, int]:
    h = zlib.crc32(name.encode() + b"c")
    return 40 + h % 180, 40 + (h >> 8) % 180, 40 + (h >> 16) % 180


def draw_frame(colour: tuple[int, int, int], visible: Sequence[str], held: str | None, step: int, size: int) -> bytes:
    """One camera frame: a box per visible object, the held object as a bar, and a step tick
    (the real camera re-renders after every executed skill, so consecutive frames differ)."""
    import io

    im = Image.new("RGB", (size, size), colour)
    draw = ImageDraw.Draw(im)
    for name in visible:
        draw.rectangle(object_box(name, size), fill=_colour(name), outline=(0, 0, 0))
    if held:
        draw.rectangle((size // 4, size - size // 8, 3 * size // 4, size - 2), fill=_colour(held))
    draw.rectangle((0, size - 3, (step * 5) % size + 2, size - 1), fill=(255, 255, 255))
    buf = io.BytesIO()
    im.save(buf, format="PNG", optimize=False, compress_level=6)
    return buf.getvalue()


def _family_for(subset: str, i: int) -> _Family:
    if subset == "long_horizon":  # the longest recorded plans
        return _EVAL_FAMILIES[(1, 2)[i % 2]]
    return _EVAL_FAMILIES[(SUBSETS.index(subset) + i) % len(_EVAL_FAMILIES)]


def _example(instruction: str, plan: str, actions: Sequence[str]) -> str:
    """One in-context example in EmbodiedBench's shape (``alfred_examples.json``)."""
    ids = {a: i for i, a in enumerate(global_skills())}
    steps = "\n".join(json.dumps({"action_id": ids[a], "action_name": a}) for a in actions)
    return (
        f"Human instruction: {instruction}\nOutput: {{\n'language_plan': '{plan}',\n'executable_plan': [\n{steps}\n]}}"
    )


def alfred_trajectory(fam: _Family, instruction: str, low_actions: bool = True) -> dict[str, Any]:
    """The family's ALFRED ``traj_data.json``: the fields EmbodiedBench and the expert-plan loader
    read, ``planner_action`` objectIds included (the high-level plan alone names the instances)."""
    ids = name_ids(scene_objects(fam))

    def object_id(kind: str) -> str:
        return f"{ids['Sink']}|SinkBasin" if kind == "SinkBasin" else ids[kind]

    high, low = [], []
    steps = [*_ALFRED_PLANS[fam.key], ("NoOp", (), ())]
    for k, (verb, args, acts) in enumerate(steps):
        planner: dict[str, Any] = {"action": verb}
        for action, kind, receptacle in acts:
            api = {"action": action, "objectId": object_id(kind)}
            if receptacle:
                api["receptacleObjectId"] = object_id(receptacle)
            low.append({"high_idx": k, "api_action": api})
            if args and ALFRED_NAMES.get(args[0]) == kind.split("_")[0]:
                planner.setdefault("objectId", api["objectId"])
            if receptacle:
                planner.setdefault("receptacleObjectId", api["receptacleObjectId"])
        high.append({"high_idx": k, "discrete_action": {"action": verb, "args": list(args)}, "planner_action": planner})
    plan: dict[str, Any] = {"high_pddl": high}
    if low_actions:
        plan["low_actions"] = low
    return {
        "task_type": fam.task_type,
        "scene": {"scene_num": 1 + _FAMILIES.index(fam)},
        "plan": plan,
        "turk_annotations": {"anns": [{"task_desc": instruction}]},
    }


def write_examples(folder: Path) -> None:
    """Example files shaped as EmbodiedBench's (10 default, 7 long-horizon), from the task families."""
    folder.mkdir(parents=True, exist_ok=True)
    pairs = [(fam, subset) for subset in ("base", "common_sense", "complex_instruction") for fam in _EVAL_FAMILIES]
    default = [
        _example(fam.instructions[subset], f"First {fam.task_type.replace('_', ' ')}, step by step.",
                 [st.action for st in fam.steps])
        for fam, subset in pairs[:10]
    ]  # fmt: skip
    long = [
        _example(f"{fam.instructions['long_horizon']} Then do it once more.", "Explore first, then act.",
                 [st.action for st in fam.steps] * 2)
        for fam in [*_EVAL_FAMILIES, *_EVAL_FAMILIES][:7]
    ]  # fmt: skip
    for name, examples in ((EXAMPLE_FILES["default"], default), (EXAMPLE_FILES["long_horizon"], long)):
        (folder / name).write_text(json.dumps(examples, indent=1) + "\n", encoding="utf-8")


def _episode(root: Path, subset: str, i: int, fam: _Family, instruction: str, resolution: int) -> dict[str, Any]:
    """One episode's transcript; its frames are written under ``frames/<subset>/<i>/``."""
    frame_dir = root / "frames" / subset / str(i)
    frame_dir.mkdir(parents=True, exist_ok=True)

    def state(step: int, visible: Sequence[str], held: str | None, conds: int) -> dict[str, Any]:
        png = draw_frame(fam.colour, visible, held, step, resolution)
        (frame_dir / f"{step:03d}.png").write_bytes(png)
        return {
            "frame": f"frames/{subset}/{i}/{step:03d}.png",
            "visible": list(visible),
            "held": held,
            "conds": conds,
            "boxes": {v.lower(): [round(c * (1000 / resolution)) for c in object_box(v, resolution)] for v in visible},
        }

    objects = scene_objects(fam)
    ids = name_ids(objects)
    steps = []
    for k, st in enumerate(fam.steps, start=1):
        rec = state(k, st.visible, st.held, st.conds)
        # The instance a find/open/close acts on (the fake controller matches skills by it).
        instance = ids[st.action.rsplit(" ", 1)[-1]] if st.action.startswith(INSTANCE_VERBS) else ""
        rec.update(action=st.action, object_id=instance, success=True, feedback=SUCCESS_FEEDBACK)
        steps.append(rec)
    skills = language_skill_set(objects)
    return {
        "instruction": instruction,
        "task_type": fam.task_type,
        "objects": object_names(objects),
        "scene_objects": objects,
        "skills": skills,
        "admissible": scene_filter(skills, objects),
        "conds_total": fam.conds_total,
        "initial": state(0, fam.initial_visible, None, 0),
        "steps": steps,
    }


def fixture_settings(root: Path) -> tuple[int, int, int] | None:
    """(format version, episodes per subset, frame resolution) of the fixture built in ``root``;
    ``None`` where none was (or its index is unreadable)."""
    try:
        doc = json.loads((root / "transcripts.json").read_text())
        per_subset = sum(1 for key in doc["episodes"] if key.split("/")[0] == SUBSETS[0])
        return int(doc["version"]), per_subset, int(doc["resolution"])
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return None


def build_fixture(out: str | Path, episodes_per_subset: int = 3, resolution: int = 96, train_episodes: int = 6) -> Path:
    """Write the fixture to ``out`` (an existing one there is overwritten) and return ``out``;
    the same arguments give byte-identical files. The ``train_episodes`` stand for ALFRED
    training trajectories: other tasks and instructions than every evaluation episode."""
    if episodes_per_subset < 1:
        raise ValueError(f"episodes_per_subset must be >= 1, got {episodes_per_subset}")
    if train_episodes < 0:
        raise ValueError(f"train_episodes must be >= 0, got {train_episodes}")
    if resolution < 32:
        raise ValueError(f"resolution must be >= 32 pixels, got {resolution}")
    root = Path(out)
    root.mkdir(parents=True, exist_ok=True)
    plan = [(s, i, _family_for(s, i)) for s in SUBSETS for i in range(episodes_per_subset)]
    plan += [(TRAIN_SUBSET, i, _FAMILIES[i % len(_FAMILIES)]) for i in range(train_episodes)]  # every family
    splits: dict[str, list[dict[str, Any]]] = {s: [] for s in (*SUBSETS, TRAIN_SUBSET)}
    episodes: dict[str, Any] = {}
    for subset, i, fam in plan:
        train = subset == TRAIN_SUBSET
        instruction = _TRAIN_INSTRUCTIONS[fam.key] if train else fam.instructions[subset]
        trial = f"trial_fixture_train_{i}" if train else f"trial_fixture_{subset}"
        task = f"{fam.task_type}-fixture-{i}/{trial}"
        splits[subset].append({"task": task, "repeat_idx": 0, "instruction": instruction})
        # ALFRED's folders: training trajectories under train, EB-ALFRED's under valid_seen.
        traj = root / ALFRED_DIR / ("train" if train else "valid_seen") / task / "traj_data.json"
        traj.parent.mkdir(parents=True, exist_ok=True)
        traj.write_text(json.dumps(alfred_trajectory(fam, instruction), indent=1, sort_keys=True) + "\n")
        episodes[f"{subset}/{i}"] = _episode(root, subset, i, fam, instruction, resolution)
    train_split = {TRAIN_SUBSET: splits.pop(TRAIN_SUBSET)}
    (root / "splits.json").write_text(json.dumps(splits, indent=1, sort_keys=True) + "\n")
    (root / TRAIN_FILE).write_text(json.dumps(train_split, indent=1, sort_keys=True) + "\n")
    write_examples(root / "examples")
    doc = {"version": FIXTURE_VERSION, "resolution": resolution, "episodes": episodes}
    (root / "transcripts.json").write_text(json.dumps(doc, indent=1, sort_keys=True) + "\n")
    return root
