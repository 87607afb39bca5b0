"""End to end: the fast path (indexed ``compose``, cached ``layout``, replayed ``paint``)
against the straightforward path (``compose_reference``, ``layout`` from empty caches,
``paint_reference``) for all 144 view actions of hypothesis-generated streams reached by
growing the stream one event per decision. View structure, text and PNG bytes must match.
"""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st
from PIL import Image

from memprism_ray.composer import ComposerConfig, compose
from memprism_ray.composer.reference import compose_reference
from memprism_ray.composer.synthetic import alfworld_like_stream, random_stream
from memprism_ray.recorder import EventStream
from memprism_ray.render import RenderConfig, layout
from memprism_ray.render.optical import (
    clear_render_caches,
    encode_png,
    paint,
    paint_image,
    paint_reference,
    palette,
)
from memprism_ray.view_space import ALL_ACTIONS


@settings(max_examples=12, deadline=None)
@given(
    kind=st.sampled_from(["random", "alfworld"]),
    n=st.integers(0, 70),
    seed=st.integers(0, 10_000),
    side=st.sampled_from([448, 672, 896]),
    mode=st.sampled_from(["window", "history", "off"]),
    goal=st.sampled_from([None, "", "put a clean mug in cabinet", "heat some apple and put it in drawer"]),
)
def test_fast_path_equals_reference_path_for_all_actions(
    kind: str, n: int, seed: int, side: int, mode: str, goal: str | None
) -> None:
    full = random_stream(n, seed) if kind == "random" else alfworld_like_stream(n, seed)
    composer, config = ComposerConfig(goal_restore=mode), RenderConfig(max_side=side)
    grow = EventStream(full.meta)
    for k, rec in enumerate(full):  # warm every cache the way an agent loop does
        grow.append(rec.raw, rec.event)
        paint_image(layout(compose(grow, ALL_ACTIONS[(k * 29 + seed) % 144], goal, composer), config), config)
    fast = []
    for a in ALL_ACTIONS:
        view = compose(grow, a, goal, composer)
        page = layout(view, config)
        fast.append((view, "\n".join(page.lines), paint(page, config).tobytes(), paint_image(page, config)))
    for a, (view, text, pixels, image) in zip(ALL_ACTIONS, fast, strict=False):
        ref_view = compose_reference(grow, a, goal, composer)
        clear_render_caches()
        ref_page = layout(ref_view, config)
        assert view == ref_view, a.name
        assert text == "\n".join(ref_page.lines), a.name
        ref_pixels = paint_reference(ref_page, config)
        assert pixels == ref_pixels.tobytes(), a.name
        # The image as the straightforward path made it: a copy of the pixels, then the palette.
        ref_image = Image.frombytes("P", (ref_pixels.shape[1], ref_pixels.shape[0]), ref_pixels.tobytes())
        ref_image.putpalette(palette(config.colors))
        assert encode_png(image, config) == encode_png(ref_image, config), a.name
