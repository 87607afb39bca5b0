"""Optical renderer: size rules, determinism across processes, visual grammar."""

from __future__ import annotations

import hashlib
import io
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from PIL import Image

from memprism_ray.composer import View, compose
from memprism_ray.recorder import EventStream, RawEvent
from memprism_ray.render import RenderColors, RenderConfig, encode_png, layout, render, render_image, render_text
from memprism_ray.render.font import atlas
from memprism_ray.testing.synthetic_streams import alfworld_like_stream, random_stream
from memprism_ray.view_space import ALL_ACTIONS, ViewAction

ROOT = Path(__file__).resolve().parents[2]
CASES = [
    ("TemporalTrace/all/all/fine", 120, 672),
    ("ActionEffect/recent_long/all/medium", 80, 448),
    ("EntityState/all/state_update/coarse", 200, 896),
    ("DependencyChain/all/exception/fine", 60, 672),
    ("EntityState/recent_short/all/fine", 30, 448),
    ("TemporalTrace/all/no_observed_change/coarse", 300, 672),
]
SCRIPT = """
import hashlib, json, sys
from memprism_ray.composer import compose
from memprism_ray.testing.synthetic_streams import alfworld_like_stream
from memprism_ray.render import RenderConfig, encode_png, render_image
out = []
for name, n, side in json.loads(sys.argv[1]):
    cfg = RenderConfig(max_side=side)
    png = encode_png(render_image(compose(alfworld_like_stream(n, 7), name), cfg), cfg)
    out.append(hashlib.sha256(png).hexdigest())
print(json.dumps(out))
"""


def render_png(view: View, config: RenderConfig | None = None) -> bytes:
    """The optical view as PNG bytes, as a policy receives it (``views.ViewService``)."""
    config = config or RenderConfig()
    return encode_png(render_image(view, config), config)


def rgb(img: Image.Image) -> np.ndarray:
    return np.asarray(img.convert("RGB"))


def has_color(img: Image.Image, hex_color: str) -> bool:
    target = np.array([int(hex_color[i : i + 2], 16) for i in (1, 3, 5)], np.uint8)
    return bool((rgb(img) == target).all(axis=-1).any())


def test_png_bytes_identical_across_processes() -> None:
    here = [
        hashlib.sha256(render_png(compose(alfworld_like_stream(n, 7), name), RenderConfig(max_side=side))).hexdigest()
        for name, n, side in CASES
    ]
    env = {**os.environ, "PYTHONHASHSEED": "12345", "PYTHONPATH": str(ROOT)}
    proc = subprocess.run(
        [sys.executable, "-c", SCRIPT, json.dumps(CASES)],
        capture_output=True,
        text=True,
        env=env,
        cwd=ROOT,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout) == here
    assert len(set(here)) == len(here)  # different views are different images


@settings(max_examples=60, deadline=None)
@given(
    n=st.integers(0, 120),
    seed=st.integers(0, 1000),
    action=st.sampled_from(ALL_ACTIONS),
    side=st.sampled_from([448, 672, 896]),
    mode=st.sampled_from(["P", "RGB"]),
)
def test_size_rules(n: int, seed: int, action: ViewAction, side: int, mode: str) -> None:
    view = compose(random_stream(n, seed), action)
    img = render_image(view, RenderConfig(max_side=side, image_mode=mode))
    w, h = img.size
    assert w == side and h % 28 == 0 and 28 <= h <= side
    assert img.mode == mode
    page = layout(view, RenderConfig(max_side=side))
    assert page.height == h
    assert 0 <= page.shown <= page.total


def test_png_round_trips_and_modes_agree() -> None:
    view = compose(alfworld_like_stream(90, 4), "ActionEffect/all/all/fine")
    p_img = render_image(view)
    rgb_img = render_image(view, RenderConfig(image_mode="RGB"))
    assert p_img.mode == "P" and rgb_img.mode == "RGB"
    assert np.array_equal(rgb(p_img), np.asarray(rgb_img))
    png = render_png(view)
    assert png.startswith(b"\x89PNG\r\n\x1a\n")
    back = Image.open(io.BytesIO(png))
    assert back.size == p_img.size and np.array_equal(rgb(back), rgb(p_img))
    both = render(view)
    assert np.array_equal(rgb(both.image), rgb(p_img)) and both.text == render_text(view)


def _stream(goal: str) -> EventStream:
    s = EventStream({"goal": goal})

    def step(action: str, entity: str, delta: list[tuple[str, str]], failed: bool = False) -> None:
        s.record(RawEvent("o", action, "f"), entity=entity, act=action.split()[0], delta=delta, failed=failed)

    step("go to countertop 1", "countertop 1", [("agent.location", "countertop 1"), ("mug 1.location", "countertop 1")])
    step("take mug 1 from countertop 1", "mug 1", [("agent.holding", "mug 1"), ("mug 1.location", "agent")])
    step("go to drawer 1", "drawer 1", [("agent.location", "drawer 1")])
    step("open drawer 1", "drawer 1", [], failed=True)
    step("look", "agent", [])
    return s


def test_highlights_mark_failures_and_goal_evidence() -> None:
    colors = RenderColors()
    s = _stream("put a clean mug in cabinet")
    for tau in ("TemporalTrace", "ActionEffect", "DependencyChain"):
        with_goal = render_image(compose(s, ViewAction(tau, "all", "all", "fine")))
        no_goal = render_image(compose(s, ViewAction(tau, "all", "all", "fine"), goal=""))
        assert has_color(with_goal, colors.exception_bg), tau
        assert has_color(with_goal, colors.goal_bg) and has_color(with_goal, colors.accent), tau
        assert not has_color(no_goal, colors.goal_bg), tau
        only_ok = render_image(compose(s, ViewAction(tau, "all", "state_update", "fine"), goal=""))
        if tau != "DependencyChain":  # its anchor/previous come from the unfiltered stream
            assert not has_color(only_ok, colors.exception_bg), tau


def test_dependency_arrows_and_cards_are_drawn() -> None:
    colors = RenderColors()
    cfg = RenderConfig()
    cell_w = atlas(cfg.font_size).cell_w
    s = _stream("")
    img = rgb(render_image(compose(s, "DependencyChain/all/all/fine"), cfg))
    arrow = np.array([int(colors.arrow[i : i + 2], 16) for i in (1, 3, 5)], np.uint8)
    page = layout(compose(s, "DependencyChain/all/all/fine"), cfg)
    below_anchor = page.header_h + 4 + page.geometry.height(page.blocks[0])
    trunk = img[below_anchor:, cfg.margin + cell_w]  # the connector column under the anchor card
    assert page.shown == 5 and (trunk == arrow).all(axis=-1).sum() > 3 * (page.shown - 1)
    one = EventStream()
    one.record(RawEvent("o", "look", "f"), entity="agent", act="look")
    lone = rgb(render_image(compose(one, "DependencyChain/all/all/fine"), cfg))
    assert not (lone[below_anchor:, cfg.margin + cell_w] == arrow).all(axis=-1).any()
    cards = rgb(render_image(compose(s, "ActionEffect/all/all/fine"), cfg))
    assert has_color(Image.fromarray(cards), colors.card_bg) and has_color(Image.fromarray(cards), colors.rule)


def test_bounded_by_the_page_at_1000_events() -> None:
    stream = alfworld_like_stream(1000, 5)
    for tau in ("TemporalTrace", "ActionEffect", "EntityState", "DependencyChain"):
        for side in (448, 672):
            view = compose(stream, ViewAction(tau, "all", "all", "fine"))
            page = layout(view, RenderConfig(max_side=side))
            assert page.height <= side and page.shown >= 1
            if tau != "DependencyChain":
                assert page.omitted > 0, "a 1000-event fine view cannot fit; something must be omitted"
                assert page.lines[3] == f"... {page.omitted} earlier {page.unit} omitted"


def test_config_validation() -> None:
    for bad in ({"max_side": 500}, {"max_side": 112}, {"font_size": 4}, {"image_mode": "L"}, {"compress_level": 10}):
        with pytest.raises(ValueError, match="RenderConfig"):
            RenderConfig(**bad)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=r"RenderColors\.accent"):
        RenderColors(accent="orange")
    with pytest.raises(ValueError, match="too large"):
        RenderConfig(max_side=224, font_size=32)


def test_unusual_characters_render() -> None:
    s = EventStream({"goal": "trouver le café ☕"})
    s.record(RawEvent("o", "tab\there\nnewline", "f"), entity="café 1", act="go", delta=[("café 1.état", "chaud 中文")])
    for tau in ("TemporalTrace", "EntityState"):
        view = compose(s, ViewAction(tau, "all", "all", "fine"))
        img = render_image(view)
        assert img.size[0] == 672
        assert "tab here newline" in render_text(view) or tau == "EntityState"


@settings(max_examples=40, deadline=None)
@given(n=st.integers(0, 80), seed=st.integers(0, 500), actions=st.lists(st.sampled_from(ALL_ACTIONS), min_size=2))
def test_earlier_views_never_change_pixels(n: int, seed: int, actions: list[ViewAction]) -> None:
    """A view drawn after other views of a growing stream is byte-identical to the same
    view of the same content built in one go (nothing carries over between decisions)."""
    stream = random_stream(n, seed)
    grow = EventStream(stream.meta)
    warm = []
    for k, rec in enumerate(stream):
        grow.append(rec.raw, rec.event)
        if k % 7 == 0:
            render_png(compose(grow, actions[k % len(actions)]))
    for a in actions:
        warm.append(render_png(compose(grow, a)))
    assert [render_png(compose(random_stream(n, seed), a)) for a in actions] == warm


def test_render_without_paint_is_the_same_page_without_pixels(monkeypatch: pytest.MonkeyPatch) -> None:
    import memprism_ray.render.optical as optical

    stream = alfworld_like_stream(30, seed=3)
    views = [compose(stream, a, "put a mug in the fridge") for a in ALL_ACTIONS[::7]]
    painted = [render(v) for v in views]

    def no_paint(*args: object, **kwargs: object) -> None:
        raise AssertionError("painted")

    monkeypatch.setattr(optical, "paint", no_paint)
    for v, p in zip(views, painted, strict=True):
        bare = render(v, paint=False)
        assert bare.image is None and p.image is not None
        assert (bare.text, bare.width, bare.height, bare.shown, bare.total) == (p.text, *p.image.size, p.shown, p.total)
    assert len({p.height for p in painted}) > 1  # pages of different sizes were compared
