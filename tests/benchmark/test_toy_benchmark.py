"""A fourth benchmark is one module and one registration line (issue 36 item 1): the toy of
``tests/benchmark/toy_benchmark.py`` (reach N by +1/+2) trains with D1 and GRPO and is evaluated
through :func:`memprism_ray.trainer.fit`, touching no file of ``memprism_ray``.

The registration line runs when this module is imported, at collection, before any test starts
Ray: :func:`~memprism_ray.benchmark.register_benchmark` also puts it in ``$MEMPRISM_BENCHMARKS``,
which Ray's workers inherit, and they import the toy as ``tests.benchmark.toy_benchmark`` from the
driver's working directory (the repository root, which Ray puts on every worker's ``sys.path``).
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import pytest

from memprism_ray.benchmark import get_benchmark, register_benchmark

register_benchmark("toy", "tests.benchmark.toy_benchmark:Toy")  # the one registration line


def toy_config(out_dir: Path) -> Any:
    """A run small enough for a test: 2 D1 games, one GRPO iteration of 2 groups x 3, 4 evaluation
    episodes per condition."""
    from memprism_ray.config import load_config

    tiny = {
        "corpus.benchmark": "toy",
        "run.out_dir": str(out_dir),
        "run.name": "toy",
        "run.tensorboard": "false",
        "run.checkpoint_every": "1",
        "run.call_timeout_s": "120",
        "agent.max_steps": "10",
        "label.games": "2",
        "label.rollin_games": "0",
        "label.workers": "1",
        "label.counterfactual.uninformative": "tie_break",
        "sft.epochs": "2",
        "grpo.iterations": "1",
        "grpo.replay_first": "0",
        "grpo.groups_per_iteration": "2",
        "grpo.group_size": "3",
        "grpo.reward": "fewest_adds",
        "grpo.update_batch_size": "16",
        "rollout.num_workers": "1",
        "rollout.env_slots_per_worker": "3",
        "eval.conditions": "memprism,no_memory",
        "eval.episodes": "4",
        "eval.workers": "1",
        "eval.slots": "4",
        "eval.artifacts": "0",
        "toy.eval_targets": "10,12",  # its own section (ToySection), read like any other
    }
    return load_config("configs/local.yaml", [x for k, v in tiny.items() for x in (f"--{k}", v)])


def test_the_toy_brings_every_part_of_a_benchmark(tmp_path: Path) -> None:
    from memprism_ray.policy.base import PolicyInput
    from memprism_ray.policy.config import PolicyConfig
    from memprism_ray.policy.factory import make_policy, needs_view_text
    from memprism_ray.recorder import RawEvent
    from memprism_ray.recorder.phi.config import PhiConfig
    from memprism_ray.recorder.phi.factory import build_phi

    toy = get_benchmark("toy")
    cfg = toy_config(tmp_path)
    toy.check(cfg)
    toy.check_disjoint(cfg)
    contract = toy.task_contract()
    policy = make_policy(PolicyConfig(backend="scripted", scripted={"temperature": 0.0}), contract)
    goal, actions = "Your task is to: reach 5.", ("add 1", "add 2")
    inp = PolicyInput("toy", goal, "You add 2.", actions, view_text="")
    assert policy.act([inp])[0].action == "add 2" and needs_view_text(PolicyConfig(), contract)
    seen = PolicyInput("toy", goal, "You add 2.", actions, view_text="step 2 | add 2 | counter.value -> 4")
    assert policy.act([seen])[0].action == "add 1"  # the view tells it how far it got
    assert "Your task is to: reach 5." in contract.build_prompt_text(inp)
    assert not contract.to_output(inp, "<action>add 3</action>").valid
    # Its Phi: the rules, and an LLM Phi over its own prompt (a stub backend here).
    answer = '{"delta_s": [{"key": "counter.value", "new_value": "2"}]}'
    llm = build_phi(toy.phi_spec(), PhiConfig(kind="llm", model="m"), complete=lambda items: [answer] * len(items))
    ex = llm.extract(RawEvent("You start at 0.", "add 2", "You add 2."), {})
    assert ex.evidence["phi"] == "llm" and [(d.key, d.new_value) for d in ex.delta] == [("counter.value", "2")]
    assert toy.phi_spec().rule().extract(RawEvent("o", "add 2", "Nothing happens."), {}).failed
    assert toy.sft_preset().preset_name == toy.grpo_preset().preset_name == "toy"
    # Its own settings section, from the registry: parsed, checked, in the plan, in --help.
    from memprism_ray.config import load_config
    from memprism_ray.config_tree import describe, to_dict

    assert cfg.toy.eval_targets == (10, 12) and cfg.toy.train_targets == tuple(range(4, 10))
    assert [g.game_id for g in toy.train_games(cfg)] == [f"reach-{n}" for n in range(4, 10)]
    assert {s.game.game_id for s in toy.eval_plan(cfg).specs} == {"reach-10", "reach-12"}
    assert to_dict(cfg)["toy"] == {"train_targets": [4, 5, 6, 7, 8, 9], "eval_targets": [10, 12]}
    assert ("toy.eval_targets", "(10, 11, 12, 13)", "targets N of the evaluation games") in describe(type(cfg))
    with pytest.raises(ValueError, match=r"toy: targets \[5\] are in both toy.train_targets and toy.eval_targets"):
        load_config(None, ["--toy.eval_targets", "5,11"])
    with pytest.raises(ValueError, match=r"unknown setting\(s\) toy.targets; valid keys under toy: train_targets"):
        load_config(None, ["--toy.targets", "5"])
    # Its own reward, declared in its module: what GRPO trains on (issue 42 item 3).
    from memprism_ray.agent import EpisodeResult, EpisodeSpec
    from memprism_ray.benchmark import BenchmarkConfigError
    from tests.benchmark.toy_benchmark import game

    spec = EpisodeSpec("e", game(7, "train"))
    returns = [
        toy.trajectory_return(EpisodeResult(spec, won=w, steps=n), cfg.grpo) for w, n in ((1, 4), (1, 5), (0, 3))
    ]
    assert returns == [1.0, 0.8, 0.0]  # ceil(7 / 2) = 4 adds at best
    with pytest.raises(
        BenchmarkConfigError, match=r"grpo\.reward='success' is not defined for toy; it defines: fewest_adds"
    ):
        toy.check(dataclasses.replace(cfg, grpo=dataclasses.replace(cfg.grpo, reward="success")))


@pytest.mark.ray
def test_fit_trains_and_evaluates_the_toy(ray_session, tmp_path: Path) -> None:
    from memprism_ray.trainer.fit import fit

    cfg = toy_config(tmp_path)
    assert fit(cfg, get_benchmark("toy"), []) == 0
    run = tmp_path / "toy"
    (d1,) = (run / "d1").iterdir()
    assert pq.read_table(d1 / "expert_trajectories.parquet").num_rows > 0
    assert pq.read_table(d1 / "labels.parquet").num_rows > 0 and (d1 / "checkpoint").is_dir()
    assert (run / "checkpoints" / "iter_0001").is_dir()
    metrics = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    (grpo,) = [m for m in metrics if m.get("kind") == "grpo"]
    assert grpo["trajectories"] == 6 and grpo["failed_trajectories"] == 0  # 2 groups x 3
    assert {m["condition"] for m in metrics if m.get("kind") == "eval"} == {"memprism", "no_memory"}
    report = (run / "eval" / "toy.md").read_text()  # the toy's own report
    assert "Targets: 10, 12" in report  # its settings section reached the evaluation
    assert report.startswith("# Toy: reach N") and "| memprism | " in report and "| no_memory | " in report
    assert (run / "eval" / "summary.md").is_file()  # beside the shared one
