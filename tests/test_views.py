"""ViewService: compose + render per request with a content-addressed LRU cache (paper
"Composer", "Render", appendix D.3: same stream, action, goal and renderer settings give
the same image)."""

from __future__ import annotations

import io

import pytest
from PIL import Image

from memprism_ray.composer import compose
from memprism_ray.recorder.events import RawEvent
from memprism_ray.recorder.stream import EventStream
from memprism_ray.render import RenderConfig, encode_png, qwen25vl_tokens, render_image, render_text
from memprism_ray.testing.synthetic_streams import alfworld_like_stream
from memprism_ray.view_space import ALL_ACTIONS, ViewAction
from memprism_ray.views import (
    DeltaTracker,
    StreamOutOfSync,
    StreamReplicas,
    ViewRequest,
    ViewService,
    content_digest,
)

ACTION = ViewAction("EntityState", "recent_long", "all", "medium")
GOAL = "put a clean mug in cabinet"


def _png(image: Image.Image) -> bytes:
    buf = io.BytesIO()
    image.save(buf, format="PNG")
    return buf.getvalue()


def _with_meta(stream: EventStream, meta: dict, raw_meta: dict) -> EventStream:
    """The same records under other stream meta and other raw-event bookkeeping meta."""
    out = EventStream(meta)
    for rec in stream:
        raw = rec.raw
        ev = rec.event
        out.record(
            RawEvent(raw.o_pre, raw.action, raw.feedback, raw.reward, {**raw.meta, **raw_meta}),
            entity=ev.entity,
            act=ev.act,
            delta=ev.delta,
            outcome=ev.outcome,
            evidence=ev.evidence,
        )
    return out


def test_render_matches_the_renderers_and_counts_tokens() -> None:
    stream = alfworld_like_stream(30, 4, goal=GOAL)
    svc = ViewService()
    rv = svc.render_one(ViewRequest(stream, ACTION, GOAL, want_image=True, want_text=True))
    view = compose(stream, ACTION, GOAL)
    assert rv.action == ACTION and rv.n_selected == view.n_selected and not rv.cached
    assert _png(rv.pil()) == _png(render_image(view))
    assert rv.text == render_text(view)
    assert (rv.width, rv.height) == rv.pil().size and rv.pixels == rv.width * rv.height > 0
    assert rv.visual_tokens == qwen25vl_tokens(rv.width, rv.height) > 0
    assert rv.compose_ms >= 0 and rv.render_ms > 0


def test_text_only_and_image_only_requests() -> None:
    stream = alfworld_like_stream(12, 1, goal=GOAL)
    svc = ViewService()
    text_only = svc.render_one(ViewRequest(stream, ACTION, GOAL, want_image=False, want_text=True))
    assert text_only.image is None and text_only.png is None and text_only.pil() is None
    assert text_only.pixels == 0 and text_only.visual_tokens == 0
    assert text_only.text == render_text(compose(stream, ACTION, GOAL))
    image_only = svc.render_one(ViewRequest(stream, ACTION, GOAL, want_image=True, want_text=False))
    assert image_only.text is None and image_only.image is not None
    assert svc.stats()["misses"] == 2  # medium is part of the address


def test_encode_png_ships_bytes_identical_to_a_direct_render() -> None:
    stream = alfworld_like_stream(20, 2, goal=GOAL)
    cfg = RenderConfig(max_side=448)
    rv = ViewService(cfg, encode_png=True).render_one(ViewRequest(stream, ACTION, GOAL))
    assert rv.image is None and rv.png is not None
    assert rv.png == encode_png(render_image(compose(stream, ACTION, GOAL), cfg), cfg)
    im = rv.pil()
    assert im.mode == "RGB" and im.size == (rv.width, rv.height) and max(im.size) <= 448


def test_cache_hit_returns_the_same_view_marked_cached() -> None:
    stream = alfworld_like_stream(25, 3, goal=GOAL)
    svc = ViewService()
    req = ViewRequest(stream, ACTION, GOAL, want_image=True, want_text=True)
    first = svc.render_one(req)
    second = svc.render_one(ViewRequest(stream.copy(), ACTION, GOAL, want_image=True, want_text=True))
    assert not first.cached and second.cached
    assert second.key == first.key and second.text == first.text and _png(second.pil()) == _png(first.pil())
    assert svc.stats() == {"hits": 1, "misses": 1, "size": 1}


@pytest.mark.parametrize(
    "change",
    ["action", "goal", "medium", "settings", "one_more_event"],
)
def test_everything_a_view_depends_on_is_in_the_address(change: str) -> None:
    stream = alfworld_like_stream(15, 5, goal=GOAL)
    base = ViewService()
    req = ViewRequest(stream, ACTION, GOAL)
    other_svc = base
    if change == "action":
        other = ViewRequest(stream, ViewAction("EntityState", "recent_long", "all", "fine"), GOAL)
    elif change == "goal":
        other = ViewRequest(stream, ACTION, "put a hot apple in countertop")
    elif change == "medium":
        other = ViewRequest(stream, ACTION, GOAL, want_image=True, want_text=True)
    elif change == "settings":
        other, other_svc = req, ViewService(RenderConfig(max_side=448))
    else:
        other = ViewRequest(alfworld_like_stream(16, 5, goal=GOAL), ACTION, GOAL)
    assert base.key(req) != other_svc.key(other)
    base.render_one(req)
    assert not other_svc.render_one(other).cached


def test_trajectories_with_equal_content_share_one_view() -> None:
    # Two trajectories of one GRPO group: different episode ids and bookkeeping, same events.
    stream = alfworld_like_stream(10, 8, goal=GOAL)
    a = _with_meta(stream, {"goal": GOAL, "episode_id": "g0-t0"}, {"view": "TemporalTrace/all/all/fine"})
    b = _with_meta(stream, {"goal": GOAL, "episode_id": "g0-t1"}, {"view": "EntityState/all/all/coarse"})
    assert a.meta != b.meta and content_digest(a) == content_digest(b)
    svc = ViewService()
    ra = svc.render_one(ViewRequest(a, ACTION, GOAL))
    rb = svc.render_one(ViewRequest(b, ACTION, GOAL))
    assert rb.cached and _png(ra.pil()) == _png(rb.pil())
    # The empty streams every trajectory starts from are one view too.
    e1, e2 = EventStream({"episode_id": "x"}), EventStream({"episode_id": "y"})
    svc.render_one(ViewRequest(e1, ACTION, GOAL))
    assert svc.render_one(ViewRequest(e2, ACTION, GOAL)).cached


def test_content_digest_sees_feedback_and_outcome() -> None:
    stream = alfworld_like_stream(6, 9, goal=GOAL)
    changed = EventStream(stream.meta)
    for i, rec in enumerate(stream):
        raw, ev = rec.raw, rec.event
        feedback = raw.feedback + (" (edited)" if i == 3 else "")
        changed.record(
            RawEvent(raw.o_pre, raw.action, feedback, raw.reward, raw.meta),
            entity=ev.entity,
            act=ev.act,
            delta=ev.delta,
            outcome=ev.outcome,
            evidence=ev.evidence,
        )
    assert content_digest(changed) != content_digest(stream)
    assert content_digest(stream) == content_digest(stream.copy())


def test_lru_evicts_the_least_recently_used() -> None:
    stream = alfworld_like_stream(8, 6, goal=GOAL)
    svc = ViewService(cache_size=2)
    a, b, c = (ViewRequest(stream, ALL_ACTIONS[i], GOAL, want_image=False, want_text=True) for i in (0, 1, 2))
    svc.render_one(a)
    svc.render_one(b)
    assert svc.render_one(a).cached  # a is now the most recent
    svc.render_one(c)  # evicts b
    assert svc.stats()["size"] == 2
    assert svc.render_one(a).cached
    assert not svc.render_one(b).cached


def test_batch_render_keeps_request_order() -> None:
    stream = alfworld_like_stream(12, 7, goal=GOAL)
    reqs = [ViewRequest(stream, ALL_ACTIONS[i], GOAL, want_image=False, want_text=True) for i in (5, 77, 140)]
    out = ViewService().render(reqs)
    assert [rv.action for rv in out] == [r.action for r in reqs]


# --------------------------------------------------------------------------- stream deltas


def _grow(source: EventStream, n: int) -> EventStream:
    """The first ``n`` records of ``source`` as a new stream (same meta)."""
    out = EventStream(source.meta)
    for rec in list(source)[:n]:
        out.append(rec.raw, rec.event)
    return out


def test_views_from_deltas_equal_views_from_the_stream() -> None:
    """A replica fed only the appended records draws exactly what the stream itself draws,
    and after the first step each request carries one record, not the stream."""
    source = alfworld_like_stream(30, 12, goal=GOAL)
    stream = EventStream(source.meta)
    tracker, worker, local = DeltaTracker(2), ViewService(encode_png=True), ViewService(encode_png=True)
    for t in range(len(source)):
        action = ALL_ACTIONS[(7 * t) % len(ALL_ACTIONS)]
        req = ViewRequest(stream, action, GOAL, want_image=True, want_text=True)
        w, delta = tracker.request(req)
        assert w == 0  # one stream stays on the worker it was pinned to
        assert delta.base == (0 if t == 0 else t - 1) and len(delta.records) == (0 if t == 0 else 1)
        assert (delta.meta is not None) == (t <= 1)  # meta travels only when the replica starts
        drawn = worker.render_delta(delta)
        tracker.acknowledge(stream, len(stream))
        expect = local.render_one(req)
        assert drawn.key == expect.key and drawn.png == expect.png and drawn.text == expect.text
        stream.append(source[t].raw, source[t].event)
    assert worker.replicas.resyncs == 0


def test_delta_request_bytes_do_not_grow_with_the_stream() -> None:
    import pickle

    source = alfworld_like_stream(50, 4, goal=GOAL)
    tracker = DeltaTracker(1)
    sizes = {}
    for n in (5, 49):
        stream = _grow(source, n - 1)
        tracker.request(ViewRequest(stream, ACTION, GOAL))
        tracker.acknowledge(stream, len(stream))
        stream.append(source[n - 1].raw, source[n - 1].event)
        _, delta = tracker.request(ViewRequest(stream, ACTION, GOAL))
        sizes[n] = (len(pickle.dumps(delta)), len(pickle.dumps(ViewRequest(stream, ACTION, GOAL))))
    assert sizes[49][0] < 1.5 * sizes[5][0], sizes  # one record either way
    assert sizes[49][1] > 5 * sizes[5][1], sizes  # what used to travel: the whole stream


def test_a_replica_out_of_step_is_refused_and_a_full_resend_repairs_it() -> None:
    source = alfworld_like_stream(6, 2, goal=GOAL)
    stream = _grow(source, 3)
    tracker = DeltaTracker(1)
    tracker.request(ViewRequest(stream, ACTION, GOAL))
    tracker.acknowledge(stream, 3)
    stream.append(source[3].raw, source[3].event)
    _, delta = tracker.request(ViewRequest(stream, ACTION, GOAL))
    restarted = ViewService()  # a worker that lost its replicas
    with pytest.raises(StreamOutOfSync, match="replica has no records, delta starts at 3"):
        restarted.render_delta(delta)
    _, full = tracker.request(ViewRequest(stream, ACTION, GOAL), full=True)
    assert full.base == 0 and len(full.records) == 4 and full.meta == stream.meta
    rv = restarted.render_delta(full)
    assert rv.key == ViewService().key(ViewRequest(stream, ACTION, GOAL))
    # A replica ahead of the delta (a retried call applied twice) is refused too.
    with pytest.raises(StreamOutOfSync, match="replica has 4 records"):
        restarted.render_delta(delta)
    assert restarted.replicas.resyncs == 2


def test_replicas_are_bounded_and_the_tracker_forgets_ended_streams() -> None:
    import gc

    replicas = StreamReplicas(max_streams=2)
    tracker = DeltaTracker(3, offset=1)
    streams = [alfworld_like_stream(2, s, goal=GOAL) for s in range(3)]
    pins = []
    for s in streams:
        w, delta = tracker.request(ViewRequest(s, ACTION, GOAL))
        pins.append(w)
        replicas.apply(delta)
    assert pins == [1, 2, 0] and len(replicas) == 2 and len(tracker) == 3
    del s, streams
    gc.collect()
    assert len(tracker) == 0


def test_a_page_laid_out_but_not_painted_has_the_painted_size_tokens_and_text(monkeypatch) -> None:
    import memprism_ray.render.optical as optical

    stream = alfworld_like_stream(30, 4, goal=GOAL)
    painted = ViewService().render_one(ViewRequest(stream, ACTION, GOAL, want_image=True, want_text=True))

    def no_pixels(*_: object) -> None:
        raise AssertionError("painted a page that was only to be laid out")

    monkeypatch.setattr(optical, "paint", no_pixels)
    svc = ViewService(encode_png=True)
    for want_text in (True, False):
        req = ViewRequest(stream, ACTION, GOAL, want_image=True, want_text=want_text, paint=False)
        laid = svc.render_one(req)
        assert laid.image is None and laid.png is None and laid.pil() is None
        assert (laid.width, laid.height, laid.visual_tokens) == (painted.width, painted.height, painted.visual_tokens)
        assert laid.text == (painted.text if want_text else None)
        # A painted request of the same view is another address, not this cache entry.
        assert svc.key(req) != svc.key(ViewRequest(stream, ACTION, GOAL, want_image=True, want_text=want_text))
