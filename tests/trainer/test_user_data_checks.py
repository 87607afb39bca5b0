"""User data checked on the driver first (issue 40 item 3): every file a run reads that is
cheap to parse whole is parsed before Ray starts, and a bad one ends the job in one line naming
the file, the line (or row) and the fix, exit status 2, with no run directory left behind.

Each case runs :func:`memprism_ray.trainer.fit.fit` with ``init_ray`` replaced by a function
that fails the test: the refusal must come before any Ray start (before issue 40 these files were
first parsed inside the actors, or by the final evaluation after training)."""

from __future__ import annotations

import importlib
import json
import pickle
from collections.abc import Callable
from pathlib import Path

import pytest

from memprism_ray.benchmark import get_benchmark
from memprism_ray.benchmark.mind2web.fixture import SCORES_FILE, build_fixture
from memprism_ray.config import load_config

fit_module = importlib.import_module("memprism_ray.trainer.fit")  # the package re-exports fit(), the function

REGENERATE = "regenerate it from the release's scores_all_data.pkl with `python -m memprism_ray.benchmark.mind2web."


@pytest.fixture(autouse=True)
def no_ray(monkeypatch: pytest.MonkeyPatch) -> None:
    from memprism_ray.cluster import placement

    def refuse(*_args: object, **_kwargs: object) -> None:
        raise AssertionError("Ray was started before the bad file was refused")

    monkeypatch.setattr(placement, "init_ray", refuse)


@pytest.fixture(scope="module")
def m2w_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The fixture the smoke config builds (2 tasks per site, seed 0), built once."""
    return build_fixture(tmp_path_factory.mktemp("m2w-checks"), tasks_per_site=2, seed=0)


def _refused(cfg, benchmark: str, capsys: pytest.CaptureFixture[str]) -> str:
    """The one line ``fit`` refuses ``cfg`` with (exit status 2, no run directory left)."""
    assert fit_module.fit(cfg, get_benchmark(benchmark), []) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1, err
    assert not cfg.run.dir.exists()
    return err[0]


def _fixture_line(root: Path) -> str:
    return (root / SCORES_FILE).read_text().splitlines()[0]


def _parquet(rows: dict[str, list]) -> Callable[[Path], None]:
    def write(path: Path) -> None:
        import pyarrow as pa
        import pyarrow.parquet as pq

        pq.write_table(pa.table(rows), path)

    return write


# name, writer of the bad file, what the line must say after "mind2web.candidate_scores <path>"
BAD_SCORES = [
    ("torn.jsonl", lambda p, r: p.write_text(_fixture_line(r) + "\n{not json\n"), ":2: not JSON"),
    (
        "negative.jsonl",
        lambda p, r: p.write_text('{"sample_id": "a_b", "ranks": {"7": 0, "9": -3}}\n'),
        ":1 (sample a_b, node 9): a rank must be an integer >= 0, got -3",
    ),
    (
        "fraction.jsonl",
        lambda p, r: p.write_text(_fixture_line(r) + '\n{"sample_id": "a_b", "ranks": {"7": 2.5}}\n'),
        ":2 (sample a_b, node 7): a rank must be an integer >= 0, got 2.5",
    ),
    # A text pickle (protocol 0) has no 0x80 first byte: its content gives it away.
    ("scores.json", lambda p, r: p.write_bytes(pickle.dumps({"ranks": {"a_b": {"7": 0}}}, protocol=0)), ":1: not JSON"),
    ("scores.parquet", lambda p, r: p.write_bytes(pickle.dumps({"ranks": {}}, protocol=0)), ": not a Parquet file"),
    (
        "columns.parquet",
        lambda p, r: _parquet({"sample_id": ["a_b"], "node": ["7"], "rank": [0]})(p),
        ": missing column(s) backend_node_id; expected sample_id, backend_node_id, rank",
    ),
    (
        "negative.parquet",
        lambda p, r: _parquet({"sample_id": ["a_b"] * 3, "backend_node_id": ["1", "2", "3"], "rank": [0, 1, -3]})(p),
        " row 3: a rank must be an integer >= 0, got {'sample_id': 'a_b', 'backend_node_id': '3', 'rank': -3}",
    ),
    # Outside the top-50 cut, so no pool ever reads it: still refused, the file is whole or not at all.
    (
        "null.parquet",
        lambda p, r: _parquet({"sample_id": ["a_b", "a_b"], "backend_node_id": ["1", None], "rank": [0, 70]})(p),
        " row 2: column 'backend_node_id' is empty (null)",
    ),
]


@pytest.mark.parametrize(("name", "write", "said"), BAD_SCORES, ids=[b[0] for b in BAD_SCORES])
def test_bad_candidate_scores_are_one_line_before_ray(
    name: str,
    write: Callable[[Path, Path], None],
    said: str,
    m2w_root: Path,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv("MIND2WEB_DATA", raising=False)
    path = tmp_path / name
    write(path, m2w_root)
    cfg = load_config(
        "configs/mind2web_smoke.yaml",
        ["--corpus.data_root", str(m2w_root), "--run.out_dir", str(tmp_path / "runs"), "--run.name", "r",
         "--run.ray_address", "local", "--mind2web.candidate_scores", str(path)],
    )  # fmt: skip
    line = _refused(cfg, "mind2web", capsys)
    assert line.startswith(f"[grpo] error: mind2web.candidate_scores {path}{said}"), line
    assert REGENERATE in line


@pytest.mark.parametrize("split", ["evaluation tasks", "training split"])
def test_candidate_scores_that_miss_a_played_step_are_one_line_before_ray(
    split: str, m2w_root: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A whole file that ranks none of some step the run plays: every env playing that task would
    fail on it mid-run; the driver names the first such step instead."""
    from memprism_ray.benchmark.mind2web import list_games
    from memprism_ray.benchmark.mind2web.candidates import sample_id
    from memprism_ray.benchmark.mind2web.data import load_task

    monkeypatch.delenv("MIND2WEB_DATA", raising=False)
    dropped_split = "test_task" if split == "evaluation tasks" else "train"
    task = load_task(list_games(dropped_split, m2w_root)[0])
    gone = sample_id(task.annotation_id, task.steps[-1].action_uid)
    rows = [json.loads(x) for x in (m2w_root / SCORES_FILE).read_text().splitlines()]
    assert gone in {r["sample_id"] for r in rows}
    path = tmp_path / "partial.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows if r["sample_id"] != gone))
    cfg = load_config(
        "configs/mind2web_smoke.yaml",
        ["--corpus.data_root", str(m2w_root), "--run.out_dir", str(tmp_path / "runs"), "--run.name", "r",
         "--mind2web.candidate_scores", str(path)],
    )  # fmt: skip
    line = _refused(cfg, "mind2web", capsys)
    assert line.startswith(
        f"[grpo] error: mind2web.candidate_scores {path} ranks no candidate of 1 step(s) of the {split} "
        f"(e.g. step {gone})"
    ), line
    assert "convert the release's scores_all_data.pkl" in line


def test_good_candidate_scores_pass_and_reach_the_actors_parsed(
    m2w_root: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The fixture's own file passes every check (and the run goes on to start Ray)."""
    monkeypatch.delenv("MIND2WEB_DATA", raising=False)
    cfg = load_config(
        "configs/mind2web_smoke.yaml",
        ["--corpus.data_root", str(m2w_root), "--run.out_dir", str(tmp_path / "runs"), "--run.name", "r",
         "--mind2web.candidate_scores", SCORES_FILE],
    )  # fmt: skip
    with pytest.raises(AssertionError, match="Ray was started"):
        fit_module.fit(cfg, get_benchmark("mind2web"), [])
    assert "error" not in capsys.readouterr().err


def test_a_bad_eval_marginal_is_one_line_before_ray_not_after_training(
    tmp_path: Path, memprism_tiny_corpus: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """``eval.marginal`` is read by the final evaluation; a training job reads it at its start."""

    def refusal(name: str, text: str) -> tuple[Path, str]:
        marginal = tmp_path / name
        marginal.write_text(text)
        cfg = load_config(
            "configs/local.yaml",
            ["--corpus.data_root", str(memprism_tiny_corpus), "--run.out_dir", str(tmp_path / "runs"),
             "--run.name", "r", "--eval.marginal", str(marginal)],
        )  # fmt: skip
        return marginal, _refused(cfg, "alfworld", capsys)

    bad, line = refusal("marginal.json", "[0.5, 0.5,\n")
    assert line.startswith(f"[grpo] error: {bad}: not valid JSON (") and "line 2" in line, line
    short, line = refusal("short.json", "[0.5, 0.5]\n")
    assert line == f"[grpo] error: {short}: the view marginal needs 144 probabilities (one per view), got 2"


def test_a_bad_ebalfred_episode_list_names_its_file_and_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    import memprism_ray.llm_client

    # The preset's D1 asks the LLM view teacher, whose endpoint the job asks first: it answers here.
    monkeypatch.setattr(memprism_ray.llm_client, "probe", lambda *args, **kwargs: None)
    bad = tmp_path / "alfred_train.json"
    bad.write_text('{"alfred_train": [\n  {"instruction": "x",}\n]}\n')
    cfg = load_config(
        "configs/ebalfred_smoke.yaml",
        ["--run.out_dir", str(tmp_path / "runs"), "--run.name", "r", "--ebalfred.train_splits", str(bad)],
    )
    line = _refused(cfg, "ebalfred", capsys)
    assert line.startswith(f"[grpo] error: {bad} is not valid JSON: ") and "line 2 column" in line, line
    assert line.endswith(
        "or write the ALFRED training list again with python -m memprism_ray.benchmark.ebalfred.training"
    )
