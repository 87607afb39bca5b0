"""``compose(E_<t, a, g) = C_{tau,gamma}(Select(E_<t, w, c, g))`` (paper "Composer", eqs.
event-select and compose).

The stream is only read: granularity changes what a view shows, never what is stored, and
the view is never written back (appendix D.3). The result equals
``composer.reference.compose_reference`` (select, then one compiler pass, O(N)); it is
computed from the stream's incremental index (``composer.index``), so a decision costs the
events appended since the previous one plus what the view holds.
"""

from __future__ import annotations

from collections.abc import Sequence

from memprism_ray.composer.index import compose_indexed
from memprism_ray.composer.select import DEFAULT_CONFIG, ComposerConfig, as_action
from memprism_ray.composer.structures import View
from memprism_ray.recorder.stream import EventStream, StreamRecord
from memprism_ray.view_space import ViewAction


def compose(
    stream: EventStream | Sequence[StreamRecord],
    action: ViewAction | str,
    goal: str | None = None,
    config: ComposerConfig | None = None,
) -> View:
    """Select and compile one view. ``goal=None`` reads ``stream.meta["goal"]`` (or ``""``)."""
    act = as_action(action)
    if goal is None:
        goal = str(stream.meta.get("goal", "")) if isinstance(stream, EventStream) else ""
    if not isinstance(goal, str):
        raise ValueError(f"goal must be a string, got {type(goal).__name__}")
    return compose_indexed(stream, act, goal, config or DEFAULT_CONFIG)
