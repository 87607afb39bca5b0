"""Render: optical working memory (paper "Render: Optical Working Memory", appendix D.3).

``render_image`` draws a compiled view with the fixed visual grammar (``encode_png``: its PNG bytes);
``render_text`` prints the same entries as text; ``visual_tokens`` counts what an image
costs a VLM. Importing this package loads no font: atlases are built on first use.
"""

from memprism_ray.render.config import RenderColors, RenderConfig
from memprism_ray.render.layout import Page, layout
from memprism_ray.render.optical import encode_png, render, render_image
from memprism_ray.render.text import render_text
from memprism_ray.render.visual_tokens import qwen25vl_tokens

__all__ = [
    "Page",
    "RenderColors",
    "RenderConfig",
    "encode_png",
    "layout",
    "qwen25vl_tokens",
    "render",
    "render_image",
    "render_text",
]
