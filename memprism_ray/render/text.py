"""The text renderer: the paper's "Dynamic Text" condition and what a text-only policy reads:
the optical renderer's laid-out page (the same kept entries and omission marker), one entry per line.
"""

from __future__ import annotations

from memprism_ray.composer.structures import View
from memprism_ray.render.config import RenderConfig
from memprism_ray.render.layout import layout


def render_text(view: View, config: RenderConfig | None = None) -> str:
    """The text twin of ``render_image(view, config)`` (same cap, same entries)."""
    return "\n".join(layout(view, config or RenderConfig()).lines)
