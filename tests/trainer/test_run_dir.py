"""Run directories: fresh runs never clobber, resume checks the config hash, falls back past a
corrupt checkpoint, supersedes metrics rows past the resumed iteration; D1 artifacts keyed by config."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from memprism_ray.adapter.checkpoint import save_checkpoint
from memprism_ray.adapter.grpo_update import GRPOConfig, GRPOUpdater
from memprism_ray.benchmark import get_benchmark
from memprism_ray.config import load_config
from memprism_ray.router.model import RouterConfig, ViewPolicyModel
from memprism_ray.trainer.run_dir import (
    RunDirError,
    RunLogger,
    checkpoint_dir,
    checkpoint_extra,
    config_hash,
    d1_dir,
    latest_checkpoint,
    prepare_run_dir,
)

TINY = RouterConfig(d_model=32, n_heads=4, n_layers=1, ff_dim=64, planner_hidden=64, entity_hint_dim=8)


def cfg(tmp: Path, *extra: str):
    return load_config("configs/local.yaml", ["--run.out_dir", str(tmp), "--run.name", "r", *extra])


def d1_key(config) -> str:
    """The D1 key of ``config``: the name of its D1 directory."""
    return d1_dir(config.run.dir, config, get_benchmark(config.corpus.benchmark)).name


def save_d2(path: Path, config, iteration: int) -> Path:
    torch.manual_seed(iteration)
    model = ViewPolicyModel(TINY)
    trainer = GRPOUpdater(model, ViewPolicyModel(TINY), GRPOConfig(lr=1e-3))
    trainer.iteration = iteration
    return save_checkpoint(path, model, trainer=trainer, stage="d2", extra=checkpoint_extra(config))


def test_fresh_run_refuses_an_existing_directory(tmp_path: Path) -> None:
    c = cfg(tmp_path)
    assert prepare_run_dir(c.run.dir, "", c) is None
    assert (c.run.dir / "config.yaml").exists()
    # A directory with something in it (here: the config of the earlier start, no checkpoint yet).
    with pytest.raises(RunDirError, match=r"already exists \(no checkpoint yet\).*--resume auto"):
        prepare_run_dir(c.run.dir, "", c)


@pytest.mark.parametrize("name", ["../../x", "/abs/x", "a/b", "..", ".hidden", ""])
def test_run_names_that_leave_out_dir_are_rejected(tmp_path: Path, name: str) -> None:
    with pytest.raises(ValueError, match=r"run\.name"):
        cfg(tmp_path, "--run.name", name)


def test_resume_refuses_a_changed_config_unless_allowed(tmp_path: Path) -> None:
    c = cfg(tmp_path)
    prepare_run_dir(c.run.dir, "", c)
    save_d2(checkpoint_dir(c.run.dir, 1), c, 1)
    # Where the run executes may change freely.
    same = cfg(tmp_path, "--run.num_cpus", "3", "--run.call_timeout_s", "9", "--eval.workers", "1")
    assert config_hash(same) == config_hash(c)
    assert prepare_run_dir(c.run.dir, "auto", same) == checkpoint_dir(c.run.dir, 1)
    changed = cfg(tmp_path, "--grpo.lr", "1e-5")
    with pytest.raises(RunDirError, match=r"config differs.*grpo\.lr.*--run\.allow_config_change true"):
        prepare_run_dir(c.run.dir, "auto", changed)
    warnings: list[str] = []
    allowed = cfg(tmp_path, "--grpo.lr", "1e-5", "--run.allow_config_change", "true")
    assert prepare_run_dir(c.run.dir, "auto", allowed, warn=warnings.append) == checkpoint_dir(c.run.dir, 1)
    assert len(warnings) == 1 and "grpo.lr" in warnings[0]
    # The new config is recorded; the earlier one is kept, not overwritten.
    assert "1.0e-05" in (c.run.dir / "config.yaml").read_text()
    assert (c.run.dir / "config.1.yaml").exists()


def test_corrupt_latest_checkpoint_falls_back_with_a_warning(tmp_path: Path) -> None:
    c = cfg(tmp_path)
    prepare_run_dir(c.run.dir, "", c)
    save_d2(checkpoint_dir(c.run.dir, 1), c, 1)
    two = save_d2(checkpoint_dir(c.run.dir, 2), c, 2)
    data = bytearray((two / "model.safetensors").read_bytes())
    data[-3] ^= 0xFF
    (two / "model.safetensors").write_bytes(bytes(data))
    assert latest_checkpoint(c.run.dir) == two
    warnings: list[str] = []
    assert prepare_run_dir(c.run.dir, "auto", c, warn=warnings.append) == checkpoint_dir(c.run.dir, 1)
    assert len(warnings) == 1 and "iter_0002 is corrupt" in warnings[0]
    assert (c.run.dir / "checkpoints" / "iter_0002.corrupt" / "model.safetensors").exists()  # kept, not deleted
    assert latest_checkpoint(c.run.dir) == checkpoint_dir(c.run.dir, 1)


def test_a_refused_resume_renames_nothing(tmp_path: Path) -> None:
    """``--resume auto`` with a changed config is refused before the corrupt newest checkpoint
    is set aside: the run directory is left as it was (issue 29, item 9)."""
    c = cfg(tmp_path)
    prepare_run_dir(c.run.dir, "", c)
    save_d2(checkpoint_dir(c.run.dir, 1), c, 1)
    two = save_d2(checkpoint_dir(c.run.dir, 2), c, 2)
    (two / "model.safetensors").write_bytes(b"torn")
    before = sorted(p.name for p in (c.run.dir / "checkpoints").iterdir())
    with pytest.raises(RunDirError, match=r"config differs.*grpo\.lr"):
        prepare_run_dir(c.run.dir, "auto", cfg(tmp_path, "--grpo.lr", "1e-5"), warn=lambda _: None)
    assert sorted(p.name for p in (c.run.dir / "checkpoints").iterdir()) == before == ["iter_0001", "iter_0002"]


@pytest.mark.parametrize("out_dir", ["{file}/runs", "/proc/memprism-x"])
def test_an_out_dir_that_cannot_be_created_is_one_line(tmp_path: Path, out_dir: str) -> None:
    (tmp_path / "file").write_text("a regular file")
    c = load_config("configs/local.yaml", ["--run.out_dir", out_dir.format(file=tmp_path / "file"), "--run.name", "r"])
    with pytest.raises(RunDirError, match=r"^run directory .* cannot be (created|used): .*check --run\.out_dir\)$"):
        prepare_run_dir(c.run.dir, "", c)


def test_bad_resume_paths_and_init_checkpoints_are_one_line_errors(tmp_path: Path) -> None:
    c = cfg(tmp_path)
    with pytest.raises(RunDirError, match="no such checkpoint directory"):
        prepare_run_dir(c.run.dir, str(tmp_path / "nowhere"), c)
    (tmp_path / "empty").mkdir()
    with pytest.raises(RunDirError, match=r"no config\.json"):
        prepare_run_dir(c.run.dir, str(tmp_path / "empty"), c)
    ck = save_d2(tmp_path / "ck", c, 1)
    (ck / "state.pt").write_bytes(b"truncated")
    with pytest.raises(RunDirError, match=r"state\.pt: cannot be read"):
        prepare_run_dir(c.run.dir, str(ck), c)
    bad_init = cfg(tmp_path, "--init_checkpoint", str(tmp_path / "nope"))
    with pytest.raises(RunDirError, match=r"init_checkpoint .*no such checkpoint directory"):
        prepare_run_dir(bad_init.run.dir, "", bad_init)
    assert not c.run.dir.exists()  # nothing created for a refused start


def test_resume_path_older_than_the_runs_latest_is_refused(tmp_path: Path) -> None:
    c = cfg(tmp_path)
    prepare_run_dir(c.run.dir, "", c)
    one = save_d2(checkpoint_dir(c.run.dir, 1), c, 1)
    save_d2(checkpoint_dir(c.run.dir, 2), c, 2)
    with pytest.raises(RunDirError, match="later checkpoint iter_0002"):
        prepare_run_dir(c.run.dir, str(one), c)


def test_resumed_logger_supersedes_rows_past_the_checkpoint(tmp_path: Path) -> None:
    log = RunLogger(tmp_path, tensorboard=False)
    for step in (1, 2, 3):
        log.log("grpo", step, {"loss": float(step)})
        if step <= 2:
            log.log("checkpoint", step, {"sha256": "x"})
    log.close()
    # Killed after iteration 3 was logged but before its checkpoint; resumed from iter_0002.
    resumed = RunLogger(tmp_path, tensorboard=False, resume_step=2)
    assert resumed.superseded == 1
    for step in (3, 4):
        resumed.log("grpo", step, {"loss": 10.0 + step})
    rows = [json.loads(x) for x in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    grpo = [(r["step"], r["loss"]) for r in rows if r["kind"] == "grpo"]
    assert grpo == [(1, 1.0), (2, 2.0), (3, 13.0), (4, 14.0)]
    old = [json.loads(x) for x in (tmp_path / RunLogger.SUPERSEDED).read_text().splitlines()]
    assert [(r["kind"], r["step"], r["loss"]) for r in old] == [("grpo", 3, 3.0)]


def _logged(run_dir: Path, steps: range) -> str:
    log = RunLogger(run_dir, tensorboard=False)
    for step in steps:
        log.log("grpo", step, {"success_rate": step / 10})
    log.close()
    return (run_dir / "metrics.jsonl").read_text()


def test_a_torn_last_row_is_cut_reported_and_the_next_row_lands_whole(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Issue 40 item 4: a writer killed mid-row leaves half a JSON object without its newline.
    Resuming used to keep the fragment and glue the next row onto it (that row lost, and the
    training plot's reader then failed on the glued line)."""
    whole = _logged(tmp_path, range(1, 4))
    fragment = json.dumps({"kind": "grpo", "step": 4, "success_rate": 0.4})[:23]
    (tmp_path / "metrics.jsonl").write_text(whole + fragment)
    capsys.readouterr()
    resumed = RunLogger(tmp_path, tensorboard=False, resume_step=3)
    resumed.log("grpo", 4, {"success_rate": 0.4})
    resumed.close()
    lines = (tmp_path / "metrics.jsonl").read_text().splitlines()
    assert len(lines) == 4 and lines[3].startswith('{"kind": "grpo", "step": 4, "time": ')  # whole, not glued
    rows = [json.loads(line) for line in lines]
    assert [(r["step"], r["success_rate"]) for r in rows] == [(1, 0.1), (2, 0.2), (3, 0.3), (4, 0.4)]
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [
        f"memprism: warning: metrics {tmp_path / 'metrics.jsonl'}: line 4 was torn (23 bytes without a newline: a "
        "writer killed mid-row); cut off before appending and kept in metrics.jsonl.torn"
    ]
    assert (tmp_path / "metrics.jsonl.torn").read_text() == fragment + "\n"  # kept, not lost
    assert resumed.superseded == 0 and resumed.torn_bytes == 23


def test_a_whole_last_row_without_its_newline_is_kept(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    whole = _logged(tmp_path, range(1, 3))
    (tmp_path / "metrics.jsonl").write_text(whole.rstrip("\n"))  # killed between the row and its newline
    capsys.readouterr()
    log = RunLogger(tmp_path, tensorboard=False, resume_step=2)
    log.log("grpo", 3, {"success_rate": 0.3})
    assert capsys.readouterr().err == "" and not (tmp_path / "metrics.jsonl.torn").exists()
    assert [json.loads(x)["step"] for x in (tmp_path / "metrics.jsonl").read_text().splitlines()] == [1, 2, 3]


def test_a_resume_logs_the_checkpoint_row_a_killed_driver_had_not_written(tmp_path: Path) -> None:
    """Killed between a whole checkpoint and its ``checkpoint`` row (the kill-and-resume drill
    failed so, once in a run beside a busy core): the resumed log lacked that row."""
    from memprism_ray.adapter.checkpoint import read_checkpoint_meta

    c = cfg(tmp_path)
    ckpt = save_d2(checkpoint_dir(c.run.dir, 1), c, 1)
    log = RunLogger(c.run.dir, tensorboard=False)
    log.log("grpo", 1, {"loss": 1.0})
    log.close()
    resumed = RunLogger(c.run.dir, tensorboard=False, resume_step=1)
    resumed.note_checkpoint(1, ckpt)
    resumed.note_checkpoint(1, ckpt)  # once only
    rows = [json.loads(x) for x in (c.run.dir / "metrics.jsonl").read_text().splitlines()]
    assert [(r["kind"], r["step"]) for r in rows] == [("grpo", 1), ("checkpoint", 1)]
    assert rows[1]["sha256"] == read_checkpoint_meta(ckpt)["weights_sha256"]


def test_read_metrics_skips_and_says_a_torn_last_row_and_refuses_a_damaged_one(tmp_path: Path) -> None:
    """The reader of ``metrics.jsonl`` (the training plot's): every whole row, a torn last one
    skipped and said, a damaged row elsewhere one line naming the file and line."""
    from memprism_ray.trainer.run_dir import read_metrics

    assert read_metrics(tmp_path) == []
    whole = _logged(tmp_path, range(1, 4))
    (tmp_path / "metrics.jsonl").write_text(whole + '{"kind": "grpo", "st')
    said: list[str] = []
    assert [r["step"] for r in read_metrics(tmp_path, said.append)] == [1, 2, 3]
    assert said == [
        f"metrics {tmp_path / 'metrics.jsonl'}: line 4 is torn (20 bytes without a newline: a writer killed "
        "mid-row); skipped"
    ]
    lines = whole.splitlines(keepends=True)
    glued = lines[1].rstrip("\n") + lines[2]  # what the old logger made of a torn row and the next one
    (tmp_path / "metrics.jsonl").write_text(lines[0] + glued + "\n" + lines[2])
    with pytest.raises(ValueError) as err:
        read_metrics(tmp_path, said.append)
    text = str(err.value)
    assert text.startswith(f"metrics {tmp_path / 'metrics.jsonl'}:2 is not JSON (Extra data at column ")
    assert "remove that line (or move the file aside)" in text and "\n" not in text and len(said) == 1
    (tmp_path / "metrics.jsonl").write_text(lines[0] + "[1, 2]\n")
    with pytest.raises(ValueError, match=r"row 2 is not a JSON object"):
        read_metrics(tmp_path)


def test_resume_refuses_a_damaged_metrics_row_before_any_work(tmp_path: Path) -> None:
    c = cfg(tmp_path)
    prepare_run_dir(c.run.dir, "", c)
    whole = _logged(c.run.dir, range(1, 3))
    (c.run.dir / "metrics.jsonl").write_text("{oops\n" + whole + '{"torn')
    with pytest.raises(RunDirError, match=r"^--resume auto: metrics .*metrics\.jsonl:1 is not JSON"):
        prepare_run_dir(c.run.dir, "auto", c)
    (c.run.dir / "metrics.jsonl").write_text(whole + '{"torn')  # a torn last row alone: the logger's to cut
    assert prepare_run_dir(c.run.dir, "auto", c) is None


def test_d1_artifacts_are_keyed_by_the_sections_that_make_them(tmp_path: Path) -> None:
    c = cfg(tmp_path)
    assert d1_key(cfg(tmp_path, "--grpo.lr", "1e-5", "--eval.workers", "1")) == d1_key(c)
    for override in (("--label.games", "3"), ("--corpus.seed", "5"), ("--sft.epochs", "2"), ("--run.seed", "4")):
        assert d1_key(cfg(tmp_path, *override)) != d1_key(c), override
    bench = get_benchmark(c.corpus.benchmark)
    a, b = d1_dir(c.run.dir, c, bench), d1_dir(c.run.dir, cfg(tmp_path, "--label.games", "3"), bench)
    assert a != b and a.parent == b.parent == c.run.dir / "d1"
    about = json.loads((a / "key.json").read_text())
    assert about["key"] == a.name == d1_key(c) and about["label"]["games"] == c.label.games
    assert about["run.seed"] == c.run.seed


def _older_checkpoint(c, edit) -> Path:
    """Iteration 1's checkpoint of run ``c`` as an older version wrote it: its recorded config
    ``edit``-ed (keys that version lacked or had), its config hash another."""
    prepare_run_dir(c.run.dir, "", c)
    path = checkpoint_dir(c.run.dir, 1)
    extra = checkpoint_extra(c)
    extra["config"] = edit(extra["config"])
    extra["config_sha256"] = "0" * 64
    torch.manual_seed(1)
    model = ViewPolicyModel(TINY)
    trainer = GRPOUpdater(model, ViewPolicyModel(TINY), GRPOConfig(lr=1e-3))
    trainer.iteration = 1
    save_checkpoint(path, model, trainer=trainer, stage="d2", extra=extra)
    return path


def test_settings_added_later_at_their_defaults_do_not_block_resume(tmp_path: Path) -> None:
    c = cfg(tmp_path)
    # A checkpoint written before the `phi` section existed: its recorded config lacks phi.*.
    path = _older_checkpoint(c, lambda config: {k: v for k, v in config.items() if not k.startswith("phi.")})
    assert prepare_run_dir(c.run.dir, "auto", c) == path
    # The same missing section at a non-default value is a change.
    with pytest.raises(RunDirError, match=r"phi\.kind"):
        prepare_run_dir(c.run.dir, "auto", cfg(tmp_path, "--phi.kind", "llm", "--phi.model", "m"))


def test_a_checkpoint_made_with_grpo_max_steps_resumes(tmp_path: Path) -> None:
    """Issue 42: ``grpo.max_steps`` is gone (it had to equal ``agent.max_steps``); a checkpoint
    that recorded it resumes, and its ``agent.max_steps`` is still compared."""
    c = cfg(tmp_path)
    path = _older_checkpoint(c, lambda config: {**config, "grpo.max_steps": config["agent.max_steps"]})
    assert prepare_run_dir(c.run.dir, "auto", c) == path
    with pytest.raises(RunDirError, match=r"agent\.max_steps"):
        prepare_run_dir(c.run.dir, "auto", cfg(tmp_path, "--agent.max_steps", "3"))


def test_d1_key_covers_phi_only_when_an_llm_phi_extracts(tmp_path: Path) -> None:
    c = cfg(tmp_path)
    assert d1_key(cfg(tmp_path, "--phi.base_url", "http://127.0.0.1:9/v1")) == d1_key(c)
    assert d1_key(cfg(tmp_path, "--phi.kind", "llm", "--phi.model", "m")) != d1_key(c)


def test_d1_key_follows_the_benchmarks_own_section(tmp_path: Path) -> None:
    """Issue 35: Mind2Web's D1 replays the human trajectories on a candidate pool, so D1 data
    made on the project's pool is never reused for MindAct's (the mind2web section is keyed)."""
    from memprism_ray.config import load_config

    def m2w(*extra: str):
        return load_config("configs/mind2web_smoke.yaml", ["--run.out_dir", str(tmp_path), *extra])

    assert d1_key(m2w()) == d1_key(m2w())
    assert d1_key(m2w("--mind2web.candidate_scores", "candidate_scores.jsonl")) != d1_key(m2w())


# Per benchmark: settings of its own section that only shape the evaluation (or where it runs),
# and settings that make its D1 data (Benchmark.d1_keys).
D1_KEYED = {
    "configs/ebalfred_smoke.yaml": (
        [
            ("--ebalfred.eval_workers", "3"),
            ("--ebalfred.eval_slots", "2"),
            ("--ebalfred.episodes_per_subset", "5"),
            ("--ebalfred.subsets", "base,common_sense"),
            ("--ebalfred.splits", "/elsewhere/splits.json"),
            ("--ebalfred.x_display", "7"),
            ("--ebalfred.local_build", "/opt/thor"),
            ("--ebalfred.frame_dir", "/tmp/frames"),
        ],
        [
            ("--ebalfred.fixture_episodes", "4"),
            ("--ebalfred.train_splits", "/elsewhere/train.json"),
            ("--ebalfred.skills", "full"),
            ("--ebalfred.n_shots", "3"),
            ("--ebalfred.resolution", "64"),
            ("--grpo.progress_reward_coef", "0.1"),
        ],
    ),
    "configs/mind2web_smoke.yaml": (
        [("--mind2web.eval_tasks", "1"), ("--mind2web.eval_splits", "test_task"), ("--mind2web.train_tasks", "3")],
        [
            ("--mind2web.candidate_scores", "candidate_scores.jsonl"),
            ("--mind2web.candidate_top_k", "7"),
            ("--mind2web.fixture_tasks_per_site", "3"),
        ],
    ),
}


@pytest.mark.parametrize("config", sorted(D1_KEYED))
def test_d1_key_covers_only_the_benchmark_settings_that_make_d1(tmp_path: Path, config: str) -> None:
    """Review of issue 35: the benchmark's evaluation settings (and where its simulator runs)
    never rerun D1; its d1_keys do."""

    def load(*extra: str):
        return load_config(config, ["--run.out_dir", str(tmp_path), *extra])

    base = d1_key(load())
    eval_only, d1 = D1_KEYED[config]
    for override in eval_only:
        assert d1_key(load(*override)) == base, override
    for override in d1:
        assert d1_key(load(*override)) != base, override


def test_a_checkpoint_made_before_alfworld_had_its_section_resumes(tmp_path: Path) -> None:
    """Issue 42: ``corpus.train_split`` and ``eval.split`` are ALFWorld's section's now
    (``alfworld.train_split``, ``alfworld.eval_split``); a checkpoint that recorded the old keys
    resumes, its values compared under the new names; the old keys are refused naming the new."""
    c = cfg(tmp_path)

    def older(config: dict) -> dict:
        config = {k: v for k, v in config.items() if not k.startswith("alfworld.")}
        return {**config, "corpus.train_split": "train", "eval.split": "eval_out_of_distribution"}

    path = _older_checkpoint(c, older)
    assert prepare_run_dir(c.run.dir, "auto", c) == path
    with pytest.raises(RunDirError, match=r"alfworld\.eval_split"):
        prepare_run_dir(c.run.dir, "auto", cfg(tmp_path, "--alfworld.eval_split", "eval_in_distribution"))
    with pytest.raises(ValueError, match=r"eval\.split was renamed alfworld\.eval_split"):
        cfg(tmp_path, "--eval.split", "train")
    with pytest.raises(ValueError, match=r"corpus\.train_split was renamed alfworld\.train_split"):
        cfg(tmp_path, "--corpus.train_split", "train")
    with pytest.raises(ValueError, match=r"alfworld\.eval_split: unknown ALFWorld split 'nope'"):
        cfg(tmp_path, "--alfworld.eval_split", "nope")


def test_a_metrics_row_its_disk_cannot_hold_names_the_log(tmp_path: Path) -> None:
    # /dev/full refuses every write with ENOSPC, as a full disk does; the error named no file, so
    # the job's one line (trainer/fit.run_failure) could not say which.
    import errno

    log = RunLogger(tmp_path, tensorboard=False)
    (tmp_path / "metrics.jsonl").symlink_to("/dev/full")
    with pytest.raises(OSError) as raised:
        log.log("grpo", 1, {"success_rate": 0.5})
    assert raised.value.errno == errno.ENOSPC and raised.value.filename == str(tmp_path / "metrics.jsonl")


def test_a_second_job_on_a_run_in_use_is_refused_before_it_writes_there(tmp_path: Path) -> None:
    """A resubmitted job, or the same command in a second terminal, while the first still runs:
    both wrote the same metrics log and checkpoints."""
    import contextlib
    import os

    c = cfg(tmp_path)
    with contextlib.ExitStack() as first:
        assert prepare_run_dir(c.run.dir, "", c, hold=first) is None
        (c.run.dir / "config.yaml").unlink()  # what the second would write again
        for resume in ("", "auto"):
            with contextlib.ExitStack() as second, pytest.raises(RunDirError) as refused:
                prepare_run_dir(
                    c.run.dir, resume, cfg(tmp_path, *(["--run.resume", resume] if resume else [])), hold=second
                )
            assert str(refused.value) == (
                f"run directory {c.run.dir} is in use: the lock {c.run.dir / '.lock'} is taken (held by process "
                f"{os.getpid()}, a job on this run); wait for that process or stop it, or choose another --run.name"
            )
        assert not (c.run.dir / "config.yaml").exists()
    # Released when the first job ends (or its process dies): the run resumes.
    with contextlib.ExitStack() as again:
        assert prepare_run_dir(c.run.dir, "auto", cfg(tmp_path, "--run.resume", "auto"), hold=again) is None
    assert (c.run.dir / "config.yaml").exists()
