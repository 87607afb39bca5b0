"""The AI2-THOR scene layouts shipped inside the ``alfworld`` wheel: per ALFRED scene, the object
types (``-objects.json``), the receptacle instances with a vetted pose (``-openable.json``) and
the reachable floor points (``-layout.npy``). ALFRED holds scenes 1-6, 201-206, 301-306 and
401-406 out; ALFWorld's ``valid_unseen`` games use only those.
"""

from __future__ import annotations

import functools
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

#: Room type by scene-number range (ALFRED ``constants.SCENE_TYPE``).
ROOM_TYPES: tuple[tuple[str, range], ...] = (
    ("Kitchen", range(1, 31)),
    ("LivingRoom", range(201, 231)),
    ("Bedroom", range(301, 331)),
    ("Bathroom", range(401, 431)),
)


def _constants() -> Any:
    import alfworld.gen.constants as constants

    return constants


def train_scenes() -> tuple[int, ...]:
    return tuple(_constants().TRAIN_SCENE_NUMBERS)


def test_scenes() -> tuple[int, ...]:
    return tuple(_constants().TEST_SCENE_NUMBERS)


def room_type(scene_num: int) -> str:
    for name, numbers in ROOM_TYPES:
        if scene_num in numbers:
            return name
    raise ValueError(f"scene {scene_num} is not an ALFRED scene number (1-30, 201-230, 301-330, 401-430)")


def receptacle_type(instance_id: str) -> str:
    """``"Sink|+00.71|+00.82|-01.77|SinkBasin" -> "SinkBasin"``, ``"Drawer|+00.95|..." -> "Drawer"``."""
    parts = instance_id.split("|")
    if "Basin" in parts[-1]:
        return parts[-1]
    return parts[0]


@dataclass(frozen=True)
class SceneLayout:
    """One packaged scene: its receptacle instances with poses, object types and floor points."""

    scene_num: int
    room_type: str
    #: receptacle instance id -> (x, z, rotation degrees, camera horizon), THOR units
    receptacles: tuple[tuple[str, tuple[float, float, int, int]], ...]
    object_types: tuple[str, ...]
    floor_points: tuple[tuple[float, float], ...]

    @property
    def floor_plan(self) -> str:
        return f"FloorPlan{self.scene_num}"

    @functools.cached_property
    def receptacle_types(self) -> frozenset[str]:
        return frozenset(receptacle_type(r) for r, _ in self.receptacles)


@functools.cache
def load_scene(scene_num: int) -> SceneLayout:
    """Read one scene's three packaged files (cached per process)."""
    rtype = room_type(scene_num)
    base = Path(_constants().__file__).parent / "layouts" / f"FloorPlan{scene_num}"
    try:
        openable = json.loads(Path(f"{base}-openable.json").read_text())
        objects = json.loads(Path(f"{base}-objects.json").read_text())
        points = np.load(f"{base}-layout.npy", allow_pickle=False)
    except FileNotFoundError as exc:
        raise ValueError(
            f"the alfworld package lacks the layout files of scene {scene_num} ({exc.filename}); "
            "reinstall alfworld==0.4.2"
        ) from None
    receptacles = tuple(sorted((rid, (float(p[0]), float(p[1]), int(p[2]), int(p[3]))) for rid, p in openable.items()))
    floor = tuple((float(x), float(z)) for x, z in np.asarray(points, dtype=float).reshape(-1, 2))
    return SceneLayout(scene_num, rtype, receptacles, tuple(sorted(set(objects))), floor)
