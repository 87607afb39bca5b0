"""The text renderer: the paper's "Dynamic Text" condition and what a text-only policy reads.

It prints the same laid-out page as the optical renderer (``render.layout``): the same
header facts, the same kept entries under the same row budget and the same omission
marker, one entry per line, with entity names, actions, outcomes and state changes verbatim
(``step 7 | take mug 1 from countertop 2 | state_update | agent.holding -> mug 1``).
Goal-relevant entries end in ``[goal]``.
"""

from __future__ import annotations

from memprism_ray.composer.structures import View
from memprism_ray.render.config import RenderConfig
from memprism_ray.render.layout import layout


def render_text(view: View, config: RenderConfig | None = None) -> str:
    """The text twin of ``render_image(view, config)`` (same cap, same entries)."""
    return "\n".join(layout(view, config or RenderConfig()).lines)
