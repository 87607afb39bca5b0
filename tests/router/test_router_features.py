"""Router features: the A.2 window summary and global statistics on hand-built streams."""

from __future__ import annotations

import hashlib

import numpy as np
import pytest

from memprism_ray.recorder import EventStream, RawEvent, StateDelta
from memprism_ray.router.encoder import HashingEncoder
from memprism_ray.router.features import (
    STATS_DIM,
    TEXT_DIM,
    WINDOW_DIM,
    EventWindowSummarizer,
    FeatureExtractor,
    RouterFeatures,
    canonical_action,
    global_stats,
    unit_hash,
)


def add(stream: EventStream, action, entity: str, delta=(), failed: bool = False) -> None:
    stream.record(
        RawEvent(o_pre="obs", action=action, feedback="fb"),
        entity=entity,
        act="x",
        delta=[StateDelta(k, v) for k, v in delta],
        failed=failed,
    )


def kitchen_stream() -> EventStream:
    """Ten steps; the window (last 8) is steps 3..10, described in the comments."""
    s = EventStream({"goal": "put a clean mug in cabinet"})
    add(s, "go to countertop 1", "countertop 1", [("agent.location", "countertop 1")])  # 1 update
    add(s, "examine countertop 1", "countertop 1")  # 2 no change
    add(s, "take mug 1 from countertop 1", "mug 1", [("agent.holding", "mug 1")])  # 3 update
    add(s, "go to sinkbasin 1", "sinkbasin 1", [("agent.location", "sinkbasin 1")])  # 4 update
    for _ in range(3):  # 5, 6, 7 exceptions
        add(s, "clean mug 1 with sinkbasin 1", "mug 1", failed=True)
    add(s, "look", "")  # 8 no change, no entity
    add(s, "go to sinkbasin 1", "sinkbasin 1", [("agent.location", "sinkbasin 1")])  # 9 delta, unchanged
    add(s, "go to cabinet 2", "cabinet 2", [("agent.location", "cabinet 2")])  # 10 update
    return s


def test_canonical_action_text_and_mapping() -> None:
    assert canonical_action("take mug 1 from countertop 2") == "take X from X"
    assert canonical_action("go to drawer 3") == "go to X"
    assert canonical_action("put mug 1 in/on cabinet 3") == "put X in/on X"
    assert canonical_action("pick up the Mug") == "pick up X"
    assert canonical_action("put down the object in hand") == "put down X in X"
    assert canonical_action("  LOOK ") == "look"
    assert canonical_action("") == "<empty>"
    assert canonical_action("take mug 1 from countertop 2", abstract_objects=False) == "take mug from countertop"
    assert canonical_action({"op": "CLICK", "ref": "e12"}) == "click"
    assert canonical_action({"action_type": "Type", "ref": "e3", "value": "NYC"}) == "type"
    assert canonical_action({"type": "select"}) == "select"
    assert canonical_action({"op": "CLICK", "type": "other"}) == "click"  # op has priority
    assert canonical_action({"ref": "e1", "value": "x"}) == "{ref,value}"
    assert canonical_action('{"op": "TYPE", "ref": "e9"}') == "type"
    with pytest.raises(ValueError, match="str or a mapping"):
        canonical_action(3)  # type: ignore[arg-type]


def test_window_summary_known_answers() -> None:
    u = EventWindowSummarizer()(kitchen_stream())
    assert u.shape == (WINDOW_DIM,) and u.dtype == np.float32
    # signatures in steps 3..10: go to X x3, clean X with X x3, take X from X x1, look x1
    np.testing.assert_allclose(u[:8], [3 / 8, 3 / 8, 1 / 8, 1 / 8, 0, 0, 0, 0])
    np.testing.assert_allclose(u[8:11], [3 / 8, 3 / 8, 2 / 8])  # exception, update, no change
    assert u[11] == pytest.approx(3 / 8)  # mug 1, sinkbasin 1, cabinet 2
    assert u[12] == pytest.approx(7 / 8)  # step 8 names no entity
    assert u[13] == pytest.approx(4 / 8)  # steps 3, 4, 9, 10 carry deltas
    assert u[14] == pytest.approx(3 / 8)  # three exceptions in a row
    assert u[15] == pytest.approx(2 / 8)  # steps 8, 9
    w = np.array([0.75 ** (7 - j) for j in range(8)])
    changed = np.array([1, 1, 0, 0, 0, 0, 0, 1])  # step 9 repeats a known value
    exc = np.array([0, 0, 1, 1, 1, 0, 0, 0])
    assert u[16] == pytest.approx(float((w * changed).sum() / w.sum()), rel=1e-6)
    assert u[17] == pytest.approx(float((w * exc).sum() / w.sum()), rel=1e-6)
    assert not u[18:].any()


def test_window_reads_only_the_last_eight() -> None:
    s = kitchen_stream()
    u = EventWindowSummarizer()(s)
    older = EventStream()
    for _ in range(5):
        add(older, "open fridge 1", "fridge 1", failed=True)
    for rec in s:
        older.append(
            rec.raw, type(rec.event)(older.next_t, rec.event.entity, rec.event.act, rec.event.outcome, rec.event.delta)
        )
    np.testing.assert_array_equal(EventWindowSummarizer()(older), u)
    # a sequence of records works like the stream
    np.testing.assert_array_equal(EventWindowSummarizer()(list(s)), u)


def test_empty_and_short_streams() -> None:
    assert not EventWindowSummarizer()(EventStream()).any()
    assert not global_stats(EventStream()).any()
    s = EventStream()
    add(s, "open drawer 1", "drawer 1", failed=True)
    u = EventWindowSummarizer()(s)
    assert u[0] == 1.0 and u[8] == 1.0 and u[14] == pytest.approx(1 / 8) and u[17] == 1.0
    assert u[11] == pytest.approx(1 / 8) and u[12] == 1.0


def test_global_stats_known_answers() -> None:
    s = kitchen_stream()
    g = global_stats(s)
    assert g.shape == (STATS_DIM,) and g.dtype == np.float32
    expected_hash = int.from_bytes(hashlib.blake2b(b"cabinet 2", digest_size=8).digest(), "big") / 2.0**64
    np.testing.assert_allclose(g, [3 / 10, 4 / 10, 4 / 64, 10 / 64, expected_hash, 0.0, 0.0, 4 / 10], rtol=1e-6)
    add(s, "open cabinet 2", "cabinet 2", failed=True)
    add(s, "open cabinet 2", "cabinet 2", failed=True)
    g = global_stats(s)
    assert g[5] == pytest.approx(2 / 64) and g[6] == 0.0
    assert g[7] == pytest.approx(4 / 12)
    add(s, "look", "")
    g = global_stats(s)
    assert g[4] == 0.0 and g[5] == 0.0 and g[6] == pytest.approx(1 / 64)


def test_global_stats_horizon_caps_at_64() -> None:
    s = EventStream()
    for i in range(70):
        add(s, f"go to shelf {i}", f"shelf {i}", [("agent.location", f"shelf {i}")], failed=i < 6)
    g = global_stats(s)
    assert g[3] == 1.0  # 64 of 64
    assert g[0] == 0.0  # the six failures are older than the last 64
    assert g[2] == 1.0  # 64 distinct entities
    assert g[7] == 1.0


def test_unit_hash_is_stable_and_in_unit_interval() -> None:
    assert unit_hash("mug 1") == unit_hash("mug 1")
    assert unit_hash("mug 1") != unit_hash("mug 2")
    # a fixed value: the same in every process (Python's hash() would be salted)
    assert unit_hash("mug 1") == int.from_bytes(hashlib.blake2b(b"mug 1", digest_size=8).digest(), "big") / 2**64
    assert all(0.0 <= unit_hash(t) < 1.0 for t in ("", "a", "drawer 1", "é"))


def test_router_features_validation_and_stack() -> None:
    one = RouterFeatures(np.zeros(TEXT_DIM), np.ones(TEXT_DIM), np.zeros(WINDOW_DIM), np.zeros(STATS_DIM))
    assert one.obs.dtype == np.float32 and not one.batched and len(one) == 1
    b = RouterFeatures.stack([one, one.as_batch()])
    assert b.obs.shape == (2, TEXT_DIM) and b.stats.shape == (2, STATS_DIM)
    tensors = b.to_tensors()
    assert [tuple(t.shape) for t in tensors] == [(2, 384), (2, 384), (2, 128), (2, 8)]
    with pytest.raises(ValueError, match="window"):
        RouterFeatures(np.zeros(TEXT_DIM), np.zeros(TEXT_DIM), np.zeros(127), np.zeros(STATS_DIM))
    with pytest.raises(ValueError, match="NaN"):
        RouterFeatures(np.full(TEXT_DIM, np.nan), np.zeros(TEXT_DIM), np.zeros(WINDOW_DIM), np.zeros(STATS_DIM))
    with pytest.raises(ValueError, match="batch shape"):
        RouterFeatures(np.zeros((2, TEXT_DIM)), np.zeros((3, TEXT_DIM)), np.zeros((2, 128)), np.zeros((2, 8)))


def test_feature_extractor_batches_and_embeds_goal_once() -> None:
    enc = HashingEncoder()
    fx = FeatureExtractor(enc)
    s = kitchen_stream()
    goal = "put a clean mug in cabinet"
    single = fx.features(s, "You are at cabinet 2.", goal)
    assert single.obs.shape == (TEXT_DIM,) and single.window.shape == (WINDOW_DIM,)
    np.testing.assert_array_equal(single.window, EventWindowSummarizer()(s))
    np.testing.assert_array_equal(single.stats, global_stats(s))
    batch = fx.features_batch([s, EventStream()], ["You are at cabinet 2.", "You are in the middle."], [goal, goal])
    assert batch.obs.shape == (2, TEXT_DIM)
    np.testing.assert_array_equal(batch.obs[0], single.obs)
    np.testing.assert_array_equal(batch.goal[0], batch.goal[1])
    assert not batch.window[1].any()
    # three distinct texts were ever embedded: the goal once, two observations
    assert enc.cache_info()["size"] == 3
    with pytest.raises(ValueError, match="as many"):
        fx.features_batch([s], ["a", "b"], [goal])
    with pytest.raises(ValueError, match="observation 0 must be a string"):
        fx.features_batch([s], [None], [goal])  # type: ignore[list-item]
