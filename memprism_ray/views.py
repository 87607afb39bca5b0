"""Compose + render one working-memory view per request, with a content-addressed cache
(paper "Composer" and "Render"; appendix C.3: "The same event stream, action, goal, and
renderer configuration produce the same image").

Because the output is a pure function of (stream content, view action, goal, renderer
settings), a view is addressed by ``sha256(content digest, action index, goal, medium,
render settings)``. The content digest covers every record's raw event and structured
event but not the bookkeeping metadata (the stream's episode id, the raw events' step,
game id and chosen view name), which no view shows: identical views requested by several
trajectories of a GRPO group (all of them at step 1, for instance) are drawn once. The Ray
``ViewWorker`` wraps this class; in-process runs use it directly.

Views are composed where the streams live (paper appendix C.3: the view is a function of the
stream, computed at decision time and discarded). A rollout worker that hands drawing to a
``ViewWorker`` pool composes each view itself (:meth:`ViewService.compose`, O(1) key from the
stream's content hash chain) and ships only the composed view (:class:`ComposedView`) to be
drawn (:meth:`ViewService.draw`): the stream never travels. Shipping the whole stream each step
made the bytes per episode grow with the square of its length
(``benchmarks/bench_view_bytes.py`` prints both).
"""

from __future__ import annotations

import hashlib
import io
import json
import time
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import asdict, dataclass, is_dataclass
from typing import Any

from PIL import Image

from memprism_ray.recorder.stream import EventStream
from memprism_ray.view_space import ViewAction


@dataclass(frozen=True)
class ViewRequest:
    """One view to build. ``want_image``/``want_text`` choose the renderers to run."""

    stream: EventStream
    action: ViewAction
    goal: str
    want_image: bool = True
    want_text: bool = False


@dataclass(frozen=True)
class ComposedView:
    """A view composed next to its stream, ready to be drawn elsewhere: the content address
    ``key`` (as :meth:`ViewService.key` computes it), the compiled view and the media wanted.
    Its size is that of what the view shows, not of the stream."""

    key: str
    view: Any  # composer.View
    want_image: bool
    want_text: bool
    compose_ms: float


@dataclass(frozen=True)
class RenderedView:
    """A rendered view. ``png`` is set when the image is wanted and ``encode_png`` is on
    (actors ship bytes, not PIL objects); ``image`` is the in-process PIL image."""

    action: ViewAction
    text: str | None
    image: Image.Image | None
    png: bytes | None
    width: int
    height: int
    visual_tokens: int
    compose_ms: float
    render_ms: float
    cached: bool
    n_selected: int
    key: str

    def pil(self) -> Image.Image | None:
        """The image as PIL (decoding the PNG when only bytes travelled)."""
        if self.image is not None:
            return self.image
        if self.png is None:
            return None
        with Image.open(io.BytesIO(self.png)) as im:
            im.load()
            return im.convert("RGB")

    @property
    def pixels(self) -> int:
        return self.width * self.height


def _settings_digest(config: Any) -> str:
    data = asdict(config) if is_dataclass(config) else dict(vars(config)) if config is not None else {}
    return hashlib.sha256(json.dumps(data, sort_keys=True, default=str).encode()).hexdigest()[:16]


def content_digest(stream: EventStream) -> str:
    """Digest of what a view of ``stream`` can depend on: each record's raw and structured
    event, in order, without episode bookkeeping metadata (kept by the stream, O(1))."""
    return stream.content_digest


class ViewService:
    """Compose and render views with an LRU cache keyed by content address."""

    def __init__(self, render_config: Any = None, *, cache_size: int = 512, encode_png: bool = False) -> None:
        from memprism_ray.render import RenderConfig

        self.render_config = render_config if render_config is not None else RenderConfig()
        self.encode_png = encode_png
        self.cache_size = cache_size
        self._cache: OrderedDict[str, RenderedView] = OrderedDict()
        self._settings = _settings_digest(self.render_config)
        self.hits = 0
        self.misses = 0

    def key(self, req: ViewRequest) -> str:
        parts = [content_digest(req.stream), str(req.action.index), req.goal, str(req.want_image), str(req.want_text)]
        parts.append(self._settings)
        return hashlib.sha256("\x1f".join(parts).encode()).hexdigest()

    def render(self, requests: Sequence[ViewRequest]) -> list[RenderedView]:
        return [self.render_one(r) for r in requests]

    def render_each(self, requests: Sequence[ViewRequest]) -> list[RenderedView | BaseException]:
        """:meth:`render_one` per request; a failure becomes that request's result."""
        return _each(self.render_one, requests)

    def render_one(self, req: ViewRequest) -> RenderedView:
        """Compose (unless cached) and draw one view."""
        hit = self._lookup(self.key(req))
        return hit if hit is not None else self.draw(self.compose(req))

    def compose(self, req: ViewRequest) -> ComposedView:
        """The composition half, run where ``req.stream`` lives."""
        from memprism_ray.composer import compose

        t0 = time.perf_counter()
        view = compose(req.stream, req.action, req.goal)
        ms = (time.perf_counter() - t0) * 1000
        return ComposedView(self.key(req), view, req.want_image, req.want_text, ms)

    def draw(self, job: ComposedView) -> RenderedView:
        """The drawing half (what a ``ViewWorker`` runs), cached by ``job.key``."""
        from memprism_ray.render import encode_png, render, render_image, render_text
        from memprism_ray.render.visual_tokens import qwen25vl_tokens

        hit = self._lookup(job.key)
        if hit is not None:
            return hit
        self.misses += 1
        view = job.view
        t1 = time.perf_counter()
        image, text = None, None
        if job.want_image and job.want_text:
            both = render(view, self.render_config)  # one layout for both media
            image, text = both.image, both.text
        elif job.want_image:
            image = render_image(view, self.render_config)
        elif job.want_text:
            text = render_text(view, self.render_config)
        png = encode_png(image, self.render_config) if (image is not None and self.encode_png) else None
        t2 = time.perf_counter()
        width, height = (image.width, image.height) if image is not None else (0, 0)
        out = RenderedView(
            action=view.action,
            text=text,
            image=None if self.encode_png else image,
            png=png,
            width=width,
            height=height,
            visual_tokens=qwen25vl_tokens(width, height) if image is not None else 0,
            compose_ms=job.compose_ms,
            render_ms=(t2 - t1) * 1000,
            cached=False,
            n_selected=view.n_selected,
            key=job.key,
        )
        self._cache[job.key] = out
        if len(self._cache) > self.cache_size:
            self._cache.popitem(last=False)
        return out

    def draw_each(self, jobs: Sequence[ComposedView]) -> list[RenderedView | BaseException]:
        return _each(self.draw, jobs)

    def _lookup(self, key: str) -> RenderedView | None:
        hit = self._cache.get(key)
        if hit is None:
            return None
        self._cache.move_to_end(key)
        self.hits += 1
        return RenderedView(**{**hit.__dict__, "cached": True})

    def stats(self) -> dict[str, int]:
        return {"hits": self.hits, "misses": self.misses, "size": len(self._cache)}


def _each(fn: Any, items: Sequence[Any]) -> list[Any]:
    """``fn`` over a batch; an exception becomes that item's result (one bad view fails one
    episode, not the batch; ``agent.each_request``, which imports this module)."""
    out: list[Any] = []
    for item in items:
        try:
            out.append(fn(item))
        except Exception as exc:
            out.append(exc)
    return out
