"""The evaluation protocol (paper appendix C "Common controlled protocol": every condition
plays the same ordered episode list; per condition a manifest, tables, report, plots and a few
episodes' artifacts; several conditions side by side with paired differences), through the one
evaluation path (memprism_ray/trainer/evaluate.py: EvalWorker actors on the in-process Ray
session). Runs the real engine on the shared tiny corpus (tests/conftest.py)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import pytest

from memprism_ray.baselines.conditions import FIXED_FILTER, FIXED_GAMMA, FIXED_WINDOW
from memprism_ray.benchmark import get_benchmark
from memprism_ray.config import ExperimentConfig, FinalEvalConfig
from memprism_ray.config_tree import from_dict, merge
from memprism_ray.eval.episodes import parse_episode_id
from memprism_ray.policy.config import PolicyConfig
from memprism_ray.view_space import ViewAction

pytestmark = [pytest.mark.ray]

SPLIT = "eval_out_of_distribution"
ALFWORLD = get_benchmark("alfworld")


def _cfg(corpus: Path, conditions: tuple[str, ...], **kw: Any) -> ExperimentConfig:
    """The evaluation config of these tests: ``kw`` sets ``eval`` keys, ``max_steps`` both horizons."""
    steps = kw.pop("max_steps", 12)
    data = {
        "run": {"name": "eval-protocol", "seed": 3},
        "corpus": {"data_root": str(corpus)},
        "eval": merge({"conditions": list(conditions), "episodes": 4, "slots": 4, "artifacts": 1, "workers": 1}, kw),
        "alfworld": {"eval_split": SPLIT},
        "agent": {"max_steps": steps, "token_counter": "words"},
        "rollout": {"env_cpus": 0.1},
        "policy": {"backend": "scripted", "scripted": {"temperature": 0.3, "seed": 3}},
    }  # fmt: skip
    return from_dict(ExperimentConfig, data)


def _evaluate(cfg: ExperimentConfig, out: Path, checkpoint: str = "", log: Any = None) -> dict[str, Any]:
    from memprism_ray.trainer.evaluate import evaluate, router_state_for

    state = router_state_for(cfg, checkpoint)
    return evaluate(cfg, ALFWORLD, cfg.eval.conditions, state, checkpoint, out, log=log or (lambda _: None))


@pytest.fixture(scope="module")
def agent_eval_run(
    ray_session, memprism_tiny_corpus: Path, tmp_path_factory: pytest.TempPathFactory
) -> tuple[Path, dict]:
    out = tmp_path_factory.mktemp("eval-run")
    lines: list[str] = []
    summary = _evaluate(_cfg(memprism_tiny_corpus, ("no_memory", "fixed:EntityState")), out, log=lines.append)
    assert any(line.startswith("eval fixed:EntityState: ") and line.split(": ")[1].count("/4 = ") for line in lines)
    assert summary["failed_episodes"] == 0
    return out, summary


def test_each_condition_plays_the_same_ordered_episodes(agent_eval_run) -> None:
    out, _ = agent_eval_run
    ids = {}
    for cond, name in (("no_memory", "no_memory"), ("fixed_EntityState", "fixed:EntityState")):
        manifest = json.loads((out / cond / "manifest.json").read_text())
        episodes = pq.read_table(out / cond / "episodes.parquet").to_pylist()
        assert [e["episode_id"] for e in episodes] == manifest["episode_ids"]
        assert len(manifest["episode_ids"]) == 4 and manifest["split"] == SPLIT and manifest["seed"] == 3
        assert all(parse_episode_id(e)[0] == SPLIT for e in manifest["episode_ids"])
        assert manifest["n_unique_games"] == 4  # 4 of 6 games, none repeated
        assert manifest["model_ids"]["task_policy"].startswith("scripted:")
        assert manifest["prompt_version"] and manifest["decoding"]
        assert manifest["output_paths"]["dir"] == str(out / cond)
        assert manifest["checkpoint_sha256"] == {}
        assert manifest["extra"]["config"]["agent"]["max_steps"] == 12
        assert manifest["condition"] == name
        ids[cond] = manifest["episode_ids"]
    assert ids["no_memory"] == ids["fixed_EntityState"]


def test_tables_reports_and_plots_agree(agent_eval_run) -> None:
    out, summary = agent_eval_run
    for cond, rep in zip(("no_memory", "fixed_EntityState"), summary["conditions"], strict=True):
        d = out / cond
        episodes = pq.read_table(d / "episodes.parquet").to_pylist()
        steps = pq.read_table(d / "steps.parquet").to_pylist()
        report = json.loads((d / "report.json").read_text())
        assert report == json.loads(json.dumps(rep))
        assert report["n"] + report["failed_episodes"] == 4
        assert report["successes"] == sum(e["won"] for e in episodes if e["status"] == "ok")
        assert len(steps) == sum(e["steps"] for e in episodes) == report["efficiency"]["decisions"]
        assert {s["condition"] for s in steps} == {report["condition"]}
        assert all(e["steps"] <= 12 for e in episodes)
        assert report["efficiency"]["stored_bytes"] > 0
        assert (d / "report.md").read_text().startswith(f"# Evaluation: {report['condition']}")
        assert (d / "sr_tokens_by_length.png").stat().st_size > 0
        assert (d / "view_marginals.png").exists() == (cond != "no_memory")
        # Full artifacts of the first episode only.
        arts = sorted((d / "episodes").iterdir())
        assert len(arts) == 1 and (arts[0] / "trajectory.html").exists() and (arts[0] / "events.parquet").exists()
        # The stand-in reads no pixels, yet the viewer's episode has its pages painted.
        assert ("data:image/png;base64" in (arts[0] / "trajectory.html").read_text()) == (cond != "no_memory")
    fixed = summary["conditions"][1]
    want = ViewAction("EntityState", FIXED_WINDOW, FIXED_FILTER, FIXED_GAMMA)
    assert fixed["view_selection"]["view_marginal"][want.index] == 1.0
    assert summary["conditions"][0]["view_selection"]["decisions_with_view"] == 0


def test_summary_pairs_every_condition_with_the_first(agent_eval_run) -> None:
    out, summary = agent_eval_run
    assert summary["base"] == "no_memory"
    assert [r["condition"] for r in summary["conditions"]] == ["no_memory", "fixed:EntityState"]
    cmp = summary["paired_vs_base"]
    assert cmp["no_memory"]["diff"] == 0.0
    a, b = summary["conditions"]
    assert cmp["fixed:EntityState"]["n_common"] == 4
    assert cmp["fixed:EntityState"]["diff"] == pytest.approx(b["sr"] - a["sr"])
    assert json.loads((out / "summary.json").read_text())["base"] == "no_memory"
    md = (out / "summary.md").read_text()
    assert "| no_memory |" in md and "| fixed:EntityState |" in md and "diff vs no_memory" in md


def test_freq_random_samples_the_marginal_of_another_run(agent_eval_run, memprism_tiny_corpus, tmp_path) -> None:
    out, _ = agent_eval_run
    cfg = _cfg(memprism_tiny_corpus, ("freq_random",), marginal=str(out / "fixed_EntityState"), episodes=2,
               artifacts=0, max_steps=4)  # fmt: skip
    _evaluate(cfg, tmp_path)
    steps = pq.read_table(tmp_path / "freq_random" / "steps.parquet").to_pylist()
    want = ViewAction("EntityState", FIXED_WINDOW, FIXED_FILTER, FIXED_GAMMA).index
    assert steps and {s["view_index"] for s in steps} == {want}
    assert all(s["view_logprob"] == 0.0 for s in steps)  # log(1)
    assert not (tmp_path / "freq_random" / "episodes").exists()


@pytest.mark.parametrize(
    ("conditions", "message"),
    [(("no_memory", "bogus"), "eval.conditions: unknown condition 'bogus'; valid conditions: no_memory"),
     (("no_memory", "no_memory"), "eval.conditions: 'no_memory' is listed twice"),
     (("fixed:Nope",), "eval.conditions: "),
     ((), "eval.conditions must name at least one condition"),
     (("freq_random",), "list memprism before it")],
)  # fmt: skip
def test_bad_condition_names_fail_when_the_config_is_built(conditions, message, tmp_path: Path) -> None:
    with pytest.raises(ValueError, match=message):
        _cfg(tmp_path / "no-corpus", conditions)


@pytest.mark.parametrize(
    ("conditions", "kw", "message"),
    [(("constrained:gamma=fine",), {}, "needs a Router checkpoint"),
     (("freq_random",), {"marginal": "/nonexistent/report.json"}, "does not exist")],
)  # fmt: skip
def test_bad_conditions_fail_before_any_work(conditions, kw, message, tmp_path: Path, monkeypatch) -> None:
    import memprism_ray.cluster.placement as placement
    from memprism_ray.trainer.fit import run_evaluation

    monkeypatch.setattr(placement, "init_ray", lambda *a, **k: pytest.fail("Ray started before the refusal"))
    out = tmp_path / "never"
    errors: list[str] = []
    assert run_evaluation(_cfg(tmp_path / "no-corpus", conditions, **kw), ALFWORLD, "", out, error=errors.append) == 2
    assert len(errors) == 1 and message in errors[0]
    assert not out.exists()


@pytest.mark.parametrize(
    ("content", "message"),
    [([0.5, 0.5], "needs 144 probabilities (one per view), got 2"),
     ([[0.1] * 144], "must be a flat JSON list of numbers"),
     ({"view_marginal": [{"a": 1}] * 144}, "must be a flat JSON list of numbers"),
     ([-1.0] * 144, "must be finite, non-negative and not all zero")],
)  # fmt: skip
def test_a_bad_marginal_fails_before_any_worker(content, message, tmp_path: Path, monkeypatch) -> None:
    """eval.marginal is checked as each worker's freq_random selector checks it, once, before Ray
    starts: it used to pass the start when short (then every freq_random episode failed) or
    escape as a TypeError when it held objects."""
    import memprism_ray.cluster.placement as placement
    from memprism_ray.trainer.fit import run_evaluation

    monkeypatch.setattr(placement, "init_ray", lambda *a, **k: pytest.fail("Ray started before the refusal"))
    path = tmp_path / "marginal.json"
    path.write_text(json.dumps(content))
    errors: list[str] = []
    cfg = _cfg(tmp_path / "no-corpus", ("freq_random",), marginal=str(path))
    assert run_evaluation(cfg, ALFWORLD, "", tmp_path / "never", error=errors.append) == 2
    assert len(errors) == 1 and str(path) in errors[0] and message in errors[0] and "\n" not in errors[0]


def test_eval_config_rejects_bad_settings() -> None:
    with pytest.raises(ValueError, match="at least one condition"):
        FinalEvalConfig(conditions=())
    with pytest.raises(ValueError, match="slots"):
        FinalEvalConfig(slots=0)
    with pytest.raises(ValueError, match=r"policy\.scripted\.temperature must be >= 0"):
        PolicyConfig(scripted={"temperature": -1})


def _corpus_with_broken_games(corpus: Path, root: Path, n: int, broken: int) -> list[str]:
    """``n`` games of the split copied under ``root``, the last ``broken`` of them with a game
    file that is not JSON; returns the broken games' ids."""
    import shutil

    from memprism_ray.benchmark.alfworld import list_games

    games = list_games(SPLIT, corpus)[:n]
    for g in games:
        shutil.copytree(g.path.parent, root / "json_2.1.1" / "valid_unseen" / g.game_id)
    for g in games[n - broken :]:
        (root / "json_2.1.1" / "valid_unseen" / g.game_id / "game.tw-pddl").write_text("not json {")
    return [g.game_id for g in games[n - broken :]]


def test_broken_games_stay_in_the_plan_as_failures(ray_session, memprism_tiny_corpus: Path, tmp_path: Path) -> None:
    bad = _corpus_with_broken_games(memprism_tiny_corpus, tmp_path / "data", 4, 3)
    cfg = _cfg(tmp_path / "data", ("no_memory", "recent4"), episodes=0, artifacts=0, max_steps=3)
    lines: list[str] = []
    summary = _evaluate(cfg, tmp_path / "out", log=lines.append)
    assert "3 broken game(s) in split 'eval_out_of_distribution': their episodes count as failures" in lines
    assert summary["failed_episodes"] == 6
    for rep in summary["conditions"]:
        assert (rep["n"], rep["failed_episodes"], rep["failure_reasons"]) == (4, 3, {"broken game": 3})
        assert sorted(parse_episode_id(f["episode_id"])[1] for f in rep["failed"]) == sorted(bad)
        assert all(f["error"].startswith("broken game: game.tw-pddl is not valid JSON") for f in rep["failed"])
    episodes = pq.read_table(tmp_path / "out" / "no_memory" / "episodes.parquet").to_pylist()
    manifest = json.loads((tmp_path / "out" / "no_memory" / "manifest.json").read_text())
    assert [e["episode_id"] for e in episodes] == manifest["episode_ids"] and len(episodes) == 4
    assert sum(e["status"] == "failed" for e in episodes) == 3
    assert summary["paired_vs_base"]["recent4"]["n_common"] == 4  # failures are paired as failures
    md = (tmp_path / "out" / "summary.md").read_text()
    assert "- no_memory: 3 of 4 (3 broken game); see its report.md" in md
    assert "broken game: game.tw-pddl is not valid JSON" in (tmp_path / "out" / "recent4" / "report.md").read_text()


def test_a_crashed_wave_fails_its_episodes_and_the_run_goes_on(
    ray_session, memprism_tiny_corpus: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from memprism_ray.actors.evaluation import EvalWorker
    from memprism_ray.trainer import evaluate

    class CrashingEvalWorker(EvalWorker.__ray_actor_class__):
        """An EvalWorker whose decision loop raises on a wave of one episode (in its own process)."""

        def __init__(self, *args: Any, **kwargs: Any) -> None:
            from memprism_ray.agent import Agent

            real_run = Agent.run

            def run(agent, specs, *a, **k):
                if len(specs) == 1:  # the last wave of 3 episodes in slots of 2
                    raise RuntimeError("selector exploded")
                return real_run(agent, specs, *a, **k)

            Agent.run = run
            super().__init__(*args, **kwargs)

    monkeypatch.setattr(evaluate, "EvalWorker", ray_session.remote(max_restarts=0)(CrashingEvalWorker))
    cfg = _cfg(memprism_tiny_corpus, ("no_memory",), episodes=3, slots=2, artifacts=0, max_steps=3)
    rep = _evaluate(cfg, tmp_path)["conditions"][0]
    assert (rep["n"], rep["failed_episodes"], rep["failure_reasons"]) == (3, 1, {"crashed": 1})
    assert rep["failed"][0]["error"] == "crashed: RuntimeError: selector exploded"
    episodes = pq.read_table(tmp_path / "no_memory" / "episodes.parquet").to_pylist()
    assert [e["status"] for e in episodes] == ["ok", "ok", "failed"]


@pytest.mark.slow
def test_memprism_uses_the_router_and_freq_random_samples_its_marginal(
    ray_session, memprism_tiny_corpus, actors_reference_ckpt, tmp_path
) -> None:
    from memprism_ray.adapter.checkpoint import checkpoint_sha256

    cfg = _cfg(memprism_tiny_corpus, ("memprism", "freq_random"), episodes=2, artifacts=0, max_steps=3)
    summary = _evaluate(cfg, tmp_path, str(actors_reference_ckpt))
    steps = pq.read_table(tmp_path / "memprism" / "steps.parquet").to_pylist()
    assert steps and all(0 <= s["view_index"] < 144 and s["view_logprob"] <= 0.0 for s in steps)
    assert all(s["view_medium"] == "optical" and s["visual_tokens"] > 0 for s in steps)
    manifest = json.loads((tmp_path / "memprism" / "manifest.json").read_text())
    assert manifest["checkpoint_sha256"] == {"router": checkpoint_sha256(actors_reference_ckpt)}
    assert summary["conditions"][0]["view_selection"]["decisions_with_view"] == len(steps)
    # freq_random (no eval.marginal): every view it drew has positive mass in the marginal memprism measured.
    memprism, freq = summary["conditions"]
    chosen = {i for i, p in enumerate(memprism["view_selection"]["view_marginal"]) if p > 0}
    steps = pq.read_table(tmp_path / "freq_random" / "steps.parquet").to_pylist()
    assert steps and {s["view_index"] for s in steps} <= chosen
    assert freq["condition"] == "freq_random"
    with pytest.raises(ValueError, match="list memprism before it"):
        _cfg(memprism_tiny_corpus, ("freq_random",))


def test_an_output_directory_with_an_evaluation_is_refused_and_files_are_never_replaced(tmp_path) -> None:
    # Issue 10 item 5: reports are written atomically and never silently overwritten.
    import pytest

    from memprism_ray.eval import report as rpt
    from memprism_ray.eval.report import check_fresh_output

    out = tmp_path / "ev"
    check_fresh_output(out)  # absent: fine
    (out / "memprism").mkdir(parents=True)
    check_fresh_output(out)  # an empty condition directory: fine
    rpt.write_json(out / "memprism" / "report.json", {"sr": 0.5})
    with pytest.raises(rpt.InterruptedEvaluation, match=r"interrupted evaluation \(report.json of memprism;"):
        check_fresh_output(out)
    (out / "summary.md").write_text("done")
    with pytest.raises(FileExistsError, match="already holds an evaluation") as refused:
        check_fresh_output(out)
    assert not isinstance(refused.value, rpt.InterruptedEvaluation)
    with pytest.raises(FileExistsError, match="refusing to overwrite"):
        rpt.write_json(out / "memprism" / "report.json", {"sr": 0.9})
    assert (out / "memprism" / "report.json").read_text().strip().endswith("}")
    assert '"sr": 0.5' in (out / "memprism" / "report.json").read_text()
    assert not list((out / "memprism").glob("*.tmp*"))
