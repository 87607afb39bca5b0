"""View selectors: what the agent shows the task policy at each decision (paper "Router",
section "Where Does the Gain Come From?" and the baselines of "Experiment Setup"). Every
condition is a :class:`ViewSelector` answering each decision with a :class:`ViewDecision`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

from memprism_ray.view_space import ViewAction

#: How a view reaches the task policy.
MEDIA: tuple[str, ...] = ("optical", "text", "none")

#: ``history`` value meaning "every earlier step" (Full Text History).
FULL_HISTORY = -1


@dataclass(frozen=True)
class ViewDecision:
    """One decision's view choice: ``action`` (``None`` exactly when ``medium == "none"``), the
    steps of text history the prompt keeps (``None``: the agent's default; :data:`FULL_HISTORY`:
    all) and ``logprob``, the choice's log-probability (GRPO's ``pi_old``; 0 when deterministic)."""

    action: ViewAction | None
    medium: str
    logprob: float = 0.0
    history: int | None = None

    def __post_init__(self) -> None:
        if self.medium not in MEDIA:
            raise ValueError(f"view medium must be one of {', '.join(MEDIA)}, got {self.medium!r}")
        if (self.action is None) != (self.medium == "none"):
            raise ValueError("a ViewDecision has an action exactly when its medium is not 'none'")
        if self.history is not None and self.history < FULL_HISTORY:
            raise ValueError(f"history must be >= 0, None or FULL_HISTORY (-1), got {self.history}")

    @property
    def index(self) -> int:
        """The action's eq. (A.1) index, -1 without a view."""
        return -1 if self.action is None else self.action.index


@dataclass(frozen=True)
class DecisionContext:
    """What a selector may know about one decision besides the Router features."""

    episode_id: str
    step: int
    goal: str
    observation: str
    task_type: str = ""


@runtime_checkable
class ViewSelector(Protocol):
    """Chooses one :class:`ViewDecision` per decision of a batch; the agent computes Router
    ``features`` (batched) only for a selector whose ``uses_features`` is true, else ``None``."""

    name: str
    uses_features: bool

    def select(self, contexts: Sequence[DecisionContext], features: object | None) -> list[ViewDecision]: ...
