"""The whole history drawn flat as one image: the AgentOCR (w/o RL) optical-history baseline
(paper appendix "Optical baseline scope" and "ALFWorld comparison with AgentOCR (w/o RL)").

AgentOCR's ALFWorld runs (github.com/langfengQ/AgentOCR ``run_alfworld.sh``:
``env.history_length=50``, ``ocr.font_size=10``, ``ocr.max_width=392``, the other ``ocr`` keys at
their ``ppo_trainer.yaml`` defaults, ``HIGHLIGHT_CONFIGS='[Observation]:0,0,255;[Action]:255,0,0'``)
render one line per step, ``[Observation]: <o_pre> [Action]: <action>``, each wrapped at
``int(392 / average character width)`` characters, stacked, with a 5 px border; no compression
(the "w/o RL" setting). This re-implements that layout (no code copied) with DejaVu Sans Mono
from matplotlib, loaded with ``ImageFont.Layout.BASIC``: the same bytes on every machine with
the pinned Pillow.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from functools import lru_cache

from PIL import Image, ImageDraw, ImageFont, ImageOps

from memprism_ray.config_tree import field as cfg_field
from memprism_ray.formats.history import HistoryRecord
from memprism_ray.render.config import check_int
from memprism_ray.render.font import font_path
from memprism_ray.render.visual_tokens import qwen25vl_tokens

#: AgentOCR's sample string for the average character width and the line height.
_METRIC_SAMPLE = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789 .,;:!?()[]{}@#$%^&*-_=+/\\"

OBSERVATION_TAG = "[Observation]:"
ACTION_TAG = "[Action]:"


@dataclass(frozen=True)
class FlatHistoryConfig:
    """AgentOCR's ALFWorld rendering settings (see the module docstring for their source)."""

    font_size: int = cfg_field(10, help="DejaVu Sans Mono pixel size (AgentOCR ocr.font_size)")
    width: int = cfg_field(392, help="text width in pixels before the border (ocr.max_width)")
    padding: int = cfg_field(5, help="white border added around the stacked lines (ocr.padding)")
    min_side: int = cfg_field(28, help="side of the blank image without history (ocr.min_*)")
    max_segment_height: int = cfg_field(
        4096, help="cap on one step's rendered height; lines past it are cut (ocr.max_height)"
    )
    history_length: int = cfg_field(50, help="most recent steps drawn (env.history_length)")
    highlight: bool = cfg_field(True, help="draw [Observation]: blue and [Action]: red (HIGHLIGHT_CONFIGS)")

    def __post_init__(self) -> None:
        check_int(self, "font_size", 6, 32)
        check_int(self, "width", 28, 1024)
        check_int(self, "padding", 0, 64)
        check_int(self, "min_side", 1)
        check_int(self, "max_segment_height", self.font_size)
        check_int(self, "history_length", 1)


@dataclass(frozen=True)
class FlatHistoryImage:
    """A rendered flat history: the image, the text it shows and what it costs the VLM."""

    image: Image.Image
    text: str
    steps: int
    visual_tokens: int


def format_flat_history(history: Sequence[HistoryRecord], history_length: int = 50) -> str:
    """The last ``history_length`` steps as AgentOCR's ``SimpleMemory.fetch`` lines."""
    lines = []
    for rec in list(history)[-history_length:] if history_length > 0 else []:
        obs = rec.observation.replace("\n", " ")
        act = rec.action.replace("\n", " ")
        lines.append(f"{OBSERVATION_TAG} {obs} {ACTION_TAG} {act}")
    return "\n".join(lines)


@lru_cache(maxsize=8)
def _font(size: int) -> tuple[ImageFont.FreeTypeFont, float, int]:
    font = ImageFont.truetype(str(font_path()), size, layout_engine=ImageFont.Layout.BASIC)
    left, top, right, bottom = font.getbbox(_METRIC_SAMPLE)
    avg_char = (right - left) / len(_METRIC_SAMPLE)
    return font, avg_char, int((bottom - top) * 1.2)


def wrap_fast(text: str, max_chars: int) -> list[str]:
    """AgentOCR's character-count wrap (``wrap_text_fast``) of one segment."""
    out: list[str] = []
    for paragraph in text.split("\n"):
        paragraph = paragraph.strip()
        if not paragraph:
            out.append("")
            continue
        if len(paragraph) <= max_chars:
            out.append(paragraph)
            continue
        line = ""
        for word in paragraph.split():
            candidate = f"{line} {word}" if line else word
            if len(candidate) <= max_chars:
                line = candidate
                continue
            if line:
                out.append(line)
            if len(word) > max_chars:
                out.extend(word[i : i + max_chars] for i in range(0, len(word), max_chars))
                line = ""
            else:
                line = word
        if line:
            out.append(line)
    return out


_HIGHLIGHTS = ((OBSERVATION_TAG, (0, 0, 255)), (ACTION_TAG, (255, 0, 0)))
_BLACK, _WHITE = (0, 0, 0), (255, 255, 255)


def _spans(line: str, highlight: bool) -> list[tuple[int, int, tuple[int, int, int]]]:
    """Coloured character spans of one line: the tags in their colour, the rest black."""
    marks: list[tuple[int, int, tuple[int, int, int]]] = []
    if highlight:
        for tag, colour in _HIGHLIGHTS:
            start = line.find(tag)
            while start != -1:
                marks.append((start, start + len(tag), colour))
                start = line.find(tag, start + 1)
    marks.sort(key=lambda m: m[0])
    spans, pos = [], 0
    for start, end, colour in marks:
        if start < pos:  # overlapping match: the first one wins, as in AgentOCR
            continue
        if pos < start:
            spans.append((pos, start, _BLACK))
        spans.append((start, end, colour))
        pos = end
    if pos < len(line):
        spans.append((pos, len(line), _BLACK))
    return spans


def _render_segment(segment: str, cfg: FlatHistoryConfig) -> Image.Image:
    font, avg_char, line_height = _font(cfg.font_size)
    lines = wrap_fast(segment, int(cfg.width / avg_char))
    if len(lines) * line_height > cfg.max_segment_height:
        lines = lines[: cfg.max_segment_height // line_height]
    img = Image.new("RGB", (cfg.width, max(1, len(lines) * line_height)), _WHITE)
    draw = ImageDraw.Draw(img)
    for row, line in enumerate(lines):
        y = row * line_height
        for start, end, colour in _spans(line, cfg.highlight):
            # x from the prefix's advance, as AgentOCR positions highlighted segments.
            draw.text((int(font.getlength(line[:start])), y), line[start:end], fill=colour, font=font)
    return img


def render_flat_history(history: Sequence[HistoryRecord], config: FlatHistoryConfig | None = None) -> FlatHistoryImage:
    """Draw the last ``history_length`` steps of ``history`` as one image (module docstring)."""
    cfg = config or FlatHistoryConfig()
    text = format_flat_history(history, cfg.history_length)
    segments = [line.strip() for line in text.split("\n") if line.strip()]
    if not segments:
        body = Image.new("RGB", (cfg.min_side, cfg.min_side), _WHITE)
    else:
        parts = [_render_segment(s, cfg) for s in segments]
        body = Image.new("RGB", (cfg.width, sum(p.height for p in parts)), _WHITE)
        y = 0
        for p in parts:
            body.paste(p, (0, y))
            y += p.height
    image = ImageOps.expand(body, border=cfg.padding, fill=_WHITE) if cfg.padding else body
    return FlatHistoryImage(
        image=image,
        text=text,
        steps=min(len(history), cfg.history_length),
        visual_tokens=qwen25vl_tokens(image.width, image.height),
    )
