"""Building the Mind2Web page snapshot the task policy reads (paper appendix D.2 "Mind2Web":
"The adapter uses cleaned_html near candidate backend-node IDs when available, falling back
to compact HTML snippets"); the line format is :mod:`memprism_ray.benchmark.mind2web.snapshot_format`.

One line per candidate of the pool: MindAct's (the ranker's top k) or the project's (every
positive plus negatives chosen by a hash of ``(action_uid, backend_node_id)``, so the choice
does not depend on the file's order). Lines follow page order, so the ground truth is not
singled out by position.
"""

from __future__ import annotations

import bisect
import hashlib
from collections.abc import Collection, Mapping
from dataclasses import dataclass, field
from html.parser import HTMLParser

from memprism_ray.benchmark.mind2web.data import Candidate, Step
from memprism_ray.benchmark.mind2web.snapshot_format import Element, ref_of

#: Attributes worth showing: what identifies a control to a reader.
_KEEP = "type name placeholder aria_label aria-label title alt value role href label input_checked input_value"
KEEP_ATTRS: tuple[str, ...] = tuple(_KEEP.split())
_VOID = {"input", "img", "br", "hr", "meta", "link", "area", "base", "col", "embed", "source", "track", "wbr"}


@dataclass(frozen=True)
class SnapshotConfig:
    """How a snapshot is built."""

    max_candidates: int = 32
    """candidate elements shown per page in the project's pool (all positives, then hashed
    negatives); MindAct's pool is the ranker's top k instead"""
    max_line_chars: int = 160
    """longest element line"""
    context_chars: int = 60
    """longest text taken from before an element that has no text of its own (its label)"""

    def __post_init__(self) -> None:
        if self.max_candidates < 1 or self.max_line_chars < 20 or self.context_chars < 0:
            raise ValueError("SnapshotConfig needs max_candidates >= 1, max_line_chars >= 20 and context_chars >= 0")


@dataclass(frozen=True)
class Snapshot:
    """A page as the policy sees it."""

    text: str
    refs: tuple[str, ...]
    elements: Mapping[str, Element] = field(default_factory=dict)
    source: str = "cleaned_html"
    """``cleaned_html`` (every line from the page), ``snippets`` (none) or ``mixed``"""


class _Page(HTMLParser):
    """Elements with a ``backend_node_id`` and the page text, in document order."""

    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.text_parts: list[str] = []
        self.starts: list[int] = []
        self.text_len = 0
        self.found: dict[str, dict[str, object]] = {}
        self.stack: list[tuple[str, str | None]] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        a = {k: (v or "") for k, v in attrs}
        node = a.get("backend_node_id")
        if node and node not in self.found:
            self.found[node] = {"tag": tag, "attrs": a, "start": self.text_len, "end": None, "order": len(self.found)}
        if tag in _VOID:
            if node and node in self.found:
                self.found[node]["end"] = self.text_len
            return
        self.stack.append((tag, node))

    def handle_endtag(self, tag: str) -> None:
        for i in range(len(self.stack) - 1, -1, -1):
            if self.stack[i][0] == tag:
                for _, node in self.stack[i:]:
                    if node and node in self.found and self.found[node]["end"] is None:
                        self.found[node]["end"] = self.text_len
                del self.stack[i:]
                return

    def handle_data(self, data: str) -> None:
        text = " ".join(data.split())
        if text:
            self.starts.append(self.text_len)
            self.text_parts.append(text + " ")
            self.text_len += len(text) + 1

    def finish(self) -> str:
        for _, node in self.stack:
            if node and node in self.found and self.found[node]["end"] is None:
                self.found[node]["end"] = self.text_len
        return "".join(self.text_parts)


def _keep(attrs: Mapping[str, str]) -> dict[str, str]:
    return {k: v for k, v in attrs.items() if k in KEEP_ATTRS and v.strip()}


def _pick(step: Step, limit: int, pool: Collection[str] | None) -> list[Candidate]:
    seen: dict[str, Candidate] = {}
    if pool is not None:
        for c in (*step.pos, *step.neg):
            if c.backend_node_id in pool:
                seen.setdefault(c.backend_node_id, c)
        return list(seen.values())
    for c in step.pos:
        seen.setdefault(c.backend_node_id, c)
    negs = [c for c in step.neg if c.backend_node_id not in seen]

    def key(c: Candidate) -> bytes:
        return hashlib.blake2b(f"{step.action_uid}|{c.backend_node_id}".encode(), digest_size=8).digest()

    for c in sorted(negs, key=key):
        if len(seen) >= max(limit, len(step.pos)):
            break
        seen.setdefault(c.backend_node_id, c)
    return list(seen.values())


def positive_in_pool(step: Step, config: SnapshotConfig | None = None, pool: Collection[str] | None = None) -> bool:
    """Whether the snapshot of ``step`` shows a positive candidate (metric.py's "Recall Cap")."""
    pos = {c.backend_node_id for c in step.pos}
    return any(c.backend_node_id in pos for c in _pick(step, (config or SnapshotConfig()).max_candidates, pool))


def build_snapshot(step: Step, config: SnapshotConfig | None = None, pool: Collection[str] | None = None) -> Snapshot:
    """The snapshot of the page before ``step``; ``pool``: MindAct's pool (``None``: the project's)."""
    cfg = config or SnapshotConfig()
    page = _Page()
    if step.cleaned_html:
        page.feed(step.cleaned_html)
        page.close()
    text = page.finish()
    chosen = _pick(step, cfg.max_candidates, pool)
    elements: list[tuple[float, Element]] = []
    for i, c in enumerate(chosen):
        ref = ref_of(c.backend_node_id)
        hit = page.found.get(c.backend_node_id)
        if hit is not None:
            start, end = int(hit["start"]), int(hit["end"] if hit["end"] is not None else hit["start"])  # type: ignore[call-overload]
            own = text[start:end].strip()
            if not own and cfg.context_chars:
                # The nearest text before the element (a field's label), not a run of the page.
                k = bisect.bisect_left(page.starts, start) - 1
                own = page.text_parts[k].strip()[-cfg.context_chars :] if k >= 0 else ""
            attrs = _keep(hit["attrs"])  # type: ignore[arg-type]
            elements.append((float(hit["order"]), Element(ref, str(hit["tag"]), attrs, own, "cleaned_html")))  # type: ignore[arg-type]
        else:
            attrs = _keep(c.attributes)
            label = c.attributes.get("text") or c.attributes.get("aria_label") or ""
            # Not on the page: after the page's elements, in candidate order.
            elements.append((1e9 + i, Element(ref, c.tag, attrs, label, "snippet")))
    elements.sort(key=lambda x: x[0])
    ordered = [e for _, e in elements]
    sources = {e.source for e in ordered}
    source = "snippets" if sources == {"snippet"} else ("mixed" if len(sources) > 1 else "cleaned_html")
    return Snapshot(
        text="\n".join(e.line(cfg.max_line_chars) for e in ordered),
        refs=tuple(e.ref for e in ordered),
        elements={e.ref: e for e in ordered},
        source=source,
    )


def human_refs(step: Step, snapshot: Snapshot) -> tuple[str, ...]:
    """The refs of the step's positive candidates that the snapshot shows (any is the human target)."""
    return tuple(r for r in (ref_of(c.backend_node_id) for c in step.pos) if r in snapshot.elements)
