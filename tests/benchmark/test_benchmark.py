"""The Benchmark interface (memprism_ray/benchmark): one implementation per benchmark the
paper names, looked up by name, each refusing a config whose evaluation episodes are among
its training tasks, with the GRPO return of Table A.4."""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pytest

from memprism_ray.agent import EpisodeResult, EpisodeSpec
from memprism_ray.benchmark import BENCHMARKS, BenchmarkConfigError, get_benchmark
from memprism_ray.config import load_config
from memprism_ray.envs.base import GameRef
from memprism_ray.registry import known_benchmarks


def test_every_benchmark_has_its_prompt_contract_and_phi_and_unknown_names_are_refused() -> None:
    for name in BENCHMARKS:
        benchmark = get_benchmark(name)
        assert benchmark.name == name
        assert benchmark.task_contract().name == name and benchmark.phi_spec().benchmark == name
    with pytest.raises(ValueError, match=r"unknown benchmark .webshop.; known benchmarks: alfworld"):
        get_benchmark("webshop")
    # The config names a benchmark; the job or command that looks it up refuses an unknown one.
    with pytest.raises(ValueError, match="unknown benchmark 'nope'"):
        get_benchmark(load_config(None, ["--corpus.benchmark", "nope"]).corpus.benchmark)


def test_a_config_for_another_benchmark_is_refused_in_one_line() -> None:
    cfg = load_config("configs/local.yaml")
    get_benchmark("alfworld").check(cfg)
    with pytest.raises(BenchmarkConfigError, match=r"corpus\.benchmark='alfworld': the mind2web jobs need mind2web"):
        get_benchmark("mind2web").check(cfg)
    with pytest.raises(BenchmarkConfigError) as unknown:  # said "or use the  job"
        get_benchmark("alfworld").check(load_config("configs/local.yaml", ["--corpus.benchmark", ""]))
    assert str(unknown.value) == (
        f"corpus.benchmark='' names no benchmark (known: {', '.join(known_benchmarks())}); the alfworld jobs need "
        "alfworld"
    )
    with pytest.raises(BenchmarkConfigError, match=r"grpo\.reward='action_correct' is not defined for alfworld"):
        get_benchmark("alfworld").check(load_config("configs/local.yaml", ["--grpo.reward", "action_correct"]))
    # Another benchmark's settings did nothing in this job, unsaid; every preset leaves them alone.
    with pytest.raises(BenchmarkConfigError) as other:
        get_benchmark("alfworld").check(load_config("configs/local.yaml", ["--mind2web.eval_tasks", "3"]))
    assert str(other.value) == (
        "mind2web.eval_tasks: the alfworld jobs do not read the mind2web settings (corpus.benchmark=alfworld); "
        "remove it, or run the mind2web job"
    )
    for preset in Path("configs").glob("*.yaml"):
        cfg = load_config(preset)
        get_benchmark(cfg.corpus.benchmark).check(cfg)


def test_trajectory_return_follows_the_reward_setting() -> None:
    """Table A.4: binary success (ALFWorld), success + coef x progress as the env's summed
    reward (EB-ALFRED), mean 1[action correct] over the replayed decisions (Mind2Web)."""
    grpo = load_config("configs/local.yaml").grpo
    r = EpisodeResult(EpisodeSpec("e", GameRef("g", "x", "t", "train")), won=False, reward=3.0, steps=4)
    alf, m2w = get_benchmark("alfworld"), get_benchmark("mind2web")
    m2w_grpo = load_config("configs/mind2web_smoke.yaml").grpo
    eb_grpo = load_config("configs/ebalfred_smoke.yaml").grpo
    assert m2w.trajectory_return(r, m2w_grpo) == 0.75
    assert alf.trajectory_return(r, grpo) == 0.0
    assert get_benchmark("ebalfred").trajectory_return(r, eb_grpo) == 3.0  # progress_reward_coef 0.2
    r.won = True
    assert alf.trajectory_return(r, grpo) == 1.0
    assert np.isclose(m2w.trajectory_return(EpisodeResult(r.spec, steps=0), m2w_grpo), 0.0)


def test_alfworld_refuses_evaluation_on_training_games(memprism_tiny_corpus: Path) -> None:
    alf = get_benchmark("alfworld")
    cfg = alf.prepare(load_config("configs/local.yaml", ["--corpus.data_root", str(memprism_tiny_corpus)]), print)
    alf.check_disjoint(cfg)  # the default: eval_out_of_distribution against train
    bad = alf.prepare(
        load_config(
            "configs/local.yaml", ["--corpus.data_root", str(memprism_tiny_corpus), "--alfworld.eval_split", "train"]
        ),
        print,
    )
    n = len(alf.train_games(bad))
    with pytest.raises(
        BenchmarkConfigError, match=rf"^{n} of the {n} alfworld evaluation tasks are also training tasks"
    ):
        alf.check_disjoint(bad)
    with pytest.raises(
        BenchmarkConfigError, match=r"change alfworld\.train_split, alfworld\.eval_split, corpus\.data_root"
    ):
        alf.check_disjoint(bad)


def test_mind2web_refuses_a_test_split_holding_training_tasks(tmp_path: Path) -> None:
    m2w = get_benchmark("mind2web")
    root = tmp_path / "fx"
    cfg = m2w.prepare(load_config("configs/mind2web_smoke.yaml", ["--corpus.data_root", str(root)]), print)
    m2w.check_disjoint(cfg)
    train_file = sorted((root / "train").glob("*.json"))[0]
    test_dir = next(p for p in root.iterdir() if p.is_dir() and p.name.startswith("test_"))
    shutil.copy(train_file, test_dir / "leaked_0.json")  # a release whose test split repeats training tasks
    planned = len(m2w.eval_plan(cfg).specs)
    with pytest.raises(BenchmarkConfigError, match=rf"^[1-9]\d* of the {planned} mind2web evaluation tasks .*train-"):
        m2w.check_disjoint(cfg)


def test_a_training_job_that_selects_no_training_task_is_refused(tmp_path: Path) -> None:
    """``ebalfred.train_subsets`` set to none: the job said "0 training episodes", started Ray and
    its workers, and ended in "iteration 1: no group produced a decision ... first cause: unknown"."""
    eb = get_benchmark("ebalfred")
    overrides = ["--run.out_dir", str(tmp_path), "--ebalfred.train_subsets", ""]
    cfg = eb.prepare(load_config("configs/ebalfred_smoke.yaml", overrides), print)
    with pytest.raises(BenchmarkConfigError) as err:
        eb.check_disjoint(cfg)
    assert str(err.value) == "no ebalfred training episodes: ebalfred.train_splits, ebalfred.train_subsets select none"


def test_ebalfred_refuses_training_on_its_evaluation_episodes(tmp_path: Path) -> None:
    """The paper preset's former default: ``ebalfred.train_splits: ""`` fell back to the
    evaluation splits.json, so its ``base`` training episodes were evaluation episodes."""
    eb = get_benchmark("ebalfred")
    overrides = ["--run.out_dir", str(tmp_path), "--ebalfred.resolution", "64"]
    cfg = eb.prepare(load_config("configs/ebalfred_smoke.yaml", [*overrides, "--ebalfred.train_splits", ""]), print)
    eval_splits = eb.eval_plan(cfg).specs[0].game.path
    bad = load_config(
        "configs/ebalfred_smoke.yaml",
        [*overrides, "--ebalfred.train_splits", str(eval_splits), "--ebalfred.train_subsets", "base"],
    )
    with pytest.raises(
        BenchmarkConfigError, match=r"ebalfred evaluation tasks are also training tasks.*ebalfred\.train_splits"
    ):
        eb.check_disjoint(eb.prepare(bad, print))


def test_ebalfred_refuses_an_evaluation_trajectory_listed_for_training_under_another_id(tmp_path: Path) -> None:
    """EmbodiedBench's subsets reuse ALFRED trajectories, so game ids alone cannot show an
    overlap: a training list naming an evaluation episode's trajectory is refused too."""
    import json

    eb = get_benchmark("ebalfred")
    overrides = ["--run.out_dir", str(tmp_path), "--ebalfred.resolution", "64"]
    cfg = eb.prepare(load_config("configs/ebalfred_smoke.yaml", overrides), print)
    eb.check_disjoint(cfg)  # the fixture's own training list plays other trajectories
    evaluation = eb.eval_plan(cfg).specs[0].game
    subset = evaluation.game_id.split("/")[0]
    leaked = json.loads(Path(evaluation.path).read_text())[subset][0]
    train_list = tmp_path / "train.json"
    train_list.write_text(json.dumps({"alfred_train": [leaked]}))
    bad = load_config("configs/ebalfred_smoke.yaml", [*overrides, "--ebalfred.train_splits", str(train_list)])
    with pytest.raises(BenchmarkConfigError, match=r"^1 ALFRED trajectories are played by both"):
        eb.check_disjoint(eb.prepare(bad, print))


def test_ebalfred_d1_plays_the_fixture_annotations_with_instance_names(tmp_path: Path) -> None:
    """Issue 41 item 1: D1's expert table on the smoke preset comes from the fixture's ALFRED
    annotations, named in each scene at reset (the second book is ``Book_2``), every plan won; a
    fixture of an older format in the run directory is rebuilt, not refused."""
    import io
    import json

    import pyarrow.parquet as pq

    from memprism_ray.benchmark.ebalfred.phi import EbAlfredRulePhi

    eb = get_benchmark("ebalfred")
    overrides = ["--run.out_dir", str(tmp_path), "--ebalfred.resolution", "64"]
    cfg = eb.prepare(load_config("configs/ebalfred_smoke.yaml", overrides), print)
    doc = Path(cfg.ebalfred.fixture) / "transcripts.json"
    doc.write_text(json.dumps({**json.loads(doc.read_text()), "version": 2}))
    cfg = eb.prepare(load_config("configs/ebalfred_smoke.yaml", overrides), print)
    games = eb.train_games(cfg)
    table = pq.read_table(io.BytesIO(eb.reference_table(cfg, games, [], EbAlfredRulePhi())))
    actions = table.column("reference_action").to_pylist()
    assert "find a Book_2" in actions and "open the Drawer_2" in actions
    assert len(set(table.column("game_id").to_pylist())) == len(games) and all(table.column("won").to_pylist())
