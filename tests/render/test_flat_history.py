"""The AgentOCR (w/o RL) flat history image (paper appendix "Optical baseline scope"):
AgentOCR's ALFWorld format and settings, deterministic bytes, visual tokens counted like
every other image."""

from __future__ import annotations

import hashlib

import numpy as np
import pytest

from memprism_ray.formats.history import HistoryRecord
from memprism_ray.render.flat_history import (
    FlatHistoryConfig,
    _font,
    format_flat_history,
    render_flat_history,
    wrap_fast,
)
from memprism_ray.render.visual_tokens import qwen25vl_tokens


def _history(n: int) -> list[HistoryRecord]:
    return [
        HistoryRecord(
            i,
            f"You arrive at cabinet {i}.\nOn the cabinet {i}, you see a mug {i}, a plate {i + 1}, and a knife 3.",
            f"go to cabinet {i + 1}",
            f"You arrive at cabinet {i + 1}.",
        )
        for i in range(n)
    ]


def test_lines_are_agentocr_memory_lines() -> None:
    text = format_flat_history(_history(3))
    lines = text.split("\n")
    assert len(lines) == 3
    assert lines[0] == (
        "[Observation]: You arrive at cabinet 0. On the cabinet 0, you see a mug 0, a plate 1, and a knife 3. "
        "[Action]: go to cabinet 1"
    )
    # the feedback is not a field of AgentOCR's line: it is the next step's observation
    assert "Result" not in text


def test_only_the_last_history_length_steps_are_drawn() -> None:
    text = format_flat_history(_history(60), 50)
    lines = text.split("\n")
    assert len(lines) == 50
    assert lines[0].startswith("[Observation]: You arrive at cabinet 10.")
    assert render_flat_history(_history(60)).steps == 50


def test_image_size_follows_agentocr_layout() -> None:
    cfg = FlatHistoryConfig()
    _, avg_char, line_height = _font(cfg.font_size)
    max_chars = int(cfg.width / avg_char)
    hist = _history(7)
    rows = sum(len(wrap_fast(line, max_chars)) for line in format_flat_history(hist).split("\n"))
    out = render_flat_history(hist, cfg)
    assert out.image.size == (cfg.width + 2 * cfg.padding, rows * line_height + 2 * cfg.padding)
    assert out.image.size[0] == 402
    assert out.visual_tokens == qwen25vl_tokens(out.image.width, out.image.height)
    # the border is white, the body has black text and the two highlight colours
    arr = np.asarray(out.image)
    assert (arr[: cfg.padding] == 255).all() and (arr[:, -cfg.padding :] == 255).all()
    colours = {tuple(c) for c in arr.reshape(-1, 3)}
    assert (0, 0, 255) in colours and (255, 0, 0) in colours and (0, 0, 0) in colours


def test_no_history_is_a_blank_28_px_image_with_the_border() -> None:
    out = render_flat_history([])
    assert out.image.size == (38, 38)
    assert (np.asarray(out.image) == 255).all()
    assert out.steps == 0


def test_rendering_is_deterministic_and_depends_on_the_content() -> None:
    a = render_flat_history(_history(12)).image.tobytes()
    b = render_flat_history(_history(12)).image.tobytes()
    assert hashlib.sha256(a).hexdigest() == hashlib.sha256(b).hexdigest()
    changed = _history(12)
    changed[5] = HistoryRecord(5, changed[5].observation, "take mug 5 from cabinet 5", changed[5].feedback)
    assert render_flat_history(changed).image.tobytes() != a


def test_wrap_keeps_short_lines_and_cuts_long_words() -> None:
    assert wrap_fast("a  b", 10) == ["a  b"]  # short: verbatim
    assert wrap_fast("aaa bbb ccc", 7) == ["aaa bbb", "ccc"]
    assert wrap_fast("x" * 10, 4) == ["xxxx", "xxxx", "xx"]


@pytest.mark.parametrize(
    "kwargs", [{"font_size": 5}, {"width": 2000}, {"padding": -1}, {"history_length": 0}, {"min_side": 0}]
)
def test_bad_config_is_rejected(kwargs) -> None:
    with pytest.raises(ValueError, match="FlatHistoryConfig"):
        FlatHistoryConfig(**kwargs)
