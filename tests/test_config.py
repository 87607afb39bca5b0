"""The job config tree (memprism_ray/config.py): bad settings are rejected when the config
is read, with the key, the value and what is allowed (issue 10 item 2), never after D1."""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path

import pytest

from memprism_ray.benchmark import get_benchmark
from memprism_ray.config import ExperimentConfig, RolloutConfig, load_config
from memprism_ray.config_tree import describe
from memprism_ray.policy.factory import make_policy

PRESET = "configs/local.yaml"


@pytest.mark.parametrize(
    ("overrides", "message"),
    [(["--eval.conditions", "memprism,bogus"],
      "eval.conditions: unknown condition 'bogus'; valid conditions: no_memory, full_history, recent4"),
     (["--eval.conditions", "memprism,freq_random,memprism"], "eval.conditions: 'memprism' is listed twice"),
     (["--eval.conditions", "fixed:TemporalTrace,fixed:timeline"],
      "eval.conditions: condition 'fixed:timeline' is listed twice (as 'fixed:TemporalTrace')"),
     (["--eval.conditions", "recent:4,memprism,constrained:tau=timeline,recent4"],
      "eval.conditions: condition 'recent4' is listed twice (as 'recent:4')"),
     (["--eval.conditions", "freq_random,memprism"],
      "eval.conditions: 'freq_random' samples the view marginal of this run's memprism condition; list memprism "
      "before it"),
     (["--alfworld.eval_split", "test"], "alfworld.eval_split: unknown ALFWorld split 'test'; valid splits: train, "),
     (["--alfworld.train_split", "valid_seen"], "alfworld.train_split: unknown ALFWorld split 'valid_seen'"),
     (["--label.policy_temperature", "-0.5"], "label.policy_temperature must be >= 0 (0 = greedy), got -0.5"),
     (["--label.counterfactual.cost_temperature", "0"], "label.counterfactual.cost_temperature must be > 0, got 0.0"),
     (["--label.counterfactual.uninformative", "drop"],
      "label.counterfactual.uninformative must be 'skip' or 'tie_break', got 'drop'"),
     (["--label.counterfactual.tie_break_temperature", "-1"],
      "label.counterfactual.tie_break_temperature must be >= 0"),
     (["--label.counterfactual.page_token_temperature", "-1"],
      "label.counterfactual.page_token_temperature must be >= 0 (0: structural cost)"),
     (["--label.teacher", "llm", "--label.counterfactual.page_token_temperature", "50"],
      "label.counterfactual.page_token_temperature shades the counterfactual teacher's labels; label.teacher='llm' "
      "does not use it"),
     (["--label.llm.top_k", "0"], "label.llm.top_k must be in [1, 144], got 0"),
     (["--label.llm.source", "ray"], "label.llm.source must be 'endpoint' or 'pool', got 'ray'"),
     # The flat keys of the one-section label config (issue 36): each names its new key.
     (["--label.llm_base_url", "http://10.0.0.2:8000/v1"], "label.llm_base_url was renamed label.llm.base_url"),
     (["--label.llm_model", "m"], "label.llm_model was renamed label.llm.model"),
     (["--label.llm_source", "pool"], "label.llm_source was renamed label.llm.source"),
     (["--label.llm_max_tokens", "8"], "label.llm_max_tokens was renamed label.llm.max_tokens"),
     (["--label.llm_concurrency", "8"], "label.llm_concurrency was renamed label.llm.concurrency"),
     (["--label.top_k", "3"], "label.top_k was renamed label.llm.top_k"),
     (["--label.samples_per_view", "1"], "label.samples_per_view was renamed label.counterfactual.samples_per_view"),
     (["--label.cost_temperature", "0.5"], "label.cost_temperature was renamed label.counterfactual.cost_temperature"),
     (["--label.uninformative", "skip"], "label.uninformative was renamed label.counterfactual.uninformative"),
     (["--label.tie_break_temperature", "1"],
      "label.tie_break_temperature was renamed label.counterfactual.tie_break_temperature"),
     (["--label.page_token_temperature", "1"],
      "label.page_token_temperature was renamed label.counterfactual.page_token_temperature"),
     # One step budget (issue 42): GRPO's copy of it is gone, and says where it went.
     (["--grpo.max_steps", "8"], "grpo.max_steps was renamed agent.max_steps"),
     (["--agent.benchmark", "mind2web"], "agent.benchmark was renamed corpus.benchmark"),
     (["--label.rollin_games", "-1"], "label.rollin_games must be >= 0, got -1"),
     (["--policy.scripted.temperature", "-1"], "policy.scripted.temperature must be >= 0 (0 = greedy), got -1.0"),
     (["--policy.scripted.temperature", "warm"], "policy.scripted.temperature: expected a number, got 'warm'"),
     (["--policy.scripted.temp", "1"], "unknown setting(s) policy.scripted.temp; valid keys under policy.scripted: "
      "temperature, seed"),
     (["--policy.openai.temperature", "-1", "--policy.backend", "openai"], "policy.openai.temperature must be >= 0"),
     (["--rollout.group_timeout_s", "-5"],
      "rollout.group_timeout_s must be a positive finite number of seconds, got -5.0"),
     (["--rollout.group_timeout_s", "nan"], "rollout.group_timeout_s: expected a number, got 'nan'"),
     (["--rollout.group_timeout_s", "inf"], "rollout.group_timeout_s: expected a finite number, got 'inf'"),
     # These were accepted: a learning rate of 1e400 (infinity) made every weight nan.
     (["--grpo.lr", "1e400"], "grpo.lr: expected a finite number, got '1e400'"),
     (["--sft.lambda_cost", "inf"], "sft.lambda_cost: expected a finite number, got 'inf'"),
     # A typo in a device failed in a D1 labelling task, in a traceback, after minutes of work.
     (["--encoder.device", "cpux"], "encoder.device must be cpu, cuda or cuda:N, got 'cpux'"),
     (["--sft.device", "gpu"], "sft.device must be auto, cpu, cuda or cuda:N, got 'gpu'"),
     (["--grpo.device", "cuda:x"], "grpo.device must be auto, cpu, cuda or cuda:N, got 'cuda:x'"),
     (["--policy.hf.device", "cuda:"], "policy.hf.device must be auto, cpu, cuda or cuda:N, got 'cuda:'"),
     (["--policy.vllm.top_p", "0"], "policy.vllm.top_p must be in (0, 1] (1 = off), got 0.0"),
     # configs/local.yaml runs the policy in-process (num_replicas 0): hf there failed D1 in a
     # traceback ("D1 labelling runs on the policy pool, none was given") after the expert played.
     (["--policy.backend", "hf", "--policy.hf.model_path", "."],
      "policy.backend=hf runs in the Ray policy pool: policy.num_replicas must be >= 1, got 0"),
     # Read only by the vLLM replica: with the scripted policy a typo waited for the GPU node.
     (["--policy.vllm.dtype", "bf16"],
      "policy.vllm.dtype must be one of auto, half, float16, bfloat16, float, float32, got 'bf16'"),
     (["--policy.openai.top_p", "-1"], "policy.openai.top_p must be in (0, 1] (1 = off), got -1.0"),
     (["--policy.hf.top_p", "1.5"], "policy.hf.top_p must be in (0, 1] (1 = off), got 1.5"),
     (["--rollout.view_cache_size", "-1"], "rollout.phi_workers, view_workers, max_restarts and view_cache_size must"),
     (["--rollout.learner_threads", "-2"], "rollout.learner_threads must be an int >= 0, got -2"),
     (["--rollout.num_workers", "0"], "rollout.num_workers must be an int >= 1 or auto, got 0"),
     (["--rollout.env_slots_per_worker", "0"], "rollout.env_slots_per_worker and env_workers_per_rollout must be >= 1"),
     (["--run.call_timeout_s", "nan"], "run.call_timeout_s: expected a number, got 'nan'"),
     (["--run.ray_address", "10.0.0.1:6379"], "run.ray_address must be 'auto'"),
     (["--grpo.lr", "fast"], "grpo.lr: expected a number, got 'fast'"),
     # A core package's config names its class; the user set a key (GRPOConfig is grpo, and so on).
     (["--grpo.iterations", "0"], "grpo.iterations must be >= 1, got 0"),
     (["--grpo.clip_eps_low", "0.1"], "grpo: set both clip_eps_low and clip_eps_high"),
     (["--render.max_side", "500"], "render.max_side must be a multiple of 28"),
     (["--router.dropout", "1.5"], "router.dropout must be in [0, 1), got 1.5"),
     (["--sft.lambda_cost", "-1"], "sft.lambda_cost must be >= 0, got -1.0"),
     # Issue 40 item 7: a group of one trains nothing (every advantage is 0).
     (["--grpo.group_size", "1"],
      "grpo.group_size must be at least 2: GRPO's advantage is a reward minus its group's mean, so a group of 1 "
      "has advantage 0 and nothing trains; got 1"),
     (["--grpo.group_size", "0"], "grpo.group_size must be at least 2: "),
     (["--grpo.group_size", "-4"], "grpo.group_size must be at least 2: "),
     # A list setting names each thing once: a Mind2Web split listed twice ended the evaluation
     # after Ray and its workers had started, in "manifest episode ids must be unique".
     (["--corpus.benchmark", "mind2web", "--mind2web.eval_splits", "test_task,test_website,test_task"],
      "mind2web.eval_splits: 'test_task' is listed twice"),
     (["--corpus.benchmark", "ebalfred", "--ebalfred.subsets", "base,base"],
      "ebalfred.subsets: 'base' is listed twice"),
     # A seed numpy or torch refuses: --run.seed -1 trained a whole run, then ended in the final
     # evaluation's bootstrap ("expected non-negative integer"), in a traceback.
     (["--run.seed", "-1"], "run.seed: a seed is an integer from 0 to 2**63 - 1, got -1"),
     (["--grpo.seed", str(2**70)], f"grpo.seed: a seed is an integer from 0 to 2**63 - 1, got {2**70}"),
     (["--sft.seed", "-7"], "sft.seed: a seed is an integer from 0 to 2**63 - 1, got -7"),
     (["--corpus.seed", "-2"], "corpus.seed: a seed is an integer from 0 to 2**63 - 1, got -2"),
     (["--policy.openai.seed", "-1"], "policy.openai.seed: a seed is an integer from 0 to 2**63 - 1, got -1"),
     (["--policy.scripted.seed", "x"], "policy.scripted.seed: expected an integer, got 'x'")],
)  # fmt: skip
def test_bad_settings_are_rejected_when_the_config_is_read(overrides: list[str], message: str) -> None:
    with pytest.raises(ValueError) as err:
        load_config(PRESET, overrides)
    text = str(err.value)
    assert text.startswith(message) and "\n" not in text


@pytest.mark.parametrize("workers", [True, "many", 1.5, 0])
def test_rollout_num_workers_is_an_int_of_at_least_one_or_auto(workers: object) -> None:
    """What a YAML file or a caller can give that the command line's parser never sees."""
    with pytest.raises(ValueError, match=r"^rollout\.num_workers must be an int >= 1 or auto, got "):
        RolloutConfig(num_workers=workers)  # type: ignore[arg-type]
    assert RolloutConfig(num_workers="auto").elastic and not RolloutConfig(num_workers=1).elastic


def test_numbers_given_as_strings_reach_the_policy_as_numbers() -> None:
    # Issue 10: the string '0.5' used to reach ScriptedPolicy and fail there with a TypeError.
    cfg = load_config(PRESET, ["--policy.scripted.temperature", "0.5", "--policy.scripted.seed", "4"])
    assert cfg.policy.scripted == {"temperature": 0.5, "seed": 4}
    assert isinstance(cfg.policy.scripted["temperature"], float)
    policy = make_policy(cfg.policy, get_benchmark(cfg.corpus.benchmark).task_contract())
    assert (policy.temperature, policy.seed) == (0.5, 4)


def test_the_presets_load_and_list_the_scripted_keys() -> None:
    for preset in (PRESET, "configs/alfworld_paper.yaml"):
        load_config(preset)
    names = {name for name, _, _ in describe(type(load_config(PRESET)))}
    assert {"policy.scripted.temperature", "policy.scripted.seed", "rollout.group_timeout_s"} <= names


def test_benchmark_sections_come_from_the_registry_and_read_as_sections_of_the_tree(monkeypatch) -> None:
    """Issue 42 item 2: the config declares no benchmark's section; each benchmark declares its
    own (``Benchmark.section``) and the tree takes them from the registry, read and written as
    top-level sections (``--mind2web.eval_tasks``), so presets, checkpoints' config hashes and
    resumed runs see the same tree as before."""
    import pickle

    import cloudpickle

    from memprism_ray.config_tree import from_dict, to_dict
    from memprism_ray.registry import ENV_VAR, section_types

    types = section_types()
    assert {"alfworld", "ebalfred", "mind2web"} <= set(types)  # each benchmark declares its own
    cfg = load_config(None, ["--mind2web.eval_tasks", "3", "--ebalfred.fixture_episodes", "2"])
    assert cfg.mind2web.eval_tasks == 3 and cfg.ebalfred.fixture_episodes == 2
    assert type(cfg.mind2web) is types["mind2web"]
    tree = to_dict(cfg)
    assert "sections" not in tree and tree["mind2web"]["eval_tasks"] == 3 and tree["ebalfred"]["fixture_episodes"] == 2
    assert from_dict(ExperimentConfig, tree) == cfg
    assert pickle.loads(pickle.dumps(cfg)) == cfg and cloudpickle.loads(cloudpickle.dumps(cfg)) == cfg
    assert ExperimentConfig().mind2web == types["mind2web"]()  # defaults filled in
    moved = cfg.with_section("mind2web", dataclasses.replace(cfg.mind2web, eval_tasks=5))
    assert moved.mind2web.eval_tasks == 5 and cfg.mind2web.eval_tasks == 3 and moved.ebalfred == cfg.ebalfred
    with pytest.raises(AttributeError, match="no attribute or benchmark section 'mind2wbe'"):
        _ = cfg.mind2wbe
    with pytest.raises(ValueError, match=r"unknown setting\(s\) mind2wbe; valid keys: run, .*mind2web"):
        load_config(None, ["--mind2wbe.eval_tasks", "3"])
    with pytest.raises(ValueError, match=r"mind2web.eval_tasks and train_tasks must be >= 0"):
        load_config(None, ["--mind2web.eval_tasks", "-1"])
    with pytest.raises(ValueError, match=r"nope: not a benchmark settings section"):
        ExperimentConfig(sections={"nope": types["mind2web"]()})
    with pytest.raises(ValueError, match=r"ebalfred: not a benchmark settings section"):
        ExperimentConfig(sections={"ebalfred": types["mind2web"]()})
    # A benchmark registered outside the package that this process cannot import (a job script
    # inherits $MEMPRISM_BENCHMARKS from a shell that registered one): jobs that do not use it
    # run; naming its section is one line with the cause.
    registered = os.environ.get(ENV_VAR, "")  # the toy, when its test module was collected
    monkeypatch.setenv(ENV_VAR, ",".join(filter(None, [registered, "broken=no_such_module:Nope"])))
    assert load_config(None, ["--mind2web.eval_tasks", "3"]) == cfg.with_section("ebalfred", types["ebalfred"]())
    with pytest.raises(ValueError, match=r"^broken: benchmark 'broken': cannot load 'no_such_module:Nope' \(ModuleNot"):
        load_config(None, ["--broken.x", "1"])


def test_run_out_dir_expands_the_home_of_the_node_the_job_runs_on() -> None:
    """``ray job submit`` quotes its arguments, so ``--run.out_dir '~/runs'`` reaches the job as
    written: the head's home, not the submitting machine's."""
    cfg = load_config("configs/local.yaml", ["--run.out_dir", "~/runs", "--run.name", "a"])
    assert cfg.run.dir == Path.home() / "runs" / "a"


def test_conditions_are_kept_by_their_canonical_names() -> None:
    """A legacy view alias or ``recent:K`` names the condition its reports carry: the folders
    ``memprism compare`` pairs across runs are the same whichever name a run was given."""
    given = "recent:4,fixed:timeline,fixed_text:state_table/all/all/fine,memprism,constrained:tau=causal_chain,mem0"
    cfg = load_config(PRESET, ["--eval.conditions", given, "--eval.memory.base_url", "http://127.0.0.1:9/v1"])
    assert cfg.eval.conditions == (
        "recent4", "fixed:TemporalTrace", "fixed_text:EntityState/all/all/fine", "memprism",
        "constrained:tau=DependencyChain", "mem0",
    )  # fmt: skip
