"""The scripted Mind2Web stand-in answers in the paper's tagged-JSON format, is seeded and
deterministic, can be wrong, and reads memory (the view or history) for what it already did."""

from __future__ import annotations

from memprism_ray.benchmark.mind2web.contract import MIND2WEB, decode_mind2web_action
from memprism_ray.benchmark.mind2web.stand_in import Mind2WebScriptedPolicy, goal_values
from memprism_ray.policy.base import HistoryRecord, PolicyInput
from memprism_ray.policy.config import PolicyConfig
from memprism_ray.policy.factory import make_policy

PAGE = "\n".join(
    [
        '[ref=e1] <a href="/deals"> Deals',
        '[ref=e2] <input type="text" placeholder="From"> From',
        '[ref=e3] <input type="text" placeholder="To"> To',
        '[ref=e4] <select name="cabin"> Economy Business First',
        '[ref=e5] <button type="submit"> Search flights',
    ]
)
GOAL = "Find business class flights from Columbus to Denver"


def _inp(step: int = 0, view: str | None = None, history=(), episode: str = "ep") -> PolicyInput:
    return PolicyInput(
        "mind2web", GOAL, PAGE, history=tuple(history), step=step, view_text=view, meta={"episode_id": episode}
    )


def test_goal_values() -> None:
    assert goal_values(GOAL) == ["Columbus", "Denver"]
    assert goal_values("Add Running Shoes Pro to the cart") == ["Running Shoes Pro"]


def test_output_is_one_valid_tagged_json_action() -> None:
    out = Mind2WebScriptedPolicy(temperature=0.0).act([_inp()])[0]
    assert out.valid and out.text.count("<action>") == 1 and "<reasoning>" in out.text
    assert decode_mind2web_action(out.action) == {"op": "TYPE", "ref": "e2", "value": "Columbus"}


def test_memory_of_what_was_typed_moves_it_on() -> None:
    typed = '{"op":"TYPE","ref":"e2","value":"Columbus"}'
    policy = Mind2WebScriptedPolicy(temperature=0.0)
    without = decode_mind2web_action(policy.act([_inp(1)])[0].action)
    with_history = decode_mind2web_action(
        policy.act([_inp(1, history=[HistoryRecord(0, PAGE, typed, PAGE)])])[0].action
    )
    with_view = decode_mind2web_action(
        policy.act([_inp(1, view="t1 type input 'From' field_value=Columbus")])[0].action
    )
    assert without == {"op": "TYPE", "ref": "e2", "value": "Columbus"}  # retypes the first value
    assert with_history == with_view == {"op": "TYPE", "ref": "e3", "value": "Denver"}


def test_seeded_sampling_is_reproducible_and_can_be_wrong() -> None:
    a = [Mind2WebScriptedPolicy(1.0, seed=3).act([_inp(0, episode=f"e{i}")])[0].action for i in range(30)]
    b = [Mind2WebScriptedPolicy(1.0, seed=3).act([_inp(0, episode=f"e{i}")])[0].action for i in range(30)]
    assert a == b
    assert len(set(a)) > 1  # at temperature 1 it sometimes picks another element
    dist = Mind2WebScriptedPolicy(1.0).input_distribution(_inp())
    assert abs(sum(dist.values()) - 1.0) < 1e-9 and len(dist) == 5


def test_selected_through_the_scripted_backend() -> None:
    policy = make_policy(PolicyConfig(backend="scripted", scripted={"temperature": 0.0, "seed": 0}), MIND2WEB)
    out = policy.act([_inp()])[0]
    assert out.valid and decode_mind2web_action(out.action)["ref"] == "e2"
    assert policy.input_distribution(_inp()) == Mind2WebScriptedPolicy(0.0).input_distribution(_inp())
    other = Mind2WebScriptedPolicy().act([PolicyInput("alfworld", "g", "o", ("look",))])[0]
    assert not other.valid and "the mind2web task contract reads mind2web inputs, not alfworld" in other.error
