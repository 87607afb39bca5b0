"""Visual-token accounting for task-policy inputs (paper appendix C.1 efficiency metrics:
"visual tokens attributable to memory").

The counting rules live in :mod:`memprism_ray.render.visual_tokens`; this module applies
them to a prompt's images. Until that module is importable, Qwen2.5-VL is counted with a
private copy of the same rule (``smart_resize``, factor 28, +2 vision start/end markers),
so results do not change when it lands.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

from PIL import Image

#: Families with a counting rule; "none" reports no count.
VISUAL_TOKEN_FAMILIES: tuple[str, ...] = ("qwen2.5-vl", "qwen3-vl", "minicpm-v-2.6", "none")


def _qwen25vl_tokens_fallback(width: int, height: int, min_pixels: int = 3136, max_pixels: int = 12845056) -> int:
    factor = 28
    h = max(factor, round(height / factor) * factor)
    w = max(factor, round(width / factor) * factor)
    if h * w > max_pixels:
        beta = math.sqrt(height * width / max_pixels)
        h = max(factor, math.floor(height / beta / factor) * factor)
        w = max(factor, math.floor(width / beta / factor) * factor)
    elif h * w < min_pixels:
        beta = math.sqrt(min_pixels / (height * width))
        h = math.ceil(height * beta / factor) * factor
        w = math.ceil(width * beta / factor) * factor
    return (h // factor) * (w // factor) + 2


def _counter(family: str) -> Callable[..., int]:
    try:
        from memprism_ray.render import visual_tokens as vt
    except ImportError:
        vt = None
    if family == "qwen2.5-vl":
        return getattr(vt, "qwen25vl_tokens", _qwen25vl_tokens_fallback)
    if vt is None:
        raise ValueError(f"visual-token family {family!r} needs memprism_ray.render.visual_tokens, not importable")
    if family == "qwen3-vl":
        return vt.qwen3vl_tokens
    if family == "minicpm-v-2.6":
        return vt.minicpmv26_tokens
    raise ValueError(f"unknown visual-token family {family!r}; valid: {', '.join(VISUAL_TOKEN_FAMILIES)}")


def count_visual_tokens(
    images: Sequence[Image.Image],
    family: str = "qwen2.5-vl",
    *,
    min_pixels: int | None = None,
    max_pixels: int | None = None,
) -> int | None:
    """Visual tokens the policy model spends on ``images`` (None for family "none")."""
    if family == "none":
        return None
    fn = _counter(family)
    kwargs: dict[str, int] = {}
    if family.startswith("qwen"):
        if min_pixels is not None:
            kwargs["min_pixels"] = min_pixels
        if max_pixels is not None:
            kwargs["max_pixels"] = max_pixels
    return sum(int(fn(im.width, im.height, **kwargs)) for im in images)
