"""``memprism view``: happy paths and one-line errors with exit code 2."""

from __future__ import annotations

from pathlib import Path

import pytest
from PIL import Image

from memprism_ray.cli import main
from memprism_ray.testing.synthetic_streams import alfworld_like_stream


@pytest.fixture(scope="module")
def events(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("view")
    stream = alfworld_like_stream(120, 9)
    paths = {"jsonl": root / "events.jsonl", "parquet": root / "events.parquet"}
    for p in paths.values():
        stream.save(p)
    (root / "broken.jsonl").write_text('{"format": "memprism-events", "version": 1, "meta": {}}\n{"raw": 5}\n')
    paths["broken"] = root / "broken.jsonl"
    paths["root"] = root
    return paths


def test_png_happy_path(events: dict[str, Path], capsys: pytest.CaptureFixture[str]) -> None:
    out = events["root"] / "view.png"
    args = [str(events["jsonl"]), "--tau", "EntityState", "--window", "all", "--filter", "state_update"]
    rc = main(["view", *args, "--gamma", "medium", "--max-side", "448", "--out", str(out)])
    assert rc == 0
    img = Image.open(out)
    w, h = img.size
    assert w == 448 and h % 28 == 0 and h <= 448
    printed = capsys.readouterr().out
    assert f"{w}x{h} px = {w * h} pixels" in printed
    assert f"qwen2.5-vl {(w // 28) * (h // 28) + 2} (incl. 2 markers)" in printed
    assert "compose" in printed and " ms" in printed


def test_text_to_stdout_and_file_from_parquet(events: dict[str, Path], capsys: pytest.CaptureFixture[str]) -> None:
    rc = main(["view", str(events["parquet"]), "--tau", "timeline", "--text"])  # legacy alias accepted
    assert rc == 0
    captured = capsys.readouterr()
    lines = captured.out.splitlines()
    assert lines[0] == "view: TemporalTrace | window=recent_short | filter=all | gamma=fine"
    assert lines[1] == f"goal: {alfworld_like_stream(120, 9).meta['goal']}"
    assert lines[-1].startswith("step 120 | ")
    assert "visual tokens" in captured.err
    out = events["root"] / "view.txt"
    rc = main(
        ["view", str(events["jsonl"]), "--tau", "DependencyChain", "--goal", "find a mug", "--text", "--out", str(out)]
    )
    assert rc == 0
    text = out.read_text()
    assert text.splitlines()[1] == "goal: find a mug" and "anchor | step 120" in text


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--tau", "Nope"], "unknown view tau 'Nope'; valid tau names: TemporalTrace, ActionEffect"),
        (["--window", "forever"], "unknown view window 'forever'; valid window names: recent_short"),
        (["--filter", "x"], "unknown view filter 'x'"),
        (["--gamma", "ultra"], "unknown view gamma 'ultra'"),
        (["--max-side", "500"], "must be a multiple of 28"),
        (["--max-side", "big"], "--max-side must be an integer, got 'big'"),
        (["--goal-restore", "maybe"], "goal_restore must be one of window, history, off"),
    ],
)
def test_bad_names_give_one_line_and_exit_2(
    events: dict[str, Path], capsys: pytest.CaptureFixture[str], argv: list[str], message: str
) -> None:
    rc = main(["view", str(events["jsonl"]), *argv, "--out", str(events["root"] / "x.png")])
    err = capsys.readouterr().err
    assert rc == 2
    assert err.count("\n") == 1 and err.startswith("memprism: error: ") and message in err


def test_bad_files_give_one_line_and_exit_2(events: dict[str, Path], capsys: pytest.CaptureFixture[str]) -> None:
    root = events["root"]
    (root / "notes.txt").write_text("hello")
    (root / "garbage.parquet").write_bytes(b"not parquet")
    cases = [
        ([str(root / "missing.jsonl"), "--out", str(root / "x.png")], "missing.jsonl: no such file"),
        ([str(events["broken"]), "--out", str(root / "x.png")], "broken.jsonl:2: record must be an object"),
        ([str(root / "notes.txt"), "--out", str(root / "x.png")], "unknown event-stream format '.txt'"),
        ([str(root / "garbage.parquet"), "--out", str(root / "x.png")], "cannot read as Parquet"),
        ([str(events["jsonl"])], "--out is required when writing a PNG"),
        ([str(events["jsonl"]), "--out", str(root / "no" / "such" / "dir.png")], "does not exist"),
        ([str(events["jsonl"]), "--out", str(root / "x.jpg")], "x.jpg: the file would hold a PNG; name it .png"),
        ([str(events["jsonl"]), "--text", "--out", str(root / "x.png")], "would hold the text view; name it .txt"),
    ]
    for argv, message in cases:
        rc = main(["view", *argv])
        err = capsys.readouterr().err
        assert rc == 2, argv
        assert err.count("\n") == 1 and message in err, (argv, err)
    assert not (root / "x.png").exists() and not (root / "x.jpg").exists()
