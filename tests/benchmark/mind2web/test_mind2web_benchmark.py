"""The Mind2Web benchmark's D1 source (paper appendix "Training dataset setup": "teacher-forced
human trajectories and action-conditioned view-teacher records"): human trajectories as the
shared reference table, decision states with the human next action as reference,
counterfactual labels under the Mind2Web prompt contract, Mind2Web view-teacher prompt inputs;
the plan and the data resolution."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from memprism_ray.adapter.d1_labels import counterfactual_labels, expert_states
from memprism_ray.benchmark import get_benchmark
from memprism_ray.benchmark.mind2web import benchmark as pm
from memprism_ray.benchmark.mind2web import list_games
from memprism_ray.benchmark.mind2web.data import Mind2WebDataError, load_task
from memprism_ray.benchmark.mind2web.fixture import build_fixture
from memprism_ray.config import load_config

M2W = get_benchmark("mind2web")


def _states(games: list) -> list:
    """Decision states of ``games`` through the D1 path every benchmark shares: the benchmark's
    reference table, read back by ``expert_states``."""
    import io

    import pyarrow.parquet as pq

    return expert_states(pq.read_table(io.BytesIO(M2W.reference_table(None, games, [], None))))


@pytest.fixture(scope="module")
def root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_fixture(tmp_path_factory.mktemp("m2w"), tasks_per_site=2, seed=0)


def test_human_streams_and_action_conditioned_states(root: Path) -> None:
    games = list_games("train", root)[:2]
    streams = pm.human_streams(games)
    states = _states(games)
    n_steps = sum(len(load_task(g).steps) for g in games)
    assert len(states) == n_steps
    for (_game, goal, stream), task in zip(streams, (load_task(g) for g in games), strict=True):
        assert goal == task.confirmed_task and len(stream) == len(task.steps)
        assert [json.loads(r.raw.action)["op"] for r in stream.records] == [s.op for s in task.steps]
    first = states[0]
    assert first.state.step == 1 and first.state.history == () and first.admissible
    assert json.loads(first.state.reference_action) == {
        "op": load_task(games[0]).steps[0].op,
        "ref": f"e{load_task(games[0]).steps[0].pos[0].backend_node_id}",
        "value": load_task(games[0]).steps[0].value or None,
    }
    assert all(f"[ref={r}]" in ls.state.observation for ls in states for r in ls.admissible)


def test_counterfactual_labels_read_mind2web_prompts(root: Path) -> None:
    from memprism_ray.benchmark.mind2web.stand_in import Mind2WebScriptedPolicy
    from memprism_ray.router.encoder import TextEncoder
    from memprism_ray.router.features import FeatureExtractor
    from memprism_ray.router.teacher import CounterfactualConfig

    states = _states(list_games("train", root)[:2])
    dataset, counts = counterfactual_labels(
        states,
        FeatureExtractor(TextEncoder()),
        Mind2WebScriptedPolicy(temperature=0.5),
        short_history=0,
        benchmark="mind2web",
    )
    assert counts["decisions"] == len(states)
    assert counts["labelled"] == len(dataset) and counts["labelled"] + counts["fallback_skipped"] == len(states)
    assert len(dataset) >= 1  # some decisions depend on the view: the memory shows what was typed
    # label.counterfactual.uninformative reaches the Mind2Web teacher too: tie_break keeps the uninformative states.
    _, tie = counterfactual_labels(
        states,
        FeatureExtractor(TextEncoder()),
        Mind2WebScriptedPolicy(temperature=0.5),
        CounterfactualConfig(uninformative="tie_break"),
        short_history=0,
        benchmark="mind2web",
    )
    assert tie["labelled"] > counts["labelled"] and tie["fallback_skipped"] < counts["fallback_skipped"]


def test_mind2web_teacher_prompt_is_filled(root: Path) -> None:
    from memprism_ray.router.teacher import LLMTeacherConfig

    states = _states(list_games("train", root)[:1])
    st = states[2].state
    inputs = pm.mind2web_teacher_inputs(st.history, st.observation, st.goal, st.reference_action)
    assert inputs["observation_stats"]["prior_steps"] == 2 and inputs["summary_diffs"]
    assert "feedback" not in inputs["prior_summary_events"][0]
    teacher = pm.Mind2WebLLMTeacher(LLMTeacherConfig(model="m"), complete_fn=lambda p: "")
    prompt = teacher.build_prompt(teacher.state_inputs(st))
    assert st.goal in prompt and "field_value" in prompt and "{current_summary}" not in prompt
    teacher.close()


def test_plan_covers_each_task_once_in_order(root: Path) -> None:
    specs, expected = pm.plan_episodes(root, ("test_task", "test_domain"), 0)
    assert [s.game.split for s in specs] == ["test_task"] * 4 + ["test_domain"] * 2
    assert specs[0].episode_id == f"mind2web/test_task/{specs[0].game.game_id}#0"
    assert expected[specs[0].episode_id] == len(load_task(specs[0].game).steps)
    capped, _ = pm.plan_episodes(root, ("test_task", "test_domain"), 1)
    assert [s.game.split for s in capped] == ["test_task", "test_domain"]


def test_prepare_resolves_the_data(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("MIND2WEB_DATA", raising=False)
    cfg = load_config("configs/mind2web_smoke.yaml", ["--corpus.data_root", str(tmp_path / "fx")])
    got = M2W.prepare(cfg, lambda _: None)
    assert Path(got.corpus.data_root) == tmp_path / "fx" and (tmp_path / "fx" / "train" / "train_0.json").exists()
    assert len(M2W.train_games(got)) == 4
    real = load_config("configs/mind2web_paper.yaml")
    with pytest.raises(Mind2WebDataError, match="no Mind2Web data path"):
        M2W.prepare(real, lambda _: None)
    with pytest.raises(ValueError, match="eval_splits"):
        load_config("configs/mind2web_smoke.yaml", ["--mind2web.eval_splits", "train"])


def test_the_fixture_is_the_one_the_settings_ask_for(tmp_path: Path) -> None:
    """A fixture built with other settings was reused whatever the run asked (only its files'
    presence was checked): the cache's own, keyed by its settings, is built again when an older
    version built it; a ``corpus.data_root`` holding one of other settings is one line."""
    from memprism_ray.benchmark.mind2web.fixture import FIXTURE_FILE

    def prepared(*extra: str) -> list:
        cfg = M2W.prepare(load_config("configs/mind2web_smoke.yaml", list(extra)), lambda _: None)
        return M2W.train_games(cfg)

    named = ["--corpus.data_root", str(tmp_path / "fx")]
    assert len(prepared(*named)) == 4  # the preset's 2 tasks per site
    with pytest.raises(ValueError, match=r"fixture of 2 task\(s\) per site, seed 0; this run asks 1, seed 0"):
        prepared(*named, "--mind2web.fixture_tasks_per_site", "1")
    cache = ["--corpus.cache_dir", str(tmp_path / "cache"), "--mind2web.fixture_tasks_per_site", "1"]
    assert len(prepared(*cache)) == 2
    (own,) = (tmp_path / "cache").iterdir()
    (own / FIXTURE_FILE).unlink()  # as an older version left it
    (own / "train" / "train_0.json").write_text("[]")
    assert len(prepared(*cache)) == 2 and (own / FIXTURE_FILE).is_file()


def test_the_fixture_is_never_written_over_a_release(tmp_path: Path) -> None:
    """``--mind2web.fixture true`` with ``corpus.data_root`` naming a release wrote the
    fixture's ``test_task/test_task_0.json`` (the release's own file names) over the user's."""
    release = tmp_path / "release"
    (release / "test_task").mkdir(parents=True)
    (release / "test_task" / "test_task_0.json").write_text('[{"annotation_id": "mine"}]')
    cfg = load_config("configs/mind2web_smoke.yaml", ["--corpus.data_root", str(release)])
    with pytest.raises(ValueError, match=r"holds files but no Mind2Web fixture .*--mind2web.fixture false"):
        M2W.prepare(cfg, lambda _: None)
    assert (release / "test_task" / "test_task_0.json").read_text() == '[{"annotation_id": "mine"}]'
    assert sorted(p.name for p in release.iterdir()) == ["test_task"]
    (tmp_path / "empty").mkdir()  # an empty folder the user names is where the fixture is built
    empty = load_config("configs/mind2web_smoke.yaml", ["--corpus.data_root", str(tmp_path / "empty")])
    assert len(M2W.train_games(M2W.prepare(empty, lambda _: None))) == 4


def test_candidate_pool_reaches_the_env_d1_and_reports(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Issue 35 item 4: mind2web.candidate_scores (relative: under the data root) is resolved by
    prepare, sent to every env with env_options, used by D1's human replay, and named in reports."""
    from memprism_ray.benchmark.mind2web.candidates import pool_info
    from memprism_ray.benchmark.mind2web.fixture import SCORES_FILE

    monkeypatch.delenv("MIND2WEB_DATA", raising=False)
    logged: list[str] = []
    base = ["--corpus.data_root", str(tmp_path / "fx")]
    plain = M2W.prepare(load_config("configs/mind2web_smoke.yaml", base), logged.append)
    assert M2W.env_options(plain) == {"candidate_scores": "", "candidate_top_k": 50}
    assert pm.candidate_pool(plain) == pool_info("", 50, 32) and "project candidate pool" in logged[-1]
    cfg = load_config("configs/mind2web_smoke.yaml", [*base, "--mind2web.candidate_scores", SCORES_FILE])
    got = M2W.prepare(cfg, logged.append)
    assert got.mind2web.candidate_scores == str(tmp_path / "fx" / SCORES_FILE)  # absolute for every actor
    assert "MindAct candidate pool: top 50" in logged[-1]
    env = M2W.make_env(1, M2W.env_options(got))
    assert env.ranks is not None and env.ranks.path == got.mind2web.candidate_scores
    assert pm.candidate_pool(got)["protocol"] == "mindact"
    # D1 replays the human trajectory on the pages evaluation shows.
    games = list_games("train", got.corpus.data_root)[:2]
    project = {g.game_id: s for g, _, s in pm.human_streams(games)}
    mindact = {g.game_id: s for g, _, s in pm.human_streams(games, **M2W.env_options(got))}
    assert any(
        a.records[0].raw.o_pre != b.records[0].raw.o_pre
        for a, b in zip(project.values(), mindact.values(), strict=True)
    )
    specs, _ = pm.plan_episodes(got.corpus.data_root, ("test_task",), 0)
    cover = pm.plan_positives_in_pool(specs, M2W.env_options(got))
    assert set(cover) == {s.episode_id for s in specs} and not all(all(v) for v in cover.values())
    assert all(all(v) for v in pm.plan_positives_in_pool(specs, M2W.env_options(plain)).values())
    line = M2W.condition_line(
        {
            "mind2web": {"overall": {
                "step_accuracy": {"correct": 1, "n": 4, "rate": 0.25},
                "episode_success": {"correct": 0, "n": 1},
                "failed_episodes": 0,
                "metric_py": {
                    "element_accuracy": {"correct": 2, "n": 4}, "operation_f1": {"mean": 0.625},
                    "step_success": {"correct": 1, "n": 4}, "task_success": {"correct": 0, "n": 1},
                },
            }},
            "mind2web_pool": pm.candidate_pool(got),
        }
    )  # fmt: skip
    # Issue 41 item 3: each figure named by its rule.
    assert line == (
        "paper step accuracy 1/4 = 25.0%, paper episode success 0/1; MindAct (metric.py) element accuracy 2/4, "
        "op F1 62.5%, step SR 1/4, task SR 0/1 on the mindact candidate pool"
    )
    with pytest.raises(Mind2WebDataError, match="does not exist"):
        M2W.prepare(load_config("configs/mind2web_smoke.yaml", [*base, "--mind2web.candidate_scores", "x.parquet"]))
