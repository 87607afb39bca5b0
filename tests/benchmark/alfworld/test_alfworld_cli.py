"""``memprism games``: build (resumable), list, expert, and one-line errors."""

from __future__ import annotations

from pathlib import Path

import pyarrow.parquet as pq
import pytest

from memprism_ray.cli import main


@pytest.fixture(scope="module")
def cli_corpus(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("cli-corpus")
    args = ["games", "build", "--out", str(out), "--train", "2", "--eval", "0", "--seed", "3", "--workers", "1"]
    assert main([*args, "--quiet"]) == 0
    return out


def test_build_reports_counts_and_resumes(cli_corpus: Path, capsys: pytest.CaptureFixture[str]) -> None:
    capsys.readouterr()
    args = ["games", "build", "--out", str(cli_corpus), "--train", "2", "--eval", "0", "--seed", "3", "--workers", "1"]
    assert main(args) == 0
    out, err = capsys.readouterr()
    assert "train: 2 games" in out and f"export ALFWORLD_DATA={cli_corpus.resolve()}" in out
    assert "(2 done, 0 to build)" in err  # nothing rebuilt


def test_list_and_expert(cli_corpus: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    capsys.readouterr()
    assert main(["games", "list", "--split", "train", "--data-root", str(cli_corpus)]) == 0
    lines = capsys.readouterr().out.strip().splitlines()
    assert len(lines) == 2 and all("\t" in line for line in lines)
    out_dir = tmp_path / "expert"
    cmd = ["games", "expert", "--split", "train", "--out", str(out_dir), "--data-root", str(cli_corpus)]
    assert main([*cmd, "--games", "1", "--quiet"]) == 0
    assert "1 of 1 game(s)" in capsys.readouterr().out
    table = pq.read_table(out_dir / "expert_trajectories.parquet")
    assert table.num_rows > 0 and set(table.column("game_id").to_pylist()) == {lines[0].split("\t")[0]}


def test_errors_are_one_line_with_exit_2(cli_corpus: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    capsys.readouterr()
    assert main(["games", "list", "--split", "eval_in_distribution", "--data-root", str(cli_corpus)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("memprism: error:") and "valid_seen" in err[0]
    assert main(["games", "list", "--data-root", str(tmp_path / "missing")]) == 2
    assert "does not exist" in capsys.readouterr().err
    build = ["games", "build", "--out", str(cli_corpus), "--train", "3", "--eval", "0", "--seed", "3", "--quiet"]
    assert main(build) == 2
    assert "other settings" in capsys.readouterr().err
    with pytest.raises(SystemExit) as exc:
        main(["games", "build", "--out", str(tmp_path), "--train", "-1"])
    assert exc.value.code == 2
    assert main(["games"]) == 2


def test_an_interrupted_build_says_what_it_kept_and_how_to_finish(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Ctrl-C during ``memprism games build`` said only "memprism: interrupted", though the build
    keeps every finished game and the same command finishes it."""
    from memprism_ray.benchmark.alfworld import corpus

    def interrupted(cfg, progress=True):  # as the build is stopped after two finished games
        (cfg.out / ".build" / "slots").mkdir(parents=True)
        for k in range(2):
            (cfg.out / ".build" / "slots" / f"train-{k}.json").write_text("{}")
        raise KeyboardInterrupt

    monkeypatch.setattr(corpus, "build_corpus", interrupted)
    assert main(["games", "build", "--out", str(tmp_path / "c"), "--train", "5", "--eval", "0"]) == 130
    assert capsys.readouterr().err == (
        "memprism games build: interrupted; the 2 game(s) built are kept: run the same command to finish\n"
    )
