"""View selectors: what the agent shows the task policy at each decision (paper "Router",
section "Where Does the Gain Come From?" and the baselines of "Experiment Setup").

Every condition of the mechanism analysis is a :class:`ViewSelector`: the MemPrism Router
(greedy at evaluation, sampled in GRPO rollouts), No Memory, Full Text History, Recent-4
Text, the four fixed relation views, Fixed/Dynamic Text vs Optical, Frequency-Matched
Random and the constrained planners. A selector answers, per decision, with a
:class:`ViewDecision`: which view action (if any), in which medium, how much short text
history the prompt keeps, and the log-probability of the choice under the selector (the
``pi_old`` that GRPO's importance ratio needs).
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
    """One decision's view choice.

    ``action`` is ``None`` exactly when ``medium == "none"``. ``history`` is the number of
    most recent steps the prompt's text history keeps (``None``: the agent's default
    short history; :data:`FULL_HISTORY`: all of them). ``logprob`` is the log-probability
    of ``action`` under the selector's sampling distribution (0 for deterministic ones).
    """

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
    """Chooses one :class:`ViewDecision` per decision of a batch.

    ``uses_features``: the agent computes Router features (MiniLM embeddings, window
    summary, global statistics) only for selectors that need them.
    ``features`` is a batched :class:`~memprism_ray.router.features.RouterFeatures` or
    ``None`` when ``uses_features`` is false.
    """

    name: str
    uses_features: bool

    def select(self, contexts: Sequence[DecisionContext], features: object | None) -> list[ViewDecision]: ...
