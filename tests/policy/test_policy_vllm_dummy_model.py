"""The weightless Qwen2.5-VL model directory the GPU proofs load with load_format=dummy
(memprism_ray/testing/dummy_qwen.py): 7B sizes, Qwen token ids, processor files."""

from __future__ import annotations

from pathlib import Path

import pytest
from PIL import Image

from memprism_ray.policy.chat_format import IMAGE_PLACEHOLDER
from memprism_ray.testing.dummy_qwen import FIRST_SPECIAL_ID, SPECIAL_TOKENS, build_config, build_dummy_qwen25vl


def test_config_has_the_7b_shape() -> None:
    cfg = build_config("7b")
    t, v = cfg.text_config, cfg.vision_config
    assert (t.hidden_size, t.num_hidden_layers, t.num_attention_heads, t.num_key_value_heads) == (3584, 28, 28, 4)
    assert (t.intermediate_size, t.vocab_size) == (18944, 152064)
    assert (v.depth, v.hidden_size, v.intermediate_size, v.num_heads, v.out_hidden_size) == (32, 1280, 3420, 16, 3584)
    assert list(v.fullatt_block_indexes) == [7, 15, 23, 31]
    assert cfg.image_token_id == 151655 and cfg.video_token_id == 151656


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_dummy_qwen25vl(tmp_path_factory.mktemp("dummy") / "qwen", size="tiny")


def test_tokenizer_has_qwen_special_ids_and_decodes_any_id(model_dir: Path) -> None:
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(model_dir)
    assert len(tok) == FIRST_SPECIAL_ID + len(SPECIAL_TOKENS) == 151657
    assert tok.convert_tokens_to_ids(list(SPECIAL_TOKENS)) == list(range(151643, 151657))
    assert tok("hi <|im_end|>")["input_ids"] == [ord("h"), ord("i"), ord(" "), 151645]
    assert isinstance(tok.decode([0, 255, 300, 151000]), str)  # random ids from a random model decode
    text = tok.apply_chat_template(
        [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "act"}]}],
        tokenize=False,
        add_generation_prompt=True,
    )
    assert IMAGE_PLACEHOLDER + "act<|im_end|>" in text and text.endswith("<|im_start|>assistant\n")


def test_processor_files_load_and_size_a_view_image(model_dir: Path) -> None:
    from transformers import Qwen2VLImageProcessor

    ip = Qwen2VLImageProcessor.from_pretrained(model_dir)
    grid = ip(images=[Image.new("RGB", (672, 392))])["image_grid_thw"].tolist()
    assert grid == [[1, 28, 48]]  # 392/14 x 672/14 patches -> 336 visual tokens after 2x2 merge
    assert build_dummy_qwen25vl(model_dir, size="tiny") == model_dir  # idempotent
