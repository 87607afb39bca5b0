"""The D1 counterfactual labelling helpers (memprism_ray/adapter/d1_labels.py)."""

from __future__ import annotations

import numpy as np
import pytest

from memprism_ray.adapter.d1_labels import LabelState, ViewConditionedActor, counterfactual_labels, rollin_chooser
from memprism_ray.benchmark.alfworld.scripted import ScriptedPolicy
from memprism_ray.composer import compose
from memprism_ray.policy.base import PolicyInput, PolicyOutput
from memprism_ray.recorder import EventStream, RawEvent, StateDelta
from memprism_ray.render import RenderConfig, render
from memprism_ray.render.visual_tokens import qwen25vl_tokens
from memprism_ray.router.encoder import HashingEncoder
from memprism_ray.router.features import FeatureExtractor
from memprism_ray.router.teacher import CounterfactualConfig, decision_states
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
        view = inp.view_text if inp.view_text is not None else (inp.meta or {}).get("view_text", "")
        p = 0.8 if "desk 1" in view else 0.2
        return {REF: p, "look": 1.0 - p}

    def act(self, inputs: list[PolicyInput]) -> list[PolicyOutput]:
        raise AssertionError("the exact distribution is read, never sampled")


def label_states() -> list[LabelState]:
    last = decision_states(search_stream())[-1]
    import dataclasses

    return [LabelState(dataclasses.replace(last, reference_action=REF), (REF, "look"))]


def test_page_tokens_are_the_rendered_page_as_reports_count_it() -> None:
    states = label_states()
    actor = ViewConditionedActor(DeskReader(), RenderConfig(), short_history=0, benchmark="alfworld")
    for view in (ALL_ACTIONS[0], ViewAction("EntityState", "all", "all", "fine")):
        rendered = render(compose(states[0].state.history, view, states[0].state.goal), RenderConfig())
        expected = qwen25vl_tokens(rendered.width, rendered.height)
        assert actor.page_tokens(states[0], view) == expected  # drawn on demand
        actor.distribution(states[0], view)  # drawn for the policy: the same count is kept
        assert actor.page_tokens(states[0], view) == expected


def test_page_token_shading_moves_label_mass_to_smaller_pages_among_the_kept_views() -> None:
    states = label_states()
    extractor = FeatureExtractor(HashingEncoder())
    plain, counts = counterfactual_labels(states, extractor, DeskReader(), short_history=0, benchmark="alfworld")
    shaded, _ = counterfactual_labels(
        states,
        extractor,
        DeskReader(),
        CounterfactualConfig(page_token_temperature=20.0),
        short_history=0,
        benchmark="alfworld",
    )
    assert counts.get("fallback_skipped", 0) == 0 and len(plain) == len(shaded) == 1
    actor = ViewConditionedActor(DeskReader(), RenderConfig(), short_history=0, benchmark="alfworld")
    tokens = np.array([actor.page_tokens(states[0], v) for v in ALL_ACTIONS], dtype=np.float64)
    q0, q1 = np.asarray(plain.q[0]), np.asarray(shaded.q[0])
    # Phase 1 is unchanged: the same views are kept (those that show desk 1) ...
    assert np.array_equal(q0 > 0, q1 > 0) and 0 < (q0 > 0).sum() < 144
    # ... and Phase 2 now prefers the smaller pages among them.
    assert float(q1 @ tokens) < float(q0 @ tokens) - 10
    kept = np.flatnonzero(q1 > 0)
    assert int(kept[np.argmax(q1[kept])]) == int(kept[np.argmin(tokens[kept])])


class BlindDeskReader(DeskReader):
    """DeskReader that declares it never reads pixels, as the scripted stand-in does."""

    needs_view_image = False


def test_a_policy_that_reads_no_pixels_gets_the_same_pages_and_labels_unpainted(monkeypatch) -> None:
    import memprism_ray.render.optical as optical

    states = label_states()
    extractor = FeatureExtractor(HashingEncoder())
    painted, _ = counterfactual_labels(states, extractor, DeskReader(), short_history=0, benchmark="alfworld")
    painted_actor = ViewConditionedActor(DeskReader(), RenderConfig(), short_history=0, benchmark="alfworld")
    painted_pages = [painted_actor._render(states[0], v) for v in ALL_ACTIONS]
    assert all(p.image is not None for p in painted_pages)

    def no_paint(*args: object, **kwargs: object) -> None:
        raise AssertionError("a pixel-blind policy's page was painted")

    monkeypatch.setattr(optical, "paint", no_paint)
    blind, _ = counterfactual_labels(states, extractor, BlindDeskReader(), short_history=0, benchmark="alfworld")
    actor = ViewConditionedActor(BlindDeskReader(), RenderConfig(), short_history=0, benchmark="alfworld")
    for view, p in zip(ALL_ACTIONS, painted_pages, strict=True):
        page = actor._render(states[0], view)
        assert page.image is None
        assert (page.text, page.width, page.height) == (p.text, p.width, p.height)
        assert actor.page_tokens(states[0], view) == qwen25vl_tokens(p.width, p.height)
    assert np.array_equal(np.asarray(blind.q[0]), np.asarray(painted.q[0]))
    # The real stand-in reads the unpainted page exactly as it read the painted one.
    painted_scripted = type("PaintedScripted", (ScriptedPolicy,), {"needs_view_image": True})
    assert ScriptedPolicy.needs_view_image is False and painted_scripted.needs_view_image is True
    monkeypatch.undo()
    blind_actor = ViewConditionedActor(
        ScriptedPolicy(temperature=0.5), RenderConfig(), short_history=0, benchmark="alfworld"
    )
    painted_actor = ViewConditionedActor(
        painted_scripted(temperature=0.5), RenderConfig(), short_history=0, benchmark="alfworld"
    )
    places = (*(f"go to shelf {i}" for i in range(1, 13)), "go to desk 1", REF, "go to drawer 1")
    search = LabelState(states[0].state, places)
    dists = [blind_actor.distribution(search, v) for v in ALL_ACTIONS]
    assert dists == [painted_actor.distribution(search, v) for v in ALL_ACTIONS]
    assert len({tuple(sorted(d.items())) for d in dists}) > 1  # the page matters to it here
    monkeypatch.setattr(optical, "paint", no_paint)
    with pytest.raises(AssertionError, match="painted"):  # the guard is live
        ViewConditionedActor(DeskReader(), RenderConfig(), short_history=0, benchmark="alfworld")._render(
            states[0], ALL_ACTIONS[0]
        )


class Recorder(DeskReader):
    """DeskReader that records the benchmark of every input it is shown."""

    def __init__(self) -> None:
        self.seen: list[str] = []

    def input_distribution(self, inp: PolicyInput) -> dict[str, float]:
        self.seen.append(inp.benchmark)
        return super().input_distribution(inp)

    def act(self, inputs: list[PolicyInput]) -> list[PolicyOutput]:
        self.seen.extend(inp.benchmark for inp in inputs)
        return [PolicyOutput(REF, REF, True) for _ in inputs]


def test_every_d1_caller_names_the_benchmark_its_policy_reads() -> None:
    """Review of issue 36: the labels and the roll-ins had "alfworld" as a default benchmark, so
    a caller that named none showed any benchmark's policy ALFWorld inputs; now none has a
    default, and the one named reaches every policy input."""
    states = label_states()
    extractor = FeatureExtractor(HashingEncoder())
    with pytest.raises(TypeError, match="benchmark"):
        ViewConditionedActor(DeskReader(), RenderConfig(), short_history=0)  # type: ignore[call-arg]
    with pytest.raises(TypeError, match="benchmark"):
        counterfactual_labels(states, extractor, DeskReader(), short_history=0)  # type: ignore[call-arg]
    with pytest.raises(TypeError, match="benchmark"):
        rollin_chooser(DeskReader())  # type: ignore[call-arg]
    labelled = Recorder()
    counterfactual_labels(states, extractor, labelled, short_history=0, benchmark="toy")
    assert len(labelled.seen) == len(ALL_ACTIONS) and set(labelled.seen) == {"toy"}
    rolled = Recorder()
    choose = rollin_chooser(rolled, benchmark="toy")
    st = states[0].state
    assert choose(search_stream(), st.observation, st.goal, (REF, "look"), 0) == REF and rolled.seen == ["toy"]
