"""A controller with the interface of EmbodiedBench's ``EBAlfEnv`` that replays the
recorded-transcript fixture (:mod:`.fixture`), so everything above the simulator is tested
without AI2-THOR (issue 13 item 5; docs/ebalfred.md "Tests without the simulator: the fixture").

Replay rule: the next recorded expert step plays its record; any other skill gets the failure
rules of EmbodiedBench's skill layer that need no simulator, with their wording; of the rest,
``find`` succeeds without changing the recorded state and a state-changing skill fails as not
replayable, so the feedback never contradicts the object state the fixture shows. A string that
is no skill raises ``AssertionError('instruction not supported')``, as ``ThorConnector`` does.

Names reach instances as in ``EBAlfEnv`` (issue 41 item 1): at reset the controller numbers the
scene's objects (``id_to_name_dict``, ``name_to_id_dict``: ``Drawer``, ``Drawer_2``...), and a
find/open/close plays a record only when its name maps to the record's instance: ``find a
Drawer`` is the first drawer, never the second one the record opened.
"""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np
from PIL import Image

from memprism_ray.benchmark.ebalfred.data import INSTANCE_VERBS, check_subset
from memprism_ray.benchmark.ebalfred.fixture import INVALID_PREFIX, SUCCESS_FEEDBACK
from memprism_ray.benchmark.ebalfred.fixture_format import load_transcripts
from memprism_ray.benchmark.ebalfred.skills import instance_names, is_skill_string

#: The failure reason for an off-transcript state-changing skill (not an EmbodiedBench message).
NOT_REPLAYABLE = "The fixture has no recording of this action here"


class FakeController:
    """Replays one fixture; one instance per game slot, like one ``EBAlfEnv`` per process."""

    def __init__(self, eval_set: str = "base", resolution: int = 500, *, fixture: str | Path) -> None:
        self.fixture_root = Path(fixture)
        self._doc = load_transcripts(self.fixture_root)
        self.data_path = str(self.fixture_root / "splits.json")
        self.resolution = resolution
        self.eval_set = check_subset(eval_set, "eval_set")  # EBAlfEnv: assert eval_set in ValidEvalSets
        self.dataset = self._load_dataset(eval_set)
        self.number_of_episodes = len(self.dataset)
        self._current_episode_num = 0
        self._current_step = 0
        self._max_episode_steps = 30
        self._cur_invalid_actions = 0
        self._max_invalid_actions = 10
        self._reset = False
        self.language_skill_set: list[str] = []
        self.episode_language_instruction = ""
        self.env = SimpleNamespace(last_event=None)
        self.closed = False
        self._episode: dict[str, Any] = {}
        self._pointer = 0
        self._state: dict[str, Any] = {}
        self.id_to_name_dict: dict[str, str] | None = None
        self.name_to_id_dict: dict[str, str] | None = None

    def _load_dataset(self, eval_set: str) -> list[dict[str, Any]]:
        check_subset(eval_set, "eval_set", train=True)
        dataset = json.loads(Path(self.data_path).read_text())[eval_set]
        return [dict(ep, fixture_key=f"{eval_set}/{i}") for i, ep in enumerate(dataset)]

    def reset(self) -> dict[str, Any]:
        assert self._current_episode_num < self.number_of_episodes
        entry = self.dataset[self._current_episode_num]
        self._episode = self._doc["episodes"][entry["fixture_key"]]
        self.episode_language_instruction = entry["instruction"]
        self.language_skill_set = list(self._episode["skills"])
        self.id_to_name_dict = instance_names(self._episode["scene_objects"])
        self.name_to_id_dict = {name: oid for oid, name in self.id_to_name_dict.items()}
        self._pointer = 0
        self._current_step = 0
        self._cur_invalid_actions = 0
        self._current_episode_num += 1
        self._reset = True
        self._set_state(self._episode["initial"])
        return {"head_rgb": self.env.last_event.frame}

    def step(self, action: int | str, reasoning: str = "") -> tuple[dict[str, Any], float, bool, dict[str, Any]]:
        assert self._reset, "Reset env before stepping"
        self._current_step += 1
        lang = self.language_skill_set[action] if isinstance(action, int) else str(action)
        if not is_skill_string(lang):
            raise AssertionError("instruction not supported")  # ThorConnector.llm_skill_interact
        steps = self._episode["steps"]
        if self._pointer < len(steps) and self._plays(lang, steps[self._pointer]):
            rec = steps[self._pointer]
            self._pointer += 1
            self._set_state(rec)
            success, feedback = True, SUCCESS_FEEDBACK
        else:
            message = self._rule_failure(lang)
            success = message is None
            feedback = SUCCESS_FEEDBACK if success else f"{INVALID_PREFIX} {message}"
        if not success:
            self._cur_invalid_actions += 1
        total = int(self._episode["conds_total"])
        progress = self._state["conds"] / total if total else 0.0
        task_success = float(self._pointer == len(steps) and self._state["conds"] == total)
        done = (
            self._current_step >= self._max_episode_steps
            or bool(task_success)
            or self._cur_invalid_actions >= self._max_invalid_actions
        )
        info = {
            "task_success": task_success,
            "task_progress": progress,
            "instruction": self.episode_language_instruction,
            "env_step": self._current_step,
            "env_feedback": feedback,
            "last_action_success": float(success),
            "object_states": {"visible_objs": list(self._state["visible"])},
            "action_id": action,
            "action_description": lang,
            "reasoning": reasoning,
        }
        # EBAlfEnv returns ALFRED's dense shaping reward here; the adapter does not use it.
        return {"head_rgb": self.env.last_event.frame}, 0.0, done, info

    def close(self) -> None:
        self.closed = True

    def _instance(self, name: str) -> str | None:
        """The objectId a find/open/close name acts on: ``name_to_id_dict``'s, else (a type of one
        instance, or one EmbodiedBench does not number) the scene's first object of that type."""
        assert self.name_to_id_dict is not None
        if name in self.name_to_id_dict:
            return self.name_to_id_dict[name]
        same = [o["objectId"] for o in self._episode["scene_objects"] if o["objectId"].split("|")[0] == name]
        return same[0] if same else None

    def _plays(self, lang: str, rec: dict[str, Any]) -> bool:
        """Whether ``lang`` is the recorded skill ``rec``: the same verb on the same instance."""
        verb = next((v for v in INSTANCE_VERBS if lang.startswith(v)), None)
        if verb is None or not rec.get("object_id"):
            return lang == rec["action"]
        name = lang[len(verb) :]
        same_type = rec["action"].startswith(verb) and rec["action"][len(verb) :].split("_")[0] == name.split("_")[0]
        return same_type and self._instance(name) == rec["object_id"]

    def _set_state(self, rec: dict[str, Any]) -> None:
        self._state = {"visible": list(rec["visible"]), "held": rec["held"], "conds": int(rec["conds"])}
        with Image.open(self.fixture_root / rec["frame"]) as im:
            frame = np.asarray(im.convert("RGB"), dtype=np.uint8)
        held = rec["held"]
        # AI2-THOR's metadata: every instance, the first of a visible type marked visible.
        objects, first = [], set()
        for o in self._episode["scene_objects"]:
            shown = o["objectType"] in rec["visible"] and o["objectType"] not in first
            first.add(o["objectType"])
            objects.append(dict(o, visible=shown))
        inventory = [{"objectType": held, "objectId": f"{held}|fixture"}] if held else []
        self.env.last_event = SimpleNamespace(frame=frame, metadata={"objects": objects, "inventoryObjects": inventory})

    def _rule_failure(self, lang: str) -> str | None:
        held, visible = self._state["held"], self._state["visible"]
        objects = self._episode["objects"]
        target = lang.split(" ")[-1]
        if lang.startswith(("put down ", "drop")):
            return "Robot is not holding any object" if held is None else NOT_REPLAYABLE
        if lang.startswith("find a "):  # navigation: succeeds, the replayed state stays
            if target not in objects:
                return (
                    f"Cannot find {target}. This object may not exist in this scene. "
                    "Try to explore other instances instead."
                )
            return None
        if lang.startswith("pick up the "):
            if held is not None:
                return f"Robot is currently holding {held}"
            if target not in visible:
                return f"Cannot find {target} to pick up. Find the object before picking up it"
            return NOT_REPLAYABLE
        kind = target.split("_")[0]  # an instance name is visible as its type
        if lang.startswith("open the ") and kind not in visible:
            return f"Cannot find {target} to open. Find the object before opening it"
        if lang.startswith("close the ") and kind not in visible:
            return f"Cannot find {target} to close"
        return NOT_REPLAYABLE
