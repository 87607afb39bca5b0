"""A ``fine`` view keeps every selected item (view teacher, appendix E.2: "fine: preserve all
selected events/items"): when the page cannot hold them the rows shrink, and whatever the
smallest rows still cannot hold is counted on the page, in the image and the text twin."""

from __future__ import annotations

import re

import numpy as np
import pytest

from memprism_ray.composer import compose
from memprism_ray.composer.structures import TemporalTrace
from memprism_ray.render import RenderConfig, layout, render
from memprism_ray.render.config import PATCH
from memprism_ray.render.optical import paint
from memprism_ray.testing.synthetic_streams import alfworld_like_stream
from memprism_ray.view_space import ALL_ACTIONS


def test_a_fine_view_that_overflows_shrinks_and_keeps_every_event() -> None:
    stream = alfworld_like_stream(25, 1)
    view = compose(stream, "TemporalTrace/all/all/fine")
    assert isinstance(view.body, TemporalTrace) and len(view.body.entries) == 25
    dropped = layout(view, RenderConfig(fine_fit="drop"))
    assert dropped.omitted > 0 and dropped.geometry.font_size == 12  # 12 px rows cannot hold 25 events
    page = layout(view)
    assert page.complete and page.shown == 25
    assert 8 <= page.geometry.font_size < 12
    text = "\n".join(page.lines)
    for t in range(1, 26):
        assert re.search(rf"^step {t} \| ", text, re.M), t
    assert "omitted" not in text
    pixels = paint(page, RenderConfig())
    assert pixels.shape == (page.height, 672) and page.height <= 672 and page.height % PATCH == 0
    # The largest size that shows everything is used.
    bigger = layout(view, RenderConfig(font_size=page.geometry.font_size + 1, fine_fit="drop"))
    assert not bigger.complete


def test_what_the_smallest_rows_cannot_hold_is_counted_in_image_and_text() -> None:
    stream = alfworld_like_stream(100, 1)
    view = compose(stream, "TemporalTrace/all/all/fine")
    page = layout(view)
    assert page.geometry.font_size == 8 and page.omitted > 0
    marker = f"⋯ {page.omitted} earlier entries omitted"
    assert page.blocks[0].kind == "marker" and page.blocks[0].rows[0].spans[0].text == marker
    assert page.lines[3] == marker.replace("⋯", "...")
    both = render(view)
    assert f"... {page.omitted} earlier entries omitted" in both.text
    assert (both.shown, both.total) == (page.shown, 100)
    # The marker row is drawn: the marker's row differs from blank page background.
    geo = page.geometry
    y = page.header_h + 4 + 1  # marker block: no border, 1 px top padding
    row = np.asarray(both.image)[y : y + geo.row_h, geo.margin : geo.width - geo.margin]
    assert (row != row[0, 0]).any()


@pytest.mark.parametrize("gamma", ["coarse", "medium"])
def test_only_fine_views_shrink(gamma: str) -> None:
    view = compose(alfworld_like_stream(100, 1), f"TemporalTrace/all/all/{gamma}")
    page = layout(view)
    assert page.geometry.font_size == 12


def test_views_that_fit_keep_the_configured_size() -> None:
    stream = alfworld_like_stream(4, 0)
    for a in ALL_ACTIONS:
        if a.gamma == "fine":
            page = layout(compose(stream, a))
            assert page.complete and page.geometry.font_size == 12, a.name


def test_config_validation() -> None:
    with pytest.raises(ValueError, match="fine_fit must be 'shrink' or 'drop', got 'page'"):
        RenderConfig(fine_fit="page")
    with pytest.raises(ValueError, match=r"min_font_size must be in \[8, font_size=12\], got 13"):
        RenderConfig(min_font_size=13)
    with pytest.raises(ValueError, match=r"min_font_size must be in \[8, font_size=12\], got 6"):
        RenderConfig(min_font_size=6)
