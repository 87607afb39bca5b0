"""transformers backend on a tiny randomly initialised Qwen2.5-VL built here (no downloads).

Its output is random text, so these tests check the plumbing: placeholder expansion per
image, token accounting, parsing marks the output invalid, batching, no crash.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from PIL import Image

from memprism_ray.benchmark import get_benchmark
from memprism_ray.policy.base import PolicyInput
from memprism_ray.policy.chat_format import QWEN2_VL_CHAT_TEMPLATE
from memprism_ray.policy.config import HFConfig, PolicyConfig
from memprism_ray.policy.factory import make_policy
from memprism_ray.policy.tokens import count_visual_tokens

SPECIALS = [
    "<|endoftext|>",
    "<|im_start|>",
    "<|im_end|>",
    "<|vision_start|>",
    "<|vision_end|>",
    "<|image_pad|>",
    "<|video_pad|>",
]


def build_tiny_qwen25vl(path: Path) -> None:
    import torch
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast, Qwen2_5_VLConfig, Qwen2_5_VLForConditionalGeneration
    from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import Qwen2VLImageProcessorPil

    # Byte-level BPE without merges: every string tokenizes, one token per byte.
    alphabet = sorted(pre_tokenizers.ByteLevel.alphabet())
    tok = Tokenizer(models.BPE(vocab={c: i for i, c in enumerate(alphabet)}, merges=[]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens(SPECIALS)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok, eos_token="<|im_end|>", pad_token="<|endoftext|>", chat_template=QWEN2_VL_CHAT_TEMPLATE
    )
    fast.save_pretrained(path)
    Qwen2VLImageProcessorPil(min_pixels=3136, max_pixels=12845056).save_pretrained(path)
    ids = {s: fast.convert_tokens_to_ids(s) for s in SPECIALS}
    cfg = Qwen2_5_VLConfig(
        text_config={
            "vocab_size": len(fast),
            "hidden_size": 32,
            "intermediate_size": 64,
            "num_hidden_layers": 1,
            "num_attention_heads": 2,
            "num_key_value_heads": 1,
            "max_position_embeddings": 8192,
            "rope_scaling": {"type": "mrope", "mrope_section": [2, 3, 3]},
            "eos_token_id": ids["<|im_end|>"],
            "pad_token_id": ids["<|endoftext|>"],
        },
        vision_config={
            "depth": 1,
            "hidden_size": 32,
            "intermediate_size": 64,
            "num_heads": 2,
            "out_hidden_size": 32,
            "patch_size": 14,
            "spatial_merge_size": 2,
            "temporal_patch_size": 2,
            "window_size": 112,
            "fullatt_block_indexes": [0],
        },
        image_token_id=ids["<|image_pad|>"],
        video_token_id=ids["<|video_pad|>"],
        vision_start_token_id=ids["<|vision_start|>"],
        vision_end_token_id=ids["<|vision_end|>"],
    )
    torch.manual_seed(0)
    model = Qwen2_5_VLForConditionalGeneration(cfg)
    model.generation_config.eos_token_id = ids["<|im_end|>"]
    model.generation_config.pad_token_id = ids["<|endoftext|>"]
    model.save_pretrained(path)


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("tiny-qwen25vl")
    build_tiny_qwen25vl(path)
    return path


VIEW = Image.new("RGB", (224, 168), "white")
CAM = Image.new("RGB", (112, 112), "gray")
INPUTS = [
    PolicyInput(
        "alfworld", "put a mug in desk", "You see a desk 1.", admissible=("look", "go to desk 1"), view_image=VIEW
    ),
    PolicyInput(
        "ebalfred",
        "Put a pan on the counter",
        "Pan visible.",
        admissible=("find a Pan",),
        camera_image=CAM,
        view_image=VIEW,
    ),
    PolicyInput("mind2web", "book a flight", "<a [ref=e1]>Home</a>", view_text="step 1 | CLICK e1"),
]


@pytest.mark.slow
def test_tiny_vlm_plumbing(tiny_model: Path) -> None:
    config = PolicyConfig(
        backend="hf", hf=HFConfig(model_path=str(tiny_model), max_tokens=6, batch_size=2, max_pixels=672 * 672)
    )
    # A policy speaks its benchmark's task contract: one per benchmark of the inputs.
    policies = {inp.benchmark: make_policy(config, get_benchmark(inp.benchmark).task_contract()) for inp in INPUTS}
    policy = policies["mind2web"]
    assert policy.name == "hf"
    outs = [policies[inp.benchmark].act([inp])[0] for inp in INPUTS]
    assert len(policies["alfworld"].act([INPUTS[0]] * 3)) == 3  # two batches of batch_size 2
    for inp, out in zip(INPUTS, outs, strict=False):
        # Random weights: whatever it says, the parser rejects it with a reason, no crash.
        assert not out.valid and out.action is None and out.error
        assert 1 <= out.completion_tokens <= 6
        assert out.latency_s > 0
        # Placeholder expansion agrees with the smart_resize rule used for accounting.
        assert out.visual_tokens == count_visual_tokens(inp.images(), max_pixels=672 * 672)
    assert outs[0].visual_tokens == 8 * 6 + 2
    assert outs[1].visual_tokens == (8 * 6 + 2) + (4 * 4 + 2)
    assert outs[2].visual_tokens == 0

    # Prompt tokens are the real (unpadded) input ids: one per byte plus special and image tokens.
    messages, _ = policy.contract.build_messages(INPUTS[2])
    text = policy.tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    assert outs[2].prompt_tokens == len(policy.tokenizer(text)["input_ids"])
    assert outs[0].prompt_tokens > outs[0].visual_tokens

    # Greedy decoding is deterministic.
    again = policy.act([INPUTS[2]])[0]
    assert again.text == outs[2].text and again.prompt_tokens == outs[2].prompt_tokens


def test_bad_model_path_is_a_clear_error(tmp_path: Path) -> None:
    from memprism_ray.policy.hf_backend import HFPolicy

    with pytest.raises(ValueError, match="not a local model directory"):
        HFPolicy(HFConfig(model_path=str(tmp_path / "missing")), get_benchmark("alfworld").task_contract())
    with pytest.raises(ValueError, match="model_path"):
        PolicyConfig(backend="hf")
