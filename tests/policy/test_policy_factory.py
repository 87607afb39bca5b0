"""make_policy and the policy config tree."""

from __future__ import annotations

import sys
import types

import pytest

from memprism_ray.benchmark.alfworld.contract import ALFWORLD
from memprism_ray.benchmark.alfworld.scripted import ScriptedPolicy
from memprism_ray.benchmark.mind2web.contract import MIND2WEB
from memprism_ray.benchmark.mind2web.stand_in import Mind2WebScriptedPolicy
from memprism_ray.config_tree import from_dict, parse_overrides
from memprism_ray.policy.base import PolicyInput, PolicyOutput, TaskPolicy
from memprism_ray.policy.config import PolicyConfig, VLLMConfig
from memprism_ray.policy.contract import TaskContract
from memprism_ray.policy.factory import make_policy, needs_view_text
from memprism_ray.policy.openai_backend import OpenAIChatPolicy


def test_openai_backend_from_a_dotted_override_tree() -> None:
    data = parse_overrides(
        ["--backend", "openai", "--openai.base_url", "http://127.0.0.1:9999/v1", "--openai.max_retries", "2"]
    )
    cfg = from_dict(PolicyConfig, data)
    policy = make_policy(cfg, ALFWORLD)
    assert isinstance(policy, OpenAIChatPolicy) and isinstance(policy, TaskPolicy)
    assert policy.client.base_url == "http://127.0.0.1:9999/v1" and policy.config.max_retries == 2
    policy.close()
    assert cfg.decoding()["backend"] == "openai" and cfg.decoding()["temperature"] == 0.0


def test_config_rejects_bad_combinations() -> None:
    with pytest.raises(ValueError, match=r"policy\.backend must be one of"):
        PolicyConfig(backend="gpt")
    with pytest.raises(ValueError, match="gpus_per_replica"):
        PolicyConfig(backend="vllm", gpus_per_replica=0)
    assert PolicyConfig(backend="vllm", gpus_per_replica=2, vllm=VLLMConfig(tensor_parallel_size=2)).backend == "vllm"
    with pytest.raises(ValueError, match=r"gpus_per_replica >= vllm\.tensor_parallel_size"):
        PolicyConfig(backend="vllm", gpus_per_replica=1, vllm=VLLMConfig(tensor_parallel_size=2))
    with pytest.raises(ValueError, match="max_pixels"):
        VLLMConfig(min_pixels=10_000, max_pixels=100)
    with pytest.raises(ValueError, match="unknown setting"):
        from_dict(PolicyConfig, {"vllm": {"max_pixel": 5}})


class _Echo:
    name = "scripted"

    def __init__(self, temperature: float = 1.0, seed: int = 0) -> None:
        self.temperature, self.seed = temperature, seed

    @classmethod
    def from_config(cls, config: PolicyConfig) -> _Echo:
        return cls(**config.scripted)

    def act(self, inputs):
        return [PolicyOutput(text="", action=i.admissible[0], valid=True) for i in inputs]


class _Contract(TaskContract):
    """A benchmark's contract whose stand-in lives in the (fake) module ``fake_stand_in``."""

    name = "alfworld"
    stand_in = "fake_stand_in:Policy"


def _fake_module(monkeypatch: pytest.MonkeyPatch, **attrs) -> None:
    module = types.ModuleType("fake_stand_in")
    for k, v in attrs.items():
        setattr(module, k, v)
    monkeypatch.setitem(sys.modules, "fake_stand_in", module)


def test_the_scripted_policy_is_the_contracts_stand_in(monkeypatch: pytest.MonkeyPatch) -> None:
    _fake_module(monkeypatch, Policy=_Echo)
    policy = make_policy(PolicyConfig(backend="scripted", scripted={"temperature": 0.5, "seed": 7}), _Contract())
    assert isinstance(policy, _Echo) and policy.temperature == 0.5 and policy.seed == 7
    assert policy.act([PolicyInput("alfworld", "g", "o", admissible=("look",))])[0].action == "look"
    # A misspelt key never reaches the policy: the config rejects it (issue 10).
    with pytest.raises(ValueError, match=r"unknown setting\(s\) policy\.scripted\.temprature"):
        PolicyConfig(backend="scripted", scripted={"temprature": 0.5})
    assert make_policy(PolicyConfig(backend="scripted"), ALFWORLD).__class__ is ScriptedPolicy
    assert make_policy(PolicyConfig(backend="scripted"), MIND2WEB).__class__ is Mind2WebScriptedPolicy
    # Whether it reads the view's text, without building it (the rollout workers are told).
    assert needs_view_text(PolicyConfig(backend="scripted"), ALFWORLD)
    assert not needs_view_text(PolicyConfig(backend="openai"), ALFWORLD)


def test_scripted_errors_are_clear(monkeypatch: pytest.MonkeyPatch) -> None:
    _fake_module(monkeypatch, Policy=type("NotAPolicy", (), {"from_config": classmethod(lambda cls, c: cls())}))
    with pytest.raises(ValueError, match="does not implement TaskPolicy"):
        make_policy(PolicyConfig(backend="scripted"), _Contract())


def test_importing_the_package_stays_light() -> None:
    import subprocess

    code = (
        "import sys, memprism_ray.policy; "
        "print(sorted(m for m in ('httpx', 'transformers', 'torch', 'vllm', 'ray') if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"
