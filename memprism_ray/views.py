"""Compose + render one working-memory view per request, with a content-addressed cache
(paper "Composer" and "Render"; appendix D.3: "The same event stream, action, goal, and
renderer configuration produce the same image").

Identical views of a GRPO group are drawn once. A ``ViewWorker`` keeps a replica of each stream
and receives only the appended records (``benchmarks/bench_view_bytes.py``); an out-of-step
replica answers :class:`StreamOutOfSync` and the sender resends the whole stream once."""

from __future__ import annotations

import hashlib
import io
import json
import time
import uuid
import weakref
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import asdict, dataclass, is_dataclass
from typing import Any

from PIL import Image

from memprism_ray.recorder.stream import EventStream, StreamRecord
from memprism_ray.view_space import ViewAction


@dataclass(frozen=True)
class ViewRequest:
    """One view to build. ``paint=False`` with ``want_image`` lays the page out (its size, hence
    its visual tokens) without painting its pixels."""

    stream: EventStream
    action: ViewAction
    goal: str
    want_image: bool = True
    want_text: bool = False
    paint: bool = True


@dataclass(frozen=True)
class DeltaViewRequest:
    """A :class:`ViewRequest` as the records ``stream[base:]`` (and ``meta`` when ``base == 0``)."""

    stream_id: str
    base: int
    records: tuple[StreamRecord, ...]
    meta: dict[str, Any] | None
    action: ViewAction
    goal: str
    want_image: bool = True
    want_text: bool = False
    paint: bool = True


class StreamOutOfSync(RuntimeError):
    """The receiver's replica of a stream is not at the delta's base: resend from 0."""


#: Streams a ViewWorker keeps replicas of (least recently used dropped first). The paper
#: preset keeps 128 streams live (8 groups x 16 trajectories) over 8 ViewWorkers, 16 each;
#: a 50-record replica takes ~61 KB (tracemalloc, synthetic ALFWorld stream), so 256 cap a
#: worker at ~16 MB. An evicted stream that is still live costs one full resend, never a
#: wrong view.
MAX_REPLICAS = 256


class StreamReplicas:
    """Receiver side: replicas of remote streams, rebuilt by appending the sent records."""

    def __init__(self, max_streams: int = MAX_REPLICAS) -> None:
        self.max_streams = max_streams
        self._streams: OrderedDict[str, EventStream] = OrderedDict()
        self.resyncs = 0

    def apply(self, req: DeltaViewRequest) -> EventStream:
        if req.base == 0:
            stream = EventStream(req.meta or {})
        else:
            stream = self._streams.get(req.stream_id)
            if stream is None or len(stream) != req.base:
                self.resyncs += 1
                have = "no" if stream is None else len(stream)
                raise StreamOutOfSync(f"stream {req.stream_id}: replica has {have} records, delta starts at {req.base}")
        for rec in req.records:
            stream.append(rec.raw, rec.event)
        self._streams[req.stream_id] = stream
        self._streams.move_to_end(req.stream_id)
        while len(self._streams) > self.max_streams:
            self._streams.popitem(last=False)
        return stream

    def __len__(self) -> int:
        return len(self._streams)


class DeltaTracker:
    """Sender side: which worker holds a replica of each stream and up to which record; a stream
    is pinned round robin on first sight. Streams compare by content, so they are tracked by
    identity through a weak reference (checked on lookup: a recycled ``id`` never aliases)."""

    def __init__(self, num_workers: int, offset: int = 0) -> None:
        if num_workers < 1:
            raise ValueError(f"DeltaTracker needs at least one worker, got {num_workers}")
        self.num_workers = num_workers
        self._next = offset
        self._state: dict[int, tuple[weakref.ref, list[Any]]] = {}

    def _entry(self, stream: EventStream) -> list[Any] | None:
        got = self._state.get(id(stream))
        return got[1] if got is not None and got[0]() is stream else None

    def request(self, req: ViewRequest, *, full: bool = False) -> tuple[int, DeltaViewRequest]:
        """The worker index and the delta request for ``req`` (``full``: resend everything)."""
        state = self._entry(req.stream)
        if state is None:
            key = id(req.stream)
            ref = weakref.ref(req.stream, lambda r, k=key: self._drop(k, r))
            state = [uuid.uuid4().hex, self._next % self.num_workers, 0]
            self._state[key] = (ref, state)
            self._next += 1
        stream_id, worker, held = state
        base = 0 if full else min(held, len(req.stream))
        records = tuple(req.stream[i] for i in range(base, len(req.stream)))
        meta = dict(req.stream.meta) if base == 0 else None
        delta = DeltaViewRequest(
            stream_id, base, records, meta, req.action, req.goal, req.want_image, req.want_text, req.paint
        )
        return worker, delta

    def acknowledge(self, stream: EventStream, held: int) -> None:
        """The worker now holds ``held`` records of ``stream`` (0: unknown, resend next time)."""
        state = self._entry(stream)
        if state is not None:
            state[2] = held

    def _drop(self, key: int, ref: weakref.ref) -> None:
        got = self._state.get(key)
        if got is not None and got[0] is ref:
            del self._state[key]

    def __len__(self) -> int:
        return len(self._state)


@dataclass(frozen=True)
class RenderedView:
    """A rendered view: ``png`` when ``encode_png`` is on (actors ship bytes), else ``image``;
    an unpainted page has neither."""

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
    """Digest of what a view of ``stream`` can depend on (no bookkeeping metadata)."""
    return stream.content_digest


class ViewService:
    """Compose and render views with an LRU cache keyed by content address."""

    def __init__(
        self,
        render_config: Any = None,
        *,
        cache_size: int = 512,
        encode_png: bool = False,
        composer_config: Any = None,
    ) -> None:
        from memprism_ray.composer import ComposerConfig
        from memprism_ray.render import RenderConfig

        self.render_config = render_config if render_config is not None else RenderConfig()
        # The paper's Merge by default (goal restore from the whole history); see ComposerConfig.
        self.composer_config = composer_config if composer_config is not None else ComposerConfig()
        self.encode_png = encode_png
        self.cache_size = cache_size
        self._cache: OrderedDict[str, RenderedView] = OrderedDict()
        self._settings = _settings_digest(self.render_config) + "|" + _settings_digest(self.composer_config)
        self.hits = 0
        self.misses = 0
        self.replicas = StreamReplicas()

    def key(self, req: ViewRequest) -> str:
        parts = [content_digest(req.stream), str(req.action.index), req.goal, str(req.want_image), str(req.want_text)]
        parts += [str(req.paint), self._settings]
        return hashlib.sha256("\x1f".join(parts).encode()).hexdigest()

    def render(self, requests: Sequence[ViewRequest]) -> list[RenderedView]:
        return [self.render_one(r) for r in requests]

    def render_each(self, requests: Sequence[ViewRequest]) -> list[RenderedView | BaseException]:
        """:meth:`render_one` per request; a failure becomes that request's result."""
        return each_request(self.render_one, requests)

    def render_one(self, req: ViewRequest) -> RenderedView:
        from memprism_ray.composer import compose
        from memprism_ray.render import encode_png, render, render_image, render_text
        from memprism_ray.render.visual_tokens import qwen25vl_tokens

        key = self.key(req)
        hit = self._lookup(key)
        if hit is not None:
            return hit
        self.misses += 1
        t0 = time.perf_counter()
        view = compose(req.stream, req.action, req.goal, self.composer_config)
        t1 = time.perf_counter()
        image, text, width, height = None, None, 0, 0
        if req.want_image and (req.want_text or not req.paint):
            both = render(view, self.render_config, paint=req.paint)  # one layout for both media
            image, width, height = both.image, both.width, both.height
            text = both.text if req.want_text else None
        elif req.want_image:
            image = render_image(view, self.render_config)
            width, height = image.width, image.height
        elif req.want_text:
            text = render_text(view, self.render_config)
        png = encode_png(image, self.render_config) if (image is not None and self.encode_png) else None
        t2 = time.perf_counter()
        out = RenderedView(
            action=req.action,
            text=text,
            image=None if self.encode_png else image,
            png=png,
            width=width,
            height=height,
            visual_tokens=qwen25vl_tokens(width, height) if req.want_image else 0,
            compose_ms=(t1 - t0) * 1000,
            render_ms=(t2 - t1) * 1000,
            cached=False,
            n_selected=view.n_selected,
            key=key,
        )
        self._cache[key] = out
        if len(self._cache) > self.cache_size:
            self._cache.popitem(last=False)
        return out

    def render_delta(self, req: DeltaViewRequest) -> RenderedView:
        """Bring the stream's replica up to date with ``req``'s records, then :meth:`render_one`."""
        stream = self.replicas.apply(req)
        return self.render_one(ViewRequest(stream, req.action, req.goal, req.want_image, req.want_text, req.paint))

    def render_deltas(self, requests: Sequence[DeltaViewRequest]) -> list[RenderedView | BaseException]:
        return each_request(self.render_delta, requests)

    def _lookup(self, key: str) -> RenderedView | None:
        hit = self._cache.get(key)
        if hit is None:
            return None
        self._cache.move_to_end(key)
        self.hits += 1
        return RenderedView(**{**hit.__dict__, "cached": True})

    def stats(self) -> dict[str, int]:
        return {"hits": self.hits, "misses": self.misses, "size": len(self._cache)}


def each_request(fn: Any, items: Sequence[Any]) -> list[Any]:
    """``fn`` over a batch; an exception becomes that request's result (it fails one episode)."""
    out: list[Any] = []
    for item in items:
        try:
            out.append(fn(item))
        except Exception as exc:
            out.append(exc)
    return out
