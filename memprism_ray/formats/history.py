"""One executed step of the short text history ``H_short`` (paper: "Render", eq.
(task-policy)): what the task policy's prompt, the memory baselines and the flat-history
renderer of the optical baseline all read."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class HistoryRecord:
    """``step``: the zero-based decision index of ``action`` (prompts show it one-based);
    ``observation``: what the agent saw before acting; ``feedback``: the env's answer."""

    step: int
    observation: str
    action: str
    feedback: str

    def __post_init__(self) -> None:
        if not isinstance(self.step, int) or isinstance(self.step, bool) or self.step < 0:
            raise ValueError(f"HistoryRecord.step must be a non-negative int, got {self.step!r}")
        for name in ("observation", "action", "feedback"):
            value = getattr(self, name)
            if not isinstance(value, str):
                raise ValueError(f"HistoryRecord.{name} must be a str, got {type(value).__name__}")
