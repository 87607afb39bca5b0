"""Visual-token accounting for rendered views (paper appendix "Common controlled protocol":
efficiency records "rendered pixels, visual tokens, prompt tokens" as separate fields).

* **Qwen2.5-VL**: ``smart_resize`` (factor 28; Python ``round``, half to even, so 686 -> 672), one
  token per 28x28 block plus 2 vision markers: 672x672 -> 576 + 2 = 578 (7B-Instruct's defaults).
* **Qwen3-VL**: the same rule with factor 32: 672x672 -> 441 + 2 = 443.
* **MiniCPM-V 2.6**: 66 for the overview, above one 448x448 area also a ``gx x gy`` grid of
  slices of 66 plus ``gy - 1`` newlines: 672x672 -> 2x2 -> 331.
"""

from __future__ import annotations

import math

QWEN_MARKERS = 2  # <|vision_start|> ... <|vision_end|>
MINICPM_PART = 66  # 64 query tokens + <image>/</image> (or <slice>/</slice>)


def _check_size(width: int, height: int) -> None:
    for name, v in (("width", width), ("height", height)):
        if isinstance(v, bool) or not isinstance(v, int) or v <= 0:
            raise ValueError(f"image {name} must be a positive int, got {v!r}")


def smart_resize(
    height: int, width: int, factor: int = 28, min_pixels: int = 3136, max_pixels: int = 12845056
) -> tuple[int, int]:
    """Qwen2-VL/2.5-VL ``smart_resize`` (transformers ``image_processing_qwen2_vl``):
    returns ``(resized_height, resized_width)``, both multiples of ``factor``."""
    _check_size(width, height)
    if max(height, width) / min(height, width) > 200:
        raise ValueError(
            f"absolute aspect ratio must be smaller than 200, got {max(height, width) / min(height, width)}"
        )
    h_bar = round(height / factor) * factor
    w_bar = round(width / factor) * factor
    if h_bar * w_bar > max_pixels:
        beta = math.sqrt((height * width) / max_pixels)
        h_bar = max(factor, math.floor(height / beta / factor) * factor)
        w_bar = max(factor, math.floor(width / beta / factor) * factor)
    elif h_bar * w_bar < min_pixels:
        beta = math.sqrt(min_pixels / (height * width))
        h_bar = math.ceil(height * beta / factor) * factor
        w_bar = math.ceil(width * beta / factor) * factor
    return h_bar, w_bar


def qwen25vl_tokens(
    width: int, height: int, min_pixels: int = 3136, max_pixels: int = 12845056, *, markers: bool = True
) -> int:
    """Tokens a ``width x height`` image costs Qwen2.5-VL (with the 2 vision markers)."""
    h, w = smart_resize(height, width, 28, min_pixels, max_pixels)
    return (h // 28) * (w // 28) + (QWEN_MARKERS if markers else 0)


def qwen3vl_tokens(
    width: int, height: int, min_pixels: int = 65536, max_pixels: int = 16777216, *, markers: bool = True
) -> int:
    """Tokens a ``width x height`` image costs Qwen3-VL (factor 32, with the 2 markers)."""
    h, w = smart_resize(height, width, 32, min_pixels, max_pixels)
    return (h // 32) * (w // 32) + (QWEN_MARKERS if markers else 0)


def minicpmv26_grid(width: int, height: int, scale: int = 448, max_slices: int = 9) -> tuple[int, int] | None:
    """MiniCPM-V 2.6 slice grid ``(gx, gy)``, or ``None`` when the image is not sliced."""
    _check_size(width, height)
    log_ratio = math.log(width / height)
    ratio = width * height / (scale * scale)
    multiple = min(math.ceil(ratio), max_slices)
    if multiple <= 1:
        return None
    best: tuple[int, int] | None = None
    best_err = float("inf")
    for n in (multiple - 1, multiple, multiple + 1):
        if n == 1 or n > max_slices:
            continue
        for m in range(1, n + 1):
            if n % m:
                continue
            err = abs(log_ratio - math.log(m / (n // m)))
            if err < best_err:
                best, best_err = (m, n // m), err
    return best


def minicpmv26_tokens(width: int, height: int, scale: int = 448, max_slices: int = 9) -> int:
    """Tokens a ``width x height`` image costs MiniCPM-V 2.6: ``66`` unsliced, else
    ``66 + 66*gx*gy + gy - 1``."""
    grid = minicpmv26_grid(width, height, scale, max_slices)
    if grid is None:
        return MINICPM_PART
    gx, gy = grid
    return MINICPM_PART + MINICPM_PART * gx * gy + gy - 1
