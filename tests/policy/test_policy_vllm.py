"""vLLM requests and engine settings (no vLLM needed; memprism_ray/policy/vllm_backend.py)."""

from __future__ import annotations

import pytest
from PIL import Image

from memprism_ray.benchmark.alfworld.contract import ALFWORLD
from memprism_ray.benchmark.ebalfred.contract import EBALFRED
from memprism_ray.policy.base import PolicyInput
from memprism_ray.policy.chat_format import IMAGE_PLACEHOLDER
from memprism_ray.policy.config import VLLMConfig
from memprism_ray.policy.vllm_backend import build_vllm_request, engine_kwargs, sampling_kwargs

VIEW = Image.new("RGB", (672, 672), "white")
CAM = Image.new("RGB", (224, 224), "gray")


def alf(**kw) -> PolicyInput:
    return PolicyInput("alfworld", "put a mug in desk", "You see a desk 1.", admissible=("look", "go to desk 1"), **kw)


def test_engine_and_sampling_kwargs_follow_the_notes() -> None:
    cfg = VLLMConfig(model="/models/qwen", limit_mm_per_prompt=2, max_model_len=8192)
    kw = engine_kwargs(cfg)
    assert kw["limit_mm_per_prompt"] == {"image": 2}
    assert kw["mm_processor_kwargs"]["max_pixels"] == 672 * 672 == 451584
    assert kw["model"] == "/models/qwen" and kw["max_model_len"] == 8192
    greedy = sampling_kwargs(cfg)
    assert greedy["temperature"] == 0.0 and greedy["top_p"] == 1.0 and greedy["max_tokens"] == 512
    hot = sampling_kwargs(VLLMConfig(temperature=0.7, top_p=0.9, seed=3))
    assert hot == {"temperature": 0.7, "top_p": 0.9, "max_tokens": 512, "seed": 3}


def test_request_has_one_placeholder_per_image_in_prompt_order() -> None:
    req = build_vllm_request(alf(view_image=VIEW), ALFWORLD, limit_images=2)
    assert req["prompt"].count(IMAGE_PLACEHOLDER) == 1
    assert req["multi_modal_data"] == {"image": [VIEW]}
    assert req["prompt"].index(IMAGE_PLACEHOLDER) < req["prompt"].index("You are an expert agent")

    eb = PolicyInput("ebalfred", "g", "o", admissible=("find a Pan",), camera_image=CAM, view_image=VIEW)
    req = build_vllm_request(eb, EBALFRED, limit_images=2)
    assert req["prompt"].count(IMAGE_PLACEHOLDER) == 2
    assert req["multi_modal_data"]["image"] == [CAM, VIEW]

    text_only = build_vllm_request(alf(view_text="step 1 | look"), ALFWORLD, limit_images=2)
    assert "multi_modal_data" not in text_only and IMAGE_PLACEHOLDER not in text_only["prompt"]
    with pytest.raises(ValueError, match="limit_mm_per_prompt"):
        build_vllm_request(eb, EBALFRED, limit_images=1)


def test_gpu_requirements_pin_the_named_vllm_and_keep_the_other_runtime_pins() -> None:
    """requirements/gpu.txt (GPU nodes) = vLLM 0.24.0 with the torch it pins + every other
    runtime pin of pyproject.toml that fits vLLM's stack (all but torch and numpy), so GPU and
    CPU nodes run the same project stack."""
    import re
    from pathlib import Path

    tomllib = pytest.importorskip("tomllib")  # Python >= 3.11

    root = Path(__file__).resolve().parents[2]
    project = tomllib.loads((root / "pyproject.toml").read_text())["project"]
    lines = [ln.strip() for ln in (root / "requirements" / "gpu.txt").read_text().splitlines()]
    reqs = {re.split(r"[=<>\[]", ln)[0].lower(): ln for ln in lines if ln and not ln.startswith("#")}
    assert project["optional-dependencies"]["vllm"] == [reqs["vllm"]] == ["vllm==0.24.0"]
    assert reqs["torch"] == "torch==2.11.0"  # vllm 0.24.0's exact pin, not pyproject's CPU torch
    for dep in project["dependencies"]:
        name = re.split(r"[=<>\[]", dep)[0].lower()
        if name == "numpy":  # vllm 0.24.0 -> mistral-common caps numpy<2.4 on Python < 3.13
            assert name not in reqs
        elif name != "torch":
            assert reqs.get(name) == dep, f"requirements/gpu.txt lacks pyproject's {dep}"


# --- scheduler parity (issue 31) ------------------------------------------------------------------
def test_engines_get_an_explicit_scheduler_not_the_usage_context_default() -> None:
    """vLLM 0.24 gives vllm.LLM 16,384 tokens / 1,024 sequences a step on a large GPU and
    AsyncLLM.from_engine_args 2,048 / 128: both engines now get the same explicit values."""
    kw = engine_kwargs(VLLMConfig())
    assert kw["max_num_batched_tokens"] == 16384 and kw["max_num_seqs"] == 1024
    vendor = engine_kwargs(VLLMConfig(max_num_batched_tokens=0, max_num_seqs=0))
    assert "max_num_batched_tokens" not in vendor and "max_num_seqs" not in vendor  # 0: vLLM decides
    budget = r"^policy\.vllm\.max_num_batched_tokens \(512\) must be >= policy\.vllm\.max_num_seqs \(1024\)"
    with pytest.raises(ValueError, match=budget):
        VLLMConfig(max_num_batched_tokens=512)
    with pytest.raises(ValueError, match="frontend_threads must be >= 0"):
        VLLMConfig(frontend_threads=-1)


def test_the_async_engine_is_built_with_the_config_scheduler(monkeypatch: pytest.MonkeyPatch) -> None:
    """build_async_engine passes engine_kwargs to AsyncEngineArgs (stand-in vLLM modules)."""
    import sys
    import types

    from memprism_ray.policy.vllm_async import build_async_engine

    seen: dict = {}

    class AsyncEngineArgs:
        def __init__(self, **kw) -> None:
            seen["args"] = kw

    class AsyncLLM:
        @classmethod
        def from_engine_args(cls, args, **kw):
            seen["context"] = kw
            return "engine"

    for name, attrs in {
        "vllm": {},
        "vllm.engine": {},
        "vllm.engine.arg_utils": {"AsyncEngineArgs": AsyncEngineArgs},
        "vllm.v1": {},
        "vllm.v1.engine": {},
        "vllm.v1.engine.async_llm": {"AsyncLLM": AsyncLLM},
    }.items():
        monkeypatch.setitem(sys.modules, name, types.SimpleNamespace(**attrs))
    assert build_async_engine(VLLMConfig(model="/m", max_num_seqs=256)) == "engine"
    assert seen["args"]["max_num_batched_tokens"] == 16384 and seen["args"]["max_num_seqs"] == 256
    assert seen["args"]["model"] == "/m" and seen["args"]["enable_prefix_caching"] is True


def test_prompt_layout_is_a_policy_setting_for_the_vllm_backend() -> None:
    from memprism_ray.policy.config import PolicyConfig

    cfg = PolicyConfig(backend="vllm", gpus_per_replica=1.0, prompt_layout="instructions_first")
    assert cfg.decoding()["prompt_layout"] == "instructions_first"
    assert "prompt_layout" not in PolicyConfig().decoding()  # the paper's manifests are unchanged
    with pytest.raises(ValueError, match="prompt_layout must be one of paper, instructions_first"):
        PolicyConfig(prompt_layout="sideways")
    with pytest.raises(ValueError, match=r"implemented for policy\.backend=vllm only"):
        PolicyConfig(backend="scripted", prompt_layout="instructions_first")
    prompt = build_vllm_request(alf(view_image=VIEW), ALFWORLD, limit_images=2, layout="instructions_first")["prompt"]
    assert prompt.index("You are an expert agent") < prompt.index(IMAGE_PLACEHOLDER)
