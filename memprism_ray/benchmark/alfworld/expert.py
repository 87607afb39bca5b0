"""ALFWorld's handcoded expert, with the 0.4.2 move/put bug fixed (issue 3, items 1 and 6).

``BasePolicy.update_state_tracking`` registers a put only when the last command contains
``"put"``, but the 0.4.2 grammar phrases it ``"move X to Y"``: the expert still believes it holds
the object and, on ``pick_two_obj_and_place``, loops. The policies here read ``move`` as the put
it is. The expert draws from the global ``random``; each agent here owns a ``random.Random``
seeded from the expert seed and the game, so a run is reproducible.
"""

from __future__ import annotations

import contextlib
import hashlib
import random
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import alfworld.agents.expert.handcoded_expert as _hc
import alfworld.agents.expert.handcoded_expert_tw as _tw
from alfworld.agents.environment.alfred_tw_env import AlfredExpert
from alfworld.agents.expert import HandCodedTWAgent


class _MoveIsPut:
    """Mixin: the 0.4.2 grammar's ``move X to Y`` is the expert's ``put``."""

    def update_state_tracking(self, game_state: Any, last_action: str) -> Any:
        if last_action.startswith("move "):
            last_action = "put " + last_action[len("move ") :]
        return super().update_state_tracking(game_state, last_action)  # type: ignore[misc]


class _SortedFacts:
    """Mixin: the expert reads the game's facts in sorted order. TextWorld hands them over as
    ``list(set)``, in an order that follows ``PYTHONHASHSEED``, and the expert's choices depend
    on it (in a roll-in of a pick-two game five reference commands changed with the seed)."""

    def get_facts(self, game_state: Any) -> list[str]:
        return sorted(super().get_facts(game_state))  # type: ignore[misc]


_POLICIES: dict[str, type] = {
    task: type(f"Fixed{cls.__name__}", (_SortedFacts, _MoveIsPut, cls), {})
    for task, cls in (
        ("pick_and_place_simple", _tw.PickAndPlaceSimpleTWPolicy),
        ("pick_two_obj_and_place", _tw.PickTwoObjAndPlaceTWPolicy),
        ("look_at_obj_in_light", _tw.LookAtObjInLightTWPolicy),
        ("pick_heat_then_place_in_recep", _tw.PickHeatThenPlaceInRecepTWPolicy),
        ("pick_cool_then_place_in_recep", _tw.PickCoolThenPlaceInRecepTWPolicy),
        ("pick_clean_then_place_in_recep", _tw.PickCleanThenPlaceInRecepTWPolicy),
    )
}


@contextlib.contextmanager
def _private_random(rng: random.Random) -> Iterator[None]:
    # The expert module calls ``random.choice``; point that name at our generator for the call.
    saved = _hc.random
    _hc.random = rng  # type: ignore[assignment]
    try:
        yield
    finally:
        _hc.random = saved


class FixedHandCodedTWAgent(HandCodedTWAgent):
    """``HandCodedTWAgent`` with the move/put fix and a private seeded generator."""

    def __init__(self, max_steps: int = 200, seed: int = 0) -> None:
        super().__init__(max_steps=max_steps)
        self.seed = seed
        self.rng = random.Random(seed)

    def get_task_policy(self, task_param: dict[str, Any]) -> type:
        task = task_param["task_type"]
        if task not in _POLICIES:
            raise ValueError(f"the handcoded expert has no policy for task type {task!r}")
        return _POLICIES[task]

    def reset(self, game: str = "INVALID") -> None:
        # Seeded by the task file's content, not its path: a game validated in a temporary
        # folder replays the same way from its final place.
        traj = (Path(game).parent / "traj_data.json").read_bytes()
        self.rng = random.Random(f"{self.seed}:{hashlib.sha256(traj).hexdigest()}")
        super().reset(game)

    def act(self, game_state: Any, reward: float, done: bool, last_action: str = "") -> str:
        with _private_random(self.rng):
            return super().act(game_state, reward, done, last_action)

    def observe(self, obs: str) -> None:
        with _private_random(self.rng):
            super().observe(obs)


class FixedAlfredExpert(AlfredExpert):
    """ALFWorld's ``AlfredExpert`` driving :class:`FixedHandCodedTWAgent` (``extra.expert_plan``)."""

    def __init__(self, env: Any = None, seed: int = 0, max_steps: int = 200) -> None:
        super().__init__(env=env, expert_type="handcoded")
        self.expert_seed = seed
        self.expert_max_steps = max_steps

    def load(self, gamefile: str) -> None:
        super().load(gamefile)
        self._handcoded_expert = FixedHandCodedTWAgent(max_steps=self.expert_max_steps, seed=self.expert_seed)


class ExpertFailed(RuntimeError):
    """The handcoded expert did not win the game within its budget."""


def expert_walkthrough(engine: Any, gamefile: str | Path, max_steps: int = 100) -> list[str]:
    """The expert's winning commands on ``gamefile`` (``engine``: a ``make_engine(expert=True)``
    stack); :class:`ExpertFailed` when it gives up, times out, or has not won in ``max_steps``."""
    engine.load(str(gamefile))
    state = engine.reset()
    commands: list[str] = []
    while not state["won"]:
        if len(commands) >= max_steps:
            raise ExpertFailed(f"expert did not win within {max_steps} steps")
        try:
            command = state["extra.expert_plan"][0]
            state, _, _ = engine.step(command)
        except Exception as exc:  # the expert signals failure with NameError subclasses and Exception("Timeout")
            raise ExpertFailed(f"expert failed after {len(commands)} steps: {type(exc).__name__}: {exc}") from None
        commands.append(command)
    return commands
