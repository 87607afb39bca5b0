"""Render settings (paper "Render: Optical Working Memory"; appendix "Optical-resolution
sensitivity" varies only the maximum long side: 448, 672 (default), 896)."""

from __future__ import annotations

import re
from dataclasses import dataclass, field, fields

PATCH = 28  # Qwen2.5-VL pixels per visual token side: sides at multiples of 28 are never resized.
_HEX = re.compile(r"^#[0-9a-fA-F]{6}$")


@dataclass(frozen=True)
class RenderColors:
    """The fixed palette of the visual grammar (``#rrggbb``)."""

    background: str = field(default="#ffffff", metadata={"help": "page background"})
    text: str = field(default="#1f2328", metadata={"help": "body text"})
    dim: str = field(default="#656d76", metadata={"help": "secondary text: steps, counts, collapsed runs"})
    rule: str = field(default="#c9d1d9", metadata={"help": "card borders and table rules"})
    header_bg: str = field(default="#eaeef2", metadata={"help": "header bar and table column-title background"})
    accent: str = field(default="#9a6700", metadata={"help": "goal-relevant evidence: goal terms and row bars"})
    goal_bg: str = field(default="#fff8c5", metadata={"help": "background of goal-relevant rows"})
    exception: str = field(default="#cf222e", metadata={"help": "exception outcome text"})
    exception_bg: str = field(default="#ffebe9", metadata={"help": "background of failed (exception) rows"})
    update: str = field(default="#1a7f37", metadata={"help": "state_update outcome text"})
    arrow: str = field(default="#0969da", metadata={"help": "change arrows, anchor frame, dependency links"})
    link: str = field(default="#8250df", metadata={"help": "dependency link labels"})
    card_bg: str = field(default="#f6f8fa", metadata={"help": "ActionEffect / anchor card background"})

    def __post_init__(self) -> None:
        for f in fields(self):
            value = getattr(self, f.name)
            if not isinstance(value, str) or not _HEX.match(value):
                raise ValueError(f"RenderColors.{f.name} must be a '#rrggbb' colour, got {value!r}")

    def rgb(self, role: str) -> tuple[int, int, int]:
        value = getattr(self, role)
        return int(value[1:3], 16), int(value[3:5], 16), int(value[5:7], 16)


@dataclass(frozen=True)
class RenderConfig:
    """How a view becomes pixels. Same view + same config -> same bytes."""

    max_side: int = field(default=672, metadata={"help": "long-side cap in pixels (multiple of 28; 448/672/896)"})
    font_size: int = field(default=12, metadata={"help": "DejaVu Sans Mono pixel size"})
    fine_fit: str = field(
        default="shrink",
        metadata={
            "help": "a fine view the page cannot hold: shrink (smaller rows, down to min_font_size, so every "
            "selected item is shown) | drop (keep font_size, leave the oldest entries out with a count)"
        },
    )
    min_font_size: int = field(default=8, metadata={"help": "smallest font size a fine view shrinks to (>= 8)"})
    line_gap: int = field(default=1, metadata={"help": "extra pixels between text rows"})
    margin: int = field(default=8, metadata={"help": "page margin in pixels (goal bars sit in it)"})
    compress_level: int = field(default=1, metadata={"help": "PNG zlib level 0-9 (1: fast, images are tiny)"})
    image_mode: str = field(
        default="P", metadata={"help": "P: exact-colour palette image (fast, small PNG) or RGB: converted copy"}
    )
    colors: RenderColors = field(default_factory=RenderColors, metadata={"help": "the palette"})

    def __post_init__(self) -> None:
        check_int(self, "max_side", 224, 4032)
        if self.max_side % PATCH:
            raise ValueError(
                f"RenderConfig.max_side must be a multiple of {PATCH} in [224, 4032] so the image is never "
                f"resized by the VLM processor, got {self.max_side}"
            )
        check_int(self, "font_size", 8, 32)
        if self.fine_fit not in ("shrink", "drop"):
            raise ValueError(f"RenderConfig.fine_fit must be 'shrink' or 'drop', got {self.fine_fit!r}")
        check_int(self, "min_font_size", 8, self.font_size, "font_size=")
        check_int(self, "line_gap", 0, 16)
        check_int(self, "margin", 4, 64)  # goal bars need 4 px
        check_int(self, "compress_level", 0, 9)
        if self.image_mode not in ("P", "RGB"):
            raise ValueError(f"RenderConfig.image_mode must be 'P' or 'RGB', got {self.image_mode!r}")
        if not isinstance(self.colors, RenderColors):
            raise ValueError(f"RenderConfig.colors must be RenderColors, got {type(self.colors).__name__}")
        if self.max_side // (self.font_size + self.line_gap) < 12:
            raise ValueError(
                f"RenderConfig: font_size {self.font_size} is too large for max_side {self.max_side} "
                f"(fewer than 12 text rows)"
            )


def check_int(config: object, name: str, lo: int, hi: int | None = None, hi_name: str = "") -> None:
    """Reject a setting that is not an int in ``[lo, hi]`` (``hi`` None: no upper bound),
    naming the key; ``hi_name`` names the setting the upper bound comes from."""
    value = getattr(config, name)
    where = f"{type(config).__name__}.{name}"
    bound = f">= {lo}" if hi is None else f"in [{lo}, {hi_name}{hi}]"
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError(f"{where} must be an int {bound}, got {value!r}")
    if value < lo or (hi is not None and value > hi):
        raise ValueError(f"{where} must be {bound}, got {value}")
