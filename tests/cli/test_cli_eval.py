"""``memprism eval`` and ``memprism compare`` (paper appendix C evaluation protocol) on the
shared tiny corpus (tests/conftest.py), and their one-line errors. ``memprism eval`` runs the
trainer's evaluation (EvalWorker actors) on the in-process Ray session."""

from __future__ import annotations

import contextlib
import io
import json
import os
import re
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from memprism_ray.cli import main

SPLIT = "eval_out_of_distribution"


@pytest.fixture(scope="module")
def agent_cli_eval(
    ray_session, memprism_tiny_corpus: Path, tmp_path_factory: pytest.TempPathFactory
) -> tuple[Path, str]:
    out = tmp_path_factory.mktemp("cli-eval")
    args = ["eval", "--condition", "no_memory,fixed:TemporalTrace", "--split", SPLIT, "--data-root",
            str(memprism_tiny_corpus), "--out", str(out), "--episodes", "3", "--slots", "3", "--max-steps", "10",
            "--seed", "2", "--artifacts", "1"]  # fmt: skip
    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        assert main(args) == 0
    return out, buf.getvalue()


def test_eval_writes_reports_manifests_plots_and_summary(agent_cli_eval) -> None:
    out, stdout = agent_cli_eval
    assert stdout.rstrip().endswith((out / "summary.md").read_text().rstrip())
    assert "| no_memory |" in stdout and "| fixed:TemporalTrace |" in stdout
    for d in ("no_memory", "fixed_TemporalTrace"):
        for name in ("report.json", "report.md", "manifest.json", "episodes.parquet", "steps.parquet",
                     "sr_tokens_by_length.png"):  # fmt: skip
            assert (out / d / name).is_file(), (d, name)
        manifest = json.loads((out / d / "manifest.json").read_text())
        assert manifest["split"] == SPLIT and manifest["seed"] == 2 and len(manifest["episode_ids"]) == 3
        # The CLI's defaults reach the run: scripted policy at temperature 0.3 seeded by --seed.
        assert manifest["extra"]["config"]["policy"]["scripted"] == {"temperature": 0.3, "seed": 2}
        assert manifest["extra"]["config"]["agent"]["max_steps"] == 10
        assert all(s <= 10 for s in pq.read_table(out / d / "episodes.parquet").column("steps").to_pylist())
    assert (out / "fixed_TemporalTrace" / "view_marginals.png").is_file()
    assert json.loads((out / "summary.json").read_text())["base"] == "no_memory"


def test_compare_prints_the_paired_difference(agent_cli_eval, capsys: pytest.CaptureFixture[str]) -> None:
    out, _ = agent_cli_eval
    a, b = out / "no_memory", out / "fixed_TemporalTrace"
    assert main(["compare", str(a), str(b), "--boot", "2000"]) == 0
    text = capsys.readouterr().out
    res = json.loads(text.strip().splitlines()[-1])
    won_a = {r["episode_id"]: r["won"] for r in pq.read_table(a / "episodes.parquet").to_pylist()}
    won_b = {r["episode_id"]: r["won"] for r in pq.read_table(b / "episodes.parquet").to_pylist()}
    assert res["n_common"] == 3
    assert res["diff"] == pytest.approx(sum(won_b.values()) / 3 - sum(won_a.values()) / 3)
    assert res["rate_a"] == pytest.approx(sum(won_a.values()) / 3) and res["a"] == str(a)
    assert res["measure"] == "success"
    assert res["ci95"][0] <= res["diff"] <= res["ci95"][1]
    assert f"on 3 common episodes: {100 * res['diff']:+.2f} points" in text
    # Swapping the directories flips the sign.
    assert main(["compare", str(b), str(a), "--boot", "2000"]) == 0
    swapped = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert swapped["diff"] == pytest.approx(-res["diff"])


def test_bad_condition_exits_2_with_the_valid_list(
    memprism_tiny_corpus: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "out"
    code = main(["eval", "--condition", "no_memory,fixed_views", "--split", SPLIT, "--data-root",
                 str(memprism_tiny_corpus), "--out", str(out)])  # fmt: skip
    assert code == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0
    assert err.startswith("memprism: error: eval.conditions: unknown condition 'fixed_views'")
    for name in ("no_memory", "full_history", "recent4", "fixed:TAU", "freq_random", "constrained:FACTOR=VALUE"):
        assert name in err
    assert not out.exists()  # rejected before any episode ran


def test_compare_errors(agent_cli_eval, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out, _ = agent_cli_eval
    assert main(["compare", str(tmp_path), str(out / "no_memory")]) == 2
    assert (
        "is not an evaluation directory (no episodes.parquet, nor a condition folder holding one)"
        in capsys.readouterr().err
    )
    other = tmp_path / "other"
    other.mkdir()
    rows = pq.read_table(out / "no_memory" / "episodes.parquet").to_pylist()
    pq.write_table(pa.Table.from_pylist([{**r, "episode_id": r["episode_id"] + "-x"} for r in rows]),
                   other / "episodes.parquet")  # fmt: skip
    assert main(["compare", str(out / "no_memory"), str(other)]) == 2
    assert "share no episode ids" in capsys.readouterr().err


def test_broken_games_are_failures_and_the_exit_code_says_so(
    ray_session, memprism_tiny_corpus: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # Issue 10's report: four games of which three are broken printed "0 / 1" and exited 0.
    import shutil

    from memprism_ray.benchmark.alfworld import list_games

    games = list_games(SPLIT, memprism_tiny_corpus)[:4]
    for i, g in enumerate(games):
        dst = tmp_path / "data" / "json_2.1.1" / "valid_unseen" / g.game_id
        shutil.copytree(g.path.parent, dst)
        if i:
            (dst / "game.tw-pddl").write_text("not json {")
    out = tmp_path / "out"
    code = main(["eval", "--condition", "no_memory", "--split", SPLIT, "--data-root", str(tmp_path / "data"),
                 "--out", str(out), "--max-steps", "3", "--artifacts", "0"])  # fmt: skip
    captured = capsys.readouterr()
    assert code == 1
    row = next(line for line in captured.out.splitlines() if line.startswith("| no_memory |"))
    assert re.match(r"\| no_memory \| [01] / 4 \| .* \| 3 \|", row)
    assert "- no_memory: 3 of 4 (3 broken game); see its report.md" in captured.out
    err = captured.err.strip()
    assert err.count("\n") == 0 and err == (
        "memprism: error: 3 episode(s) failed and count as failures: no_memory: 3 of 4 (3 broken game); "
        f"see {out / 'summary.md'}"
    )
    rep = json.loads((out / "no_memory" / "report.json").read_text())
    assert (rep["n"], rep["failed_episodes"]) == (4, 3)


@pytest.mark.parametrize(
    ("args", "message"),
    [(["--policy-temperature", "-1"], "policy.scripted.temperature must be >= 0 (0 = greedy), got -1.0"),
     (["--split", "test"],
      "alfworld.eval_split: unknown ALFWorld split 'test'; valid splits: train, eval_in_distribution, "
      "eval_out_of_distribution"),
     (["--condition", "no_memory,no_memory"], "eval.conditions: 'no_memory' is listed twice")],
)  # fmt: skip
def test_bad_settings_exit_2_before_any_work(
    args: list[str], message: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "out"
    base = {"--condition": "no_memory", "--split": SPLIT, "--data-root": str(tmp_path / "none"), "--out": str(out)}
    base.update(dict(zip(args[::2], args[1::2], strict=True)))
    assert main(["eval", *[x for kv in base.items() for x in kv]]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and err == f"memprism: error: {message}"
    assert not out.exists()


def test_compare_of_two_eval_outputs_pairs_every_condition_both_hold(
    agent_cli_eval, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """``memprism compare`` given two ``--out`` folders of ``memprism eval`` (or two runs'
    ``eval/``): one paired comparison per condition both hold, A's and B's directories of that
    condition; a folder and one condition's directory mixed is one line naming the choices."""
    import shutil

    out, _ = agent_cli_eval
    other = tmp_path / "other"
    other.mkdir()
    shutil.copytree(out / "fixed_TemporalTrace", other / "fixed_TemporalTrace")
    shutil.copytree(out / "no_memory", other / "recent4")  # a condition only B has
    assert main(["compare", str(out), str(other), "--boot", "200"]) == 0
    lines = capsys.readouterr().out.strip().splitlines()
    assert lines[0].startswith("fixed_TemporalTrace: SR(A) = ")
    results = [json.loads(line) for line in lines if line.startswith("{")]
    assert [(r["condition"], r["a"], r["b"]) for r in results] == [
        ("fixed_TemporalTrace", str(out / "fixed_TemporalTrace"), str(other / "fixed_TemporalTrace"))
    ]
    assert results[0]["diff"] == 0.0 and results[0]["n_common"] == 3
    assert main(["compare", str(out), str(other / "recent4")]) == 2
    err = capsys.readouterr().err.strip()
    assert err == (
        f"memprism: error: {out} holds the evaluations of fixed_TemporalTrace, no_memory and "
        f"{other / 'recent4'} one condition's: name one of them, e.g. {out / 'fixed_TemporalTrace'}"
    )
    shutil.rmtree(other / "fixed_TemporalTrace")
    assert main(["compare", str(out), str(other)]) == 2
    assert "share no condition" in capsys.readouterr().err


def test_compare_names_the_settings_the_two_evaluations_differ_in(
    agent_cli_eval, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A paired difference between evaluations played at other horizons or policy settings (the
    eval CLI's defaults against a run's preset) was printed as the condition's alone: a note line
    names what differs, but for what made the Router (its hash) and where it ran."""
    import shutil

    out, _ = agent_cli_eval
    other = tmp_path / "other"
    shutil.copytree(out / "no_memory", other)
    path = other / "manifest.json"
    manifest = json.loads(path.read_text())
    config = manifest["extra"]["config"]
    config["agent"]["max_steps"] = 25
    config["grpo"]["lr"] = 0.5  # training settings: the Router's hash says what they made
    config["eval"]["workers"] = 7  # where and how it ran
    path.write_text(json.dumps(manifest))
    assert main(["compare", str(out / "no_memory"), str(other), "--boot", "200"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0] == "note: A and B were played with other settings (agent.max_steps 10 -> 25)"
    assert lines[1].startswith("SR(A) = ")
    assert main(["compare", str(out / "no_memory"), str(out / "fixed_TemporalTrace"), "--boot", "200"]) == 0
    assert capsys.readouterr().out.startswith("SR(A) = ")  # the same settings: no note
    # Another backend is named once; the settings of one neither played with are not named (the
    # note listed policy.openai.base_url, model, ... of two scripted evaluations' configs).
    config["agent"]["max_steps"] = 10
    config["policy"]["openai"]["model"] = "another"
    path.write_text(json.dumps(manifest))
    assert main(["compare", str(out / "no_memory"), str(other), "--boot", "200"]) == 0
    assert capsys.readouterr().out.startswith("SR(A) = ")
    config["policy"]["backend"] = "openai"
    path.write_text(json.dumps(manifest))
    assert main(["compare", str(out / "no_memory"), str(other), "--boot", "200"]) == 0
    note = capsys.readouterr().out.splitlines()[0]
    assert note == "note: A and B were played with other settings (policy.backend scripted -> openai)"


def test_compare_of_a_table_without_the_outcome_columns_is_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    for d, rows in (("a", [{"episode_id": "e1", "won": True, "status": "ok"}]), ("b", [{"episode_id": "e1"}])):
        (tmp_path / d).mkdir()
        pq.write_table(pa.Table.from_pylist(rows), tmp_path / d / "episodes.parquet")
    assert main(["compare", str(tmp_path / "a"), str(tmp_path / "b")]) == 2
    err = capsys.readouterr().err.strip()
    table = tmp_path / "b" / "episodes.parquet"
    assert err == f"memprism: error: {table}: no column won, status: not an evaluation's episodes"


def test_compare_counts_failed_episodes_as_failures(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    def table(d: Path, rows: list[tuple[str, bool, str]]) -> Path:
        d.mkdir()
        pq.write_table(pa.Table.from_pylist([{"episode_id": e, "won": w, "status": s} for e, w, s in rows]),
                       d / "episodes.parquet")  # fmt: skip
        return d

    a = table(tmp_path / "a", [("e1", True, "ok"), ("e2", True, "ok"), ("e3", False, "ok")])
    b = table(tmp_path / "b", [("e1", True, "ok"), ("e2", True, "failed"), ("e3", False, "failed")])
    assert main(["compare", str(a), str(b), "--boot", "200"]) == 0
    res = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert res["n_common"] == 3 and res["rate_b"] == pytest.approx(1 / 3) and res["diff"] == pytest.approx(-1 / 3)


def test_compare_pairs_each_split_after_the_whole(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """The paper reports each split (Mind2Web) or subset (EB-ALFRED): after the whole, one pair
    of lines per split the episodes' ``split`` column names, on that split's episodes alone."""

    def table(d: Path, won: list[bool]) -> Path:
        d.mkdir()
        rows = [{"episode_id": f"e{i}", "won": w, "status": "ok", "split": "abc"[i // 2]} for i, w in enumerate(won)]
        pq.write_table(pa.Table.from_pylist(rows), d / "episodes.parquet")
        return d

    a = table(tmp_path / "a", [True, False, True, True])
    b = table(tmp_path / "b", [True, True, False, True, True])  # e4 of split c: B's alone
    assert main(["compare", str(a), str(b), "--boot", "200"]) == 0
    lines = capsys.readouterr().out.strip().splitlines()
    assert lines[-1] == "  c: SR: no episodes in common (A 0, B 1)"
    whole, in_a, in_b = (json.loads(line) for line in lines if line.startswith("{"))
    assert "split" not in whole and whole["n_common"] == 4 and whole["diff"] == pytest.approx(0.0)
    assert (in_a["split"], in_a["n_common"], in_a["diff"]) == ("a", 2, pytest.approx(0.5))
    assert (in_b["split"], in_b["rate_a"], in_b["rate_b"]) == ("b", 1.0, 0.5)
    assert lines[3].startswith("  a: SR(A) = 50.00% (2 episodes), SR(B) = 100.00% (2 episodes); SR(B) - SR(A) on 2")


def _mind2web_eval(
    d: Path, correct: dict[str, list[bool]], expected: dict[str, int], failed: set[str], split: str = "e2"
) -> Path:
    """A Mind2Web condition directory as an evaluation writes it: the manifest naming the
    benchmark, episodes and steps tables, and mind2web.json with each episode's recorded steps."""
    d.mkdir(parents=True)
    (d / "manifest.json").write_text(json.dumps({"benchmark": "mind2web"}))
    episodes = [
        {"episode_id": e, "won": all(c) and len(c) == expected[e], "status": "failed" if e in failed else "ok",
         "steps": len(c), "split": "test_website" if e in split else "test_task"}
        for e, c in correct.items()
    ]  # fmt: skip
    pq.write_table(pa.Table.from_pylist(episodes), d / "episodes.parquet")
    steps = [{"episode_id": e, "step": t, "correct": v} for e, c in correct.items() for t, v in enumerate(c)]
    pq.write_table(pa.Table.from_pylist(steps), d / "steps.parquet")
    (d / "mind2web.json").write_text(json.dumps({"expected_steps": expected}))
    return d


def test_compare_of_mind2web_evaluations_pairs_step_accuracy_then_episode_success(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Mind2Web's headline is the paper's step accuracy: ``memprism compare`` pairs it per
    recorded step (a failed episode's unplayed steps wrong, as in its reports), then episode
    success; an evaluation without the recorded steps, or of another benchmark, is one line."""
    expected = {"e1": 2, "e2": 3}
    a = _mind2web_eval(tmp_path / "a", {"e1": [True, True], "e2": [True, False, False]}, expected, set())
    b = _mind2web_eval(tmp_path / "b", {"e1": [True, True], "e2": [True]}, expected, {"e2"})  # crashed after 1 of 3
    assert main(["compare", str(a), str(b), "--boot", "200"]) == 0
    lines = capsys.readouterr().out.strip().splitlines()
    steps, task_steps, website_steps, episodes, *_ = (json.loads(line) for line in lines if line.startswith("{"))
    assert steps["measure"] == "step_accuracy" and steps["n_common"] == 5
    assert steps["rate_a"] == pytest.approx(3 / 5) and steps["rate_b"] == pytest.approx(3 / 5)
    assert episodes["measure"] == "episode_success" and episodes["n_common"] == 2
    assert episodes["rate_a"] == episodes["rate_b"] == pytest.approx(1 / 2)
    assert lines[0] == "step accuracy(A) = 60.00% (5 steps), step accuracy(B) = 60.00% (5 steps)"
    # each split on its own steps: e1's 2 steps (test_task), e2's 3 (test_website, 1 of 3 right in A and B)
    assert (task_steps["split"], task_steps["n_common"], task_steps["rate_a"]) == ("test_task", 2, 1.0)
    assert (website_steps["split"], website_steps["n_common"]) == ("test_website", 3)
    assert website_steps["rate_a"] == website_steps["rate_b"] == pytest.approx(1 / 3)
    (b / "mind2web.json").write_text("{}")
    assert main(["compare", str(a), str(b)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and f"{b / 'mind2web.json'}: no expected_steps" in err
    (b / "manifest.json").write_text(json.dumps({"benchmark": "alfworld"}))
    assert main(["compare", str(a), str(b)]) == 2
    assert capsys.readouterr().err.strip() == (
        f"memprism: error: {a} is an evaluation of mind2web and {b} of alfworld: compare one benchmark"
    )


@pytest.mark.parametrize(
    "content", [{"view_marginal": [[0.1] * 144]}, [{"a": 1}] * 144, {"view_selection": {"view_marginal": "x"}}]
)
def test_nested_marginal_json_is_a_one_line_error(tmp_path: Path, content: object, capsys) -> None:
    path = tmp_path / "marginal.json"
    path.write_text(json.dumps(content))
    args = ["eval", "--condition", "freq_random", "--marginal", str(path), "--out", str(tmp_path / "o")]
    assert main(args) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "flat JSON list of numbers" in err


def test_a_short_marginal_is_a_one_line_error_before_any_worker(tmp_path: Path, capsys, monkeypatch) -> None:
    """A flat list of the wrong length used to pass the start and fail every freq_random episode."""
    import memprism_ray.cluster.placement as placement

    monkeypatch.setattr(placement, "init_ray", lambda *a, **k: pytest.fail("Ray started before the refusal"))
    path = tmp_path / "marginal.json"
    path.write_text(json.dumps([0.5, 0.5]))
    args = ["eval", "--condition", "freq_random", "--marginal", str(path), "--out", str(tmp_path / "o")]
    assert main(args) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and f"{path}: the view marginal needs 144 probabilities (one per view), got 2" in err


def test_eval_plays_every_benchmark(
    ray_session, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """``memprism eval --config`` runs any benchmark's evaluation, as its job does: EB-ALFRED's
    per-subset summary on the smoke preset (fake controller over the fixture)."""
    for key in [k for k in os.environ if k.startswith("MEMPRISM_EBALFRED_")]:
        monkeypatch.delenv(key)
    out = tmp_path / "eval"
    args = ["eval", "--config", "configs/ebalfred_smoke.yaml", "--condition", "no_memory", "--out", str(out),
            "--run.out_dir", str(tmp_path), "--ebalfred.subsets", "base,long_horizon",
            "--ebalfred.episodes_per_subset", "2"]  # fmt: skip
    assert main(args) == 0
    summary = (out / "summary.md").read_text()
    assert "| Condition | Base | Long | Avg |" in summary
    assert capsys.readouterr().out.rstrip().endswith(summary.rstrip())
    manifest = json.loads((out / "no_memory" / "manifest.json").read_text())
    assert manifest["benchmark"] == "ebalfred" and len(manifest["episode_ids"]) == 4


def test_an_interrupted_evaluation_is_continued_with_run_resume_auto(
    ray_session, memprism_tiny_corpus: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch
) -> None:
    """``memprism eval`` (as ``jobs/eval_<benchmark>.py``) into the ``--out`` of an evaluation a stop
    cut short: refused, naming ``--run.resume auto``, which continues it keeping what it finished."""
    import memprism_ray.trainer.evaluate as ev

    args = ["eval", "--condition", "no_memory,full_history", "--split", SPLIT, "--data-root", str(memprism_tiny_corpus),
            "--out", str(tmp_path / "out"), "--episodes", "2", "--slots", "2", "--max-steps", "3"]  # fmt: skip
    play = ev.play_condition
    played: list[str] = []

    def stopped_in_full_history(workers, condition, *rest, **kw):
        played.append(condition)
        if condition == "full_history" and len(played) == 2:
            raise KeyboardInterrupt
        return play(workers, condition, *rest, **kw)

    monkeypatch.setattr(ev, "play_condition", stopped_in_full_history)
    assert main(args) == 130
    assert main(args) == 2
    assert "holds an interrupted evaluation (report.json of no_memory; no summary): continue it with --run.resume " \
        "auto" in capsys.readouterr().err  # fmt: skip
    assert main([*args, "--run.resume", "auto"]) == 0
    out = capsys.readouterr().out
    assert played == ["no_memory", "full_history", "full_history"]
    assert (
        "eval no_memory: kept from the interrupted evaluation: " in out and (tmp_path / "out" / "summary.md").exists()
    )
    assert "--run.resume auto: no evaluation to continue" not in out
    # An --out holding nothing to continue (a misspelt one: every condition played again) is said.
    assert main([*args[:-8], "--out", str(tmp_path / "typo"), *args[-6:], "--run.resume", "auto"]) == 0
    said = f"--run.resume auto: no evaluation to continue in {tmp_path / 'typo'}: every condition is played"
    assert said in capsys.readouterr().out


def test_an_out_a_file_stands_in_the_way_of_is_one_line_before_any_work(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """``--out`` naming a file ended, after Ray and the workers had started, in "[Errno 17] File
    exists"; a path below a file, in a NotADirectoryError traceback."""
    a_file = tmp_path / "notes.txt"
    a_file.write_text("mine")
    for out in (a_file, a_file / "sub"):
        code = main(["eval", "--condition", "no_memory", "--split", SPLIT, "--data-root", str(tmp_path / "none"),
                     "--out", str(out)])  # fmt: skip
        err = capsys.readouterr().err
        assert (
            code == 2
            and err == f"memprism: error: --out {out}: {a_file} is a file, not a folder; choose another --out\n"
        )
    assert a_file.read_text() == "mine"
