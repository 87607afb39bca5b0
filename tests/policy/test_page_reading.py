"""A policy that sees a page cannot read what the page does not show (issue 11, item 1a).

The scripted stand-in for the VLM reads the render's text twin: the lines of the laid-out
page, under the same row cap as the image. A fact recorded in the event stream but cut
from the page (an older row beyond the budget, an event outside the window) must not reach
the policy, and the same fact on a page that does show it must change its action.
"""

from __future__ import annotations

from memprism_ray.benchmark.alfworld.phi import AlfworldPhi
from memprism_ray.benchmark.alfworld.reader import read_facts
from memprism_ray.benchmark.alfworld.scripted import ScriptedPolicy, belief, decide
from memprism_ray.composer import compose
from memprism_ray.recorder.events import RawEvent
from memprism_ray.recorder.phi.base import record_event
from memprism_ray.recorder.stream import EventStream
from memprism_ray.render import RenderConfig, render
from memprism_ray.render.layout import layout
from memprism_ray.view_space import ViewAction

GOAL = "put a mug in shelf."
PLACES = [f"drawer {i}" for i in range(1, 13)] + [f"countertop {i}" for i in range(2, 6)] + ["stoveburner 1"]


def _stream() -> EventStream:
    """The mug is seen at step 1 on countertop 1; then 17 more places hold other things."""
    phi, stream = AlfworldPhi(), EventStream()
    steps = [("go to countertop 1", "You arrive at countertop 1. On the countertop 1, you see a mug 1, and a fork 1.")]
    for k, place in enumerate(PLACES):
        steps.append((f"go to {place}", f"You arrive at {place}. On the {place}, you see a spoon {k + 2}."))
    for action, feedback in steps:
        record_event(stream, RawEvent("You are in the middle of a room.", action, feedback), phi)
    return stream


ADMISSIBLE = ["go to countertop 1", "go to shelf 1", "go to cabinet 1", "go to cabinet 2"]
ADMISSIBLE += [f"go to {p}" for p in PLACES]
OBS = "You arrive at stoveburner 1. On the stoveburner 1, you see a spoon 18."


def _page(view: ViewAction, config: RenderConfig | None = None):
    stream = _stream()
    return render(compose(list(stream.records), view, GOAL), config or RenderConfig())


def test_the_text_twin_is_the_laid_out_page() -> None:
    stream = _stream()
    view = compose(list(stream.records), ViewAction("TemporalTrace", "all", "all", "medium"), GOAL)
    r = render(view)
    page = layout(view, RenderConfig())
    assert r.text == "\n".join(page.lines)
    assert r.shown < r.total  # the page is full: older rows were cut
    # Every shown event has a line, no cut event has one.
    shown_steps = [int(line.split(" | ")[0].split()[1]) for line in page.lines if line.startswith("step ")]
    assert len(shown_steps) == r.shown and min(shown_steps) > 1
    assert "omitted" in r.text


def test_a_fact_cut_from_the_page_is_not_read() -> None:
    # TemporalTrace over all events at medium detail: the page keeps the latest rows; the
    # sighting at step 1 falls off.
    cut = _page(ViewAction("TemporalTrace", "all", "all", "medium"))
    assert "step 1 |" not in cut.text
    facts = read_facts(cut.text)
    assert "mug 1" not in facts.seen_at
    d = decide(GOAL, OBS, ADMISSIBLE, [cut.text])
    assert not d.reason.startswith("mug seen")
    # The same history on a page that shows the sighting: a selective filter over the whole
    # history keeps few rows, and the goal-relevant sighting is restored among them.
    shown = _page(ViewAction("TemporalTrace", "all", "exception", "medium"))
    assert "mug 1" in shown.text
    assert read_facts(shown.text).seen_at.get("mug 1") == "countertop 1"
    d2 = decide(GOAL, OBS, ADMISSIBLE, [shown.text])
    best = max(d2.scores.values())
    assert [a for a, s in d2.scores.items() if s == best] == ["go to countertop 1"]


def test_a_smaller_page_shows_and_lets_read_less() -> None:
    """The row cap is the page's: a smaller page (max_side 336) cuts more places, and the
    reader knows fewer visited places from it."""
    view = ViewAction("TemporalTrace", "all", "all", "medium")
    big = _page(view, RenderConfig(max_side=672))
    small = _page(view, RenderConfig(max_side=336))
    assert small.shown < big.shown
    assert len(read_facts(small.text).visited) < len(read_facts(big.text).visited)


def test_the_policy_reads_only_the_view_it_is_given() -> None:
    """Nothing reaches the policy but its prompt: with no view and no history it explores
    by its fixed search belief, whatever the stream holds."""
    policy = ScriptedPolicy(temperature=0.0)
    dist = policy.action_distribution(GOAL, OBS, ADMISSIBLE, [])
    favourite = max(
        (a for a in ADMISSIBLE if a != "go to stoveburner 1"), key=lambda a: belief("mug", a[len("go to ") :])
    )
    assert dist == {favourite: 1.0}
    shown = policy.action_distribution(
        GOAL, OBS, ADMISSIBLE, [_page(ViewAction("TemporalTrace", "all", "exception", "medium")).text]
    )
    assert shown == {"go to countertop 1": 1.0}  # the page that shows the sighting changes it


def test_a_value_chain_is_read_as_every_place_visited() -> None:
    text = "agent | agent.location: drawer 1 -> (3 more) -> drawer 5 -> shelf 2 | agent.holding: nothing"
    facts = read_facts(text)
    assert facts.visited == ["drawer 1", "drawer 5", "shelf 2"] and facts.location == "shelf 2"
    assert read_facts("cabinet 3 | cabinet 3.contents: nothing").visited == ["cabinet 3"]
