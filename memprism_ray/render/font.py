"""Monospace glyph atlas for the optical renderer (paper "Render": a fixed, deterministic
visual grammar).

DejaVu Sans Mono (matplotlib's copy, ``ImageFont.Layout.BASIC``: no host shaping library), each
glyph rasterised once into a cell as 8 coverage levels; pixels depend only on the pinned
Pillow/FreeType and the font file. No per-text cache: it bought nothing
(``benchmarks/bench_views.py`` docstring).
"""

from __future__ import annotations

import threading
from functools import lru_cache
from pathlib import Path

import numpy as np

LEVELS = 8  # coverage levels per glyph pixel (palette images hold 32 styles x 8 levels)


def font_path(bold: bool = False) -> Path:
    """DejaVu Sans Mono (regular or bold) from matplotlib's bundled fonts."""
    import matplotlib

    name = "DejaVuSansMono-Bold.ttf" if bold else "DejaVuSansMono.ttf"
    path = Path(matplotlib.get_data_path()) / "fonts" / "ttf" / name
    if not path.is_file():
        raise FileNotFoundError(f"font {path} not found: matplotlib's mpl-data fonts are required")
    return path


def _charmap(bold: bool) -> frozenset[int]:
    from matplotlib.ft2font import FT2Font

    return frozenset(FT2Font(str(font_path(bold))).get_charmap())


class GlyphAtlas:
    """Glyph cells of one font file at one pixel size; grows on demand, thread-safe."""

    def __init__(self, size: int, bold: bool, cell: tuple[int, int] | None = None) -> None:
        from PIL import ImageFont

        self.size = size
        self.bold = bold
        self.font = ImageFont.truetype(str(font_path(bold)), size, layout_engine=ImageFont.Layout.BASIC)
        ascent, descent = self.font.getmetrics()
        if cell is None:
            advance = round(self.font.getlength("M"))
            ink_right = max(self.font.getbbox(chr(c))[2] for c in range(33, 127))
            cell = (max(advance, ink_right), ascent + descent)
        self.cell_w, self.cell_h = cell
        self._cmap = _charmap(bold)
        self._lock = threading.Lock()
        self._index: dict[str, int] = {}
        self._glyphs: list[np.ndarray] = []
        self._atlas = np.zeros((0, self.cell_h, self.cell_w), np.uint8)
        self._ascii = np.zeros(128, np.intp)
        with self._lock:
            for code in range(128):
                ch = chr(code) if 32 <= code < 127 else " "
                self._ascii[code] = self._add(ch)

    def _raster(self, ch: str) -> np.ndarray:
        from PIL import Image, ImageDraw

        img = Image.new("L", (self.cell_w, self.cell_h), 0)
        ImageDraw.Draw(img).text((0, 0), ch, font=self.font, fill=255)
        cover = np.asarray(img, dtype=np.uint16)
        return ((cover * (LEVELS - 1) + 127) // 255).astype(np.uint8)

    def _add(self, ch: str) -> int:
        # Callers hold the lock. The index is published only after the atlas holds the
        # glyph, so a concurrent reader never sees an index past the atlas it reads.
        idx = self._index.get(ch)
        if idx is None:
            idx = len(self._glyphs)
            self._glyphs.append(self._raster(ch))
            self._atlas = np.stack(self._glyphs)
            self._index[ch] = idx
        return idx

    def _lookup(self, ch: str) -> int:
        idx = self._index.get(ch)
        if idx is not None:
            return idx
        code = ord(ch)
        if code < 32 or 127 <= code < 160:
            return self._index[" "]
        if code not in self._cmap:
            return self._index["?"]
        with self._lock:
            return self._add(ch)

    def codes(self, text: str) -> np.ndarray:
        """Atlas indices of the characters of ``text``."""
        if text.isascii():
            return self._ascii[np.frombuffer(text.encode("ascii"), np.uint8)]
        return np.fromiter((self._lookup(ch) for ch in text), np.intp, len(text))

    def strip(self, text: str) -> np.ndarray:
        """Coverage levels of ``text`` as a ``(cell_h, len(text) * cell_w)`` uint8 array."""
        codes = self.codes(text)
        atlas = self._atlas
        return atlas[codes].transpose(1, 0, 2).reshape(self.cell_h, len(text) * self.cell_w)


# Kept: without it every view rasterises its glyphs again, many times the cost of a whole
# decision's compose + render (benchmarks/results/bench_views.json, "no glyph atlas lru").
@lru_cache(maxsize=16)
def atlas(size: int, bold: bool = False) -> GlyphAtlas:
    """The shared atlas for ``(size, bold)``; bold glyphs use the regular font's cell."""
    if bold:
        regular = atlas(size, False)
        return GlyphAtlas(size, True, (regular.cell_w, regular.cell_h))
    return GlyphAtlas(size, False)
