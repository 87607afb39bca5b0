"""The painter: a pure function of the laid-out page.

``paint`` draws every row of every block on a fresh canvas (no row strips, replayed steps
or pooled canvases: they bought <= 1.16x at the paper's horizons, see
``benchmarks/bench_views.py --horizons-only``). Pages cut short clip the blocks that
straddle the bottom edge; images handed out never change afterwards.
"""

from __future__ import annotations

import dataclasses

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st
from PIL import Image, ImageDraw

from memprism_ray.composer import compose
from memprism_ray.recorder import EventStream, RawEvent
from memprism_ray.render import Page, RenderConfig, layout, render, render_image, render_text
from memprism_ray.render.layout import _BOX
from memprism_ray.render.optical import paint, paint_image, palette
from memprism_ray.testing.synthetic_streams import alfworld_like_stream, random_stream
from memprism_ray.view_space import ALL_ACTIONS

sides = st.sampled_from([448, 672, 896])


def _assert_clipped_prefix(page: Page, short: Page, cfg: RenderConfig) -> None:
    """A page cut short shows the full page's pixels above the cut, except the frame a
    clipped card or anchor closes at the cut (its bottom border, at most 2 px) and the
    dependency trunk, which ends at the last link the cut page shows."""
    full, cut = paint(page, cfg), paint(short, cfg)
    assert cut.shape == (short.height, page.geometry.width)
    keep = max(0, short.height - max(b for b, *_ in _BOX.values()))
    geo = page.geometry
    trunk = np.ones(geo.width, bool)
    trunk[geo.margin + geo.cell_w : geo.margin + geo.cell_w + 2] = False
    assert np.array_equal(cut[:keep, trunk], full[:keep, trunk])


@settings(max_examples=40, deadline=None)
@given(
    n=st.integers(0, 150),
    seed=st.integers(0, 5000),
    picks=st.lists(st.integers(0, len(ALL_ACTIONS) - 1), min_size=1, max_size=6),
    side=sides,
    cut=st.integers(0, 400),
)
def test_paint_is_deterministic_and_clips_as_a_prefix(n: int, seed: int, picks: list[int], side: int, cut: int) -> None:
    stream = random_stream(n, seed) if seed % 2 else alfworld_like_stream(n, seed)
    cfg = RenderConfig(max_side=side)
    for index in picks:
        page = layout(compose(stream, ALL_ACTIONS[index]), cfg)
        first = paint(page, cfg)
        assert first.shape == (page.height, side)
        assert np.array_equal(paint(page, cfg), first)
        short = dataclasses.replace(page, height=max(page.header_h, page.height - cut))
        _assert_clipped_prefix(page, short, cfg)


def test_entry_taller_than_the_page_is_clipped_identically() -> None:
    s = EventStream({"goal": "put a clean mug in cabinet"})
    for k in range(3):
        delta = [(f"mug {i}.state", f"value {k} {i} " * 3) for i in range(60)]
        s.record(RawEvent("o", f"look {k}", "f"), entity="mug 1", act="look", delta=delta)
    for side in (448, 896):
        cfg = RenderConfig(max_side=side)
        for a in ALL_ACTIONS:
            page = layout(compose(s, a), cfg)
            assert page.height <= side
            pixels = paint(page, cfg)
            assert pixels.shape == (page.height, side), a.name
            assert (pixels != pixels[0, 0]).any(), a.name  # something is drawn


def test_image_maps_the_painted_array_and_edits_do_not_leak() -> None:
    """``render_image`` wraps the painted array without copying; Pillow copies before an
    in-place edit, so drawing on a returned image does not change the next image of the
    same view."""
    stream = alfworld_like_stream(200, 3)
    cfg = RenderConfig()
    view = compose(stream, "TemporalTrace/all/all/fine")
    page = layout(view, cfg)
    img = paint_image(page, cfg)
    copy = Image.frombytes("P", img.size, paint(page, cfg).tobytes())
    copy.putpalette(palette(cfg.colors))
    assert img.tobytes() == copy.tobytes() and img.getpalette() == copy.getpalette()
    before = render_image(view, cfg).tobytes()
    ImageDraw.Draw(img).rectangle((0, 0, 300, 300), fill=0)
    img.putpixel((400, 400), 1)
    assert render_image(view, cfg).tobytes() == before
    both = render(view, cfg)
    assert both.image.tobytes() == before and both.text == render_text(view, cfg)
    assert render_image(view, RenderConfig(image_mode="RGB")).mode == "RGB"


def test_every_clip_height_of_cards_tables_and_anchors() -> None:
    """Cut pages one pixel at a time so that every block kind straddles the bottom edge by
    every amount (card and anchor borders are drawn differently when clipped)."""
    stream = alfworld_like_stream(120, 8)
    cfg = RenderConfig(max_side=448)
    for name in ("ActionEffect/all/all/fine", "DependencyChain/all/all/fine", "EntityState/all/all/medium"):
        page = layout(compose(stream, name), cfg)
        for cut in range(0, 120):
            _assert_clipped_prefix(page, dataclasses.replace(page, height=page.height - cut), cfg)


def test_images_handed_out_never_change() -> None:
    """Each paint draws on a fresh array: images and arrays a caller keeps stay as drawn
    while other views are painted."""
    stream = alfworld_like_stream(300, 1)
    cfg = RenderConfig()
    pages = [layout(compose(stream, a), cfg) for a in ALL_ACTIONS if a.window == "all"]
    kept_images = [(paint_image(p, cfg), paint(p, cfg).tobytes()) for p in pages[:6]]
    kept_arrays = [(paint(p, cfg), paint(p, cfg).copy()) for p in pages[6:12]]
    for p in pages:
        paint_image(p, cfg)
    for img, pixels in kept_images:
        assert img.tobytes() == pixels
    for arr, want in kept_arrays:
        assert np.array_equal(arr, want)


def test_concurrent_painting_gives_the_reference_pixels() -> None:
    import threading

    stream = alfworld_like_stream(200, 2)
    cfg = RenderConfig()
    pages = [layout(compose(stream, a), cfg) for a in ALL_ACTIONS[::5]]
    want = [paint(p, cfg).tobytes() for p in pages]
    errors: list[int] = []

    def worker(offset: int) -> None:
        for k in range(len(pages)):
            i = (k + offset) % len(pages)
            img = paint_image(pages[i], cfg)
            if img.tobytes() != want[i]:
                errors.append(i)

    threads = [threading.Thread(target=worker, args=(j * 7,)) for j in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
