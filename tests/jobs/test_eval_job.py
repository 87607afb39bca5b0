"""``jobs/eval_alfworld.py`` (distributed evaluation, paper appendix B) reports every
episode of its plan: broken games and lost workers count as failures, and the job exits
non-zero when any episode failed (issue 10 item 1). Runs on the in-process Ray session."""

from __future__ import annotations

import importlib.util
import json
import shutil
from pathlib import Path

import pytest

pytestmark = [pytest.mark.ray]

ROOT = Path(__file__).resolve().parents[2]
SPLIT = "eval_out_of_distribution"


def _eval_job():
    spec = importlib.util.spec_from_file_location("eval_alfworld_job", ROOT / "jobs" / "eval_alfworld.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _data(corpus: Path, root: Path, n: int, broken: int) -> Path:
    from memprism_ray.benchmark.alfworld import list_games

    for i, g in enumerate(list_games(SPLIT, corpus)[:n]):
        dst = root / "json_2.1.1" / "valid_unseen" / g.game_id
        shutil.copytree(g.path.parent, dst)
        if i >= n - broken:
            (dst / "game.tw-pddl").write_text("not json {")
    return root


def _overrides(data: Path) -> list[str]:
    return ["--corpus.data_root", str(data), "--eval.episodes", "4", "--eval.conditions", "no_memory,recent4",
            "--alfworld.eval_split", SPLIT, "--eval.workers", "2", "--eval.slots", "2", "--eval.artifacts", "0",
            "--agent.max_steps", "3", "--rollout.env_cpus", "0.1"]  # fmt: skip


def test_broken_games_are_failures_and_the_job_exits_1(
    ray_session, memprism_tiny_corpus: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    data = _data(memprism_tiny_corpus, tmp_path / "data", 4, 3)
    out = tmp_path / "out"
    assert _eval_job().main(["--config", "configs/local.yaml", "--out", str(out), *_overrides(data)]) == 1
    captured = capsys.readouterr()
    assert "3 broken game(s) in split 'eval_out_of_distribution': their episodes count as failures" in captured.out
    assert captured.err.strip().splitlines()[-1] == (
        "[eval] error: 6 episode(s) failed and count as failures: no_memory: 3 of 4 (3 broken game); "
        f"recent4: 3 of 4 (3 broken game); see {out / 'summary.md'}"
    )
    summary = json.loads((out / "summary.json").read_text())
    assert summary["failed_episodes"] == 6
    for rep in summary["conditions"]:
        assert (rep["n"], rep["failed_episodes"]) == (4, 3)
    assert "- recent4: 3 of 4 (3 broken game); see its report.md" in (out / "summary.md").read_text()


def test_a_lost_worker_fails_its_share_not_the_job(
    ray_session, memprism_tiny_corpus: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from memprism_ray.benchmark import get_benchmark
    from memprism_ray.config import load_config
    from memprism_ray.trainer import evaluate

    calls = {"n": 0}
    real_get = evaluate.ray.get

    def get(ref, *args, **kwargs):  # the second worker's share never comes back
        calls["n"] += 1
        if calls["n"] == 2:
            raise evaluate.ray.exceptions.GetTimeoutError("worker lost")
        return real_get(ref, *args, **kwargs)

    monkeypatch.setattr(evaluate.ray, "get", get)
    cfg = load_config("configs/local.yaml", _overrides(_data(memprism_tiny_corpus, tmp_path / "data", 4, 0)))
    summary = evaluate.evaluate(
        cfg, get_benchmark("alfworld"), ("no_memory",), None, "", tmp_path / "out", log=lambda _: None
    )
    rep = summary["conditions"][0]
    assert (rep["n"], rep["failed_episodes"], rep["failure_reasons"]) == (4, 2, {"crashed": 2})
    assert {f["error"] for f in rep["failed"]} == {"crashed: GetTimeoutError: worker lost"}


def test_the_viewer_episode_is_painted_on_whichever_worker_plays_it(
    ray_session, memprism_tiny_corpus: Path, tmp_path: Path
) -> None:
    from memprism_ray.benchmark.alfworld.benchmark import plan_episodes

    data = _data(memprism_tiny_corpus, tmp_path / "data", 4, 0)
    out = tmp_path / "out"
    overrides = _overrides(data)
    overrides[overrides.index("--eval.artifacts") + 1] = "1"
    overrides[overrides.index("--eval.conditions") + 1] = "fixed:EntityState"
    assert _eval_job().main(["--config", "configs/local.yaml", "--out", str(out), *overrides]) == 0
    arts = sorted((out / "fixed_EntityState" / "episodes").iterdir())
    first = plan_episodes(SPLIT, str(data), 4, 0)[1][0].episode_id
    assert len(arts) == 1 and arts[0].name == "".join(c if c.isalnum() or c in "-_." else "_" for c in first)
    assert "data:image/png;base64" in (arts[0] / "trajectory.html").read_text()
