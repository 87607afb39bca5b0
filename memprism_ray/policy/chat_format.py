"""Qwen2-VL / Qwen2.5-VL chat formatting (paper "Experiment Setup": the frozen task VLM is
Qwen2.5-VL-7B-Instruct; notes: one vision placeholder per image in the chat prompt).
:func:`format_qwen_chat` renders :data:`QWEN2_VL_CHAT_TEMPLATE` in plain Python (tests check they agree)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

IMAGE_PLACEHOLDER = "<|vision_start|><|image_pad|><|vision_end|>"
DEFAULT_SYSTEM = "You are a helpful assistant."

QWEN2_VL_CHAT_TEMPLATE = (
    "{% set image_count = namespace(value=0) %}{% set video_count = namespace(value=0) %}"
    "{% for message in messages %}{% if loop.first and message['role'] != 'system' %}"
    "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n{% endif %}"
    "<|im_start|>{{ message['role'] }}\n"
    "{% if message['content'] is string %}{{ message['content'] }}<|im_end|>\n"
    "{% else %}{% for content in message['content'] %}"
    "{% if content['type'] == 'image' or 'image' in content or 'image_url' in content %}"
    "{% set image_count.value = image_count.value + 1 %}"
    "{% if add_vision_id %}Picture {{ image_count.value }}: {% endif %}"
    "<|vision_start|><|image_pad|><|vision_end|>"
    "{% elif content['type'] == 'video' or 'video' in content %}"
    "{% set video_count.value = video_count.value + 1 %}"
    "{% if add_vision_id %}Video {{ video_count.value }}: {% endif %}"
    "<|vision_start|><|video_pad|><|vision_end|>"
    "{% elif 'text' in content %}{{ content['text'] }}{% endif %}{% endfor %}<|im_end|>\n"
    "{% endif %}{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


def format_qwen_chat(messages: Sequence[dict[str, Any]], add_generation_prompt: bool = True) -> str:
    """The Qwen2-VL chat prompt of ``messages`` (text and ``{"type": "image"}`` parts)."""
    out: list[str] = []
    for i, message in enumerate(messages):
        role = message["role"]
        if i == 0 and role != "system":
            out.append(f"<|im_start|>system\n{DEFAULT_SYSTEM}<|im_end|>\n")
        out.append(f"<|im_start|>{role}\n")
        content = message["content"]
        if isinstance(content, str):
            out.append(content)
        else:
            for part in content:
                kind = part.get("type")
                if kind in ("image", "image_url") or "image" in part or "image_url" in part:
                    out.append(IMAGE_PLACEHOLDER)
                elif "text" in part:
                    out.append(part["text"])
                else:
                    raise ValueError(f"unsupported chat content part type {kind!r}")
        out.append("<|im_end|>\n")
    if add_generation_prompt:
        out.append("<|im_start|>assistant\n")
    return "".join(out)
