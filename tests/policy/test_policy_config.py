"""Task-policy settings are validated when built (issue 10 item 2): typed scripted keyword
settings, temperatures, and whether the chosen backend can run on this machine."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

from memprism_ray.policy.config import HFConfig, OpenAIConfig, PolicyConfig, VLLMConfig


def test_scripted_settings_are_coerced_and_checked_even_when_built_in_code() -> None:
    assert PolicyConfig(scripted={"temperature": "0.5", "seed": "2"}).scripted == {"temperature": 0.5, "seed": 2}
    assert PolicyConfig().scripted == {}  # the scripted policy's own defaults apply
    with pytest.raises(ValueError, match=r"^policy\.scripted\.temperature must be >= 0 \(0 = greedy\), got -0\.1$"):
        PolicyConfig(scripted={"temperature": -0.1})
    with pytest.raises(ValueError, match=r"^unknown setting\(s\) policy\.scripted\.top_p; valid keys under"):
        PolicyConfig(scripted={"top_p": 0.9})


@pytest.mark.parametrize(
    ("backend", "key"), [(VLLMConfig, r"policy\.vllm"), (OpenAIConfig, r"policy\.openai"), (HFConfig, r"policy\.hf")]
)
@pytest.mark.parametrize("temperature", [-1.0, float("nan")])
def test_backend_decoding_is_checked_under_the_backends_own_key(backend: type, key: str, temperature: float) -> None:
    """One decoding rule for every model backend (``Decoding``), its errors naming the key a
    user sets (``policy.<backend>.temperature``)."""
    with pytest.raises(ValueError, match=rf"^{key}\.temperature must be >= 0"):
        backend(temperature=temperature)
    with pytest.raises(ValueError, match=rf"^{key}\.max_tokens must be >= 1, got 0$"):
        backend(max_tokens=0)
    with pytest.raises(ValueError, match=rf"^{key}: need 1 <= min_pixels <= max_pixels, got 10 and 9$"):
        backend(min_pixels=10, max_pixels=9)


def test_a_backend_that_cannot_run_here_says_how_to_fix_it(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "vllm" else real(name, *a))
    vllm = PolicyConfig(backend="vllm", gpus_per_replica=1.0)
    problem = vllm.unavailable_here()
    assert problem is not None and "\n" not in problem
    assert problem.startswith("policy.backend=vllm needs vLLM, which is not importable here")
    assert "clusters/node_setup.sh install gpu" in problem and "--policy.backend openai|hf|scripted" in problem
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: object() if name == "vllm" else real(name, *a))
    assert vllm.unavailable_here() is None
    hf = PolicyConfig(backend="hf", hf=HFConfig(model_path=str(tmp_path / "missing")))
    assert "is not a local model directory here" in (hf.unavailable_here() or "")
    assert PolicyConfig(backend="hf", hf=HFConfig(model_path=str(tmp_path))).unavailable_here() is None
    assert PolicyConfig().unavailable_here() is None
