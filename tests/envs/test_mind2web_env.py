"""Teacher-forced replay (issue 12 item 3): the prediction is scored against the human
action (one tagged JSON action; unknown ops and refs absent from the snapshot are
invalid; op, target and value normalised) and replay advances with the human action."""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path

import pytest

from memprism_ray.envs.base import Env
from memprism_ray.envs.mind2web import Mind2WebReplayEnv, list_games
from memprism_ray.envs.mind2web.data import load_task
from memprism_ray.envs.mind2web.fixture import build_fixture
from memprism_ray.benchmark import get_benchmark
from memprism_ray.recorder.phi.factory import make_rule_phi
from memprism_ray.policy.base import PolicyInput, PolicyOutput
from memprism_ray.policy.parsing import encode_mind2web_action


@pytest.fixture(scope="module")
def root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_fixture(tmp_path_factory.mktemp("m2w"), tasks_per_site=1, seed=0)


@pytest.fixture
def game(root: Path):
    return next(g for g in list_games("test_task", root) if "skyfare" in g.game_id)


def _human(game) -> list[tuple[str, str, str | None]]:
    return [(s.op, f"e{s.pos[0].backend_node_id}", s.value or None) for s in load_task(game).steps]


def test_benchmark_builds_the_replay_env_and_rule_phi() -> None:
    env = get_benchmark("mind2web").make_env(3)
    assert isinstance(env, Mind2WebReplayEnv) and isinstance(env, Env) and env.num_slots == 3
    assert make_rule_phi("mind2web").name == "mind2web-rule"


def test_human_actions_are_correct_and_the_episode_succeeds(game) -> None:
    env = Mind2WebReplayEnv()
    ob = env.reset(game)
    task = load_task(game)
    assert ob.goal == task.confirmed_task and ob.admissible and ob.meta["num_steps"] == len(task.steps)
    assert all(f"[ref={r}]" in ob.text for r in ob.admissible)
    steps = _human(game)
    for i, (op, ref, value) in enumerate(steps):
        tr = env.step(encode_mind2web_action(op, ref, value))
        assert tr.reward == 1.0 and tr.meta["correct"] and tr.meta["error"] is None
        assert tr.done == (i == len(steps) - 1)
    assert tr.won and tr.feedback.startswith("(end of")
    with pytest.raises(RuntimeError, match="has ended"):
        env.step("{}")


def test_replay_advances_with_the_human_action_whatever_was_predicted(game) -> None:
    a, b = Mind2WebReplayEnv(), Mind2WebReplayEnv()
    a.reset(game)
    b.reset(game)
    steps = _human(game)
    for op, ref, value in steps:
        good = a.step(encode_mind2web_action(op, ref, value))
        bad = b.step("<action>not json</action>")
        assert bad.reward == 0.0 and bad.meta["predicted"] is None and "JSON" in bad.meta["error"]
        # Same next page and the same recorded human action either way.
        assert bad.feedback == good.feedback and bad.admissible == good.admissible
        assert bad.meta["recorded_action"] == good.meta["recorded_action"]
        assert json.loads(good.meta["recorded_action"]) == {"op": op, "ref": ref, "value": value}
    assert good.won and not bad.won  # exact episode success needs every step


def test_scoring_normalises_and_validates(game) -> None:
    (op, ref, value), *_ = _human(game)  # a TYPE step
    assert op == "TYPE"

    def score(action: str) -> dict:
        env = Mind2WebReplayEnv()
        env.reset(game)
        return dict(env.step(action).meta)

    spaced = json.dumps({"op": "type", "ref": ref, "value": f"  {value.upper()}  "})
    assert score(spaced)["correct"]  # op case, value case and whitespace are normalised
    assert score(f"<reasoning>x</reasoning><action>{spaced}</action>")["correct"]  # tagged output too
    assert not score(encode_mind2web_action("TYPE", ref, value + "x"))["correct"]  # wrong value
    assert not score(encode_mind2web_action("CLICK", ref, None))["correct"]  # wrong op
    other = next(r for r in Mind2WebReplayEnv().reset(game).admissible if r != ref)
    wrong_target = score(encode_mind2web_action("TYPE", other, value))
    assert not wrong_target["correct"] and wrong_target["error"] is None
    assert wrong_target["predicted"] == {"op": "TYPE", "ref": other, "value": value.casefold()}
    unknown_op = score(json.dumps({"op": "HOVER", "ref": ref, "value": None}))
    assert not unknown_op["correct"] and "unknown op" in unknown_op["error"]
    absent = score(encode_mind2web_action("TYPE", "e424242", value))
    assert not absent["correct"] and "not in the current snapshot" in absent["error"]
    two = score(f"<action>{spaced}</action><action>{spaced}</action>")
    assert not two["correct"] and "exactly one" in two["error"]


def test_click_ignores_the_value(game) -> None:
    env = Mind2WebReplayEnv()
    env.reset(game)
    steps = _human(game)
    for op, ref, value in steps[:-1]:
        env.step(encode_mind2web_action(op, ref, value))
    op, ref, _ = steps[-1]
    assert op == "CLICK"
    tr = env.step(json.dumps({"op": "CLICK", "ref": ref, "value": "anything"}))
    assert tr.meta["correct"] and tr.meta["human"] == {"op": "CLICK", "ref": ref, "value": None}


def test_slots_are_independent_and_checked(root: Path) -> None:
    games = list_games("test_task", root)
    env = Mind2WebReplayEnv(num_slots=2)
    env.reset(games[0], slot=0)
    env.reset(games[1], slot=1)
    tr0 = env.step("{}", slot=0)
    assert tr0.meta["step"] == 0 and not tr0.meta["correct"]
    assert load_task(games[0]).steps[0].action_uid != load_task(games[1]).steps[0].action_uid
    assert env.step("{}", slot=1).meta["step"] == 0
    with pytest.raises(ValueError, match="out of range"):
        env.reset(games[0], slot=2)
    with pytest.raises(RuntimeError, match="before reset"):
        Mind2WebReplayEnv().step("{}")


class _WrongPolicy:
    """Always predicts a CLICK on the first ref of the snapshot (valid, mostly wrong)."""

    name = "wrong"

    def __init__(self) -> None:
        self.sources: list[str] = []

    def act(self, inputs: Sequence[PolicyInput]) -> list[PolicyOutput]:
        out = []
        for inp in inputs:
            self.sources.append(inp.meta.get("html_field", ""))
            ref = inp.admissible[0]
            action = encode_mind2web_action("CLICK", ref, None)
            out.append(PolicyOutput(text=f"<action>{action}</action>", action=action, valid=True))
        return out


def test_agent_records_events_from_the_human_trajectory(game) -> None:
    from memprism_ray.agent import Agent, AgentConfig, EpisodeSpec, LocalServices
    from memprism_ray.baselines import make_selector

    policy = _WrongPolicy()
    services = LocalServices(make_env("mind2web", 1), make_rule_phi("mind2web"), policy)
    agent = Agent(services, make_selector("full_history"), AgentConfig(benchmark="mind2web", short_history=2))
    (res,) = agent.run([EpisodeSpec("ep", game)])
    human = [json.dumps({"op": o, "ref": r, "value": v}, separators=(",", ":")) for o, r, v in _human(game)]
    assert res.status == "ok" and res.steps == len(human) and not res.won
    assert [rec.raw.action for rec in res.stream.records] == human  # events: the human actions
    assert [rec.raw.meta["predicted_action"] for rec in res.stream.records] == [r["action"] for r in res.rows]
    assert all(r["action"] != r["recorded_action"] for r in res.rows if not r["correct"])
    assert [r["recorded_action"] for r in res.rows] == human
    assert res.reward == sum(r["correct"] for r in res.rows)
    # The field the human typed into is an event entity, with its value as a delta.
    first = res.stream.records[0].event
    assert first.act == "type" and first.delta[0].key == "field_value"
    # The prompt names each snapshot's source (the fixture hides one candidate per page).
    assert policy.sources == ["mixed"] * len(human)
