"""EB-ALFRED behind the shared Env protocol (paper "Benchmarks"; Table A.4: 30 steps,
reward success + 0.2 x goal-condition progress; docs/ebalfred.md).

One controller per game slot, with the interface of EmbodiedBench's ``EBAlfEnv`` (AI2-THOR
2.1.0, or the fixture's :class:`~memprism_ray.benchmark.ebalfred.fake.FakeController`). ``reset``
points it at ``dataset[<index>]`` of the list the game was listed from (``GameRef.path``), so
one AI2-THOR process serves every episode of a slot. An action not in the controller's
``language_skill_set`` is never sent to the simulator (``ThorConnector`` would stop on
``assert False``): as in EmbodiedBench's evaluator it counts against the 10-invalid-action
limit and takes none of the 30 simulator steps. Every transition says what happened to its
action (``meta["execution"]``: rejected, executed outside the prompt's list, executed) and the
episode's invalid actions so far, as EmbodiedBench counts them. Each step returns the change of
``success + 0.2 * progress``, so an episode's summed reward is exactly Table A.4's.
"""

from __future__ import annotations

import hashlib
import io
import os
import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from PIL import Image

from memprism_ray.benchmark.ebalfred.data import SUBSETS, SceneInstances, embodiedbench_path, parse_game_id
from memprism_ray.benchmark.ebalfred.examples import (
    N_SHOTS,
    example_file,
    format_examples,
    load_examples,
)
from memprism_ray.benchmark.ebalfred.skills import check_mode, instance_names, scene_filter, upstream_ids
from memprism_ray.envs.base import STEP_TAKEN, GameRef, Observation, Transition

#: Environment variables read by :meth:`EbAlfredConfig.from_env` (docs/ebalfred.md).
ENV_VARS = {
    "controller": "MEMPRISM_EBALFRED_CONTROLLER",
    "fixture": "MEMPRISM_EBALFRED_FIXTURE",
    "local_build": "MEMPRISM_AI2THOR_BUILD",
    "x_display": "MEMPRISM_EBALFRED_X_DISPLAY",
    "frame_dir": "MEMPRISM_EBALFRED_FRAME_DIR",
    "resolution": "MEMPRISM_EBALFRED_RESOLUTION",
    "progress_coef": "MEMPRISM_EBALFRED_PROGRESS_COEF",
}
_NUMERIC = {"resolution": int, "progress_coef": float}
CONTROLLERS = ("embodiedbench", "fake")
#: Feedback of an output that is not a skill (this adapter's wording; EmbodiedBench shows none).
INVALID_OUTPUT_FEEDBACK = "Last action is invalid. The output is not one of the available actions; nothing was done."
INSTALL_HINT = 'pip install "memprism-ray[ebalfred]" and EmbodiedBench (docs/ebalfred.md)'

#: What happened to a step's action (``Transition.meta["execution"]``, the step row's column; issue 41
#: item 2): not a skill of EmbodiedBench's list, so never sent to the simulator; a skill of that
#: list the prompt did not show (the scene-filtered list), sent through the agent's fallback; a
#: skill the prompt showed.
REJECTED, EXECUTED_OUTSIDE_LIST, EXECUTED = "rejected", "executed_outside_list", "executed"
EXECUTIONS = (REJECTED, EXECUTED_OUTSIDE_LIST, EXECUTED)


def check_settings(c: Any) -> None:
    """The checks the ``ebalfred`` config section and :class:`EbAlfredConfig` share."""
    if c.controller not in CONTROLLERS:
        raise ValueError(f"ebalfred.controller={c.controller!r}; valid controllers: {', '.join(CONTROLLERS)}")
    if c.resolution < 32:
        raise ValueError(f"ebalfred.resolution must be >= 32, got {c.resolution}")
    check_mode(c.skills)
    if c.n_shots < 0:
        raise ValueError(f"ebalfred.n_shots must be >= 0, got {c.n_shots}")


@dataclass
class EbAlfredConfig:
    """How EB-ALFRED episodes are played (paper Table A.4 for the reward); the ``ebalfred`` config
    section (:mod:`.section`) documents the fields it shares."""

    controller: str = "embodiedbench"
    fixture: str = ""
    resolution: int = 500
    x_display: str = "1"
    local_build: str = ""
    frame_dir: str = ""
    progress_coef: float = 0.2
    """weight of goal-condition progress in the reward (Table A.4: 0.2)"""
    skills: str = "scene"
    n_shots: int = N_SHOTS
    examples: str = ""
    extra: dict[str, Any] = field(default_factory=dict)
    """further keyword arguments for the real controller (e.g. ``down_sample_ratio``)"""

    def __post_init__(self) -> None:
        check_settings(self)
        if self.controller == "fake" and not self.fixture:
            raise ValueError(
                f"ebalfred.controller='fake' needs ebalfred.fixture (or ${ENV_VARS['fixture']}): a fixture folder"
            )
        if not 0.0 <= self.progress_coef <= 1.0:
            raise ValueError(f"ebalfred.progress_coef must be in [0, 1], got {self.progress_coef}")

    def examples_dir(self) -> Path | None:
        """Where the in-context example files are read from on this node."""
        if self.examples:
            return Path(self.examples)
        if self.controller == "fake":
            return Path(self.fixture) / "examples"
        return embodiedbench_path("evaluator", "config")

    @classmethod
    def from_env(cls, **overrides: Any) -> EbAlfredConfig:
        """Defaults overridden by the ``MEMPRISM_EBALFRED_*`` variables, then ``overrides``."""
        values: dict[str, Any] = {}
        for key, var in ENV_VARS.items():
            if os.environ.get(var):
                raw = os.environ[var]
                try:
                    values[key] = _NUMERIC[key](raw) if key in _NUMERIC else raw
                except ValueError:
                    raise ValueError(f"${var}={raw!r} is not a valid ebalfred.{key}") from None
        if values.get("fixture") and "controller" not in values:
            values["controller"] = "fake"
        values.update(overrides)
        return cls(**values)


def encode_png(frame: Any) -> bytes:
    """An ``HxWx3`` uint8 frame (AI2-THOR's ``event.frame``) as PNG bytes."""
    arr = np.asarray(frame)
    if arr.ndim != 3 or arr.shape[2] not in (3, 4) or arr.dtype != np.uint8:
        raise ValueError(f"camera frame must be an HxWx3 uint8 array, got shape {arr.shape} dtype {arr.dtype}")
    buf = io.BytesIO()
    # Level 1, not PIL's default 6: on a 500x500 frame with render-like noise 98 ms vs 162 ms
    # per step for 11% more bytes; a flat frame 9 ms vs 18 ms (measured on this 2-core box).
    Image.fromarray(arr[:, :, :3]).save(buf, format="PNG", compress_level=1)
    return buf.getvalue()


def state_text(controller: Any) -> str:
    """``"Visible objects: A, B. Held objects: C (held)."`` from the controller's last event."""
    event = getattr(getattr(controller, "env", None), "last_event", None)
    meta: Mapping[str, Any] = getattr(event, "metadata", None) or {}
    visible = list(dict.fromkeys(o["objectType"] for o in meta.get("objects", []) if o.get("visible")))
    held = [f"{o['objectType']} (held)" for o in meta.get("inventoryObjects", [])]
    return f"Visible objects: {', '.join(visible) or 'none'}. Held objects: {', '.join(held) or 'none'}."


def make_embodiedbench_controller(eval_set: str, config: EbAlfredConfig) -> Any:
    """EmbodiedBench's ``EBAlfEnv`` on AI2-THOR 2.1.0, imported here and only here."""
    if config.resolution < 300:  # ai2thor 2.1.0's Controller.start refuses smaller screens
        raise RuntimeError(f"ebalfred.resolution={config.resolution}: AI2-THOR 2.1.0 needs >= 300 pixels")
    try:
        import ai2thor  # noqa: F401
        import embodiedbench.envs.eb_alfred.gen.constants as constants
    except ImportError as exc:
        raise RuntimeError(f"EB-ALFRED needs ai2thor 2.1.0 and EmbodiedBench ({exc}): {INSTALL_HINT}") from None
    if config.local_build:
        if not os.path.isfile(config.local_build):
            raise RuntimeError(
                f"ebalfred.local_build={config.local_build!r} is not a file; point it (or "
                f"${ENV_VARS['local_build']}) at the AI2-THOR build executable (thor-*-Linux64)"
            )
        if "embodiedbench.envs.eb_alfred.env.thor_env" in sys.modules and config.local_build != constants.BUILD_PATH:
            raise RuntimeError(
                "ebalfred.local_build must be set before EmbodiedBench's thor_env is first imported in this process"
            )
        # ThorEnv binds constants.BUILD_PATH as its build_path default when thor_env is imported.
        constants.BUILD_PATH = config.local_build
    try:
        import embodiedbench.envs.eb_alfred.EBAlfEnv as module
    except ImportError as exc:
        raise RuntimeError(f"EB-ALFRED needs ai2thor 2.1.0 and EmbodiedBench ({exc}): {INSTALL_HINT}") from None
    module.X_DISPLAY = config.x_display  # read by EBAlfEnv.__init__
    try:
        return module.EBAlfEnv(eval_set=eval_set, resolution=config.resolution, **config.extra)
    except Exception as exc:
        raise RuntimeError(
            f"AI2-THOR could not start ({type(exc).__name__}: {exc}). Without network access ai2thor cannot "
            f"download its simulator build: set ebalfred.local_build (or ${ENV_VARS['local_build']}) to a local "
            f"build executable; headless nodes also need an X display (ebalfred.x_display, "
            f"${ENV_VARS['x_display']}; see docs/ebalfred.md)"
        ) from exc


def make_controller(eval_set: str, config: EbAlfredConfig) -> Any:
    """The controller ``config.controller`` names, for subset ``eval_set``."""
    if config.controller == "fake":
        from memprism_ray.benchmark.ebalfred.fake import FakeController

        return FakeController(eval_set, config.resolution, fixture=config.fixture)
    return make_embodiedbench_controller(eval_set, config)


class EbAlfredEnv:
    """``num_slots`` EB-ALFRED game slots, one controller each, created on first reset."""

    def __init__(
        self,
        num_slots: int = 1,
        config: EbAlfredConfig | None = None,
        controller_factory: Callable[[str, EbAlfredConfig], Any] | None = None,
    ) -> None:
        if isinstance(num_slots, bool) or not isinstance(num_slots, int) or num_slots < 1:
            raise ValueError(f"num_slots must be a positive int, got {num_slots!r}")
        self._num_slots = num_slots
        self.config = config if config is not None else EbAlfredConfig.from_env()
        self._factory = controller_factory or make_controller
        self._controllers: list[Any] = [None] * num_slots
        self._subsets: list[str | None] = [None] * num_slots
        self._potential = [0.0] * num_slots
        self._frame_sha = [""] * num_slots
        self._steps = [0] * num_slots
        self._live = [False] * num_slots
        self._episode_dir: list[Path | None] = [None] * num_slots
        self._data_paths: list[str | None] = [None] * num_slots
        self._admissible: list[tuple[str, ...]] = [()] * num_slots
        self._scenes: list[SceneInstances | None] = [None] * num_slots
        self._png: list[bytes] = [b""] * num_slots
        self._progress = [0.0] * num_slots
        self._examples: dict[str, str] = {}
        self._resets = 0

    @property
    def num_slots(self) -> int:
        return self._num_slots

    def _slot(self, slot: int) -> int:
        if isinstance(slot, bool) or not isinstance(slot, int) or not 0 <= slot < self._num_slots:
            raise ValueError(f"slot must be an int in [0, {self._num_slots}), got {slot!r}")
        return slot

    def _controller(self, slot: int, subset: str, data_path: str | None) -> Any:
        ctrl = self._controllers[slot]
        if ctrl is None:
            # EBAlfEnv's constructor accepts only an evaluation subset; any other list is loaded after.
            first = subset if subset in SUBSETS else SUBSETS[0]
            ctrl = self._controllers[slot] = self._factory(first, self.config)
            self._subsets[slot] = first
            self._data_paths[slot] = getattr(ctrl, "data_path", None)
        want = data_path or self._data_paths[slot]
        if self._subsets[slot] != subset or self._data_paths[slot] != want:
            if want is not None:
                ctrl.data_path = want
            ctrl.dataset = ctrl._load_dataset(subset)
            ctrl.number_of_episodes = len(ctrl.dataset)
            self._data_paths[slot] = want
        self._subsets[slot] = subset
        return ctrl

    @staticmethod
    def _data_path(game: GameRef) -> str | None:
        """The episode list ``game`` was read from, or ``None``; one this node cannot read is an
        error (the controller's default list would play other episodes under the same id)."""
        path = Path(game.path) if game.path else None
        if path is None or str(path) in ("", "."):
            return None
        if not path.is_file():
            raise FileNotFoundError(
                f"EB-ALFRED game {game.game_id!r} comes from {path}, which this node cannot read: put the "
                "episode list (ebalfred.splits / ebalfred.train_splits) at the same path on every env node"
            )
        return str(path)

    def _examples_block(self, subset: str) -> str:
        """The formatted in-context examples of ``subset``, read once per example file."""
        if self.config.n_shots == 0:
            return ""
        folder = self.config.examples_dir()
        if folder is None:
            load_examples(Path("<EmbodiedBench not installed>"), subset)  # raises the one-line error
        key = f"{folder}|{example_file(subset)}"
        if key not in self._examples:
            self._examples[key] = format_examples(load_examples(folder, subset), self.config.n_shots)
        return self._examples[key]

    def reset(self, game: GameRef, slot: int = 0) -> Observation:
        slot = self._slot(slot)
        subset, index = parse_game_id(game.game_id)
        ctrl = self._controller(slot, subset, self._data_path(game))
        if index >= ctrl.number_of_episodes:
            raise ValueError(
                f"EB-ALFRED game {game.game_id!r}: subset {subset} has {ctrl.number_of_episodes} episode(s)"
            )
        ctrl._current_episode_num = index
        obs = ctrl.reset()
        png = encode_png(obs["head_rgb"])
        self._potential[slot] = 0.0
        self._steps[slot] = 0
        self._frame_sha[slot] = hashlib.sha1(png).hexdigest()
        self._png[slot] = png
        self._progress[slot] = 0.0
        self._live[slot] = True
        full = tuple(ctrl.language_skill_set)
        metadata = getattr(getattr(ctrl.env, "last_event", None), "metadata", None) or {}
        objects = tuple(
            {k: o.get(k) for k in ("objectId", "objectType", "receptacle", "pickupable")}
            for o in metadata.get("objects", [])
        )
        skills = tuple(scene_filter(full, objects)) if self.config.skills == "scene" else full
        if [full[i] if i < len(full) else None for i in upstream_ids(skills)] != list(skills):
            raise RuntimeError(
                f"EB-ALFRED game {game.game_id!r}: the controller's skill list is not the 162 global skills "
                "followed by the scene's instance skills (EBAlfEnv at b247936): the prompt's action ids would be wrong"
            )
        # EBAlfEnv's own table when it has one (the real controller), else upstream's rule over the objects.
        names = getattr(ctrl, "id_to_name_dict", None)
        self._scenes[slot] = SceneInstances(objects, dict(names or instance_names(objects)), full)
        self._admissible[slot] = skills
        meta: dict[str, Any] = {}
        examples = self._examples_block(subset)
        if examples:
            meta["examples"] = examples
        if self.config.frame_dir:
            self._resets += 1
            self._episode_dir[slot] = Path(self.config.frame_dir) / subset / str(index) / f"run{self._resets:05d}"
            meta["frame_path"] = self._write_frame(slot, 0, png)
        return Observation(
            text=state_text(ctrl),
            goal=str(ctrl.episode_language_instruction),
            admissible=skills,
            meta={
                "game_id": game.game_id,
                "subset": subset,
                "step": 0,
                "frame_step": 0,
                "frame_sha1": self._frame_sha[slot],
                "frame_size": [int(obs["head_rgb"].shape[1]), int(obs["head_rgb"].shape[0])],
                **meta,
            },
            frame=png,
        )

    def scene(self, slot: int = 0) -> SceneInstances:
        """The scene of the slot's last reset: its objects, EmbodiedBench's instance names and its
        full skill list (the expert's plans name instances through it: ``data.resolve_plan``)."""
        scene = self._scenes[self._slot(slot)]
        if scene is None:
            raise RuntimeError(f"EB-ALFRED slot {slot}: no scene before the first reset")
        return scene

    def step(self, action: str, slot: int = 0) -> Transition:
        slot = self._slot(slot)
        if not self._live[slot]:
            raise RuntimeError(f"EB-ALFRED slot {slot}: step before reset (or after the episode ended)")
        ctrl = self._controllers[slot]
        if action not in ctrl.language_skill_set:
            # Not a skill: handled as EmbodiedBench's evaluator does: not executed, one more invalid
            # action (the episode ends at _max_invalid_actions), no simulator step; the decision
            # still gets a transition (unchanged frame, zero reward) so step rows, Phi's frame
            # checks and the history stay aligned.
            ctrl._cur_invalid_actions += 1
            head = {"progress": self._progress[slot], "task_success": False, "last_action_success": False}
            # STEP_TAKEN False: the agent's max_steps counts simulator steps, as upstream's 30
            head |= {"invalid_output": True, STEP_TAKEN: False, "env_feedback": INVALID_OUTPUT_FEEDBACK}
            head |= {"execution": REJECTED, "invalid_actions": int(ctrl._cur_invalid_actions)}
            done = ctrl._cur_invalid_actions >= ctrl._max_invalid_actions
            feedback = f"{INVALID_OUTPUT_FEEDBACK} {state_text(ctrl)}"
            return self._transition(slot, feedback, 0.0, done, False, head, self._png[slot], False)
        obs, _dense, done, info = ctrl.step(action)
        progress = float(info.get("task_progress", 0.0))
        success = bool(info.get("task_success", 0.0))
        potential = float(success) + self.config.progress_coef * progress
        reward = potential - self._potential[slot]
        self._potential[slot] = potential
        png = encode_png(obs["head_rgb"])
        previous, self._frame_sha[slot] = self._frame_sha[slot], hashlib.sha1(png).hexdigest()
        self._png[slot] = png
        self._progress[slot] = progress
        feedback = str(info.get("env_feedback", ""))
        sep = " " if feedback.endswith((".", "!", "?")) or not feedback else ". "
        head = {"progress": progress, "task_success": success}
        head |= {"last_action_success": bool(info.get("last_action_success", 0.0)), "env_feedback": feedback}
        # EBAlfEnv counts a failed skill as invalid; with the rejected outputs above that is the
        # evaluator's num_invalid_actions (eb_alfred_evaluator.py), which the 10-invalid limit reads.
        shown = action in self._admissible[slot]
        head |= {"execution": EXECUTED if shown else EXECUTED_OUTSIDE_LIST}
        head |= {"invalid_actions": int(ctrl._cur_invalid_actions)}
        text = f"{feedback}{sep}{state_text(ctrl)}".strip()
        return self._transition(slot, text, reward, bool(done), success, head, png, self._frame_sha[slot] != previous)

    def _transition(
        self, slot: int, feedback: str, reward: float, done: bool, won: bool, head: dict, png: bytes, changed: bool
    ) -> Transition:
        self._steps[slot] += 1
        if done:
            self._live[slot] = False
        step = self._steps[slot]
        meta = {"step": step, **head, "frame_step": step, "frame_sha1": self._frame_sha[slot], "frame_changed": changed}
        if self.config.frame_dir and self._episode_dir[slot] is not None:
            meta["frame_path"] = self._write_frame(slot, step, png)
        return Transition(feedback, reward, done, won, self._admissible[slot], meta, png)

    def _write_frame(self, slot: int, step: int, png: bytes) -> str:
        folder = self._episode_dir[slot]
        assert folder is not None
        folder.mkdir(parents=True, exist_ok=True)
        path = folder / f"{step:03d}.png"
        path.write_bytes(png)
        return str(path)

    def close(self) -> None:
        errors = []
        for i, ctrl in enumerate(self._controllers):
            if ctrl is None:
                continue
            try:
                ctrl.close()
            except Exception as exc:  # close every slot; report all failures after
                errors.append(f"slot {i}: {type(exc).__name__}: {exc}")
            self._controllers[i] = None
        if errors:
            raise RuntimeError("EB-ALFRED controllers failed to close: " + "; ".join(errors))
