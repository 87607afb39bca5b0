"""``compose(E_<t, a, g) = C_{tau,gamma}(Select(E_<t, w, c, g))`` (paper "Composer", eqs.
event-select and compose): the stream is only read and the view never written back (appendix
D.3); O(N) (appendix "Computational and storage complexity"), nothing cached between decisions.
"""

from __future__ import annotations

from collections.abc import Sequence

from memprism_ray.composer.compilers import compile_view
from memprism_ray.composer.select import ComposerConfig, as_action, select
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
    sel = select(stream, act, goal, config)
    return View(
        action=act,
        goal=goal,
        goal_terms=sel.goal_terms,
        n_stream=sel.n_stream,
        n_scope=sel.n_scope,
        n_selected=len(sel.items),
        body=compile_view(sel),
    )
