"""The plain-Python Qwen2-VL chat formatter agrees with the checkpoint's Jinja template."""

from __future__ import annotations

import jinja2.sandbox
import pytest
from PIL import Image

from memprism_ray.benchmark import get_benchmark
from memprism_ray.policy.base import PolicyInput
from memprism_ray.policy.chat_format import IMAGE_PLACEHOLDER, QWEN2_VL_CHAT_TEMPLATE, format_qwen_chat


def render_jinja(messages: list[dict]) -> str:
    env = jinja2.sandbox.ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
    return env.from_string(QWEN2_VL_CHAT_TEMPLATE).render(messages=messages, add_generation_prompt=True)


IMG = Image.new("RGB", (28, 28))
CASES = [
    PolicyInput("alfworld", "put {a} mug", "obs", admissible=("look",), view_image=IMG),
    PolicyInput("alfworld", "g", "obs", admissible=("look",), view_text="view\nlines"),
    PolicyInput("ebalfred", "g", "obs", admissible=("find a Pan",), view_image=IMG, camera_image=IMG),
    PolicyInput("mind2web", "g", "[ref=e1]", view_image=IMG),
]


@pytest.mark.parametrize("inp", CASES, ids=lambda i: f"{i.benchmark}-{i.view_mode}")
def test_formatter_matches_the_jinja_template(inp: PolicyInput) -> None:
    messages, images = get_benchmark(inp.benchmark).task_contract().build_messages(inp)
    text = format_qwen_chat(messages)
    assert text == render_jinja(messages)
    assert text.count(IMAGE_PLACEHOLDER) == len(images)
    assert text.startswith("<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n<|im_start|>user\n")
    assert text.endswith("<|im_end|>\n<|im_start|>assistant\n")


def test_string_content_and_explicit_system() -> None:
    messages = [{"role": "system", "content": "S"}, {"role": "user", "content": "hi"}]
    assert format_qwen_chat(messages) == render_jinja(messages)
    assert format_qwen_chat(messages).startswith("<|im_start|>system\nS<|im_end|>")
    with pytest.raises(ValueError, match="unsupported"):
        format_qwen_chat([{"role": "user", "content": [{"type": "audio"}]}])
