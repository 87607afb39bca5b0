"""Router input features (paper: "Router", eq. router-state; appendix A.2 and D.4).

``z_t = Enc_theta(o_t, g, Summary(E_<t))`` reads four fixed-size vectors: ``obs`` and ``goal``,
384-d MiniLM embeddings of the serialised observation ``x_t`` and of the goal ``g``; ``window``
(``u_t``), the 128-d :class:`EventWindowSummarizer` vector over the latest 8 events; ``stats``
(``s_t``), the 8 :func:`global_stats` over at most the latest 64. Their coordinates are the
``W_*`` and ``S_*`` constants below (A.2: "first eight coordinates encode the action_frequency
profile ..., the next three coordinates are the exception, state-update, and
no-observed-change ratios. Seven further coordinates record ...").

Action canonicalisation (A.2: "Raw actions are canonicalized from fields such as op,
action_type, or type"), :func:`canonical_action`: ``take mug 1 from countertop 2`` -> ``take X
from X``; ``abstract_objects=False`` removes only instance numbers.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import math
import re
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np

from memprism_ray.recorder import EventStream, Outcome, StreamRecord

TEXT_DIM: int = 384
WINDOW_DIM: int = 128
STATS_DIM: int = 8
WINDOW_EVENTS: int = 8
GLOBAL_EVENTS: int = 64
RECENT_EVENTS: int = 16
RECENCY_DECAY: float = 0.75
NUM_SIGNATURES: int = 8

# Window coordinates over the latest n <= W = 8 events (every ratio is 0 when n == 0); 0-7 hold
# the 8 largest action-signature frequencies count / n, descending, zero padded; 18+ are 0.
W_EXCEPTION_RATIO = 8  # outcome counts / n
W_STATE_UPDATE_RATIO = 9
W_NO_CHANGE_RATIO = 10
W_ENTITY_COUNT = 11  # distinct non-empty main entities / W
W_ENTITY_COVERAGE = 12  # events that name a main entity / n
W_DELTA_RATIO = 13  # events with an accepted state delta / n
W_MAX_EXCEPTION_STREAK = 14  # longest run of exceptions / W
W_MAX_NO_CHANGE_STREAK = 15  # longest run of no_observed_change / W
# Recency-weighted (w_j = 0.75 ** (n - 1 - j), newest 1) share of the events that changed a
# known value (the Recorder's per-delta flags: not the state-update ratio where an extractor
# forced state_update without a changing key), and of exceptions.
W_RECENT_STATE_CHANGE = 16
W_RECENT_EXCEPTION = 17

# Global statistics over the latest m = min(len, H = 64) events.
S_EXCEPTION_RATIO = 0  # outcome counts / m
S_STATE_UPDATE_RATIO = 1
S_ENTITY_COUNT = 2  # distinct non-empty main entities / H
S_HISTORY_LENGTH = 3  # m / H
S_ENTITY_HASH = 4  # unit_hash of the latest event's main entity (0 without one)
S_EXCEPTION_STREAK = 5  # trailing run of exceptions / H
S_NO_CHANGE_STREAK = 6  # trailing run of no_observed_change / H
S_RECENT_STATE_UPDATE = 7  # state_update share of the latest 16

#: Words kept in a text-action signature besides the leading verb.
_PARTICLE_WORDS = (
    "to from in on in/on into onto with at up down off out of under inside for by over back around through"
)
PARTICLES: frozenset[str] = frozenset(_PARTICLE_WORDS.split())
ARTICLES: frozenset[str] = frozenset({"a", "an", "the"})
MAPPING_ACTION_FIELDS: tuple[str, ...] = ("op", "action_type", "type")
_STRIP = "\"'`.,;:!?()[]<>"
_NUMBER = re.compile(r"^#?\d+$")


# --- action canonicalisation ------------------------------------------------------------
def canonical_action(action: str | Mapping[str, Any], *, abstract_objects: bool = True) -> str:
    """The action signature used by the ``action_frequency`` profile (see module docstring)."""
    if isinstance(action, str):
        text = action.strip()
        if text.startswith("{") and text.endswith("}"):
            with contextlib.suppress(json.JSONDecodeError):
                parsed = json.loads(text)
                if isinstance(parsed, dict):
                    return _mapping_signature(parsed)
        return _text_signature(text, abstract_objects)
    if isinstance(action, Mapping):
        return _mapping_signature(action)
    raise ValueError(f"action must be str or a mapping, got {type(action).__name__}")


def _mapping_signature(action: Mapping[str, Any]) -> str:
    for field_name in MAPPING_ACTION_FIELDS:
        if field_name in action and action[field_name] is not None:
            value = action[field_name]
            text = value if isinstance(value, str) else json.dumps(value, sort_keys=True)
            return " ".join(text.strip().lower().split()) or "<empty>"
    return "{" + ",".join(sorted(str(k) for k in action)) + "}"


def _text_signature(text: str, abstract_objects: bool) -> str:
    words = [w.strip(_STRIP) for w in text.lower().split()]
    words = [w for w in words if w]
    if not words:
        return "<empty>"
    out: list[str] = []
    for i, word in enumerate(words):
        if _NUMBER.match(word):
            if abstract_objects and out and out[-1] != "X" and i > 0:
                out.append("X")
            continue
        if i == 0:
            out.append(word)
        elif word in ARTICLES:
            continue
        elif word in PARTICLES or not abstract_objects:
            out.append(word)
        elif not out or out[-1] != "X":
            out.append("X")
    return " ".join(out) if out else "<empty>"


# --- the window summary -----------------------------------------------------------------
def _last_records(records: EventStream | Sequence[StreamRecord] | Iterable[StreamRecord], k: int) -> list[StreamRecord]:
    if isinstance(records, EventStream):
        n = len(records)
        return [records[i] for i in range(max(0, n - k), n)]
    if isinstance(records, Sequence):
        return list(records[-k:]) if k > 0 else []
    return list(records)[-k:] if k > 0 else []


def _max_run(flags: Sequence[bool]) -> int:
    best = run = 0
    for flag in flags:
        run = run + 1 if flag else 0
        best = max(best, run)
    return best


def _terminal_run(flags: Sequence[bool]) -> int:
    run = 0
    for flag in reversed(flags):
        if not flag:
            break
        run += 1
    return run


def _outcome_flags(recs: Sequence[StreamRecord]) -> tuple[list[bool], list[bool], list[bool]]:
    """Per record: is it an exception, a state_update, a no_observed_change."""
    outcomes = [r.event.outcome for r in recs]
    return tuple([o is kind for o in outcomes] for kind in Outcome)  # type: ignore[return-value]


def unit_hash(text: str) -> float:
    """Deterministic hash of ``text`` into [0, 1), stable across processes."""
    digest = hashlib.blake2b(text.encode("utf-8"), digest_size=8).digest()
    return int.from_bytes(digest, "big") / 2.0**64


@dataclass(frozen=True)
class EventWindowSummarizer:
    """``u_t``: the 128-d summary of the latest ``window`` events (coordinates ``W_*``)."""

    window: int = WINDOW_EVENTS
    abstract_objects: bool = True
    recency_decay: float = RECENCY_DECAY

    def __post_init__(self) -> None:
        if self.window < 1:
            raise ValueError(f"EventWindowSummarizer.window must be >= 1, got {self.window}")
        if not 0.0 < self.recency_decay <= 1.0:
            raise ValueError(f"EventWindowSummarizer.recency_decay must be in (0, 1], got {self.recency_decay}")

    def __call__(self, records: EventStream | Sequence[StreamRecord]) -> np.ndarray:
        return self.summarize(records)

    def summarize(self, records: EventStream | Sequence[StreamRecord]) -> np.ndarray:
        """Return the float32 vector of length 128 for the latest ``window`` records."""
        out = np.zeros(WINDOW_DIM, dtype=np.float32)
        recs = _last_records(records, self.window)
        n = len(recs)
        if n == 0:
            return out
        cap = float(self.window)
        signatures = Counter(canonical_action(r.raw.action, abstract_objects=self.abstract_objects) for r in recs)
        freqs = sorted((c / n for c in signatures.values()), reverse=True)[:NUM_SIGNATURES]
        out[: len(freqs)] = freqs

        exc, upd, noc = _outcome_flags(recs)
        out[W_EXCEPTION_RATIO] = sum(exc) / n
        out[W_STATE_UPDATE_RATIO] = sum(upd) / n
        out[W_NO_CHANGE_RATIO] = sum(noc) / n

        entities = [r.event.entity.strip() for r in recs]
        named = [e for e in entities if e]
        out[W_ENTITY_COUNT] = min(len(set(named)), self.window) / cap
        out[W_ENTITY_COVERAGE] = len(named) / n
        out[W_DELTA_RATIO] = sum(1 for r in recs if r.event.delta) / n
        out[W_MAX_EXCEPTION_STREAK] = _max_run(exc) / cap
        out[W_MAX_NO_CHANGE_STREAK] = _max_run(noc) / cap

        weights = [self.recency_decay ** (n - 1 - j) for j in range(n)]
        total = math.fsum(weights)
        changed = [any(r.changed) for r in recs]
        out[W_RECENT_STATE_CHANGE] = math.fsum(w for w, c in zip(weights, changed, strict=True) if c) / total
        out[W_RECENT_EXCEPTION] = math.fsum(w for w, e in zip(weights, exc, strict=True) if e) / total
        return out


def global_stats(records: EventStream | Sequence[StreamRecord], *, horizon: int = GLOBAL_EVENTS) -> np.ndarray:
    """``s_t``: the 8 global statistics over at most the latest ``horizon`` events (float32)."""
    if horizon < 1:
        raise ValueError(f"global_stats horizon must be >= 1, got {horizon}")
    out = np.zeros(STATS_DIM, dtype=np.float32)
    recs = _last_records(records, horizon)
    m = len(recs)
    if m == 0:
        return out
    h = float(horizon)
    exc, upd, noc = _outcome_flags(recs)
    out[S_EXCEPTION_RATIO] = sum(exc) / m
    out[S_STATE_UPDATE_RATIO] = sum(upd) / m
    out[S_ENTITY_COUNT] = len({r.event.entity.strip() for r in recs} - {""}) / h
    out[S_HISTORY_LENGTH] = m / h
    latest = recs[-1].event.entity.strip()
    out[S_ENTITY_HASH] = unit_hash(latest) if latest else 0.0
    out[S_EXCEPTION_STREAK] = _terminal_run(exc) / h
    out[S_NO_CHANGE_STREAK] = _terminal_run(noc) / h
    recent = upd[-RECENT_EVENTS:]
    out[S_RECENT_STATE_UPDATE] = sum(recent) / len(recent)
    return out


# --- the feature bundle -------------------------------------------------------------------
#: The four feature matrices by name and width, in the Router's input order.
FEATURE_DIMS: dict[str, int] = {"obs": TEXT_DIM, "goal": TEXT_DIM, "window": WINDOW_DIM, "stats": STATS_DIM}


@dataclass(frozen=True)
class RouterFeatures:
    """The Router's four inputs as float32 arrays: one decision (``[D]``) or a batch (``[B, D]``)."""

    obs: np.ndarray
    goal: np.ndarray
    window: np.ndarray
    stats: np.ndarray

    def __post_init__(self) -> None:
        lead: tuple[int, ...] | None = None
        for name, dim in FEATURE_DIMS.items():
            arr = np.asarray(getattr(self, name), dtype=np.float32)
            if arr.ndim not in (1, 2) or arr.shape[-1] != dim:
                raise ValueError(f"RouterFeatures.{name} must have shape [{dim}] or [B, {dim}], got {arr.shape}")
            if not np.isfinite(arr).all():
                raise ValueError(f"RouterFeatures.{name} contains NaN or infinite values")
            if lead is None:
                lead = arr.shape[:-1]
            elif arr.shape[:-1] != lead:
                raise ValueError(f"RouterFeatures fields disagree on the batch shape: {name} has {arr.shape[:-1]}")
            object.__setattr__(self, name, arr)

    @property
    def batched(self) -> bool:
        return self.obs.ndim == 2

    def __len__(self) -> int:
        return self.obs.shape[0] if self.batched else 1

    @classmethod
    def stack(cls, items: Sequence[RouterFeatures]) -> RouterFeatures:
        """Concatenate single or batched features into one batch."""
        if not items:
            raise ValueError("RouterFeatures.stack needs at least one item")
        parts = {name: [np.atleast_2d(getattr(f, name)) for f in items] for name in FEATURE_DIMS}
        return cls(**{name: np.concatenate(arrs, axis=0) for name, arrs in parts.items()})

    def as_batch(self) -> RouterFeatures:
        return self if self.batched else RouterFeatures.stack([self])

    def to_tensors(self, device: Any = None) -> tuple[Any, Any, Any, Any]:
        """``(obs, goal, window, stats)`` float32 torch tensors with a batch dimension."""
        import torch

        b = self.as_batch()
        return tuple(torch.as_tensor(getattr(b, name), device=device) for name in FEATURE_DIMS)  # type: ignore[return-value]


class TextEncoderLike(Protocol):
    """What :class:`FeatureExtractor` needs from an encoder (``TextEncoder``, ``HashingEncoder``)."""

    dim: int

    def encode(self, texts: Sequence[str]) -> np.ndarray: ...


class FeatureExtractor:
    """Builds :class:`RouterFeatures` from an event stream, the current observation and the goal
    (a batch's texts go through the encoder in one call)."""

    def __init__(
        self,
        encoder: TextEncoderLike,
        summarizer: EventWindowSummarizer | None = None,
        *,
        stats_horizon: int = GLOBAL_EVENTS,
    ) -> None:
        if getattr(encoder, "dim", TEXT_DIM) != TEXT_DIM:
            raise ValueError(f"the Router needs {TEXT_DIM}-d text embeddings, encoder gives {encoder.dim}")
        self.encoder = encoder
        self.summarizer = summarizer or EventWindowSummarizer()
        self.stats_horizon = stats_horizon

    def features(self, stream: EventStream | Sequence[StreamRecord], observation: str, goal: str) -> RouterFeatures:
        """Features of one decision (arrays without a batch dimension)."""
        batch = self.features_batch([stream], [observation], [goal])
        return RouterFeatures(batch.obs[0], batch.goal[0], batch.window[0], batch.stats[0])

    def features_batch(
        self,
        streams: Sequence[EventStream | Sequence[StreamRecord]],
        observations: Sequence[str],
        goals: Sequence[str],
    ) -> RouterFeatures:
        """Features of ``B`` decisions as ``[B, D]`` arrays."""
        if not (len(streams) == len(observations) == len(goals)):
            raise ValueError(
                f"features_batch needs as many streams, observations and goals; got "
                f"{len(streams)}, {len(observations)}, {len(goals)}"
            )
        for name, texts in (("observation", observations), ("goal", goals)):
            for i, text in enumerate(texts):
                if not isinstance(text, str):
                    raise ValueError(f"{name} {i} must be a string, got {type(text).__name__}")
        b = len(streams)
        if b == 0:
            raise ValueError("features_batch needs at least one decision")
        emb = np.asarray(self.encoder.encode(list(observations) + list(goals)), dtype=np.float32)
        window = np.stack([self.summarizer.summarize(s) for s in streams])
        stats = np.stack([global_stats(s, horizon=self.stats_horizon) for s in streams])
        return RouterFeatures(emb[:b], emb[b:], window, stats)
