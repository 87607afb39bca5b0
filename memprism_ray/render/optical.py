"""The optical renderer ``V_t = R_{tau,gamma}(S_t)`` (paper "Render: Optical Working
Memory"; appendix D.3: "The same event stream, action, goal, and renderer configuration
produce the same image").

A laid-out page (``render.layout``) is painted into a palette-index canvas with numpy: the
palette holds 32 (foreground, background) styles x 8 coverage levels, so a text span is
one array assignment (glyph levels + style base) and a fill is one slice assignment. The
result is a ``P`` image with exact colours (1 byte per pixel: PNG encoding is ~6x faster
than RGB and files are small); ``RenderConfig.image_mode="RGB"`` returns a converted copy.
No step depends on process state, so bytes are identical in any process.

Speed (the paper's rendering cost is O(P) in what the page shows): ``paint_reference``
draws every row of every block; ``paint`` draws the same pixels by replaying each block's
recorded steps (frame fills merged into one pre-drawn rectangle, then the cached row
strips), found by block identity because layout returns the same block objects for the
same entries. Canvases come from a small pool and are reused only when nothing refers to
them any more (the returned image maps its canvas without a copy). Caches never change a
pixel; the tests compare both painters on warm, cold and clipped pages.
"""

from __future__ import annotations

import io
import sys
import threading
from dataclasses import dataclass
from functools import lru_cache

import numpy as np
from PIL import Image

from memprism_ray.composer.structures import View
from memprism_ray.render.config import RenderColors, RenderConfig
from memprism_ray.render.font import LEVELS, atlas
from memprism_ray.render.layout import _BOX, Block, Geometry, Page, Row, layout

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
_SOLID: dict[str, int] = {}
for (_fg, _bg), _base in STYLE_BASE.items():
    _SOLID.setdefault(_bg, _base)  # level 0: the background colour
    _SOLID.setdefault(_fg, _base + LEVELS - 1)  # top level: the foreground colour


def solid(role: str) -> int:
    """Palette index of a plain colour role."""
    return _SOLID[role]


@lru_cache(maxsize=16)
def palette(colors: RenderColors) -> bytes:
    """768-byte RGB palette: style ``s`` level ``k`` is ``bg + (fg - bg) * k / 7``."""
    out = bytearray()
    for fg_role, bg_role in STYLE_PAIRS:
        fg, bg = colors.rgb(fg_role), colors.rgb(bg_role)
        for k in range(LEVELS):
            out.extend(
                (bg[c] * (LEVELS - 1) + (fg[c] - bg[c]) * k + (LEVELS - 1) // 2) // (LEVELS - 1) for c in range(3)
            )
    out.extend(b"\x00" * (768 - len(out)))
    return bytes(out)


_ROW_CACHE: dict[tuple, np.ndarray] = {}
_ROW_CACHE_BYTES = [0]
# Budget of cached row strips (a full 672 px page holds ~45 strips of ~8 KB): room for the
# pages of a few dozen streams and all their views; beyond it every cached pixel is dropped.
_ROW_CACHE_MAX = 64 * 1024 * 1024


def _drop_pixels() -> None:
    """Forget cached pixels together: row strips, the rows and block steps that refer to
    them and pre-drawn frames, so memory stays within the strip and frame budgets."""
    _ROW_CACHE.clear()
    _ROW_CACHE_BYTES[0] = 0
    _ROW_IDS.clear()
    _OPS.clear()
    _FRAMES.clear()
    _FRAME_BYTES[0] = 0


# Row object -> (row, size, bg, strip): rows of cached entry blocks are drawn again at every
# decision that shows the entry, so their strip is found without rebuilding the content key.
_ROW_IDS: dict[int, tuple[Row, int, str, np.ndarray]] = {}
_ROW_IDS_MAX = 16_384


def row_strip(row: Row, bg: str, size: int) -> np.ndarray:
    """Palette indices of one text row (its spans over its background), cached by content:
    consecutive decisions redraw mostly the same entries, so rows repeat."""
    hit = _ROW_IDS.get(id(row))
    if hit is not None and hit[0] is row and hit[1] == size and hit[2] == bg:
        return hit[3]
    key = (size, bg, tuple((sp.col, sp.text, sp.fg, sp.bold) for sp in row.spans))
    cached = _ROW_CACHE.get(key)
    if cached is None:
        cached = _row_strip(row, bg, size, key)
    if len(_ROW_IDS) >= _ROW_IDS_MAX:
        _ROW_IDS.clear()
    _ROW_IDS[id(row)] = (row, size, bg, cached)
    return cached


def _row_strip(row: Row, bg: str, size: int, key: tuple) -> np.ndarray:
    regular, bold = atlas(size), atlas(size, True)
    end = max((sp.col + len(sp.text) for sp in row.spans), default=0)
    strip = np.full((regular.cell_h, end * regular.cell_w), solid(bg), np.uint8)
    for sp in row.spans:
        glyphs = (bold if sp.bold else regular).strip(sp.text)
        x = sp.col * regular.cell_w
        strip[:, x : x + glyphs.shape[1]] = glyphs + np.uint8(STYLE_BASE[(sp.fg, bg)])
    if _ROW_CACHE_BYTES[0] > _ROW_CACHE_MAX:
        _drop_pixels()
    _ROW_CACHE[key] = strip
    _ROW_CACHE_BYTES[0] += strip.nbytes + 200
    return strip


def clear_render_caches() -> None:
    """Forget cached row strips and laid-out entry blocks (benchmarks time cold renders)."""
    from memprism_ray.render.layout import clear_layout_cache

    _drop_pixels()
    with _CANVAS_LOCK:
        _CANVASES.clear()
    clear_layout_cache()


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
            canvas[ry:ry1, x0:x1] = solid(row.bg)
        if row.bar:
            canvas[ry:ry1, max(0, geo.margin - 5) : geo.margin - 2] = solid(row.bar)
        if not row.spans:
            continue
        strip = row_strip(row, row.bg or block.bg, config.font_size)
        w = min(strip.shape[1], width - x_text)
        h = min(strip.shape[0], height - ry)
        canvas[ry : ry + h, x_text : x_text + w] = strip[:h, :w]


def _paint_block(canvas: np.ndarray, block: Block, y: int, page: Page, config: RenderConfig) -> None:
    """Draw one block with its top at ``y``, clipped to the canvas (the reference drawing)."""
    geo = page.geometry
    h, w = canvas.shape
    bh = geo.height(block)
    y1 = min(h, y + bh)
    x0, x1 = geo.margin, w - geo.margin
    border = _BOX[block.kind][0]
    if block.kind in ("card", "anchor"):
        canvas[y:y1, x0:x1] = solid("arrow" if block.kind == "anchor" else "rule")
        canvas[y + border : max(y + border, y1 - border), x0 + border : x1 - border] = solid(block.bg)
    elif block.kind == "table_head":
        canvas[y:y1, x0:x1] = solid("header_bg")
    if block.kind in ("table_head", "table_row"):
        x_text = geo.content_x(block.kind)
        for col in block.col_rules:
            xr = x_text + col * geo.cell_w + geo.cell_w // 2
            canvas[y:y1, xr : xr + 1] = solid("rule")
        if block.kind == "table_row" and y + bh - 1 < h:
            canvas[y + bh - 1, x0:x1] = solid("rule")
    _draw_rows(canvas, block, y, page, config)


#: One drawing step of a block: ``canvas[y + dy0 : y + dy1, x0:x1] = value``.
Op = tuple[int, int, int, int, "int | np.ndarray"]
# Block object -> (block, font size, geometry, ops). Blocks of a page are cached by layout and
# drawn again at every decision that shows their entry; replaying their recorded steps skips
# the per-row bookkeeping. The ops reference the shared row strips, so they cost little memory.
_OPS: dict[int, tuple[Block, int, Geometry, list[Op]]] = {}
_OPS_MAX = 8_192


# (frame steps, block height) -> one pre-drawn array: a block's frame (card border and
# background, table rules) is pasted in one step. Few distinct frames exist per geometry.
_FRAMES: dict[tuple, tuple[int, int, np.ndarray]] = {}
_FRAME_BYTES = [0]
_FRAMES_MAX_BYTES = 16 * 1024 * 1024


def _frame(ops: list[Op], bh: int, width: int) -> Op:
    """The frame steps ``ops`` (plain fills) as one step: an array spanning the columns
    they touch, background wherever none of them paints."""
    key = (bh, width, tuple((*op[:4], int(op[4])) for op in ops))
    hit = _FRAMES.get(key)
    if hit is None:
        full = np.full((bh, width), solid("background"), np.uint8)
        for dy0, dy1, xa, xb, value in ops:
            full[dy0:dy1, xa:xb] = value
        touched = np.zeros(width, bool)
        for _, _, xa, xb, _ in ops:
            touched[xa:xb] = True
        cols = np.flatnonzero(touched)
        lo, hi = (int(cols[0]), int(cols[-1]) + 1) if len(cols) else (0, 0)
        if _FRAME_BYTES[0] > _FRAMES_MAX_BYTES:
            _drop_pixels()
        hit = _FRAMES[key] = (lo, hi, full[:, lo:hi].copy())
        _FRAME_BYTES[0] += hit[2].nbytes + 200
    lo, hi, arr = hit
    return (0, bh, lo, hi, arr)


def _record_ops(block: Block, geo: Geometry, config: RenderConfig) -> list[Op]:
    """The steps of :func:`_paint_block` for an unclipped block at ``y = 0``, in order
    (the frame fills merged into one step when the frame touches contiguous columns)."""
    ops: list[Op] = []
    bh = geo.height(block)
    x0, x1 = geo.margin, geo.width - geo.margin
    border, _, _, top, _ = _BOX[block.kind]
    if block.kind in ("card", "anchor"):
        ops.append((0, bh, x0, x1, solid("arrow" if block.kind == "anchor" else "rule")))
        ops.append((border, max(border, bh - border), x0 + border, x1 - border, solid(block.bg)))
    elif block.kind == "table_head":
        ops.append((0, bh, x0, x1, solid("header_bg")))
    if block.kind in ("table_head", "table_row"):
        x_text = geo.content_x(block.kind)
        for col in block.col_rules:
            xr = x_text + col * geo.cell_w + geo.cell_w // 2
            ops.append((0, bh, xr, xr + 1, solid("rule")))
        if block.kind == "table_row":
            ops.append((bh - 1, bh, x0, x1, solid("rule")))
    if len(ops) > 2:
        # Table rules: several thin fills become one pre-drawn rectangle (cards keep their
        # two plain fills, which cost no memory). The block's area is still background when
        # its frame is drawn, so pasting the rectangle (background wherever no frame step
        # paints) is exact.
        ops = [_frame(ops, bh, geo.width)]
    x_text = geo.content_x(block.kind)
    rx0 = x_text - 3 if block.kind == "link" else geo.margin + border
    rx1 = geo.width - geo.margin - border
    for r, row in enumerate(block.rows):
        ry = border + top + r * geo.row_h
        if row.bg:
            ops.append((ry, ry + geo.row_h, rx0, rx1, solid(row.bg)))
        if row.bar:
            ops.append((ry, ry + geo.row_h, max(0, geo.margin - 5), geo.margin - 2, solid(row.bar)))
        if row.spans:
            strip = row_strip(row, row.bg or block.bg, config.font_size)
            w = min(strip.shape[1], geo.width - x_text)
            ops.append((ry, ry + strip.shape[0], x_text, x_text + w, strip[:, :w]))
    return ops


def _block_ops(block: Block, geo: Geometry, config: RenderConfig) -> list[Op]:
    hit = _OPS.get(id(block))
    if hit is not None and hit[0] is block and hit[1] == config.font_size and (hit[2] is geo or hit[2] == geo):
        return hit[3]
    ops = _record_ops(block, geo, config)
    if len(_OPS) >= _OPS_MAX:
        _OPS.clear()
    _OPS[id(block)] = (block, config.font_size, geo, ops)
    return ops


# Canvases handed out by `paint` and reused once nothing else refers to them. A fresh
# max_side x max_side array costs page faults on every decision (the allocator returns
# large blocks to the system); a returned image maps its canvas, so a canvas is free again
# only when the image and every view of the array are gone, which its reference count says.
_CANVASES: list[np.ndarray] = []
_CANVASES_MAX = 16
_CANVAS_LOCK = threading.Lock()


def _refs(pool: list[np.ndarray], i: int) -> int:
    """References to ``pool[i]`` counted from here (free: the pool's only)."""
    return sys.getrefcount(pool[i])


# What `_refs` reports for an array only the pool refers to (measured, not assumed).
_FREE_REFS = _refs([np.zeros(1, np.uint8)], 0)


def _canvas(h: int, w: int, fill: int) -> np.ndarray:
    """A ``(h, w)`` uint8 array filled with ``fill``, reused from the pool when one is free."""
    with _CANVAS_LOCK:
        spare = -1
        for i in range(len(_CANVASES)):
            if _refs(_CANVASES, i) == _FREE_REFS:
                a = _CANVASES[i]
                if a.shape == (h, w):
                    a.fill(fill)
                    return a
                spare = i
        a = np.full((h, w), fill, np.uint8)
        if len(_CANVASES) < _CANVASES_MAX:
            _CANVASES.append(a)
        elif spare >= 0:
            _CANVASES[spare] = a
        return a


def paint(page: Page, config: RenderConfig) -> np.ndarray:
    """Palette indices ``(height, width)`` of a laid-out page (equal to
    :func:`paint_reference`: blocks that fit are drawn by replaying their recorded steps).
    The array may be reused by a later call once the caller has dropped every reference."""
    geo = page.geometry
    h, w = page.height, geo.width
    canvas = _canvas(h, w, solid("background"))
    canvas[: page.header_h, :] = solid("header_bg")
    canvas[page.header_h - 2 : page.header_h, :] = solid("arrow")
    _draw_rows(canvas, page.header, 0, page, config)
    y = page.header_h + 4
    anchor_bottom = -1
    link_mids: list[int] = []
    size = config.font_size
    for block in page.blocks:
        y += block.gap
        bh = geo.height(block)
        if y >= h:
            break
        if y + bh <= h:
            hit = _OPS.get(id(block))
            if hit is not None and hit[0] is block and hit[1] == size and hit[2] is geo:
                ops = hit[3]
            else:
                ops = _block_ops(block, geo, config)
            for dy0, dy1, xa, xb, value in ops:
                canvas[y + dy0 : y + dy1, xa:xb] = value
        else:
            _paint_block(canvas, block, y, page, config)
        if block.kind == "anchor":
            anchor_bottom = min(h, y + bh)
        elif block.kind == "link":
            link_mids.append(y + _BOX["link"][3] + geo.row_h // 2)
        y += bh
    if anchor_bottom >= 0 and link_mids:
        _connectors(canvas, page, anchor_bottom, link_mids)
    return canvas


def paint_reference(page: Page, config: RenderConfig) -> np.ndarray:
    """Palette indices of a laid-out page, every row drawn directly (the reference)."""
    geo = page.geometry
    h, w = page.height, geo.width
    canvas = np.full((h, w), solid("background"), np.uint8)
    canvas[: page.header_h, :] = solid("header_bg")
    canvas[page.header_h - 2 : page.header_h, :] = solid("arrow")
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
            canvas[y:y1, x0:x1] = solid("arrow" if block.kind == "anchor" else "rule")
            canvas[y + border : max(y + border, y1 - border), x0 + border : x1 - border] = solid(block.bg)
            if block.kind == "anchor":
                anchor_bottom = y1
        elif block.kind == "table_head":
            canvas[y:y1, x0:x1] = solid("header_bg")
        if block.kind in ("table_head", "table_row"):
            x_text = geo.content_x(block.kind)
            for col in block.col_rules:
                xr = x_text + col * geo.cell_w + geo.cell_w // 2
                canvas[y:y1, xr : xr + 1] = solid("rule")
            if block.kind == "table_row" and y + bh - 1 < h:
                canvas[y + bh - 1, x0:x1] = solid("rule")
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
    color = solid("arrow")
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
    """An optical view and its text twin from one layout."""

    image: Image.Image
    text: str
    width: int
    height: int
    shown: int
    total: int


def paint_image(page: Page, config: RenderConfig) -> Image.Image:
    """A laid-out page as a PIL image (palette or RGB per ``config.image_mode``).

    The palette image maps the painted array without a copy (as ``Image.fromarray`` does:
    Pillow marks it read-only and copies before any in-place edit)."""
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


def render_png(view: View, config: RenderConfig | None = None) -> bytes:
    """The optical view as PNG bytes (byte-identical for the same view and config)."""
    config = config or RenderConfig()
    return encode_png(render_image(view, config), config)


def render(view: View, config: RenderConfig | None = None) -> Rendered:
    """Image and text from one layout (what the agent loop needs at each decision)."""
    config = config or RenderConfig()
    page = layout(view, config)
    img = paint_image(page, config)
    return Rendered(img, "\n".join(page.lines), img.width, img.height, page.shown, page.total)
