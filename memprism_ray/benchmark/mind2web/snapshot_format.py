"""The text format of a Mind2Web page snapshot (paper appendix D.2 "Mind2Web"): one line per
candidate element, in page order, opened by the ref marker the Mind2Web prompt and parser use
(``[ref=e<backend_node_id>]``)::

    [ref=e136] <input type="text" placeholder="From"> From
    [ref=e142] <button> Search flights

written by :mod:`memprism_ray.benchmark.mind2web.snapshot`, read back by :func:`parse_snapshot`.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass

_LINE = re.compile(r"^\[ref=(?P<ref>[^\]\s]+)\] <(?P<tag>[a-zA-Z0-9_-]+)(?P<attrs>[^>]*)>(?P<text>.*)$")
_ATTR = re.compile(r'([a-zA-Z_:-]+)="([^"]*)"')


def ref_of(backend_node_id: str) -> str:
    """The snapshot ref of a backend node id."""
    return f"e{backend_node_id}"


def clip(text: str, limit: int) -> str:
    """``text`` on one line, cut to ``limit`` characters with ``...``."""
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 3] + "..."


@dataclass(frozen=True)
class Element:
    """One snapshot line's element."""

    ref: str
    tag: str
    attrs: Mapping[str, str]
    text: str
    source: str  # "cleaned_html" or "snippet" ("" when parsed back from text)

    def line(self, limit: int) -> str:
        attrs = "".join(f' {k}="{clip(v, 40)}"' for k, v in self.attrs.items())
        return clip(f"[ref={self.ref}] <{self.tag}{attrs}> {self.text}".rstrip(), limit)


def parse_snapshot(text: str) -> dict[str, Element]:
    """The elements of a snapshot text by ref (the inverse of :meth:`Element.line`)."""
    out: dict[str, Element] = {}
    for line in text.splitlines():
        m = _LINE.match(line.strip())
        if m:
            attrs = dict(_ATTR.findall(m.group("attrs")))
            out[m.group("ref")] = Element(m.group("ref"), m.group("tag").lower(), attrs, m.group("text").strip(), "")
    return out


def describe(element: Element | None, ref: str) -> str:
    """A short name of an element for events and views (``button 'Search flights'``)."""
    if element is None:
        return ref
    names = ("aria_label", "aria-label", "placeholder", "title", "name", "alt")
    label = element.text or next((element.attrs[k] for k in names if k in element.attrs), "")
    return clip(f"{element.tag} '{label}'" if label else element.tag, 60)
