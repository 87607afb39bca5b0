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

from memprism_ray.envs.base import Env
from memprism_ray.envs.ebalfred.data import game_ref, list_games
from memprism_ray.envs.ebalfred.env import EbAlfredConfig, EbAlfredEnv, make_embodiedbench_controller
from memprism_ray.envs.ebalfred.fixture import build_fixture, load_transcripts


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
    assert ob.admissible == tuple(ep["skills"])  # the indexed skill list: id i is admissible[i]
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
    tr = env.step("find a Knife")  # no Knife in this scene's skill list
    assert tr.feedback.startswith("Last action is invalid. Action 'find a Knife' is not in the skill set")


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
    from memprism_ray.recorder.phi.factory import make_rule_phi

    env = get_benchmark("ebalfred").make_env(2)
    assert env.num_slots == 2 and env.config.controller == "fake"
    assert env.reset(game_ref("visual_appearance", 0)).admissible
    assert make_rule_phi("ebalfred").name.startswith("ebalfred")


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
    from memprism_ray.config import load_config
    from memprism_ray.benchmark import get_benchmark

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
