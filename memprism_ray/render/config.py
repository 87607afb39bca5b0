"""Render settings (paper "Render: Optical Working Memory"; appendix "Optical-resolution
sensitivity" varies only the maximum long side: 448, 672 (default), 896)."""

from __future__ import annotations

import re
from dataclasses import dataclass, fields

from memprism_ray.config_tree import field as cfg_field

PATCH = 28  # Qwen2.5-VL pixels per visual token side: sides at multiples of 28 are never resized.
_HEX = re.compile(r"^#[0-9a-fA-F]{6}$")


@dataclass(frozen=True)
class RenderColors:
    """The fixed palette of the visual grammar (``#rrggbb``)."""

    background: str = cfg_field("#ffffff", help="page background")
    text: str = cfg_field("#1f2328", help="body text")
    dim: str = cfg_field("#656d76", help="secondary text: steps, counts, collapsed runs")
    rule: str = cfg_field("#c9d1d9", help="card borders and table rules")
    header_bg: str = cfg_field("#eaeef2", help="header bar and table column-title background")
    accent: str = cfg_field("#9a6700", help="goal-relevant evidence: goal terms and row bars")
    goal_bg: str = cfg_field("#fff8c5", help="background of goal-relevant rows")
    exception: str = cfg_field("#cf222e", help="exception outcome text")
    exception_bg: str = cfg_field("#ffebe9", help="background of failed (exception) rows")
    update: str = cfg_field("#1a7f37", help="state_update outcome text")
    arrow: str = cfg_field("#0969da", help="change arrows, anchor frame, dependency links")
    link: str = cfg_field("#8250df", help="dependency link labels")
    card_bg: str = cfg_field("#f6f8fa", help="ActionEffect / anchor card background")

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

    max_side: int = cfg_field(672, help="long-side cap in pixels (multiple of 28; 448/672/896)")
    font_size: int = cfg_field(12, help="DejaVu Sans Mono pixel size")
    fine_fit: str = cfg_field(
        "shrink",
        help="a fine view the page cannot hold: shrink (smaller rows, down to min_font_size, so every "
        "selected item is shown) | drop (keep font_size, leave the oldest entries out with a count)",
    )
    min_font_size: int = cfg_field(8, help="smallest font size a fine view shrinks to (>= 8)")
    line_gap: int = cfg_field(1, help="extra pixels between text rows")
    margin: int = cfg_field(8, help="page margin in pixels (goal bars sit in it)")
    compress_level: int = cfg_field(1, help="PNG zlib level 0-9 (1: fast, images are tiny)")
    image_mode: str = cfg_field("P", help="P: exact-colour palette image (fast, small PNG) or RGB: converted copy")
    colors: RenderColors = cfg_field(default_factory=RenderColors, help="the palette")

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
