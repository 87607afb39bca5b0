"""Pinned outputs: for fixed streams, every one of the 144 view actions must give the same
View structure, text and PNG bytes as the committed fixture ``golden_views.json``.

The fixture pins every output change: the removal of the Composer index and the render
caches left it unchanged. Regenerate it only for an intended output change:

    .venv/bin/python tests/render/test_render_golden.py --regenerate
"""

from __future__ import annotations

import hashlib
import json
import sys
from pathlib import Path

import pytest
from canonical_view import view_digest

from memprism_ray.composer import ComposerConfig, compose
from memprism_ray.recorder import EventStream
from memprism_ray.render import RenderConfig, layout
from memprism_ray.render.optical import encode_png, paint_image
from memprism_ray.testing.synthetic_streams import alfworld_like_stream, random_stream
from memprism_ray.view_space import ALL_ACTIONS

FIXTURE = Path(__file__).with_name("golden_views.json")

# name -> (stream kind, n, seed, goal override or None, goal_restore, max_side)
CASES: dict[str, tuple[str, int, int, str | None, str, int]] = {
    "random-0": ("random", 0, 0, None, "window", 672),
    "random-1": ("random", 1, 1, None, "window", 672),
    "random-2": ("random", 2, 2, None, "window", 672),
    "random-5": ("random", 5, 3, None, "window", 672),
    "random-13": ("random", 13, 4, None, "window", 672),
    "random-40": ("random", 40, 5, None, "window", 672),
    "random-40-nogoal": ("random", 40, 5, "", "window", 672),
    "random-120": ("random", 120, 6, None, "window", 672),
    "random-120-448": ("random", 120, 6, None, "window", 448),
    "random-120-history": ("random", 120, 6, "heat some apple and put it in drawer", "history", 672),
    "alfworld-10": ("alfworld", 10, 0, None, "window", 672),
    "alfworld-100": ("alfworld", 100, 1, None, "window", 672),
    "alfworld-100-896": ("alfworld", 100, 1, None, "window", 896),
    "alfworld-100-history": ("alfworld", 100, 1, None, "history", 672),
    "alfworld-100-off": ("alfworld", 100, 1, None, "off", 672),
    "alfworld-1000": ("alfworld", 1000, 2, None, "window", 672),
}


def _sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()[:12]


def case_stream(name: str) -> EventStream:
    kind, n, seed, _, _, _ = CASES[name]
    return random_stream(n, seed) if kind == "random" else alfworld_like_stream(n, seed)


def case_outputs(name: str, stream: EventStream | None = None) -> list[str]:
    """``view text png`` digests of the 144 actions of one case, in index order."""
    _, _, _, goal, mode, side = CASES[name]
    stream = stream if stream is not None else case_stream(name)
    composer, config = ComposerConfig(goal_restore=mode), RenderConfig(max_side=side)
    out = []
    for a in ALL_ACTIONS:
        view = compose(stream, a, goal, composer)
        page = layout(view, config)
        png = encode_png(paint_image(page, config), config)
        text = "\n".join(page.lines)
        out.append(f"{view_digest(view)[:12]} {_sha(text.encode())} {_sha(png)}")
    return out


def _diff(name: str, got: list[str], want: list[str]) -> str:
    pairs = enumerate(zip(got, want, strict=False))
    bad = [f"{ALL_ACTIONS[i].name}: got {g}, want {w}" for i, (g, w) in pairs if g != w]
    return f"{name}: {len(bad)} of 144 views differ (view text png digests); first: " + "; ".join(bad[:3])


@pytest.fixture(scope="module")
def golden() -> dict[str, list[str]]:
    return json.loads(FIXTURE.read_text())


@pytest.mark.parametrize("name", list(CASES))
def test_outputs_match_the_pinned_fixture(name: str, golden: dict[str, list[str]]) -> None:
    got = case_outputs(name)
    assert got == golden[name], _diff(name, got, golden[name])


def test_growing_stream_matches_the_pinned_fixture(golden: dict[str, list[str]]) -> None:
    """The same content reached by appending one event per decision (with views composed
    in between) must give the pinned outputs at the end."""
    name = "alfworld-100"
    full = case_stream(name)
    grow = EventStream(full.meta)
    for k, rec in enumerate(full):
        grow.append(rec.raw, rec.event)
        compose(grow, ALL_ACTIONS[(7 * k) % len(ALL_ACTIONS)])
    got = case_outputs(name, grow)
    assert got == golden[name], _diff(name, got, golden[name])


if __name__ == "__main__":
    if sys.argv[1:] != ["--regenerate"]:
        sys.exit("usage: test_render_golden.py --regenerate")
    FIXTURE.write_text(json.dumps({name: case_outputs(name) for name in CASES}, indent=0) + "\n")
    print(f"wrote {FIXTURE}")
