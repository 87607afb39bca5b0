"""The final evaluation's driver (memprism_ray/trainer/evaluate.py): each worker plays its share
in waves of ``slots`` episodes, one call per wave, so the bar moves as waves finish (issue 29:
the first line used to come after one whole condition); every planned episode is reported in
plan order."""

from __future__ import annotations

from pathlib import Path

import pytest

from memprism_ray.benchmark import get_benchmark

pytestmark = [pytest.mark.ray]


def _tiny(corpus: Path, out: Path, *more: str):
    """The embedded default on the tiny corpus, evaluation workers of 0.1 CPU, no artifacts."""
    from memprism_ray.config import load_config

    return load_config(
        "configs/local.yaml",
        ["--corpus.data_root", str(corpus), "--eval.artifacts", "0", "--rollout.env_cpus", "0.1", "--run.out_dir",
         str(out), *more],
    )  # fmt: skip


def test_waves_report_progress_and_results_keep_plan_order(
    ray_session, memprism_tiny_corpus: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from memprism_ray.trainer.evaluate import evaluate, play_condition

    cfg = _tiny(memprism_tiny_corpus, tmp_path, "--eval.episodes", "5", "--eval.workers", "2", "--eval.slots", "1",
                "--agent.max_steps", "2", "--run.name", "waves")  # fmt: skip
    alf = get_benchmark("alfworld")
    summary = evaluate(cfg, alf, ("no_memory",), None, "", tmp_path / "eval", log=print)
    out = capsys.readouterr().out
    assert "eval no_memory" in out and "5/5" in out and "sr=" in out  # the bar, with the running SR
    assert summary["conditions"][0]["n"] == 5
    # One call per wave of `slots` episodes: 5 episodes on 2 workers with 1 slot are 5 calls.
    from memprism_ray.actors.evaluation import EvalWorker

    plan = alf.eval_plan(cfg)
    workers = [EvalWorker.options(num_cpus=0.1).remote(cfg, 1, None, None, f"t{i}", benchmark=alf) for i in range(2)]
    seen: list[int] = []
    try:
        results, _ = play_condition(workers, "no_memory", plan, None, 120.0, (), lambda rs: seen.append(len(rs)))
    finally:
        for w in workers:
            ray_session.kill(w)
    assert seen == [1] * 5
    assert [r.spec.episode_id for r in results] == [s.episode_id for s in plan.specs]


def test_freq_random_plays_the_memprism_marginal_on_every_wave(
    ray_session, memprism_tiny_corpus: Path, actors_reference_ckpt: Path, tmp_path: Path
) -> None:
    """Frequency-Matched Random samples the view marginal the Router's condition just measured;
    with one call per wave, every wave of every worker gets it (the paper's FMR baseline)."""
    from memprism_ray.config import load_config
    from memprism_ray.trainer.evaluate import evaluate, router_state_for

    cfg = load_config(
        "configs/local.yaml",
        ["--corpus.data_root", str(memprism_tiny_corpus), "--eval.episodes", "4", "--eval.workers", "2",
         "--eval.slots", "1", "--eval.artifacts", "0", "--agent.max_steps", "2", "--rollout.env_cpus", "0.1",
         "--eval.conditions", "memprism,freq_random",
         "--run.out_dir", str(tmp_path), "--run.name", "fmr"],
    )  # fmt: skip
    state = router_state_for(cfg, str(actors_reference_ckpt))
    summary = evaluate(
        cfg, get_benchmark("alfworld"), cfg.eval.conditions, state, str(actors_reference_ckpt), tmp_path / "eval",
        log=print,
    )  # fmt: skip
    reps = {r["condition"]: r for r in summary["conditions"]}
    assert reps["freq_random"]["n"] == 4 and reps["freq_random"]["failed_episodes"] == 0
    marginal = reps["memprism"]["view_selection"]["view_marginal"]
    played = reps["freq_random"]["view_selection"]["view_marginal"]
    # Every view FMR played is one the Router chose (its support is the marginal's).
    assert all(marginal[i] > 0 for i, p in enumerate(played) if p > 0)


def test_evaluation_draws_its_views_with_the_runs_render_settings(ray_session, memprism_tiny_corpus: Path) -> None:
    """An evaluation worker draws each view with the run's ``render.*`` settings, as the rollout
    workers do (it used to draw every view with the defaults, so a preset's ``render.max_side``
    or font changed training views but not the evaluated ones)."""
    from memprism_ray.actors.evaluation import EvalWorker
    from memprism_ray.config import load_config

    def pixels(*render: str) -> list[int]:
        cfg = load_config(
            "configs/local.yaml",
            ["--corpus.data_root", str(memprism_tiny_corpus), "--eval.episodes", "1", "--agent.max_steps", "3",
             "--rollout.env_cpus", "0.1", *render],
        )  # fmt: skip
        spec = get_benchmark("alfworld").eval_plan(cfg).specs[0]
        worker = EvalWorker.options(num_cpus=0.1).remote(
            cfg, 1, None, None, "render", benchmark=get_benchmark(cfg.corpus.benchmark)
        )
        try:
            game = {"episode_id": spec.episode_id, "game": spec.game.to_dict()}
            (result,) = ray_session.get(worker.play.remote("fixed:TemporalTrace", [game], None), timeout=300)
        finally:
            ray_session.kill(worker)
        assert result.status == "ok", result.error
        return [row["pixels"] for row in result.rows]

    default, large = pixels(), pixels("--render.font_size", "20")
    assert len(default) == len(large) >= 2 and all(p > 0 for p in default)
    assert all(b > a for a, b in zip(default[1:], large[1:], strict=True)), (default, large)


def test_a_router_trained_on_another_benchmark_is_evaluated_with_a_line_saying_so(tmp_path: Path) -> None:
    """A D2 checkpoint records the benchmark it trained on: evaluating it on another one (a
    transfer, or the wrong run's checkpoint) is said, not refused; on its own benchmark, nothing."""
    import torch

    from memprism_ray.adapter.checkpoint import save_checkpoint
    from memprism_ray.config import load_config
    from memprism_ray.router.model import RouterConfig, ViewPolicyModel
    from memprism_ray.trainer.evaluate import router_state_for

    torch.manual_seed(0)
    small = RouterConfig(d_model=32, n_heads=2, n_layers=1, ff_dim=64, planner_hidden=64)
    ckpt = save_checkpoint(
        tmp_path / "ckpt", ViewPolicyModel(small), stage="d2", iteration=1,
        extra={"config": {"corpus.benchmark": "mind2web"}},
    )  # fmt: skip
    said: list[str] = []
    for benchmark in ("alfworld", "mind2web"):
        cfg = load_config("configs/local.yaml", ["--corpus.benchmark", benchmark, "--eval.conditions", "memprism"])
        assert router_state_for(cfg, str(ckpt), said.append) is not None
    assert said == [f"note: the Router {ckpt} was trained on mind2web; this evaluation is alfworld"]
    said.clear()  # another text encoder: features the Router never learned on, said too
    recorded = {"corpus.benchmark": "alfworld", "encoder.model_name_or_path": None, "encoder.max_length": 128}
    ckpt = save_checkpoint(tmp_path / "enc", ViewPolicyModel(small), stage="d1", extra={"config": recorded})
    for max_length in ("128", "256"):
        cfg = load_config("configs/local.yaml", ["--eval.conditions", "memprism", "--encoder.max_length", max_length])
        router_state_for(cfg, str(ckpt), said.append)
    assert said == [
        f"note: the Router {ckpt} was trained with encoder.max_length 128; this evaluation encodes with 256: "
        "its features differ from its training's"
    ]


@pytest.mark.parametrize(
    ("preset", "extra"),
    [("configs/local.yaml", ["--eval.episodes", "3", "--eval.slots", "3", "--agent.max_steps", "4"]),
     ("configs/mind2web_smoke.yaml", ["--mind2web.eval_tasks", "1", "--eval.slots", "3"])],
    ids=["alfworld", "mind2web"],
)  # fmt: skip
def test_an_interrupted_evaluation_is_continued_and_keeps_what_it_finished(
    ray_session, memprism_tiny_corpus: Path, tmp_path: Path, monkeypatch, capsys, preset: str, extra: list
) -> None:
    """Issue 40 item 4: a stop during the third condition kept the first two's reports, and every
    way on replayed them all (the training job put them aside and played the whole evaluation
    again: hours for the paper's). Continued, the finished conditions are kept, only the others
    played, and the summary is the uninterrupted evaluation's (Mind2Web's step figures read back
    from the kept step tables); a condition played otherwise than the continuation would play it
    (another horizon here) is played again."""
    import json
    import re

    import pyarrow as pa
    import pyarrow.parquet as pq

    import memprism_ray.trainer.evaluate as ev
    from memprism_ray.config import load_config
    from memprism_ray.eval.artifacts import safe_name
    from memprism_ray.eval.report import PROGRESS, InterruptedEvaluation
    from memprism_ray.trainer.fit import prepare_benchmark

    argv = ["--corpus.data_root", str(memprism_tiny_corpus)] if "local" in preset else []
    argv += ["--eval.workers", "1", "--eval.artifacts", "0", "--rollout.env_cpus", "0.1", "--run.out_dir",
             str(tmp_path), "--eval.conditions", "no_memory,full_history,recent4", *extra]  # fmt: skip

    def config(*more: str):
        cfg = load_config(preset, [*argv, *more])
        return prepare_benchmark(cfg, get_benchmark(cfg.corpus.benchmark), lambda _: None, trains=False)

    def run(cfg, out: str, **kw: object) -> dict:
        return ev.evaluate(cfg, get_benchmark(cfg.corpus.benchmark), cfg.eval.conditions, None, "", tmp_path / out,
                           log=print, **kw)  # fmt: skip

    cfg = config()
    whole = run(cfg, "whole")
    played: list[str] = []
    play = ev.play_condition

    def counted(workers, condition, *args, **kwargs):
        played.append(condition)
        if condition == "recent4" and stop:
            raise KeyboardInterrupt  # a stop during the third condition
        return play(workers, condition, *args, **kwargs)

    monkeypatch.setattr(ev, "play_condition", counted)
    stop = True
    with pytest.raises(KeyboardInterrupt):
        run(cfg, "cut")
    with pytest.raises(InterruptedEvaluation, match=r"continue it with --run\.resume auto"):
        run(cfg, "cut")
    stop, played[:] = False, []
    resumed = run(cfg, "cut", resume=True)
    assert played == ["recent4"] and not (tmp_path / "cut" / PROGRESS).exists()

    def same(summary: dict) -> str:  # every figure but the wall-clock ones (milliseconds) of two plays
        return re.sub(r'"(\w+_ms\w*)": [0-9.e+-]+', r'"\1": 0', json.dumps(summary, default=str, sort_keys=True))

    assert same(resumed) == same(whole) and '"sr": ' in same(whole)
    for name in ("summary.md", "mind2web.md") if "mind2web" in preset else ("summary.md",):
        assert (tmp_path / "cut" / name).read_text() == (tmp_path / "whole" / name).read_text()
    # cut again in its third condition, then continued with another horizon: nothing is kept
    stop, played[:] = True, []
    with pytest.raises(KeyboardInterrupt):
        run(cfg, "other")
    stop, played[:] = False, []
    run(config("--agent.max_steps", "3"), "other", resume=True)
    assert played == ["no_memory", "full_history", "recent4"]
    # A finished condition with a failed episode (a lost worker's wave): that episode alone is
    # played again (the whole condition was: hours on a VLM), the others kept with their
    # artifacts, and the reports are the uninterrupted evaluation's.
    stop, played[:] = True, []
    with pytest.raises(KeyboardInterrupt):
        run(cfg, "lost")
    folder = tmp_path / "lost" / "no_memory"
    rows = pq.read_table(folder / "episodes.parquet").to_pylist()
    lost = rows[1]["episode_id"]
    rows[1].update(status="failed", error="crashed: ActorDiedError: the worker died", won=False, steps=0)
    pq.write_table(pa.Table.from_pylist(rows), folder / "episodes.parquet")
    steps = pq.read_table(folder / "steps.parquet")
    pq.write_table(steps.filter(pa.compute.not_equal(steps["episode_id"], lost)), folder / "steps.parquet")
    stop, played[:], specs = False, [], []
    capsys.readouterr()

    def planned(workers, condition, plan, *args, **kwargs):
        specs.append(plan.specs)
        return counted(workers, condition, plan, *args, **kwargs)

    monkeypatch.setattr(ev, "play_condition", planned)
    continued = run(cfg, "lost", resume=True)
    assert played == ["no_memory", "recent4"] and [s.episode_id for s in specs[0]] == [lost]
    assert "eval no_memory: its 1 failed of 3 episodes played again: " in capsys.readouterr().out
    assert same(continued) == same(whole)

    def written(root: Path) -> list[str]:  # the condition's tables and report, but wall-clock figures
        tables = [pq.read_table(root / "no_memory" / t).to_pylist() for t in ("episodes.parquet", "steps.parquet")]
        return [same(x) for x in (*tables, json.loads((root / "no_memory" / "report.json").read_text()))]

    assert written(tmp_path / "lost") == written(tmp_path / "whole")
    # With trajectory viewers: the kept episodes' stay as written, the one played again gets its own.
    stop, played[:] = True, []
    with pytest.raises(KeyboardInterrupt):
        run(config("--eval.artifacts", "3"), "viewed")
    folder = tmp_path / "viewed" / "no_memory"
    rows = pq.read_table(folder / "episodes.parquet").to_pylist()
    rows[1].update(status="failed", error="crashed: ActorDiedError: the worker died", won=False, steps=0)
    pq.write_table(pa.Table.from_pylist(rows), folder / "episodes.parquet")
    pages = {r["episode_id"]: folder / "episodes" / safe_name(r["episode_id"]) / "trajectory.html" for r in rows}
    (folder / "episodes" / safe_name(lost) / "trajectory.html").write_text("a failed try's page")
    before = {e: (p.stat().st_mtime_ns, p.read_text()) for e, p in pages.items()}
    stop = False
    run(config("--eval.artifacts", "3"), "viewed", resume=True)
    after = {e: (p.stat().st_mtime_ns, p.read_text()) for e, p in pages.items()}
    assert {e: after[e] == before[e] for e in pages} == {e: e != lost for e in pages}
    assert "<h2>Step 1</h2>" in after[lost][1]


def test_an_evaluation_that_ended_with_failed_episodes_plays_them_again_and_only_them(
    ray_session, memprism_tiny_corpus: Path, tmp_path: Path, monkeypatch, capsys
) -> None:
    """An evaluation whose episodes failed (a lost worker, an endpoint down) wrote its summary and
    exit 1, and its --out was then refused ("already holds an evaluation"): its failed episodes
    could be played only by playing every condition again, in another folder. Its progress record
    is now kept: refused without --run.resume auto (one line saying how), continued with it, the
    failed episodes alone are played and the summary is the undisturbed evaluation's."""
    import json
    import re

    import pyarrow.parquet as pq

    import memprism_ray.trainer.evaluate as ev
    from memprism_ray.eval.report import PROGRESS, InterruptedEvaluation, check_fresh_output

    cfg = _tiny(memprism_tiny_corpus, tmp_path, "--eval.episodes", "3", "--eval.workers", "1", "--eval.slots", "3",
                "--agent.max_steps", "3", "--eval.conditions", "no_memory,full_history")  # fmt: skip
    alf = get_benchmark("alfworld")

    def run(out: str, **kw: object) -> dict:
        return ev.evaluate(cfg, alf, cfg.eval.conditions, None, "", tmp_path / out, log=print, **kw)

    whole = run("whole")
    play, planned = ev.play_condition, []

    def losing(workers, condition, plan, *args, **kwargs):  # the worker of episode 2 is lost in full_history
        planned.append((condition, [s.episode_id for s in plan.specs]))
        results, rows = play(workers, condition, plan, *args, **kwargs)
        if condition == "full_history" and len(plan.specs) == 3:
            results[1] = ev._failed(results[1].spec, "crashed: ActorDiedError: the worker died")
            rows = [r for r in rows if r["episode_id"] != results[1].spec.episode_id]
        return results, rows

    monkeypatch.setattr(ev, "play_condition", losing)
    lost = run("lost")
    assert lost["failed_episodes"] == 1 and (tmp_path / "lost" / PROGRESS).exists()
    with pytest.raises(InterruptedEvaluation, match=r"failed episodes .* play them again with --run\.resume auto"):
        check_fresh_output(tmp_path / "lost")
    episodes = pq.read_table(tmp_path / "lost" / "full_history" / "episodes.parquet").to_pylist()
    failed = [e["episode_id"] for e in episodes if e["status"] == "failed"]
    planned.clear()
    capsys.readouterr()
    again = run("lost", resume=True)
    assert planned == [("full_history", failed)] and len(failed) == 1
    out = capsys.readouterr().out
    assert "eval no_memory: kept from the interrupted evaluation: " in out
    assert "eval full_history: its 1 failed of 3 episodes played again: " in out

    def same(summary: dict) -> str:
        return re.sub(r'"(\w+_ms\w*)": [0-9.e+-]+', r'"\1": 0', json.dumps(summary, default=str, sort_keys=True))

    assert same(again) == same(whole) and not (tmp_path / "lost" / PROGRESS).exists()
    assert (tmp_path / "lost" / "summary.md").read_text() == (tmp_path / "whole" / "summary.md").read_text()


def test_a_continued_evaluation_keeps_freq_random_only_for_the_marginal_it_sampled(
    ray_session, memprism_tiny_corpus: Path, tmp_path: Path, monkeypatch, capsys
) -> None:
    """freq_random's marginal is this evaluation's memprism one or a file's content, neither a
    setting's value: a continuation after the Router (or the file) changed kept the freq_random
    played on the old marginal. Its manifest records the marginal's SHA-256 now."""
    import json

    import memprism_ray.trainer.evaluate as ev
    from memprism_ray.config import load_config
    from memprism_ray.trainer.fit import prepare_benchmark
    from memprism_ray.view_space import NUM_ACTIONS

    marginal = tmp_path / "marginal.json"
    marginal.write_text(json.dumps([1.0] * NUM_ACTIONS))
    argv = ["--corpus.data_root", str(memprism_tiny_corpus), "--eval.workers", "1", "--eval.artifacts", "0",
            "--rollout.env_cpus", "0.1", "--run.out_dir", str(tmp_path), "--eval.conditions",
            "no_memory,freq_random,recent4", "--eval.marginal", str(marginal), "--eval.episodes", "2",
            "--eval.slots", "2", "--agent.max_steps", "3"]  # fmt: skip
    cfg = prepare_benchmark(
        load_config("configs/local.yaml", argv), get_benchmark("alfworld"), lambda _: None, trains=False
    )
    played: list[str] = []
    play, stop = ev.play_condition, [True]

    def counted(workers, condition, *args, **kwargs):
        played.append(condition)
        if condition == "recent4" and stop[0]:
            raise KeyboardInterrupt
        return play(workers, condition, *args, **kwargs)

    monkeypatch.setattr(ev, "play_condition", counted)
    out = tmp_path / "cut"
    with pytest.raises(KeyboardInterrupt):
        ev.evaluate(cfg, get_benchmark("alfworld"), cfg.eval.conditions, None, "", out, log=print)
    marginal.write_text(json.dumps([1.0] + [0.0] * (NUM_ACTIONS - 1)))  # the same file, another marginal
    stop[0], played[:] = False, []
    ev.evaluate(cfg, get_benchmark("alfworld"), cfg.eval.conditions, None, "", out, log=print, resume=True)
    assert played == ["freq_random", "recent4"]
    assert (
        "eval freq_random: played again: the interrupted evaluation's was played otherwise" in capsys.readouterr().out
    )
