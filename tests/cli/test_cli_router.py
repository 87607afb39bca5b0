"""``memprism router``: init, info (counts per group, hash), sft with resume, clear errors."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest

from memprism_ray.adapter.sft import SFTDataset
from memprism_ray.cli import main


def test_init_then_info_prints_groups_and_hash(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "init"
    assert main(["router", "init", str(out), "--seed", "3"]) == 0
    capsys.readouterr()
    assert main(["router", "info", str(out)]) == 0
    text = capsys.readouterr().out
    digest = hashlib.sha256((out / "model.safetensors").read_bytes()).hexdigest()
    assert f"sha256       {digest}" in text
    assert "encoder         9,402,880 parameters" in text
    assert "planner         3,228,304 parameters" in text
    assert "entity_hint        32,832 parameters (frozen)" in text
    assert "total          12,664,016 parameters" in text
    assert "resumable    no (weights only)" in text
    assert main(["router", "info", str(out), "--json"]) == 0
    info = json.loads(capsys.readouterr().out)
    assert info["parameter_counts"]["total"] == 12_664_016 and info["weights_sha256"] == digest


def test_info_errors_are_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["router", "info", str(tmp_path / "missing")]) == 2
    assert "memprism: error:" in capsys.readouterr().err
    out = tmp_path / "c"
    main(["router", "init", str(out)])
    data = bytearray((out / "model.safetensors").read_bytes())
    data[-5] ^= 1
    (out / "model.safetensors").write_bytes(bytes(data))
    capsys.readouterr()
    assert main(["router", "info", str(out)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "does not match the recorded" in err


def test_sft_trains_saves_and_resumes(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    rng = np.random.default_rng(0)
    n = 12
    q = rng.random((n, 144))
    q /= q.sum(1, keepdims=True)
    data_path = tmp_path / "d1.parquet"
    data = SFTDataset(rng.normal(size=(n, 384)), rng.normal(size=(n, 384)), rng.random((n, 128)), rng.random((n, 8)), q)
    pq.write_table(data.to_arrow(), data_path)  # as D1 writes labels.parquet
    out = tmp_path / "run"
    args = ["router", "sft", str(data_path), str(out), "--preset", "alfred", "--batch-size", "6"]
    assert main([*args, "--epochs", "1"]) == 0
    assert "epoch 1/1" in capsys.readouterr().out
    assert main([*args, "--epochs", "1"]) == 2  # refuses to overwrite
    assert "pass --resume" in capsys.readouterr().err
    assert main([*args, "--epochs", "2", "--resume"]) == 0
    text = capsys.readouterr().out
    assert "epoch 2/2" in text and "epoch 1/2" not in text
    assert main(["router", "info", str(out), "--json"]) == 0
    info = json.loads(capsys.readouterr().out)
    assert info["stage"] == "d1" and info["iteration"] == 2 and info["resumable"]
    assert info["train_config"]["preset_name"] == "alfred" and info["train_config"]["lambda_cost"] == 0.0
    assert main(["router", "sft", str(tmp_path / "none.parquet"), str(tmp_path / "o2")]) == 2
    err = capsys.readouterr().err
    assert err == f"memprism: error: {tmp_path / 'none.parquet'}: no such file\n"
    assert main(["router", "sft", __file__, str(tmp_path / "o2")]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"memprism: error: {__file__}: cannot read as Parquet (") and err.count(__file__) == 2


def test_a_resume_goes_on_only_as_the_run_was_trained(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """``router sft --resume`` went on silently on another dataset or another ``lambda_cost``: a
    model of neither run. Only ``--epochs`` may change; the refusal names what differs."""
    rng = np.random.default_rng(0)

    def dataset(name: str, n: int) -> str:
        q = rng.random((n, 144))
        q /= q.sum(1, keepdims=True)
        d = SFTDataset(
            rng.normal(size=(n, 384)), rng.normal(size=(n, 384)), rng.random((n, 128)), rng.random((n, 8)), q
        )
        pq.write_table(d.to_arrow(), tmp_path / name)
        return str(tmp_path / name)

    first, other = dataset("a.parquet", 12), dataset("b.parquet", 8)
    out = tmp_path / "run"
    args = [str(out), "--preset", "alfred", "--batch-size", "6"]
    assert main(["router", "sft", first, *args, "--epochs", "1"]) == 0
    weights = (out / "model.safetensors").read_bytes()
    capsys.readouterr()
    assert main(["router", "sft", other, *args, "--epochs", "2", "--resume"]) == 2
    err = capsys.readouterr().err
    assert f"it was trained on {first} (sha256" in err and f"{other} is another dataset" in err
    assert f"--init {out}" in err and err.count("\n") == 1
    assert main(["router", "sft", first, *args, "--epochs", "2", "--lambda-cost", "0.5", "--resume"]) == 2
    assert "lambda_cost 0.0 -> 0.5" in capsys.readouterr().err
    assert main(["router", "sft", first, str(out), "--batch-size", "6", "--epochs", "2", "--resume"]) == 2
    assert "preset_name 'alfred' -> 'alfworld'" in capsys.readouterr().err  # the preset, not repeated
    assert (out / "model.safetensors").read_bytes() == weights  # nothing trained by a refused resume
    assert main(["router", "sft", first, *args, "--epochs", "2", "--resume"]) == 0
    assert "epoch 2/2" in capsys.readouterr().out


def test_a_fresh_checkpoint_never_overwrites_one_and_bad_settings_stop_before_training(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """``router init`` over a trained Router wrote fresh weights over it; ``router sft`` to an OUT
    that is a file trained an epoch before failing on ``[Errno 17]``, and a NaN
    ``--lambda-cost`` trained every epoch to NaN weights."""
    rng = np.random.default_rng(1)
    q = rng.random((4, 144))
    data = SFTDataset(rng.normal(size=(4, 384)), rng.normal(size=(4, 384)), rng.random((4, 128)), rng.random((4, 8)),
                      q / q.sum(1, keepdims=True))  # fmt: skip
    pq.write_table(data.to_arrow(), tmp_path / "d1.parquet")
    trained = tmp_path / "trained"
    assert main(["router", "sft", str(tmp_path / "d1.parquet"), str(trained), "--epochs", "1"]) == 0
    weights = (trained / "model.safetensors").read_bytes()
    capsys.readouterr()
    assert main(["router", "init", str(trained)]) == 2
    assert capsys.readouterr().err == f"memprism: error: {trained} already holds a checkpoint; choose a new OUT\n"
    assert (trained / "model.safetensors").read_bytes() == weights
    a_file = tmp_path / "a_file"
    a_file.write_text("x")
    for cmd in (["router", "init", str(a_file)], ["router", "sft", str(tmp_path / "d1.parquet"), str(a_file)]):
        assert main(cmd) == 2
        out = capsys.readouterr()
        assert out.err == f"memprism: error: OUT {a_file} is a file, not a checkpoint directory: choose a new OUT\n"
        assert "epoch" not in out.out
    for value in ("nan", "inf"):
        assert main(["router", "sft", str(tmp_path / "d1.parquet"), str(tmp_path / "n"), "--lambda-cost", value]) == 2
        assert (
            capsys.readouterr().err == f"memprism: error: SFTConfig.lambda_cost must be a finite number, got {value}\n"
        )
        assert not (tmp_path / "n").exists()


def test_info_on_a_checkpoint_without_router_config_fails(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "c"
    main(["router", "init", str(out)])
    meta = json.loads((out / "config.json").read_text())
    del meta["router_config"]
    (out / "config.json").write_text(json.dumps(meta))
    capsys.readouterr()
    assert main(["router", "info", str(out)]) == 2
    captured = capsys.readouterr()
    assert "None" not in captured.out and captured.err.count("\n") == 1
    assert "no router_config" in captured.err


def test_info_on_unreadable_weights_with_a_matching_hash_is_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "c"
    main(["router", "init", str(out)])
    (out / "model.safetensors").write_bytes(b"not safetensors at all")
    meta = json.loads((out / "config.json").read_text())
    meta["weights_sha256"] = hashlib.sha256(b"not safetensors at all").hexdigest()
    (out / "config.json").write_text(json.dumps(meta))
    capsys.readouterr()
    assert main(["router", "info", str(out)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "not a readable safetensors file" in err


def test_a_path_the_machine_refuses_is_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """An OUT below a file ended ``memprism router init`` (and ``games build``/``expert``) in a
    NotADirectoryError traceback: every OSError of a command is one line, its path and reason."""
    a_file = tmp_path / "notes.txt"
    a_file.write_text("mine")
    assert main(["router", "init", str(a_file / "ckpt")]) == 2
    assert capsys.readouterr().err == f"memprism: error: {a_file / 'ckpt'}: Not a directory\n"
    assert a_file.read_text() == "mine"
