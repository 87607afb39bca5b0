"""The environment protocol shared by every benchmark (paper: "Recorder", appendix D.1).

:class:`Observation` and :class:`Transition` hold exactly the fields of the raw event
``e_t = (o_t^-, u_t, y_t^+, r_t, m_t)``, so an environment never has to know about the Recorder.
``num_slots`` independent game slots let one worker play a whole GRPO group step-synchronously.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol, runtime_checkable


def cache_base() -> Path:
    """Where built data is cached: ``$MEMPRISM_CACHE``, else ``~/.cache/memprism``."""
    return Path(os.environ.get("MEMPRISM_CACHE") or Path.home() / ".cache" / "memprism").expanduser()


_PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def _check_shared(obj: Observation | Transition) -> None:
    """Validate and normalise the fields Observation and Transition share."""
    owner = type(obj).__name__
    admissible = obj.admissible
    if isinstance(admissible, str) or not isinstance(admissible, Sequence):
        raise ValueError(f"{owner}.admissible must be a sequence of strings, got {type(admissible).__name__}")
    bad = [a for a in admissible if not isinstance(a, str)]
    if bad:
        raise ValueError(f"{owner}.admissible holds non-string command(s): {bad[:3]!r}")
    object.__setattr__(obj, "admissible", tuple(admissible))
    if not isinstance(obj.meta, Mapping):
        raise ValueError(f"{owner}.meta must be a mapping, got {type(obj.meta).__name__}")
    object.__setattr__(obj, "meta", dict(obj.meta))
    try:
        json.dumps(obj.meta, allow_nan=False)
    except (TypeError, ValueError) as exc:
        raise ValueError(f"{owner}.meta must be JSON-serialisable: {exc}") from None
    # A dedicated bytes field, not meta: meta is JSON-checked on every construction, and a
    # frame there would have to be base64 text (a third larger, encoded and decoded each step).
    if obj.frame is not None and (not isinstance(obj.frame, bytes) or not obj.frame.startswith(_PNG_MAGIC)):
        raise ValueError(f"{owner}.frame must be PNG bytes or None, got {type(obj.frame).__name__}")


@dataclass(frozen=True, slots=True)
class Observation:
    """What the agent sees at the start of an episode (``o_1^-``, the goal ``g``; ``meta`` goes into ``m_t``)."""

    text: str
    goal: str
    admissible: tuple[str, ...]
    meta: Mapping[str, Any] = field(default_factory=dict)
    frame: bytes | None = None
    """the camera frame as PNG bytes (EB-ALFRED); ``None`` for text-only benchmarks"""

    def __post_init__(self) -> None:
        if not isinstance(self.text, str) or not isinstance(self.goal, str):
            raise ValueError("Observation.text and Observation.goal must be str")
        _check_shared(self)


#: ``Transition.meta`` key: ``False`` when the decision took no step of the environment's own
#: step budget (EB-ALFRED: an output that is no skill); absent means a step was taken.
STEP_TAKEN = "step_taken"


def took_step(tr: Transition) -> bool:
    """Whether ``tr`` used a step of the episode's step limit (:data:`STEP_TAKEN`)."""
    return tr.meta.get(STEP_TAKEN, True) is not False


@dataclass(frozen=True, slots=True)
class Transition:
    """The result of one executed action: feedback ``y_t^+``, reward ``r_t``, termination and success."""

    feedback: str
    reward: float
    done: bool
    won: bool
    admissible: tuple[str, ...]
    meta: Mapping[str, Any] = field(default_factory=dict)
    frame: bytes | None = None
    """the post-action camera frame as PNG bytes (EB-ALFRED); ``None`` for text-only benchmarks"""

    def __post_init__(self) -> None:
        if not isinstance(self.feedback, str):
            raise ValueError(f"Transition.feedback must be str, got {type(self.feedback).__name__}")
        if isinstance(self.reward, bool) or not isinstance(self.reward, (int, float)):
            raise ValueError(f"Transition.reward must be a number, got {self.reward!r}")
        object.__setattr__(self, "reward", float(self.reward))
        object.__setattr__(self, "done", bool(self.done))
        object.__setattr__(self, "won", bool(self.won))
        _check_shared(self)


@dataclass(frozen=True, slots=True)
class GameRef:
    """A playable game: a stable id, the file the engine loads, its task type and split."""

    game_id: str
    path: Path
    task_type: str
    split: str

    def __post_init__(self) -> None:
        if not self.game_id or not isinstance(self.game_id, str):
            raise ValueError("GameRef.game_id must be a non-empty string")
        object.__setattr__(self, "path", Path(self.path))

    def to_dict(self) -> dict[str, str]:
        return {"game_id": self.game_id, "path": str(self.path), "task_type": self.task_type, "split": self.split}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> GameRef:
        missing = [k for k in ("game_id", "path", "task_type", "split") if k not in data]
        if missing:
            raise ValueError(f"game reference is missing field(s) {', '.join(missing)}")
        return cls(str(data["game_id"]), Path(data["path"]), str(data["task_type"]), str(data["split"]))


@runtime_checkable
class Env(Protocol):
    """One environment instance with ``num_slots`` independent game slots."""

    @property
    def num_slots(self) -> int: ...

    def reset(self, game: GameRef, slot: int = 0) -> Observation: ...

    def step(self, action: str, slot: int = 0) -> Transition: ...

    def close(self) -> None: ...
