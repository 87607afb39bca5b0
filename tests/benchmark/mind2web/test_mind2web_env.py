"""Teacher-forced replay (issue 12 item 3): the prediction is scored against the human
action (one tagged JSON action; unknown ops and refs absent from the snapshot are
invalid; op, target and value normalised) and replay advances with the human action."""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path

import pytest

from memprism_ray.benchmark import get_benchmark
from memprism_ray.benchmark.mind2web import Mind2WebReplayEnv, list_games
from memprism_ray.benchmark.mind2web.contract import MIND2WEB, encode_mind2web_action
from memprism_ray.benchmark.mind2web.data import load_task
from memprism_ray.benchmark.mind2web.fixture import build_fixture
from memprism_ray.benchmark.mind2web.phi import Mind2WebPhi
from memprism_ray.envs.base import Env
from memprism_ray.policy.base import PolicyInput, PolicyOutput


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
    assert get_benchmark("mind2web").phi_spec().rule().name == "mind2web-rule"


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
    # metric.py reads the Value line whatever the op: {CLICK, anything} vs {CLICK}, P 1/2, R 1.
    assert tr.meta["element_correct"] and tr.meta["op_f1"] == pytest.approx(2 / 3)


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
    contract = MIND2WEB

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
    services = LocalServices(get_benchmark("mind2web").make_env(1), Mind2WebPhi(), policy)
    agent = Agent(services, make_selector("full_history"), AgentConfig(short_history=2))
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
    # Mind2Web's own step scores reach the rows (benchmark/mind2web/report.py reads them from there).
    assert all(isinstance(r["element_correct"], bool) and 0.0 <= r["op_f1"] <= 1.0 for r in res.rows)
    assert [r["element_correct"] and r["op_f1"] == 1.0 for r in res.rows] == [r["correct"] for r in res.rows]


# Mind2Web's own metric (src/action_prediction/metric.py, ActionEvaluatorMultiChoice):
# "OP value" strings (postprocess_action: action.strip() + " " + value.strip(), the value's
# first line, none for CLICK) compared by calculate_f1, the F1 of their whitespace-token sets
# with case kept. Scores below computed by hand from that definition.
OFFICIAL_F1_CASES = [
    # (pred op, pred value, human op, human value, F1, paper rule: correct)
    ("TYPE", "new  york", "TYPE", "New York", 1 / 3, True),  # tokens {TYPE,new,york} vs {TYPE,New,York}: 1 of 3
    ("TYPE", "new  york", "TYPE", "new york", 1.0, True),  # split() drops the double space
    ("TYPE", "York New", "TYPE", "New York", 1.0, False),  # a token set: word order does not count
    ("CLICK", None, "CLICK", "", 1.0, True),  # "CLICK " vs "CLICK ": {CLICK}
    ("SELECT", "Economy", "TYPE", "Economy", 0.5, False),  # {SELECT,Economy} vs {TYPE,Economy}: P = R = 1/2
    ("CLICK", None, "TYPE", "New York", 0.0, False),  # no common token
    ("TYPE", "New York City", "TYPE", "New York", 6 / 7, False),  # P = 3/4, R = 1: 2PR/(P+R) = 6/7
]


@pytest.mark.parametrize(("pop", "pval", "hop", "hval", "f1", "paper"), OFFICIAL_F1_CASES)
def test_operation_f1_is_mind2web_metric_py(pop, pval, hop, hval, f1, paper) -> None:
    from memprism_ray.benchmark.mind2web.env import normalize_action, operation_f1, operation_string

    got = operation_f1(operation_string(pop, pval), operation_string(hop, hval))
    assert got == pytest.approx(f1, abs=1e-12)
    same = normalize_action(pop, "e1", pval) == normalize_action(hop, "e1", hval)
    assert same == paper  # the paper's rule (whole value after case folding) beside it


def test_operation_string_reads_the_value_as_metric_py_does() -> None:
    from memprism_ray.benchmark.mind2web.env import operation_f1, operation_string

    assert operation_string("TYPE", " New York \nsecond line") == "TYPE New York"  # `Value: (.*)$`: first line
    assert operation_string("CLICK", "ignored") == "CLICK "  # no Value line for CLICK
    assert operation_f1("", "") == 1.0 and operation_f1("TYPE", "") == 0.0


def test_steps_carry_element_correctness_and_op_f1(game) -> None:
    """The env scores a step both ways and returns both in the transition's meta."""
    import dataclasses

    from memprism_ray.benchmark.mind2web.env import score_prediction
    from memprism_ray.benchmark.mind2web.snapshot import build_snapshot, human_refs

    task = load_task(game)
    step = dataclasses.replace(next(s for s in task.steps if s.op == "TYPE"), value="New York")
    snap = build_snapshot(step)
    ref = human_refs(step, snap)[0]
    other = next(r for r in snap.refs if r not in human_refs(step, snap))
    for pred, element, f1, correct in [
        (encode_mind2web_action("TYPE", ref, "new  york"), True, 1 / 3, True),
        (encode_mind2web_action("TYPE", ref, "York New"), True, 1.0, False),
        (encode_mind2web_action("TYPE", other, "New York"), False, 1.0, False),
        ("<action>not json</action>", False, 0.0, False),
    ]:
        got = score_prediction(pred, step, snap)
        assert (got["element_correct"], got["correct"]) == (element, correct)
        assert got["op_f1"] == pytest.approx(f1)
    # A step whose positive candidates are all gone scores 0 everywhere (metric.py: no pos_ids).
    bare = dataclasses.replace(step, pos=())
    assert score_prediction(encode_mind2web_action("TYPE", ref, "New York"), bare, snap)["op_f1"] == 0.0
    env = Mind2WebReplayEnv()
    env.reset(game)
    (op, ref0, value), *_ = _human(game)
    meta = env.step(encode_mind2web_action(op, ref0, value)).meta
    assert meta["element_correct"] is True and meta["op_f1"] == 1.0


# Issue 35 item 5: where the paper's rule (appendix E.5: "rejects unknown operations ... scores
# the normalized operation, target reference, and value") and metric.py (postprocess_action on
# what the model wrote) part, each metric follows its own source. Expected F1 by hand.
EDGE_CASES = [
    # (recorded op, recorded value, predicted JSON fields, paper correct, metric.py op F1)
    ("TYPE", "", {"op": "TYPE", "value": ""}, True, 1.0),  # {TYPE} vs {TYPE}
    ("TYPE", "", {"op": "TYPE", "value": "Boston"}, False, 2 / 3),  # {TYPE, Boston} vs {TYPE}
    ("TYPE", "", {"op": "TYPE", "value": "   "}, True, 1.0),  # whitespace is no token, and normalises to ""
    ("CLICK", "", {"op": "CLICK", "value": "anything"}, True, 2 / 3),  # the value counts for metric.py
    ("CLICK", "", {"op": "CLICK", "value": "a b\nc"}, True, 0.5),  # first line: {CLICK, a, b} vs {CLICK}
    ("CLICK", "", {"op": "CLICK", "value": ""}, True, 1.0),
    ("CLICK", "", {"op": "CLICK", "value": None}, True, 1.0),
    ("CLICK", "", {"op": "click"}, True, 0.0),  # case-sensitive `Action: (CLICK|...)`: no op token
    ("TYPE", "New York", {"op": "type", "value": "New York"}, True, 0.8),  # {New, York} vs {TYPE, New, York}
    ("SELECT", "Economy", {"op": " SELECT ", "value": "Economy"}, True, 1.0),  # JSON padding is not case
]


@pytest.mark.parametrize(("hop", "hval", "fields", "paper", "f1"), EDGE_CASES)
def test_edge_cases_follow_the_paper_and_metric_py(game, hop, hval, fields, paper, f1) -> None:
    import dataclasses

    from memprism_ray.benchmark.mind2web.contract import parse_mind2web
    from memprism_ray.benchmark.mind2web.env import human_action, score_prediction
    from memprism_ray.benchmark.mind2web.snapshot import build_snapshot, human_refs

    task = load_task(game)
    step = dataclasses.replace(task.steps[0], op=hop, value=hval)
    snap = build_snapshot(step)
    ref = human_refs(step, snap)[0]
    got = score_prediction(json.dumps({**fields, "ref": ref}), step, snap)
    assert got["error"] is None and got["correct"] is paper and got["element_correct"]
    assert got["op_f1"] == pytest.approx(f1, abs=1e-12)
    # The recorded human action is itself a valid action under the contract (TYPE "" included).
    recorded, _ = human_action(step, snap)
    assert parse_mind2web(f"<action>{recorded}</action>", set(snap.refs)).action == recorded
    assert score_prediction(recorded, step, snap)["correct"]


def test_type_and_select_still_need_a_string_value(game) -> None:
    from memprism_ray.benchmark.mind2web.env import score_prediction
    from memprism_ray.benchmark.mind2web.snapshot import build_snapshot, human_refs

    step = load_task(game).steps[0]
    assert step.op == "TYPE" and len(step.value.split()) == 1  # label tokens {TYPE, <value>}
    snap = build_snapshot(step)
    ref = human_refs(step, snap)[0]
    # Invalid under the paper's rule (wrong); metric.py reads the tokens written (issue 41 item 3:
    # before, op F1 0): "TYPE" alone is 2/3 of {TYPE, <value>}, "SELECT" shares none.
    for fields, f1 in (
        ({"op": "TYPE"}, 2 / 3),
        ({"op": "TYPE", "value": None}, 2 / 3),
        ({"op": "SELECT", "value": 3}, 0.0),
    ):
        got = score_prediction(json.dumps({**fields, "ref": ref}), step, snap)
        assert got["error"] and "needs a string 'value'" in got["error"] and not got["correct"]
        assert got["element_correct"] and got["op_f1"] == pytest.approx(f1)


def test_an_output_that_does_not_parse_scores_what_it_wrote_under_metric_py(game) -> None:
    """Issue 41 item 3: metric.py's ``postprocess_action`` reads the element and ``Action:``/``Value:``
    of any output; an output the paper's parser rejects is wrong by the paper's rule and, under
    metric.py, scored on the ref, op and value it wrote (before: op F1 0, element wrong)."""
    from memprism_ray.benchmark.mind2web.env import score_prediction
    from memprism_ray.benchmark.mind2web.snapshot import build_snapshot, human_refs

    step = load_task(game).steps[0]
    snap = build_snapshot(step)
    ref, value = human_refs(step, snap)[0], step.value
    other = next(r for r in snap.refs if r != ref)
    cases = [
        # (output, element correct, op F1 by hand against {TYPE, <value>})
        (f'<action>{{"op": "TYPE", "ref": "{ref}", "value": "{value}"</action>', True, 1.0),  # no closing brace
        (f'<action>{{"op": "HOVER", "ref": "{ref}", "value": "{value}"}}</action>', True, 2 / 3),  # unknown op
        # Two actions: each field's first occurrence, {TYPE, <value>, now}.
        (
            f'<action>{{"op": "TYPE", "ref": "{other}", "value": "{value} now"}}</action>'
            '<action>{"op": "CLICK"}</action>',
            False,
            0.8,
        ),
        (f'<action>{{"op": "TYPE", "ref": "e999999", "value": "{value}"}}</action>', False, 1.0),  # ref not shown
        ("<action>TYPE it</action>", False, 0.0),  # nothing readable as written fields
    ]
    for output, element, f1 in cases:
        got = score_prediction(output, step, snap)
        assert got["error"] and not got["correct"], output
        assert (got["element_correct"], got["op_f1"]) == (element, pytest.approx(f1)), output


def test_metric_operation_reads_what_was_written() -> None:
    from memprism_ray.benchmark.mind2web.env import metric_operation

    assert metric_operation("CLICK", "x") == "CLICK x"  # a CLICK's Value line is read
    assert metric_operation("click", "x") == " x" and metric_operation(None, None) == " "
    assert metric_operation("TYPE", "New York\nmore") == "TYPE New York"
