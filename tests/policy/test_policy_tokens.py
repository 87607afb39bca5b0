"""Visual-token accounting of policy inputs (Qwen2.5-VL smart_resize rule of the notes)."""

from __future__ import annotations

import pytest
from PIL import Image

from memprism_ray.policy.tokens import count_visual_tokens


@pytest.mark.parametrize(
    ("w", "h", "max_pixels", "expected"),
    [
        (672, 672, 12845056, 576 + 2),  # the worked number of the notes
        (686, 672, 12845056, 576 + 2),  # round(686/28)=24 (half to even) -> 672
        (700, 672, 12845056, 25 * 24 + 2),
        (1344, 1344, 672 * 672, 576 + 2),  # capped by max_pixels
        (10, 10, 12845056, 4 + 2),  # raised to min_pixels 3136 = 56x56
    ],
)
def test_qwen25vl_rule(w: int, h: int, max_pixels: int, expected: int) -> None:
    assert count_visual_tokens([Image.new("RGB", (w, h))], max_pixels=max_pixels) == expected


def test_sum_over_images_and_none_family() -> None:
    ims = [Image.new("RGB", (672, 672)), Image.new("RGB", (56, 56))]
    assert count_visual_tokens(ims) == 578 + 6
    assert count_visual_tokens([]) == 0
    assert count_visual_tokens(ims, "none") is None
    with pytest.raises(ValueError, match="family"):
        count_visual_tokens(ims, "llava")
