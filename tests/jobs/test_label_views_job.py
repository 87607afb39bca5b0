"""``jobs/label_views.py`` (the D1 data alone) builds what the GRPO job's D1 builds for the same
config: the expert's games *and* the roll-ins (``label.rollin_games``), under the same key, so
the GRPO job that later reuses that directory trains on the data its config names. Runs on the
in-process Ray session."""

from __future__ import annotations

from pathlib import Path

import pytest

pytestmark = [pytest.mark.ray]


def test_label_views_plays_the_rollins_its_config_names(
    ray_session, run_job, memprism_tiny_corpus: Path, memprism_tiny_overrides, tmp_path: Path
) -> None:
    import pyarrow.parquet as pq

    from memprism_ray.benchmark import get_benchmark
    from memprism_ray.config import load_config
    from memprism_ray.trainer.run_dir import d1_dir

    overrides = memprism_tiny_overrides(memprism_tiny_corpus, tmp_path, "labels")  # 2 expert games, 1 roll-in
    assert run_job("label_views.py", ["--config", "configs/local.yaml", *overrides]) == 0
    cfg = load_config("configs/local.yaml", overrides)
    key_dir = d1_dir(cfg.run.dir, cfg, get_benchmark("alfworld"))  # the directory the GRPO job would reuse
    table = pq.read_table(key_dir / "expert_trajectories.parquet")
    sources = table.column("reference_source").to_pylist()
    episodes = {src: set() for src in sources}
    for src, ep in zip(sources, table.column("episode").to_pylist(), strict=True):
        episodes[src].add(ep)
    assert len(episodes.get("rollin", ())) == 1
    assert len(episodes.get("handcoded_expert", set()) | episodes.get("walkthrough", set())) == 2
    assert (key_dir / "labels.parquet").exists()


def test_a_labelling_task_whose_episodes_give_no_label_leaves_the_others_theirs(
    ray_session, run_job, tiny_argv, tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    """Every decision of the tiny corpus's second training game is uninformative (every view
    gives the same action): the task labelling it raised, and D1 failed for all (a traceback),
    though the first game's task had labelled 10 decisions. With every decision uninformative
    (one candidate view) the job ends in one line saying so."""
    import pyarrow.parquet as pq

    per_game = tiny_argv("split", "--label.games", "2", "--label.rollin_games", "0", "--label.workers", "2")
    assert run_job("label_views.py", per_game) == 0
    out = capsys.readouterr().out
    assert "'decisions': 30, 'labelled': 10, 'teacher_error': 0, 'fallback_skipped': 20}" in out, out[-2000:]
    (labels,) = (tmp_path / "split" / "d1").glob("*/labels.parquet")
    assert pq.read_table(labels).num_rows == 10
    none = [*per_game, "--run.name", "none", "--label.counterfactual.candidates", "5"]  # one view: no spread
    assert run_job("label_views.py", none) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [
        "[d1] error: D1: the view teacher labelled none of the 30 reference decisions ({'decisions': 30, "
        "'labelled': 0, 'teacher_error': 0, 'fallback_skipped': 30}; fallback_skipped: every view gave the same "
        "action): label more games (label.games, label.rollin_games), or check the task policy and the reference data"
    ]


def test_a_task_policy_that_cannot_be_reached_in_d1_is_one_line(
    ray_session, run_job, tiny_argv, capsys: pytest.CaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``policy.backend openai`` with no server at ``base_url``: D1's view teacher asks the policy
    in a Ray task, whose ``PolicyBackendError`` ended the job in a traceback. The server went
    away after the job's probe found it (``check_endpoints``)."""
    import memprism_ray.llm_client
    from memprism_ray.cluster.head import free_ports

    monkeypatch.setattr(memprism_ray.llm_client, "probe", lambda *args, **kwargs: None)
    (port,) = free_ports(None)  # nothing listens there
    argv = tiny_argv("unreachable", "--label.games", "1", "--label.rollin_games", "0", "--label.workers", "1",
                     "--policy.backend", "openai", "--policy.openai.base_url", f"http://127.0.0.1:{port}/v1",
                     "--policy.openai.max_retries", "0")  # fmt: skip
    assert run_job("label_views.py", argv) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1, err
    assert err[0].startswith(
        f"[d1] error: the task policy's backend failed: http://127.0.0.1:{port}/v1/chat/completions failed 1 time(s)"
    )
    assert "Connection refused" in err[0]
