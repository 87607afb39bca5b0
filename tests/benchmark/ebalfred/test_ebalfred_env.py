"""EbAlfredEnv on the fake controller (the fixture) and the real controller's clear errors."""

from __future__ import annotations

import hashlib
import importlib.util
import io
import os
import sys
from pathlib import Path

import pytest
from PIL import Image

from memprism_ray.benchmark.ebalfred.contract import EBALFRED
from memprism_ray.benchmark.ebalfred.data import game_ref, list_games
from memprism_ray.benchmark.ebalfred.env import EbAlfredConfig, EbAlfredEnv, make_embodiedbench_controller
from memprism_ray.benchmark.ebalfred.fixture import build_fixture
from memprism_ray.benchmark.ebalfred.fixture_format import load_transcripts
from memprism_ray.benchmark.ebalfred.phi import EbAlfredPhi
from memprism_ray.envs.base import Env


@pytest.fixture(scope="module")
def fixture_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_fixture(tmp_path_factory.mktemp("ebalfred-fixture"), episodes_per_subset=3)


def _env(root: Path, slots: int = 1, **kw) -> EbAlfredEnv:
    return EbAlfredEnv(slots, EbAlfredConfig(controller="fake", fixture=str(root), **kw))


def test_env_protocol_and_observation(fixture_root: Path) -> None:
    env = _env(fixture_root)
    assert isinstance(env, Env)
    ep = load_transcripts(fixture_root)["episodes"]["base/1"]
    ob = env.reset(game_ref("base", 1))
    assert ob.goal == ep["instruction"]
    assert ob.admissible == tuple(ep["admissible"])  # the indexed skill list: id i is admissible[i]
    assert ob.text == "Visible objects: CounterTop, Bowl. Held objects: none."
    with Image.open(io.BytesIO(ob.frame)) as got, Image.open(fixture_root / ep["initial"]["frame"]) as want:
        assert got.format == "PNG" and list(got.convert("RGB").getdata()) == list(want.convert("RGB").getdata())
    assert ob.meta["frame_sha1"] == hashlib.sha1(ob.frame).hexdigest() and ob.meta["subset"] == "base"


def test_expert_replay_wins_with_table_a4_reward(fixture_root: Path) -> None:
    env = _env(fixture_root)
    doc = load_transcripts(fixture_root)
    for game in list_games(path=fixture_root / "splits.json"):
        ep = doc["episodes"][game.game_id]
        env.reset(game)
        total, prev = 0.0, 0.0
        for k, st in enumerate(ep["steps"], start=1):
            tr = env.step(st["action"])
            progress = st["conds"] / ep["conds_total"]
            assert tr.meta["progress"] == pytest.approx(progress)
            assert tr.reward == pytest.approx(float(tr.won) + 0.2 * progress - prev)  # potential difference
            prev = float(tr.won) + 0.2 * progress
            total += tr.reward
            assert tr.meta["frame_step"] == k and tr.meta["frame_changed"]
            assert tr.feedback.startswith("Last action executed successfully.")
        assert tr.won and tr.done
        assert total == pytest.approx(1.2)  # success + 0.2 x progress


def test_failures_keep_state_and_frame(fixture_root: Path) -> None:
    env = _env(fixture_root)
    env.reset(game_ref("base", 1))  # the ladle episode
    tr = env.step("put down the object in hand")
    assert tr.feedback.startswith("Last action is invalid. Robot is not holding any object")
    assert not tr.meta["last_action_success"] and not tr.meta["frame_changed"] and tr.reward == 0.0
    env.step("find a Ladle")
    env.step("pick up the Ladle")
    tr = env.step("pick up the Bowl")
    assert "Robot is currently holding Ladle" in tr.feedback and "Held objects: Ladle (held)." in tr.feedback
    tr = env.step("turn on the Faucet")  # off the recorded plan, would change state: not replayable
    assert tr.feedback.startswith("Last action is invalid. The fixture has no recording")
    assert not tr.meta["frame_changed"] and tr.meta["progress"] == 0.0
    tr = env.step("find a Bowl")  # off-plan navigation succeeds, the replayed state stays
    assert tr.meta["last_action_success"] and "Held objects: Ladle (held)." in tr.feedback
    tr = env.step("find a Sink")  # the plan goes on where it was
    assert tr.meta["frame_changed"] and "Visible objects: Sink, Faucet." in tr.feedback
    tr = env.step("find a Knife")  # a global skill, no Knife in this scene: ThorConnector.nav_obj's answer
    assert tr.feedback.startswith("Last action is invalid. Cannot find Knife. This object may not exist in this scene.")
    assert "invalid_output" not in tr.meta  # a skill: it reached the controller


def test_invalid_limit_and_step_limit_end_episodes(fixture_root: Path) -> None:
    env = _env(fixture_root)
    env.reset(game_ref("base", 0))
    for i in range(10):
        tr = env.step("put down the object in hand")
        assert tr.done == (i == 9)  # EmbodiedBench ends after 10 invalid actions
    with pytest.raises(RuntimeError, match="step before reset"):
        env.step("find a Mug")
    env.reset(game_ref("base", 0))
    for i in range(30):
        tr = env.step("find a Desk" if i % 2 else "find a Pen")
    assert tr.done and not tr.won  # the 30-step limit of Table A.4


def test_slots_are_independent_and_switch_subsets(fixture_root: Path) -> None:
    env = _env(fixture_root, slots=2)
    a = env.reset(game_ref("base", 0), 0)
    b = env.reset(game_ref("long_horizon", 1), 1)
    assert a.goal != b.goal
    env.step("find a Mug", 0)
    tr = env.step("find a Mug", 1)  # not a skill of the heat episode
    assert not tr.meta["last_action_success"]
    c = env.reset(game_ref("spatial", 2), 0)
    assert c.meta["subset"] == "spatial"
    assert c.goal == load_transcripts(fixture_root)["episodes"]["spatial/2"]["instruction"]
    with pytest.raises(ValueError, match="has 3 episode"):
        env.reset(game_ref("base", 3), 0)
    with pytest.raises(ValueError, match="slot"):
        env.reset(game_ref("base", 0), 2)
    env.close()


def test_frame_dir_writes_audit_frames(fixture_root: Path, tmp_path: Path) -> None:
    env = _env(fixture_root, frame_dir=str(tmp_path / "frames"))
    ob = env.reset(game_ref("base", 0))
    tr = env.step("find a Mug")
    assert Path(ob.meta["frame_path"]).read_bytes() == ob.frame
    assert Path(tr.meta["frame_path"]).read_bytes() == tr.frame != ob.frame


def test_config_validation_and_env_vars(fixture_root: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(ValueError, match="valid controllers"):
        EbAlfredConfig(controller="thor")
    with pytest.raises(ValueError, match=r"ebalfred\.fixture"):
        EbAlfredConfig(controller="fake")
    with pytest.raises(ValueError, match="progress_coef"):
        EbAlfredConfig(controller="fake", fixture="x", progress_coef=2.0)
    monkeypatch.setenv("MEMPRISM_EBALFRED_FIXTURE", str(fixture_root))
    from memprism_ray.benchmark import get_benchmark

    env = get_benchmark("ebalfred").make_env(2)
    assert env.num_slots == 2 and env.config.controller == "fake"
    assert env.reset(game_ref("visual_appearance", 0)).admissible
    assert get_benchmark("ebalfred").phi_spec().rule().name.startswith("ebalfred")


def test_real_controller_missing_extra_is_one_clear_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "ai2thor", None)  # import fails as if not installed
    with pytest.raises(RuntimeError, match=r'pip install "memprism-ray\[ebalfred\]"'):
        make_embodiedbench_controller("base", EbAlfredConfig())
    env = EbAlfredEnv(1, EbAlfredConfig())
    with pytest.raises(RuntimeError, match="memprism-ray"):
        env.reset(game_ref("base", 0))


def test_real_controller_start_failure_names_local_build(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """A stand-in EmbodiedBench whose EBAlfEnv fails like a build download without network."""
    import types

    pkg = {
        name: types.ModuleType(name)
        for name in (
            "ai2thor",
            "embodiedbench",
            "embodiedbench.envs",
            "embodiedbench.envs.eb_alfred",
            "embodiedbench.envs.eb_alfred.gen",
            "embodiedbench.envs.eb_alfred.gen.constants",
            "embodiedbench.envs.eb_alfred.EBAlfEnv",
        )
    }
    pkg["embodiedbench.envs.eb_alfred.gen.constants"].BUILD_PATH = None
    seen = {}

    def broken(**kwargs):
        seen.update(kwargs, display=pkg["embodiedbench.envs.eb_alfred.EBAlfEnv"].X_DISPLAY)
        raise ConnectionError("could not download thor-201909061227-Linux64")

    pkg["embodiedbench.envs.eb_alfred.EBAlfEnv"].EBAlfEnv = broken
    pkg["embodiedbench.envs.eb_alfred.EBAlfEnv"].X_DISPLAY = "1"
    for name, mod in pkg.items():
        monkeypatch.setitem(sys.modules, name, mod)
    with pytest.raises(RuntimeError, match="local_build") as err:
        make_embodiedbench_controller("spatial", EbAlfredConfig(x_display="7", resolution=300))
    assert "MEMPRISM_AI2THOR_BUILD" in str(err.value)
    assert seen == {"eval_set": "spatial", "resolution": 300, "display": "7"}
    with pytest.raises(RuntimeError, match="is not a file"):
        make_embodiedbench_controller("base", EbAlfredConfig(local_build=str(tmp_path / "no-build")))
    build = tmp_path / "thor-Linux64"
    build.write_text("")
    with pytest.raises(RuntimeError, match="could not start"):
        make_embodiedbench_controller("base", EbAlfredConfig(local_build=str(build)))
    assert str(build) == pkg["embodiedbench.envs.eb_alfred.gen.constants"].BUILD_PATH


_HAVE_SIM = importlib.util.find_spec("ai2thor") is not None and importlib.util.find_spec("embodiedbench") is not None


@pytest.mark.skipif(not _HAVE_SIM, reason="ai2thor/EmbodiedBench not installed (the ebalfred extra; docs/ebalfred.md)")
def test_real_simulator_plays_one_step() -> None:  # pragma: no cover - needs AI2-THOR and a display
    env = EbAlfredEnv(
        1,
        EbAlfredConfig(
            controller="embodiedbench",
            x_display=os.environ.get("MEMPRISM_EBALFRED_X_DISPLAY", "1"),
            local_build=os.environ.get("MEMPRISM_AI2THOR_BUILD", ""),
        ),
    )
    try:
        try:
            ob = env.reset(game_ref("base", 0))
        except RuntimeError as exc:
            if "could not start" not in str(exc):
                raise
            # Installed but no simulator here (no X display, or no build and no network): the
            # one-line error is what a user gets; the episode itself needs a simulator node.
            pytest.skip(f"AI2-THOR could not start here: {str(exc)[:160]}")
        assert ob.frame and ob.admissible
        tr = env.step(ob.admissible[0])
        assert tr.frame and "Last action" in tr.feedback and 0.0 <= tr.meta["progress"] <= 1.0
    finally:
        env.close()


def test_actors_get_the_env_settings_from_the_config_not_the_environment(
    fixture_root: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Benchmark.env_options: the driver turns the `ebalfred` section into the env's
    EbAlfredConfig and sends it with the actor constructor; no MEMPRISM_EBALFRED_* needed."""
    from memprism_ray.benchmark import get_benchmark
    from memprism_ray.config import load_config

    for var in ("MEMPRISM_EBALFRED_FIXTURE", "MEMPRISM_EBALFRED_CONTROLLER", "MEMPRISM_EBALFRED_PROGRESS_COEF"):
        monkeypatch.delenv(var, raising=False)
    cfg = load_config(
        "configs/ebalfred_smoke.yaml",
        ["--run.out_dir", str(tmp_path), "--ebalfred.fixture", str(fixture_root), "--ebalfred.resolution", "64"],
    )
    opts = get_benchmark("ebalfred").env_options(cfg)
    assert opts["config"].controller == "fake" and opts["config"].fixture == str(fixture_root.resolve())
    assert opts["config"].progress_coef == cfg.grpo.progress_reward_coef and opts["config"].resolution == 64
    env = get_benchmark("ebalfred").make_env(1, opts)
    assert env.reset(game_ref("base", 0)).admissible
    assert get_benchmark("alfworld").env_options(load_config("configs/local.yaml")) == {}  # ALFWorld: nothing to send


# --- issue 30: what the real simulator, EmbodiedBench's lists and its evaluator do ---------


def test_fake_controller_stops_on_a_non_skill_string_like_thor_connector(fixture_root: Path) -> None:
    """EmbodiedBench b247936: ``EBAlfEnv.step`` counts the step, then
    ``ThorConnector.llm_skill_interact`` dispatches on the prefixes find / pick up / put down /
    open / close / turn on / turn off / slice / drop and ends anything else in ``assert False,
    'instruction not supported'``; a prefixed string it cannot carry out fails with the
    skill's own message (``nav_obj``: "Cannot find X. This object may not exist ...")."""
    from memprism_ray.benchmark.ebalfred.fake import FakeController

    ctrl = FakeController("base", 64, fixture=fixture_root)
    ctrl.reset()
    with pytest.raises(AssertionError, match="instruction not supported"):
        ctrl.step("I should look for the mug first")
    assert ctrl._current_step == 1
    with pytest.raises(AssertionError, match="instruction not supported"):
        ctrl.step("look")
    _, _, done, info = ctrl.step("find a Unicorn")
    assert info["env_feedback"] == (
        "Last action is invalid. Cannot find Unicorn. This object may not exist in this scene. "
        "Try to explore other instances instead."
    )
    assert not done and ctrl._cur_invalid_actions == 1


def test_an_unparsed_output_is_an_invalid_action_not_a_simulator_step(fixture_root: Path) -> None:
    """EmbodiedBench's evaluator (eb_alfred_evaluator.py, b247936) never sends an output its
    planner cannot parse (action -1) to the env: ``env._cur_invalid_actions += 1`` without
    ``env.step``, so no simulator step is used, and the episode ends at the env's
    ``_max_invalid_actions`` (10). Before, the adapter sent the raw text and the real
    connector's assert ended the episode as failed."""
    env = _env(fixture_root)
    ob = env.reset(game_ref("base", 1))  # the ladle episode
    ctrl = env._controllers[0]
    for i in range(8):
        tr = env.step("<think>the ladle is on the counter</think> so I pick it up")
        assert tr.meta["invalid_output"] and not tr.done and not tr.won and tr.reward == 0.0
        assert tr.frame == ob.frame and not tr.meta["frame_changed"] and tr.meta["frame_step"] == i + 1
        assert not tr.meta["last_action_success"] and tr.admissible == ob.admissible
        assert tr.feedback.startswith("Last action is invalid.") and "Visible objects: CounterTop, Bowl." in tr.feedback
    assert (ctrl._current_step, ctrl._cur_invalid_actions) == (0, 8)  # no simulator step used
    tr = env.step("find a Ladle")  # a skill still plays, as step 1 of the simulator's 30
    assert tr.meta["last_action_success"] and tr.meta["frame_changed"] and ctrl._current_step == 1
    tr = env.step("put down the object in hand")  # a failed skill: the same invalid-action count
    assert not tr.done and "invalid_output" not in tr.meta and ctrl._cur_invalid_actions == 9
    tr = env.step("look")
    assert tr.done and not tr.won and tr.meta["progress"] == 0.0  # the tenth invalid action
    with pytest.raises(RuntimeError, match="step before reset"):
        env.step("find a Ladle")


def test_the_prompt_gets_the_scene_filtered_list_or_embodiedbench_s(fixture_root: Path) -> None:
    """Paper appendix E.4: "one exact name from the scene-filtered skill list"; EmbodiedBench
    lists its whole ``language_skill_set`` (162 global skills + the scene's instances)."""
    ep = load_transcripts(fixture_root)["episodes"]["base/0"]
    scene = _env(fixture_root).reset(game_ref("base", 0))
    full = _env(fixture_root, skills="full").reset(game_ref("base", 0))
    assert scene.admissible == tuple(ep["admissible"]) and full.admissible == tuple(ep["skills"])
    assert len(full.admissible) == 162 + 7 and full.admissible[162] == "find a Drawer_2"
    assert {"find a Drawer_2", "open the Drawer_3", "find a Pen_2", "drop the object in hand"} <= set(scene.admissible)
    assert "find a Knife" in full.admissible and "find a Knife" not in scene.admissible
    with pytest.raises(ValueError, match=r"ebalfred\.skills"):
        EbAlfredConfig(controller="fake", fixture="x", skills="all")


def test_games_are_played_from_the_list_they_came_from(fixture_root: Path) -> None:
    """A training episode (subset alfred_train, its own list) is played from that list, on
    a slot whose controller was built on an evaluation subset (EBAlfEnv's constructor takes
    no other) and back; a list the node cannot read is an error, never the default list."""
    from memprism_ray.benchmark.ebalfred.fixture import TRAIN_FILE
    from memprism_ray.envs.base import GameRef

    doc = load_transcripts(fixture_root)
    train = list_games(["alfred_train"], fixture_root / TRAIN_FILE)
    env = _env(fixture_root)
    assert env.reset(train[1]).goal == doc["episodes"]["alfred_train/1"]["instruction"]
    assert env._controllers[0].eval_set == "base"
    assert env.reset(game_ref("base", 1, fixture_root / "splits.json")).goal == doc["episodes"]["base/1"]["instruction"]
    assert env.reset(train[2]).goal == doc["episodes"]["alfred_train/2"]["instruction"]
    tr = None
    for step in doc["episodes"]["alfred_train/2"]["steps"]:
        tr = env.step(step["action"])
    assert tr is not None and tr.won
    missing = GameRef("alfred_train/0", fixture_root / "gone.json", "alfred_train", "alfred_train")
    with pytest.raises(FileNotFoundError, match=r"ebalfred\.train_splits"):
        env.reset(missing)


def test_observation_carries_embodiedbench_s_in_context_examples(fixture_root: Path, tmp_path: Path) -> None:
    import json

    from memprism_ray.benchmark.ebalfred.examples import format_examples, parse_example

    ob = _env(fixture_root).reset(game_ref("base", 0))
    examples = json.loads((fixture_root / "examples" / "alfred_examples.json").read_text())
    assert ob.meta["examples"] == format_examples([parse_example(x) for x in examples], 10)
    assert ob.meta["examples"].count("## Task Execution Example ") == 10  # EmbodiedBench's n_shots: 10
    assert _env(fixture_root).reset(game_ref("long_horizon", 0)).meta["examples"].count("Example ") == 7
    assert _env(fixture_root, n_shots=3).reset(game_ref("base", 0)).meta["examples"].count("Example ") == 3
    assert "examples" not in _env(fixture_root, n_shots=0).reset(game_ref("base", 0)).meta
    with pytest.raises(FileNotFoundError, match=r"ebalfred\.n_shots: 0"):
        _env(fixture_root, examples=str(tmp_path)).reset(game_ref("base", 0))


class _TalkingPolicy:
    """A VLM that never writes an <action> tag (its output does not parse)."""

    name = "talking"
    contract = EBALFRED

    def __init__(self) -> None:
        self.inputs: list = []

    def act(self, inputs):  # type: ignore[no-untyped-def]
        self.inputs.extend(inputs)
        return [self.contract.to_output(inp, "I think the ladle is by the sink, so I will go there.") for inp in inputs]


def test_agent_episode_with_unparsed_outputs_ends_as_embodiedbench_s(fixture_root: Path) -> None:
    """End to end through the agent: ten unparsed outputs are ten invalid actions and end
    the episode (status ok, not failed: before, the first one reached the connector's
    assert on the real simulator); the prompt holds EmbodiedBench's examples and the step
    rows count their tokens."""
    import re

    from memprism_ray.agent import Agent, AgentConfig, EpisodeSpec, LocalServices
    from memprism_ray.baselines import make_selector

    policy = _TalkingPolicy()
    services = LocalServices(_env(fixture_root), EbAlfredPhi(), policy)
    config = AgentConfig(short_history=2, max_steps=30, token_counter="words")
    agent = Agent(services, make_selector("no_memory"), config)
    (res,) = agent.run([EpisodeSpec("ep", game_ref("base", 1, fixture_root / "splits.json"))])
    assert res.status == "ok" and res.steps == 10 and not res.won
    assert all(not r["valid"] for r in res.rows) and all(r["outcome"] == "exception" for r in res.rows)
    first = policy.inputs[0]
    assert first.meta["examples"].count("## Task Execution Example ") == 10
    prompt = EBALFRED.build_prompt_text(first)
    assert first.meta["examples"] in prompt
    words = re.compile(r"\w+|[^\w\s]")  # token_counter: words
    assert res.rows[0]["text_tokens"] == len(words.findall(prompt)) > len(words.findall(first.meta["examples"]))
    assert res.rows[0]["prompt_tokens"] == res.rows[0]["text_tokens"] + res.rows[0]["camera_visual_tokens"]


class _ScriptedPolicy:
    """A VLM whose first ``talk`` outputs do not parse, then always ``action`` (a skill)."""

    name = "scripted-steps"
    contract = EBALFRED

    def __init__(self, talk: int, action: str) -> None:
        self.talk, self.action, self.calls = talk, action, 0

    def act(self, inputs):  # type: ignore[no-untyped-def]
        out = []
        for inp in inputs:
            self.calls += 1
            text = "I am not sure yet." if self.calls <= self.talk else f"<action>{self.action}</action>"
            out.append(self.contract.to_output(inp, text))
        return out


def _play(env: EbAlfredEnv, policy: _ScriptedPolicy, max_steps: int, root: Path):  # type: ignore[no-untyped-def]
    from memprism_ray.agent import Agent, AgentConfig, EpisodeSpec, LocalServices
    from memprism_ray.baselines import make_selector

    config = AgentConfig(short_history=2, max_steps=max_steps, token_counter="words")
    agent = Agent(LocalServices(env, EbAlfredPhi(), policy), make_selector("no_memory"), config)
    (res,) = agent.run([EpisodeSpec("ep", game_ref("base", 1, root / "splits.json"))])
    return res


def test_nine_invalid_outputs_still_leave_thirty_simulator_steps(fixture_root: Path) -> None:
    """Issue 35 item 2 (paper: "EB-ALFRED uses a maximum of 30 steps"; EmbodiedBench: 30
    simulator steps, an output that is no skill takes none and the tenth ends the episode).
    The env says so in the transition (``meta["step_taken"]: False``) and the agent's
    ``max_steps`` counts the steps taken: 9 invalid outputs + 30 executed skills = 39
    decisions. Before, every decision counted and the episode stopped at 21 simulator steps."""
    from memprism_ray.envs.base import STEP_TAKEN, took_step

    env = _env(fixture_root)
    res = _play(env, _ScriptedPolicy(9, "find a CounterTop"), 30, fixture_root)  # off-plan find: succeeds
    ctrl = env._controllers[0]
    assert res.status == "ok" and res.steps == 39 and not res.won
    assert (ctrl._current_step, ctrl._cur_invalid_actions) == (30, 9)
    assert [r["valid"] for r in res.rows] == [False] * 9 + [True] * 30
    # The agent counts, not only the simulator: with max_steps 20 the episode stops after 20
    # simulator steps although the controller (30 steps) would go on.
    env = _env(fixture_root)
    res = _play(env, _ScriptedPolicy(9, "find a CounterTop"), 20, fixture_root)
    assert res.steps == 29 and env._controllers[0]._current_step == 20
    ob = env.reset(game_ref("base", 1))
    assert env.step("no skill at all").meta[STEP_TAKEN] is False
    tr = env.step("find a CounterTop")
    assert STEP_TAKEN not in tr.meta and took_step(tr) and ob.admissible == tr.admissible


def test_decisions_that_take_no_step_are_bounded_too(fixture_root: Path) -> None:
    """An env that never ends an episode on invalid outputs (here the controller's
    10-invalid limit lifted) still cannot keep it going: decisions that take no step stop at
    ``max_steps`` as well."""
    from memprism_ray.benchmark.ebalfred.env import make_controller

    def lenient(eval_set: str, config: EbAlfredConfig):  # type: ignore[no-untyped-def]
        ctrl = make_controller(eval_set, config)
        ctrl._max_invalid_actions = 10_000
        return ctrl

    env = EbAlfredEnv(1, EbAlfredConfig(controller="fake", fixture=str(fixture_root)), controller_factory=lenient)
    res = _play(env, _ScriptedPolicy(10_000, "find a CounterTop"), 12, fixture_root)
    assert res.status == "ok" and res.steps == 12 and env._controllers[0]._current_step == 0


class _SequencePolicy:
    """A VLM that answers with ``texts`` in turn (then the last one again)."""

    name = "sequence"
    contract = EBALFRED

    def __init__(self, texts: list[str]) -> None:
        self.texts, self.calls = texts, 0

    def act(self, inputs):  # type: ignore[no-untyped-def]
        out = []
        for inp in inputs:
            text = self.texts[min(self.calls, len(self.texts) - 1)]
            self.calls += 1
            out.append(self.contract.to_output(inp, text))
        return out


def test_step_rows_say_what_happened_to_each_action(fixture_root: Path) -> None:
    """Issue 41 item 2: ``valid`` says whether the output parsed against the prompt's list; the
    row's ``execution`` says what the env did: an output that is no skill is rejected before the
    simulator (no step); "find a Knife", outside the scene-filtered list but a skill of
    EmbodiedBench's, reaches the simulator through the fallback and takes a step (before, its row
    said only valid=False); a listed skill is executed. ``invalid_actions`` counts as EmbodiedBench
    does (rejected outputs + failed skills) and the report shows each."""
    from memprism_ray.benchmark.ebalfred.report import episode_rows, report_markdown, subset_report

    env = _env(fixture_root)
    shown = env.reset(game_ref("base", 1)).admissible  # the ladle episode, as _play plays
    assert "find a Knife" not in shown and "find a Knife" in env._controllers[0].language_skill_set
    texts = [
        "I do not know.",
        "<action>find a Knife</action>",
        "<action>find a Ladle</action>",
        "<action>look</action>",
    ]
    res = _play(env, _SequencePolicy(texts), 4, fixture_root)
    rows = res.rows[:4]
    assert [r["valid"] for r in rows] == [False, False, True, False]
    assert [r["execution"] for r in rows] == ["rejected", "executed_outside_list", "executed", "rejected"]
    assert [r["invalid_actions"] for r in rows] == [1, 2, 2, 3]  # the Knife is not in the scene: it fails
    assert res.env_steps == sum(r["execution"] != "rejected" for r in res.rows)
    (ep,) = episode_rows([res])
    n = len(res.rows)
    assert ep["rejected"] + ep["executed_outside_list"] + ep["executed"] == n and ep["executed_outside_list"] == 1
    assert ep["invalid_actions"] == res.rows[-1]["invalid_actions"] == ep["rejected"] + 1
    rep = subset_report([ep])
    assert rep["subsets"]["base"]["decisions"] == {
        "rejected": ep["rejected"], "executed_outside_list": 1, "executed": ep["executed"],
        "invalid_actions": ep["invalid_actions"],
    }  # fmt: skip
    md = report_markdown(rep)
    assert "| Subset | rejected | executed outside the list | executed | invalid actions | per episode |" in md
    assert f"| Base | {ep['rejected']} | 1 | {ep['executed']} | {ep['invalid_actions']} |" in md


def test_the_scene_at_reset_names_its_instances(fixture_root: Path) -> None:
    """Issue 41 item 1: the reset keeps the scene's objects, EmbodiedBench's instance names (the
    controller's ``id_to_name_dict``) and its full list; the fake controller maps a name to an
    instance as ``EBAlfEnv.step`` does, so ``find a Drawer`` is not the record ``find a Drawer_2``."""
    from memprism_ray.benchmark.ebalfred.fixture import TRAIN_FILE

    env = _env(fixture_root)
    with pytest.raises(RuntimeError, match="no scene before the first reset"):
        env.scene()
    train = list_games(["alfred_train"], fixture_root / TRAIN_FILE)
    doc = load_transcripts(fixture_root)["episodes"]
    key = next(
        k for k, ep in doc.items() if k.startswith("alfred_train/") and ep["steps"][0]["action"] == "find a Drawer_2"
    )
    env.reset(next(g for g in train if g.game_id == key))
    scene = env.scene()
    drawers = [o["objectId"] for o in scene.objects if o["objectType"] == "Drawer"]
    assert [scene.names[d] for d in drawers] == ["Drawer", "Drawer_2"] and "open the Drawer_2" in scene.skills
    assert doc[key]["steps"][0]["object_id"] == drawers[1]
    tr = env.step("find a Drawer")  # the first drawer: navigation succeeds, the record is not played
    assert tr.meta["last_action_success"] and tr.meta["progress"] == 0.0 and not tr.meta["frame_changed"]
    assert env.step("find a Drawer_2").meta["frame_changed"]  # the recorded instance: played
    assert env.step("open the Drawer_2").meta["frame_changed"]
