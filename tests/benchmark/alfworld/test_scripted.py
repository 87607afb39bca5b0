"""The scripted CPU stand-in for the frozen task policy (docs/architecture.md "The scripted policy";
paper eq. task-policy ``u_t ~ pi_task(. | X_t, g, H_short, V_t)``): goal parsing for the six
ALFWorld task templates, admissible-only actions, statelessness and seeding, and view
sensitivity measured on real games (tests/conftest.py tiny corpus)."""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from memprism_ray.benchmark.alfworld.contract import parse_alfworld
from memprism_ray.benchmark.alfworld.scripted import Goal, ScriptedPolicy, belief, decide, parse_goal
from memprism_ray.benchmark.ebalfred.contract import EBALFRED
from memprism_ray.policy.base import HistoryRecord, PolicyInput
from memprism_ray.policy.config import PolicyConfig
from memprism_ray.policy.factory import make_policy

TASK_OF = {
    "place": "pick_and_place_simple",
    "pick_two": "pick_two_obj_and_place",
    "clean": "pick_clean_then_place_in_recep",
    "heat": "pick_heat_then_place_in_recep",
    "cool": "pick_cool_then_place_in_recep",
    "look_at": "look_at_obj_in_light",
}
TREAT_VERB = {"pick_clean_then_place_in_recep": "clean", "pick_heat_then_place_in_recep": "heat",
              "pick_cool_then_place_in_recep": "cool"}  # fmt: skip
APPLIANCE = {"clean": "sinkbasin", "heat": "microwave", "cool": "fridge"}


@pytest.fixture(scope="module")
def agent_env():
    from memprism_ray.benchmark.alfworld import AlfworldEnv

    env = AlfworldEnv(num_slots=18)
    yield env
    env.close()


@pytest.fixture(scope="module")
def agent_all_games(memprism_tiny_corpus: Path) -> list:
    from memprism_ray.benchmark.alfworld import list_games

    return [g for s in ("train", "eval_in_distribution", "eval_out_of_distribution")
            for g in list_games(s, memprism_tiny_corpus)]  # fmt: skip


# --------------------------------------------------------------------------- goals


def _templates() -> list[tuple[str, str]]:
    import alfworld.gen.goal_library as glib

    return [(task, t) for task in TASK_OF.values() for t in glib.gdict[task]["templates"]]


@pytest.mark.parametrize(("task_type", "template"), _templates())
@pytest.mark.parametrize(
    ("obj", "recep", "toggle"), [("mug", "coffeemachine", "desklamp"), ("cd", "shelf", "floorlamp")]
)
def test_goal_templates_of_all_six_task_types(task_type, template, obj, recep, toggle) -> None:
    sentence = template.format(obj=obj, recep=recep, toggle=toggle)
    for text in (sentence, f"Your task is to: {sentence}.", f"YOUR TASK IS TO: {sentence.upper()}."):
        goal = parse_goal(text)
        assert goal is not None, text
        assert TASK_OF[goal.task] == task_type and goal.obj == obj
        if goal.task == "look_at":
            assert goal.toggle == toggle and goal.recep is None
        else:
            assert goal.recep == recep and goal.toggle is None


def test_unknown_goal_is_none_and_the_policy_still_acts() -> None:
    assert parse_goal("Your task is to: dance.") is None
    d = decide("dance", "You are in the middle of a room.", ["go to desk 1", "look"], [])
    assert set(d.scores) == {"go to desk 1", "look"} and "not understood" in d.reason


def test_corpus_goals_parse_to_their_task_types(agent_env, agent_all_games) -> None:
    for slot, game in enumerate(agent_all_games):
        goal = parse_goal(agent_env.reset(game, slot=slot).goal)
        assert goal is not None and TASK_OF[goal.task] == game.task_type, game.game_id
        assert goal.obj.lower() in game.game_id.lower()


# --------------------------------------------------------------------------- admissible, stateless, seeded

OBJS = ["mug 1", "mug 2", "apple 1", "egg 1", "cellphone 3", "peppershaker 2"]
RECEPS = ["countertop 1", "cabinet 2", "fridge 1", "microwave 1", "sinkbasin 1", "shelf 1", "drawer 4", "desk 1"]
VERBS = ["clean", "heat", "cool"]


def _command(draw: st.DrawFn) -> str:
    kind = draw(st.sampled_from(["go", "open", "close", "take", "move", "treat", "use", "examine", "look", "inv"]))
    o, r = draw(st.sampled_from(OBJS)), draw(st.sampled_from(RECEPS))
    return {
        "go": f"go to {r}", "open": f"open {r}", "close": f"close {r}", "take": f"take {o} from {r}",
        "move": f"move {o} to {r}", "treat": f"{draw(st.sampled_from(VERBS))} {o} with {r}",
        "use": "use desklamp 1", "examine": f"examine {r}", "look": "look", "inv": "inventory",
    }[kind]  # fmt: skip


@st.composite
def _situation(draw: st.DrawFn) -> tuple[str, str, list[str], list[str]]:
    import alfworld.gen.goal_library as glib

    task = draw(st.sampled_from(list(TASK_OF.values())))
    template = draw(st.sampled_from(glib.gdict[task]["templates"]))
    goal = template.format(obj=draw(st.sampled_from(["mug", "apple", "egg", "cellphone", "peppershaker"])),
                           recep=draw(st.sampled_from(["countertop", "cabinet", "fridge", "shelf", "desk"])),
                           toggle="desklamp")  # fmt: skip
    admissible = sorted({_command(draw) for _ in range(draw(st.integers(1, 14)))})
    o, r = draw(st.sampled_from(OBJS)), draw(st.sampled_from(RECEPS))
    snippets = [
        f"You arrive at {r}. On the {r}, you see a {o}.", f"You pick up the {o} from the {r}.",
        f"You heat the {o} using the {r}.", f"You move the {o} to the {r}.", f"The {r} is closed.",
        f"You open the {r}. The {r} is open. In it, you see nothing.", "Nothing happens.",
        f"{o} | {o}.location: {r} -> agent | {o}.hot: true [goal]", f"agent | agent.holding: {o}",
        f"step 4 | clean {o} with {r} | exception", draw(st.text(max_size=40)),
    ]  # fmt: skip
    memory = draw(st.lists(st.sampled_from(snippets), max_size=6))
    obs = draw(st.sampled_from(snippets))
    return goal, obs, admissible, memory


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(situation=_situation(), temperature=st.sampled_from([0.0, 0.3, 1.0, 5.0]), seed=st.integers(0, 50))
def test_actions_are_always_admissible(situation, temperature: float, seed: int) -> None:
    goal, obs, admissible, memory = situation
    policy = ScriptedPolicy(temperature=temperature, seed=seed)
    action, reason = policy.choose(goal, obs, admissible, memory, episode_id="e", step=seed)
    assert action in admissible and reason
    inp = PolicyInput("alfworld", goal, obs, tuple(admissible), step=3, view_text="\n".join(memory), meta={})
    out = policy.act([inp])[0]
    assert out.valid and out.action in admissible and parse_alfworld(out.text, admissible).action == out.action


def test_no_admissible_actions_means_look() -> None:
    assert ScriptedPolicy().choose("put a mug in desk", "You are lost.", [], [])[0] == "look"


START = "-= Welcome to TextWorld, ALFRED! =- You are in the middle of a room."
EXPLORE = tuple(f"go to {r}" for r in ("cabinet 1", "cabinet 2", "countertop 1", "desk 1", "drawer 1", "drawer 2",
                                       "shelf 1", "shelf 2", "sidetable 1", "bed 1"))  # fmt: skip


def _inp(episode_id: str, step: int = 0, **kw) -> PolicyInput:
    fields = {"goal": "put a mug in desk", "observation": START, "admissible": EXPLORE, "step": step,
              "meta": {"episode_id": episode_id}}  # fmt: skip
    return PolicyInput("alfworld", **{**fields, **kw})


def test_same_input_and_seed_give_the_same_output_and_no_state_is_kept() -> None:
    policy = ScriptedPolicy(temperature=1.0, seed=7)
    a, b = _inp("ep-a", 3), _inp("ep-b", 5)
    first = policy.act([a, b])
    for _ in range(3):  # other calls in between change nothing
        policy.act([_inp(f"noise-{_}", 1)])
    again = policy.act([b, a])
    assert [o.text for o in first] == [again[1].text, again[0].text]
    assert ScriptedPolicy(temperature=1.0, seed=7).act([a])[0].text == first[0].text


def test_episodes_and_seeds_vary_the_sampled_action() -> None:
    # Ten unvisited places score alike: sampling spreads over them, per episode id and seed.
    per_episode = {ScriptedPolicy(temperature=1.0, seed=0).act([_inp(f"ep{i}")])[0].action for i in range(40)}
    per_seed = {ScriptedPolicy(temperature=1.0, seed=s).act([_inp("ep0")])[0].action for s in range(40)}
    assert len(per_episode) >= 4 and len(per_seed) >= 4
    greedy = {ScriptedPolicy(temperature=0.0, seed=s).act([_inp(f"ep{s}")])[0].action for s in range(20)}
    assert len(greedy) == 1  # temperature 0 is the argmax whatever the seed


def test_the_view_and_history_are_its_only_memory() -> None:
    policy = ScriptedPolicy(temperature=0.0)
    obs = "You arrive at desk 1. On the desk 1, you see a pen 1."
    adm = ("go to cabinet 1", "go to countertop 1", "go to desk 1", "go to shelf 1")
    seen = "You arrive at shelf 1. On the shelf 1, you see a mug 1, and a plate 2."
    view = f"view: TemporalTrace | window=all | filter=all | gamma=medium\nstep 3 | go to shelf 1 | {seen}"
    blind = _inp("e", observation=obs, admissible=adm)
    assert blind.view_mode == "none" and policy.act([blind])[0].action != "go to shelf 1"
    for shown in (
        _inp("e", observation=obs, admissible=adm, view_text=view),
        _inp("e", observation=obs, admissible=adm, view_image=_blank(), meta={"episode_id": "e", "view_text": view}),
        _inp("e", observation=obs, admissible=adm, history=(HistoryRecord(0, START, "go to shelf 1", seen),)),
    ):
        assert policy.act([shown])[0].action == "go to shelf 1"
    # A view text without a view (No Memory) is not read.
    stray = _inp("e", observation=obs, admissible=adm, meta={"episode_id": "e", "view_text": view})
    assert policy.act([stray])[0].action == policy.act([blind])[0].action


def test_search_belief_is_fixed_and_a_place_the_page_does_not_show_is_searched_again() -> None:
    """The search belief stands for a VLM's prior: the same in every episode, not the
    generator's placement table; a favoured place the page does not show as searched looks
    unsearched, so the policy goes back to it (the looping that long windows prevent)."""
    places = [f"cabinet {i}" for i in range(1, 9)] + ["fridge 1", "countertop 1", "drawer 1", "shelf 1"]
    ranked = sorted(places, key=lambda r: -belief("apple", r))
    assert ranked == sorted(places, key=lambda r: -belief("apple", r))  # deterministic, episode-free
    assert ranked != sorted(places, key=lambda r: -belief("mug", r))  # it depends on the target
    assert all(0.0 <= belief("apple", r) < 1.0 for r in places)
    adm = tuple(f"go to {r}" for r in places)
    goal, obs = "put an apple in sinkbasin", "You arrive at bed 1. On the bed 1, you see nothing."
    policy = ScriptedPolicy(temperature=0.5)
    blind = policy.action_distribution(goal, obs, adm, [])
    favourite = max(blind, key=blind.__getitem__)
    assert favourite == f"go to {ranked[0]}" and blind[favourite] > 3 * blind[f"go to {ranked[-1]}"]
    shown = f"step 2 | go to {ranked[0]} | You arrive at {ranked[0]}. On the {ranked[0]}, you see a cup 1."
    after = policy.action_distribution(goal, obs, adm, [shown])
    assert after[favourite] < 0.01 and max(after, key=after.__getitem__) == f"go to {ranked[1]}"


def _blank():
    from PIL import Image

    return Image.new("RGB", (28, 28), "white")


def test_other_benchmarks_and_bad_settings(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("MEMPRISM_EBALFRED_FIXTURE", raising=False)
    out = ScriptedPolicy().act([PolicyInput("ebalfred", "g", "o", ("find a mug",))])[0]
    assert not out.valid and "reads alfworld inputs, not ebalfred" in out.error  # the ALFWorld stand-in only
    with pytest.raises(ValueError, match=r"policy\.scripted\.ebalfred_fixture"):  # EB-ALFRED: the fixture stand-in
        make_policy(PolicyConfig(backend="scripted"), EBALFRED)
    with pytest.raises(ValueError, match="temperature"):
        ScriptedPolicy(temperature=-1)
    with pytest.raises(ValueError, match=r"valid keys under policy\.scripted: temperature, seed, ebalfred_fixture"):
        ScriptedPolicy.from_config(PolicyConfig(backend="scripted", scripted={"temp": 1.0}))
    p = ScriptedPolicy.from_config(PolicyConfig(backend="scripted", scripted={"temperature": 0.5, "seed": 4}))
    assert (p.temperature, p.seed, p.needs_view_text) == (0.5, 4, True)


def test_goal_dataclass_roundtrip() -> None:
    assert parse_goal("put a hot egg in fridge") == Goal("heat", "egg", "fridge", None)


# --------------------------------------------------------------------------- view sensitivity


def _play(env, games, condition: str, seeds: Sequence[int], short_history: int) -> list:
    from memprism_ray.agent import Agent, AgentConfig, EpisodeSpec, LocalServices
    from memprism_ray.baselines import make_selector
    from memprism_ray.benchmark.alfworld.phi import AlfworldPhi

    results = []
    for seed in seeds:
        svc = LocalServices(env, AlfworldPhi(), ScriptedPolicy(temperature=0.3, seed=seed))
        cfg = AgentConfig(max_steps=50, short_history=short_history, token_counter="words")
        specs = [EpisodeSpec(f"s{seed}/{g.game_id}", g) for g in games]
        results += Agent(svc, make_selector(condition), cfg).run(specs)
    assert all(r.status == "ok" for r in results)
    assert all(row["valid"] for r in results for row in r.rows)
    return results


@pytest.mark.slow
def test_view_sensitivity_an_informative_view_beats_no_memory(agent_env, agent_all_games) -> None:
    """Same 18 real games x 2 policy seeds. The only memory is the condition's: no text
    history for any of them, so what differs is the view (or the full text history)."""
    from memprism_ray.eval.stats import paired_bootstrap_diff

    runs = {c: _play(agent_env, agent_all_games, c, (0, 1), short_history=0)
            for c in ("no_memory", "fixed:EntityState", "full_history")}  # fmt: skip
    won = {c: {r.spec.episode_id: r.won for r in rs} for c, rs in runs.items()}
    steps = {c: float(np.mean([r.steps for r in rs])) for c, rs in runs.items()}
    sr = {c: float(np.mean(list(w.values()))) for c, w in won.items()}
    for informative in ("fixed:EntityState", "full_history"):
        _diff, low, _high, n = paired_bootstrap_diff(won[informative], won["no_memory"], n_boot=4000, seed=0)
        assert n == 36
        assert low > 0.2, (informative, sr, steps)  # paired 95% CI of the SR gain well above zero
        assert steps[informative] < steps["no_memory"] - 10, steps
    assert sr["no_memory"] < 0.6 < min(sr["fixed:EntityState"], sr["full_history"]), sr


def _walk_to_treated(env, game) -> tuple[object, list[tuple[str, str, object]]]:
    """Replay a game's stored expert walkthrough on the real engine up to its last
    clean/heat/cool command; returns the reset observation and (action, pre-obs, transition)."""
    data = json.loads(Path(game.path).read_text())
    verb = TREAT_VERB[game.task_type]
    walk = data["walkthrough"]
    last = max(i for i, c in enumerate(walk) if c.startswith(f"{verb} "))
    ob = env.reset(game)
    obs, steps = ob.text, []
    for cmd in walk[: last + 1]:
        tr = env.step(cmd)
        steps.append((cmd, obs, tr))
        obs = tr.feedback
    return ob, steps


def _record(steps: list[tuple[str, str, object]], goal: str):
    from memprism_ray.benchmark.alfworld.phi import AlfworldPhi
    from memprism_ray.recorder.events import RawEvent
    from memprism_ray.recorder.stream import EventStream

    phi, stream = AlfworldPhi(), EventStream({"goal": goal})
    for cmd, pre, tr in steps:
        raw = RawEvent(pre, cmd, tr.feedback, tr.reward)
        ex = phi.extract(raw, stream.state)
        stream.record(raw, entity=ex.entity, act=ex.act, delta=ex.delta, failed=ex.failed, outcome=ex.outcome,
                      evidence=ex.evidence)  # fmt: skip
    return stream


def _decide(
    stream, goal: str, obs: str, adm: tuple[str, ...], action, goal_restore: str = "window"
) -> tuple[str, str | None]:
    from memprism_ray.composer import ComposerConfig
    from memprism_ray.views import ViewRequest, ViewService

    text = None
    if action is not None:
        service = ViewService(composer_config=ComposerConfig(goal_restore=goal_restore))
        text = service.render_one(ViewRequest(stream, action, goal, want_image=False, want_text=True)).text
    inp = PolicyInput("alfworld", goal, obs, adm, step=len(stream), view_text=text, meta={"episode_id": "x"})
    return ScriptedPolicy(temperature=0.0).act([inp])[0].action, text


INFORMATIVE = ("TemporalTrace/recent_long/all/medium", "EntityState/all/state_update/coarse")
UNINFORMATIVE = ("EntityState/recent_short/exception/coarse", "DependencyChain/recent_long/all/medium")


def test_view_sensitivity_a_view_without_the_evidence_misleads(agent_env, agent_all_games) -> None:
    """Real decisions: after cleaning/heating/cooling the object, the agent walks past six
    other places. A view that still shows the state change sends it to the target; a view
    that does not show it (its window lost the event, or its relation does not link it to
    the latest event), like no view at all, does not.

    Views are composed with window-only goal restore, so that a view's scope decides what
    it shows (the paper's whole-history restore, the default, is tested in
    tests/composer/test_composer_select.py)."""
    from memprism_ray.benchmark.alfworld.reader import instance_type, read_facts
    from memprism_ray.view_space import ViewAction

    games = [g for g in agent_all_games if g.task_type in TREAT_VERB]
    assert len(games) == 9
    for game in games:
        ob, steps = _walk_to_treated(agent_env, game)
        goal = parse_goal(ob.goal)
        verb = TREAT_VERB[game.task_type]
        treated = steps[-1][0].split(" ", 1)[1].split(" with ")[0]
        avoid = {APPLIANCE[verb], goal.recep}
        obs, adm = steps[-1][2].feedback, steps[-1][2].admissible
        here = None
        for k in range(6):  # detours: six moves between other places, away from the appliance and the target
            options = sorted(a for a in adm if a.startswith("go to ") and instance_type(a[6:]) not in avoid)
            cmd = next(a for a in options[k % len(options) :] + options if a[6:] != here)
            here = cmd[6:]
            tr = agent_env.step(cmd)
            steps.append((cmd, obs, tr))
            obs, adm = tr.feedback, tr.admissible
        stream = _record(steps, ob.goal)
        state = {"clean": "clean", "heat": "hot", "cool": "cool"}[verb]
        blind, _ = _decide(stream, ob.goal, obs, adm, None)
        assert instance_type(blind.split(" ", 2)[-1]) != goal.recep, (game.game_id, blind)
        for name in INFORMATIVE + UNINFORMATIVE:
            action, text = _decide(stream, ob.goal, obs, adm, ViewAction(*name.split("/")))
            shows = state in read_facts(text).states.get(treated, set())
            to_target = instance_type(action.split(" ", 2)[-1]) == goal.recep
            if name in INFORMATIVE:
                assert shows and to_target, (game.game_id, name, action)
                continue
            # Without the evidence (the state change, or what it holds) it redoes work: back
            # to the appliance, or searching for an object it does not know it holds.
            assert not to_target and not shows, (game.game_id, name, action)
