"""Visual-token accounting: Qwen2.5-VL smart_resize, Qwen3-VL, MiniCPM-V 2.6 slicing."""

from __future__ import annotations

import ast
import importlib.util
import math
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from memprism_ray.render.visual_tokens import (
    minicpmv26_grid,
    minicpmv26_tokens,
    qwen3vl_tokens,
    qwen25vl_tokens,
    smart_resize,
)


def test_worked_numbers_from_the_notes() -> None:
    assert qwen25vl_tokens(672, 672) == 578  # 24*24 image tokens + vision start/end
    assert qwen25vl_tokens(672, 672, markers=False) == 576
    assert qwen3vl_tokens(672, 672) == 443  # 21*21 + 2
    assert qwen3vl_tokens(672, 672, markers=False) == 441
    assert minicpmv26_tokens(672, 672) == 331  # 2x2 slices: 66 + 66*4 + 2 - 1


def test_round_half_to_even_and_sides_at_multiples_of_28() -> None:
    assert smart_resize(686, 672) == (672, 672)  # 686/28 = 24.5 rounds to 24 (half to even)
    assert smart_resize(714, 672) == (728, 672)  # 25.5 rounds to 26
    for side in (448, 672, 896):
        assert smart_resize(side, side) == (side, side)
        assert qwen25vl_tokens(side, 224) == (side // 28) * 8 + 2
    assert qwen25vl_tokens(448, 448) == 258 and qwen25vl_tokens(896, 896) == 1026


def test_min_and_max_pixels() -> None:
    # 28x28 is below min_pixels=3136: scaled up by sqrt(3136/784)=2 with ceil -> 56x56 -> 4 tokens.
    assert smart_resize(28, 28) == (56, 56) and qwen25vl_tokens(28, 28) == 6
    # 2000x2000 over max_pixels=451584 (672^2): beta = 2000/672, floor -> 672x672.
    assert qwen25vl_tokens(2000, 2000, max_pixels=451584) == 578
    assert (
        qwen25vl_tokens(672, 1344, max_pixels=451584)
        == (math.floor(1344 / math.sqrt(2) / 28) * math.floor(672 / math.sqrt(2) / 28)) + 2
    )
    # Qwen3-VL's min_pixels (65536) upscales small views.
    assert qwen3vl_tokens(224, 224) == 8 * 8 + 2


def test_minicpm_grids() -> None:
    assert minicpmv26_grid(448, 448) is None and minicpmv26_tokens(448, 448) == 66
    assert minicpmv26_tokens(672, 224) == 66  # area below one 448x448 slice
    # 1344x672: area ratio 4.5 -> candidates 4, 5, 6 slices; log(2) is closest to 3x2.
    assert minicpmv26_grid(1344, 672) == (3, 2)
    assert minicpmv26_tokens(1344, 672) == 66 + 66 * 6 + 1
    assert minicpmv26_grid(4000, 4000) == (3, 3)  # at most 9 slices
    assert minicpmv26_tokens(4000, 4000) == 66 + 66 * 9 + 2


def test_bad_sizes_are_rejected() -> None:
    for w, h in ((0, 10), (10, -1), (1.5, 10)):
        with pytest.raises(ValueError, match="positive int"):
            qwen25vl_tokens(w, h)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="aspect ratio"):
        qwen25vl_tokens(10_000, 28)


def _upstream_smart_resize():
    """transformers' own smart_resize, compiled from its source (its module imports
    torchvision, which this environment does not need)."""
    spec = importlib.util.find_spec("transformers")
    if spec is None or not spec.submodule_search_locations:
        pytest.skip("transformers not installed")
    path = Path(next(iter(spec.submodule_search_locations))) / "models" / "qwen2_vl" / "image_processing_qwen2_vl.py"
    tree = ast.parse(path.read_text())
    fn = next(n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == "smart_resize")
    namespace: dict = {"math": math}
    exec(compile(ast.Module(body=[fn], type_ignores=[]), str(path), "exec"), namespace)
    return namespace["smart_resize"]


@settings(max_examples=300, deadline=None)
@given(h=st.integers(10, 5000), w=st.integers(10, 5000), factor=st.sampled_from([28, 32]))
def test_smart_resize_matches_transformers(h: int, w: int, factor: int) -> None:
    upstream = _upstream_smart_resize()
    if max(h, w) / min(h, w) > 200:
        return
    for lo, hi in ((3136, 12845056), (3136, 451584), (65536, 16777216)):
        assert smart_resize(h, w, factor, lo, hi) == upstream(h, w, factor, lo, hi)
