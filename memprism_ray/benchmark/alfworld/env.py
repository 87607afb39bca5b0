"""``AlfworldEnv``: the real ALFWorld TextWorld engine behind the shared Env protocol.

Each slot is one stock wrapper stack (:func:`~memprism_ray.benchmark.alfworld.engine.make_engine`),
so observations, feedback, admissible commands and success are the engine's own. Differences
from ALFWorld's gym wrapper, on purpose: ``help`` is never offered as admissible (a manual, not
a move); a non-admissible command is passed to the engine, whose "Nothing happens." is recorded;
the step limit (50 in the paper) is the agent loop's (``max_steps`` is an optional extra guard).

Every slot holds its own copy of fast-downward's ``libdownward.so``. Measured here: the engine
imports take ~55 MB, a slot with a game loaded ~5-8 MB more (8 slots: ~106 MB PSS in all).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from memprism_ray.benchmark.alfworld.data import game_ref_from_path
from memprism_ray.benchmark.alfworld.engine import install_engine_caches, make_engine
from memprism_ray.envs.base import GameRef, Observation, Transition

_GOAL = re.compile(r"Your task is to:\s*(.+?)\.?\s*$", re.DOTALL)
HIDDEN_COMMANDS: frozenset[str] = frozenset({"help"})


def goal_from_intro(intro: str) -> str:
    """``"... Your task is to: put a mug in desk."`` -> ``"put a mug in desk"``."""
    m = _GOAL.search(intro)
    if not m:
        raise ValueError(f"ALFWorld intro has no 'Your task is to:' sentence: {intro[-200:]!r}")
    return m.group(1).strip()


@dataclass
class _Slot:
    engine: Any
    game: GameRef | None = None
    loaded_path: str | None = None
    steps: int = 0
    over: bool = False
    goal: str = ""


class AlfworldEnv:
    """Several ALFWorld game slots on the real engine. ``expert=True`` runs the handcoded expert
    beside every slot (its next command in ``meta["expert_action"]``); ``fast=False`` leaves
    the stock engine unpatched."""

    def __init__(
        self,
        num_slots: int = 1,
        *,
        expert: bool = False,
        expert_seed: int = 0,
        fast: bool = True,
        max_steps: int | None = None,
    ) -> None:
        if isinstance(num_slots, bool) or not isinstance(num_slots, int) or num_slots < 1:
            raise ValueError(f"num_slots must be a positive int, got {num_slots!r}")
        if max_steps is not None and (isinstance(max_steps, bool) or not isinstance(max_steps, int) or max_steps < 1):
            raise ValueError(f"max_steps must be a positive int or None, got {max_steps!r}")
        if fast:
            install_engine_caches()
        self._expert = expert
        self._expert_seed = expert_seed
        self.max_steps = max_steps
        self._slots: list[_Slot | None] = [None] * num_slots
        self._closed = False

    @property
    def num_slots(self) -> int:
        return len(self._slots)

    def _slot(self, slot: int, *, create: bool) -> _Slot:
        if self._closed:
            raise ValueError("AlfworldEnv is closed")
        if isinstance(slot, bool) or not isinstance(slot, int) or not 0 <= slot < len(self._slots):
            raise ValueError(f"slot must be an int in [0, {len(self._slots) - 1}], got {slot!r}")
        s = self._slots[slot]
        if not create and (s is None or s.game is None):
            raise ValueError(f"slot {slot} has no game: call reset(game, slot={slot}) first")
        if s is None:
            s = self._slots[slot] = _Slot(make_engine(expert=self._expert, expert_seed=self._expert_seed))
        return s

    def _admissible(self, state: Any) -> tuple[str, ...]:
        return tuple(c for c in state["admissible_commands"] if c not in HIDDEN_COMMANDS)

    def _meta(self, s: _Slot, state: Any, slot: int) -> dict[str, Any]:
        assert s.game is not None
        meta: dict[str, Any] = {
            "benchmark": "alfworld",
            "game_id": s.game.game_id,
            "task_type": s.game.task_type,
            "split": s.game.split,
            "slot": slot,
            "step": s.steps,
        }
        if self._expert:
            plan = state.get("extra.expert_plan") or []
            meta["expert_action"] = plan[0] if plan else None
        return meta

    def reset(self, game: GameRef | str | Path, slot: int = 0) -> Observation:
        """Start ``game`` in ``slot`` (loading it only when the slot held another game)."""
        ref = game if isinstance(game, GameRef) else game_ref_from_path(game)
        s = self._slot(slot, create=True)
        path = str(ref.path)
        if s.loaded_path != path:
            try:
                s.engine.load(path)
            except KeyError as exc:
                # fast-downward emits a dummy task for an unreachable goal; PddlEnv then fails here.
                raise ValueError(f"{path}: the engine cannot load this game (unreachable goal? {exc!r})") from None
            s.loaded_path = path
        state = s.engine.reset()
        s.game, s.steps, s.over = ref, 0, False
        s.goal = goal_from_intro(state["feedback"])
        return Observation(
            text=state["feedback"], goal=s.goal, admissible=self._admissible(state), meta=self._meta(s, state, slot)
        )

    def step(self, action: str, slot: int = 0) -> Transition:
        """Send ``action`` to the engine as is; see the module docstring."""
        if not isinstance(action, str):
            raise ValueError(f"action must be a str, got {type(action).__name__}")
        s = self._slot(slot, create=False)
        if s.over:
            raise ValueError(f"the episode in slot {slot} is over after {s.steps} steps; reset it first")
        state, score, done = s.engine.step(action)
        s.steps += 1
        won = bool(state["won"])
        truncated = self.max_steps is not None and s.steps >= self.max_steps and not won
        s.over = bool(done) or won or truncated
        meta = self._meta(s, state, slot)
        if truncated:
            meta["truncated"] = True
        return Transition(
            feedback=state["feedback"],
            reward=float(score),
            done=s.over,
            won=won,
            admissible=self._admissible(state),
            meta=meta,
        )

    def close(self) -> None:
        """Drop the engines. Their copies of fast-downward's library stay mapped until the
        process ends: unloading one (``dlclose``) makes the next load crash."""
        for s in self._slots:
            if s is not None:
                s.engine.close()
        self._slots = [None] * len(self._slots)
        self._closed = True

    def __enter__(self) -> AlfworldEnv:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
