"""The optical renderer ``V_t = R_{tau,gamma}(S_t)`` (paper "Render: Optical Working
Memory"; appendix D.3: "The same event stream, action, goal, and renderer configuration
produce the same image").

A page is painted into a palette-index canvas (32 styles x 8 coverage levels): a ``P`` image
with exact colours (PNG encoding ~6x faster than RGB). Every row is drawn on a fresh canvas:
row-strip caches, frame templates and canvas pools bought nothing at the paper's horizons
(``benchmarks/bench_views.py``).
"""

from __future__ import annotations

import io
from dataclasses import dataclass

import numpy as np
from PIL import Image

from memprism_ray.composer.structures import View
from memprism_ray.render.config import RenderColors, RenderConfig
from memprism_ray.render.font import LEVELS, atlas
from memprism_ray.render.layout import _BOX, Block, Page, Row, layout

_FGS = ("text", "dim", "exception", "update", "arrow", "link", "accent")
#: (foreground, background) colour roles with a palette style, in palette order.
STYLE_PAIRS: tuple[tuple[str, str], ...] = (
    *((fg, bg) for bg in ("background", "exception_bg", "goal_bg", "card_bg") for fg in _FGS),
    ("rule", "background"),
    ("text", "header_bg"),
    ("dim", "header_bg"),
    ("accent", "header_bg"),
)
assert len(STYLE_PAIRS) * LEVELS <= 256
STYLE_BASE: dict[tuple[str, str], int] = {pair: i * LEVELS for i, pair in enumerate(STYLE_PAIRS)}
_SOLID: dict[str, int] = {}  # palette index of a plain colour role
for (_fg, _bg), _base in STYLE_BASE.items():
    _SOLID.setdefault(_bg, _base)  # level 0: the background colour
    _SOLID.setdefault(_fg, _base + LEVELS - 1)  # top level: the foreground colour


_ROLES: tuple[str, ...] = tuple(sorted({role for pair in STYLE_PAIRS for role in pair}))
_FG = np.array([_ROLES.index(fg) for fg, _ in STYLE_PAIRS])
_BG = np.array([_ROLES.index(bg) for _, bg in STYLE_PAIRS])
_K = np.arange(LEVELS, dtype=np.int64)[None, :, None]


def palette(colors: RenderColors) -> bytes:
    """768-byte RGB palette: style ``s`` level ``k`` is ``bg + (fg - bg) * k / 7`` (rounded),
    computed per image with numpy (tens of microseconds, no cache needed)."""
    rgb = np.array([colors.rgb(role) for role in _ROLES], np.int64)
    fg, bg = rgb[_FG][:, None, :], rgb[_BG][:, None, :]
    top = LEVELS - 1
    # bg * (7 - k) + fg * k >= 0, so floor division rounds like the integer formula.
    out = ((bg * top + (fg - bg) * _K + top // 2) // top).astype(np.uint8).tobytes()
    return out + b"\x00" * (768 - len(out))


def row_strip(row: Row, bg: str, size: int) -> np.ndarray:
    """Palette indices of one text row (its spans over its background)."""
    regular, bold = atlas(size), atlas(size, True)
    end = max((sp.col + len(sp.text) for sp in row.spans), default=0)
    strip = np.full((regular.cell_h, end * regular.cell_w), _SOLID[bg], np.uint8)
    for sp in row.spans:
        glyphs = (bold if sp.bold else regular).strip(sp.text)
        x = sp.col * regular.cell_w
        strip[:, x : x + glyphs.shape[1]] = glyphs + np.uint8(STYLE_BASE[(sp.fg, bg)])
    return strip


def _draw_rows(canvas: np.ndarray, block: Block, y: int, page: Page, config: RenderConfig) -> None:
    geo = page.geometry
    border, _, _, top, _ = _BOX[block.kind]
    x_text = geo.content_x(block.kind)
    x0 = geo.margin + border
    x1 = geo.width - geo.margin - border
    if block.kind == "link":
        x0 = x_text - 3
    height, width = canvas.shape
    for r, row in enumerate(block.rows):
        ry = y + border + top + r * geo.row_h
        if ry >= height:
            return
        ry1 = min(height, ry + geo.row_h)
        if row.bg:
            canvas[ry:ry1, x0:x1] = _SOLID[row.bg]
        if row.bar:
            canvas[ry:ry1, max(0, geo.margin - 5) : geo.margin - 2] = _SOLID[row.bar]
        if not row.spans:
            continue
        strip = row_strip(row, row.bg or block.bg, page.geometry.font_size)  # a fine page may have shrunk
        w = min(strip.shape[1], width - x_text)
        h = min(strip.shape[0], height - ry)
        canvas[ry : ry + h, x_text : x_text + w] = strip[:h, :w]


def paint(page: Page, config: RenderConfig) -> np.ndarray:
    """Palette indices ``(height, width)`` of a laid-out page, every row drawn directly."""
    geo = page.geometry
    h, w = page.height, geo.width
    canvas = np.full((h, w), _SOLID["background"], np.uint8)
    canvas[: page.header_h, :] = _SOLID["header_bg"]
    canvas[page.header_h - 2 : page.header_h, :] = _SOLID["arrow"]
    _draw_rows(canvas, page.header, 0, page, config)
    y = page.header_h + 4
    anchor_bottom = -1
    link_mids: list[int] = []
    for block in page.blocks:
        y += block.gap
        bh = geo.height(block)
        if y >= h:
            break
        y1 = min(h, y + bh)
        x0, x1 = geo.margin, w - geo.margin
        border = _BOX[block.kind][0]
        if block.kind in ("card", "anchor"):
            canvas[y:y1, x0:x1] = _SOLID["arrow" if block.kind == "anchor" else "rule"]
            canvas[y + border : max(y + border, y1 - border), x0 + border : x1 - border] = _SOLID[block.bg]
            if block.kind == "anchor":
                anchor_bottom = y1
        elif block.kind == "table_head":
            canvas[y:y1, x0:x1] = _SOLID["header_bg"]
        if block.kind in ("table_head", "table_row"):
            x_text = geo.content_x(block.kind)
            for col in block.col_rules:
                xr = x_text + col * geo.cell_w + geo.cell_w // 2
                canvas[y:y1, xr : xr + 1] = _SOLID["rule"]
            if block.kind == "table_row" and y + bh - 1 < h:
                canvas[y + bh - 1, x0:x1] = _SOLID["rule"]
        _draw_rows(canvas, block, y, page, config)
        if block.kind == "link":
            link_mids.append(y + _BOX["link"][3] + geo.row_h // 2)
        y += bh
    if anchor_bottom >= 0 and link_mids:
        _connectors(canvas, page, anchor_bottom, link_mids)
    return canvas


def _connectors(canvas: np.ndarray, page: Page, top: int, mids: list[int]) -> None:
    """Dependency arrows: a trunk from each linked event up to the anchor card."""
    geo = page.geometry
    color = _SOLID["arrow"]
    x = geo.margin + geo.cell_w
    x_end = geo.content_x("link") - 4
    bottom = min(canvas.shape[0] - 1, max(mids))
    canvas[top : bottom + 1, x : x + 2] = color
    for ym in mids:
        if ym < canvas.shape[0]:
            canvas[ym : ym + 2, x:x_end] = color
    for k in range(4):  # arrowhead pointing up at the anchor
        yk = top + k
        if yk < canvas.shape[0]:
            canvas[yk, max(0, x - k) : x + 2 + k] = color


@dataclass(frozen=True, slots=True)
class Rendered:
    """An optical view and its text twin from one layout (``image`` is ``None`` when the page
    was laid out but not painted: see :func:`render`)."""

    image: Image.Image | None
    text: str
    width: int
    height: int
    shown: int
    total: int


def paint_image(page: Page, config: RenderConfig) -> Image.Image:
    """A laid-out page as a PIL image; the palette image maps the freshly painted array without a copy."""
    canvas = paint(page, config)
    img = Image.frombuffer("P", (canvas.shape[1], canvas.shape[0]), canvas, "raw", "P", 0, 1)
    img.putpalette(palette(config.colors))
    return img.convert("RGB") if config.image_mode == "RGB" else img


def render_image(view: View, config: RenderConfig | None = None) -> Image.Image:
    """The optical view as a PIL image (mode ``P`` by default, see the module docstring)."""
    config = config or RenderConfig()
    return paint_image(layout(view, config), config)


def encode_png(image: Image.Image, config: RenderConfig | None = None) -> bytes:
    config = config or RenderConfig()
    buf = io.BytesIO()
    image.save(buf, format="PNG", compress_level=config.compress_level)
    return buf.getvalue()


def render(view: View, config: RenderConfig | None = None, *, paint: bool = True) -> Rendered:
    """Image and text from one layout. ``paint=False`` skips the pixels for a reader of the text only:
    painting was 46% of D1 labelling's time (cProfile of 7,200 views; ``benchmarks/bench_labels.py``)."""
    config = config or RenderConfig()
    page = layout(view, config)
    text = "\n".join(page.lines)
    if not paint:
        return Rendered(None, text, page.geometry.width, page.height, page.shown, page.total)
    img = paint_image(page, config)
    return Rendered(img, text, img.width, img.height, page.shown, page.total)
