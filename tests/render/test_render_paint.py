"""The fast painter against the reference painter, and the caches behind layout and paint.

``paint`` replays recorded per-block drawing steps and ``layout`` memoises blocks, headers,
markers and table columns; ``paint_reference`` draws every row directly. For any page (any
view, stream, size, warm or cold caches, and pages cut short so that blocks are clipped)
the palette indices must be identical.
"""

from __future__ import annotations

import dataclasses

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st
from PIL import Image, ImageDraw

from memprism_ray.composer import compose
from memprism_ray.composer.records import clear_cache
from memprism_ray.composer.reference import compose_reference
from memprism_ray.composer.synthetic import alfworld_like_stream, random_stream
from memprism_ray.recorder import EventStream, RawEvent
from memprism_ray.render import RenderConfig, layout, render, render_image, render_text
from memprism_ray.render.optical import clear_render_caches, paint, paint_image, paint_reference, palette
from memprism_ray.view_space import ALL_ACTIONS

sides = st.sampled_from([448, 672, 896])


@settings(max_examples=60, deadline=None)
@given(
    n=st.integers(0, 150),
    seed=st.integers(0, 5000),
    picks=st.lists(st.integers(0, len(ALL_ACTIONS) - 1), min_size=1, max_size=8),
    side=sides,
    cut=st.integers(0, 400),
)
def test_paint_equals_reference_warm_cold_and_clipped(n: int, seed: int, picks: list[int], side: int, cut: int) -> None:
    stream = random_stream(n, seed) if seed % 2 else alfworld_like_stream(n, seed)
    cfg = RenderConfig(max_side=side)
    for index in picks:
        view = compose(stream, ALL_ACTIONS[index])
        page = layout(view, cfg)
        want = paint_reference(page, cfg)
        assert np.array_equal(paint(page, cfg), want)
        assert np.array_equal(paint(page, cfg), want), "second (replayed) paint differs"
        # A page cut short clips the blocks that straddle its bottom: drawn directly.
        short = dataclasses.replace(page, height=max(page.header_h, page.height - cut))
        assert np.array_equal(paint(short, cfg), paint_reference(short, cfg))
    clear_cache()
    clear_render_caches()
    for index in picks:
        page = layout(compose(stream, ALL_ACTIONS[index]), cfg)
        assert np.array_equal(paint(page, cfg), paint_reference(page, cfg))


@settings(max_examples=30, deadline=None)
@given(n=st.integers(1, 120), seed=st.integers(0, 5000), picks=st.lists(st.integers(0, 143), min_size=1, max_size=6))
def test_layout_caches_change_nothing(n: int, seed: int, picks: list[int]) -> None:
    """A page laid out with warm caches (blocks, headers, markers, row keys, chain sizes)
    has the same lines and pixels as one laid out from empty caches, for the index's
    views and for the reference Composer's freshly built views."""
    stream = alfworld_like_stream(n, seed)
    cfg = RenderConfig()
    warm = []
    for index in picks:
        page = layout(compose(stream, ALL_ACTIONS[index]), cfg)
        warm.append((page.lines, paint(page, cfg).tobytes()))
    clear_render_caches()
    for index, (lines, pixels) in zip(picks, warm, strict=False):
        page = layout(compose_reference(stream, ALL_ACTIONS[index]), cfg)
        assert page.lines == lines
        assert paint_reference(page, cfg).tobytes() == pixels


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
            assert np.array_equal(paint(page, cfg), paint_reference(page, cfg)), a.name


def test_image_maps_the_painted_array_and_edits_do_not_leak() -> None:
    """``render_image`` wraps the painted array without copying; Pillow copies before an
    in-place edit, so drawing on a returned image changes neither cached strips nor the
    next image of the same view."""
    stream = alfworld_like_stream(200, 3)
    cfg = RenderConfig()
    view = compose(stream, "TemporalTrace/all/all/fine")
    page = layout(view, cfg)
    img = paint_image(page, cfg)
    copy = Image.frombytes("P", img.size, paint_reference(page, cfg).tobytes())
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
            short = dataclasses.replace(page, height=page.height - cut)
            assert np.array_equal(paint(short, cfg), paint_reference(short, cfg)), (name, cut)


def test_pooled_canvases_are_reused_only_when_nothing_refers_to_them() -> None:
    """``paint`` reuses a canvas only after the caller dropped every reference (the array,
    an image mapping it, a view of it): images kept by a caller never change."""
    stream = alfworld_like_stream(300, 1)
    cfg = RenderConfig()
    pages = [layout(compose(stream, a), cfg) for a in ALL_ACTIONS if a.window == "all"]
    kept_images = [(paint_image(p, cfg), paint_reference(p, cfg).tobytes()) for p in pages[:6]]
    kept_arrays = [(paint(p, cfg), paint_reference(p, cfg)) for p in pages[6:12]]
    kept_view = paint(pages[12], cfg)[10:20]
    want_view = paint_reference(pages[12], cfg)[10:20].copy()
    first = paint(pages[13], cfg)
    first_id = id(first)
    del first
    assert id(paint(pages[13], cfg)) == first_id, "a dropped canvas of the same size is reused"
    for _ in range(3):
        for p in pages:
            assert np.array_equal(paint(p, cfg), paint_reference(p, cfg))
    for img, pixels in kept_images:
        assert img.tobytes() == pixels
    for arr, want in kept_arrays:
        assert np.array_equal(arr, want)
    assert np.array_equal(kept_view, want_view)


def test_concurrent_painting_gives_the_reference_pixels() -> None:
    import threading

    stream = alfworld_like_stream(200, 2)
    cfg = RenderConfig()
    pages = [layout(compose(stream, a), cfg) for a in ALL_ACTIONS[::5]]
    want = [paint_reference(p, cfg).tobytes() for p in pages]
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
