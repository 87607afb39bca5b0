"""The D1 counterfactual labelling helpers (memprism_ray/pipeline/labels.py)."""

from __future__ import annotations

import numpy as np

from memprism_ray.composer import compose
from memprism_ray.pipeline.labels import LabelState, ViewConditionedActor, counterfactual_labels
from memprism_ray.policy.base import PolicyInput, PolicyOutput
from memprism_ray.recorder import EventStream, RawEvent, StateDelta
from memprism_ray.render import RenderConfig, render
from memprism_ray.render.visual_tokens import qwen25vl_tokens
from memprism_ray.router.encoder import HashingEncoder
from memprism_ray.router.features import FeatureExtractor
from memprism_ray.router.teacher import decision_states
from memprism_ray.view_space import ALL_ACTIONS, ViewAction

REF = "go to drawer 3"


def search_stream() -> EventStream:
    s = EventStream({"goal": "put a pen in drawer", "task_id": "g1"})
    for i in range(12):
        place = f"shelf {i + 1}" if i != 2 else "desk 1"
        s.record(
            RawEvent(f"You arrive at {place}.", f"go to {place}", f"On the {place}, you see nothing."),
            entity=place,
            act="go",
            delta=[StateDelta("agent.location", place)],
        )
    return s


class DeskReader:
    """Reads the page it is shown: the reference move is likely only where the page shows
    the early visit to desk 1."""

    needs_view_text = True

    def input_distribution(self, inp: PolicyInput) -> dict[str, float]:
        p = 0.8 if "desk 1" in (inp.meta or {}).get("view_text", "") else 0.2
        return {REF: p, "look": 1.0 - p}

    def act(self, inputs: list[PolicyInput]) -> list[PolicyOutput]:
        raise AssertionError("the exact distribution is read, never sampled")


def label_states() -> list[LabelState]:
    last = decision_states(search_stream())[-1]
    import dataclasses

    return [LabelState(dataclasses.replace(last, reference_action=REF), (REF, "look"))]


def test_page_tokens_are_the_rendered_page_as_reports_count_it() -> None:
    states = label_states()
    actor = ViewConditionedActor(DeskReader(), RenderConfig(), short_history=0)
    for view in (ALL_ACTIONS[0], ViewAction("EntityState", "all", "all", "fine")):
        rendered = render(compose(states[0].state.history, view, states[0].state.goal), RenderConfig())
        expected = qwen25vl_tokens(rendered.width, rendered.height)
        assert actor.page_tokens(states[0], view) == expected  # drawn on demand
        actor.distribution(states[0], view)  # drawn for the policy: the same count is kept
        assert actor.page_tokens(states[0], view) == expected


def test_page_token_shading_moves_label_mass_to_smaller_pages_among_the_kept_views() -> None:
    states = label_states()
    extractor = FeatureExtractor(HashingEncoder())
    plain, counts = counterfactual_labels(states, extractor, DeskReader(), short_history=0)
    shaded, _ = counterfactual_labels(
        states, extractor, DeskReader(), short_history=0, page_token_temperature=20.0
    )
    assert counts.get("fallback_skipped", 0) == 0 and len(plain) == len(shaded) == 1
    actor = ViewConditionedActor(DeskReader(), RenderConfig(), short_history=0)
    tokens = np.array([actor.page_tokens(states[0], v) for v in ALL_ACTIONS], dtype=np.float64)
    q0, q1 = np.asarray(plain.q[0]), np.asarray(shaded.q[0])
    # Phase 1 is unchanged: the same views are kept (those that show desk 1) ...
    assert np.array_equal(q0 > 0, q1 > 0) and 0 < (q0 > 0).sum() < 144
    # ... and Phase 2 now prefers the smaller pages among them.
    assert float(q1 @ tokens) < float(q0 @ tokens) - 10
    kept = np.flatnonzero(q1 > 0)
    assert int(kept[np.argmax(q1[kept])]) == int(kept[np.argmin(tokens[kept])])
