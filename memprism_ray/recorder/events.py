"""Raw and structured events (paper: "Recorder: Persistent Event Memory", appendix D.1).

A raw event ``e_t = (o_t^-, u_t, y_t^+, r_t, m_t)`` is never replaced by model summaries; the
structured event ``e~_t = (t, e^ent, e^act, e^out, Delta s_t, xi_t)`` holds the main entity,
action type, outcome, the observed new values ``Delta s_t = {(k_j, v_j^new)}`` and evidence.
State keys are ``"<entity>.<attribute>"``; a bare key is read by :func:`split_key`.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import Enum
from typing import Any


class TextEnum(str, Enum):
    """A string enum that prints as its value (outcomes, selection reasons, link kinds)."""

    def __str__(self) -> str:
        return self.value


class Outcome(TextEnum):
    """Outcome type of a structured event (exactly three values, appendix D.1)."""

    EXCEPTION = "exception"
    STATE_UPDATE = "state_update"
    NO_OBSERVED_CHANGE = "no_observed_change"

    @classmethod
    def parse(cls, value: Any) -> Outcome:
        if isinstance(value, Outcome):
            return value
        try:
            return cls(value)
        except ValueError:
            valid = ", ".join(o.value for o in cls)
            raise ValueError(f"unknown outcome {value!r}; valid outcomes: {valid}") from None


#: Bare keys that describe the agent rather than an entity (paper's ALFWorld Phi prompt).
AGENT_KEYS: frozenset[str] = frozenset({"location", "held_object", "holding", "inventory"})
AGENT_ENTITY = "agent"


def split_key(key: str) -> tuple[str, str]:
    """Split a state key into ``(entity, attribute)``: a bare agent key of the paper's Phi prompt
    (``location``, ``held_object``) belongs to ``agent``, any other bare key sets its entity's ``state``."""
    if "." in key:
        entity, attribute = key.rsplit(".", 1)
        if entity and attribute:
            return entity, attribute
    if key in AGENT_KEYS:
        return AGENT_ENTITY, key
    return key, "state"


def _check_json(name: str, value: Any) -> None:
    try:
        json.dumps(value, allow_nan=False)
    except (TypeError, ValueError) as exc:
        raise ValueError(f"{name} must be JSON-serialisable (it is stored losslessly): {exc}") from None


@dataclass(frozen=True, slots=True)
class RawEvent:
    """``e_t = (o_t^-, u_t, y_t^+, r_t, m_t)``; ``action`` is text or a mapping (Mind2Web)."""

    o_pre: str
    action: str | Mapping[str, Any]
    feedback: str
    reward: float = 0.0
    meta: Mapping[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        for name in ("o_pre", "feedback"):
            if not isinstance(getattr(self, name), str):
                raise ValueError(f"RawEvent.{name} must be str, got {type(getattr(self, name)).__name__}")
        if not isinstance(self.action, (str, Mapping)):
            raise ValueError(f"RawEvent.action must be str or a mapping, got {type(self.action).__name__}")
        if isinstance(self.reward, bool) or not isinstance(self.reward, (int, float)):
            raise ValueError(f"RawEvent.reward must be a number, got {self.reward!r}")
        if not math.isfinite(self.reward):
            raise ValueError(f"RawEvent.reward must be finite, got {self.reward!r}")
        object.__setattr__(self, "reward", float(self.reward))
        if not isinstance(self.meta, Mapping):
            raise ValueError(f"RawEvent.meta must be a mapping, got {type(self.meta).__name__}")
        object.__setattr__(self, "meta", dict(self.meta))
        if isinstance(self.action, Mapping):
            object.__setattr__(self, "action", dict(self.action))
            _check_json("RawEvent.action", self.action)
        _check_json("RawEvent.meta", self.meta)

    @property
    def action_text(self) -> str:
        """The action as one line of text (mappings as compact sorted JSON)."""
        if isinstance(self.action, str):
            return self.action
        return json.dumps(self.action, sort_keys=True, separators=(",", ":"))

    def to_dict(self) -> dict[str, Any]:
        return {
            "o_pre": self.o_pre,
            "action": self.action if isinstance(self.action, str) else dict(self.action),
            "feedback": self.feedback,
            "reward": self.reward,
            "meta": dict(self.meta),
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> RawEvent:
        _require_keys("raw event", data, ("o_pre", "action", "feedback"))
        return cls(
            o_pre=data["o_pre"],
            action=data["action"],
            feedback=data["feedback"],
            reward=data.get("reward", 0.0),
            meta=data.get("meta") or {},
        )


@dataclass(frozen=True, slots=True)
class StateDelta:
    """One observed new value ``(k, v^new)``; old values are never required."""

    key: str
    new_value: str

    @property
    def entity(self) -> str:
        return split_key(self.key)[0]

    @property
    def attribute(self) -> str:
        return split_key(self.key)[1]

    def to_dict(self) -> dict[str, str]:
        return {"key": self.key, "new_value": self.new_value}


@dataclass(frozen=True, slots=True)
class Event:
    """``e~_t = (t, entity, act, outcome, delta, evidence)``; ``t`` starts at 1."""

    t: int
    entity: str
    act: str
    outcome: Outcome
    delta: tuple[StateDelta, ...] = ()
    evidence: Mapping[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if isinstance(self.t, bool) or not isinstance(self.t, int) or self.t < 1:
            raise ValueError(f"Event.t must be a positive int, got {self.t!r}")
        if not isinstance(self.entity, str) or not isinstance(self.act, str):
            raise ValueError("Event.entity and Event.act must be str")
        object.__setattr__(self, "outcome", Outcome.parse(self.outcome))
        deltas = []
        for d in self.delta:
            if isinstance(d, StateDelta):
                deltas.append(d)
            elif isinstance(d, Mapping):
                _require_keys("state delta", d, ("key", "new_value"))
                deltas.append(StateDelta(str(d["key"]), str(d["new_value"])))
            elif isinstance(d, (tuple, list)) and len(d) == 2:
                deltas.append(StateDelta(str(d[0]), str(d[1])))
            else:
                raise ValueError(f"state delta must be StateDelta, {{key, new_value}} or a pair, got {d!r}")
        object.__setattr__(self, "delta", tuple(deltas))
        if not isinstance(self.evidence, Mapping):
            raise ValueError(f"Event.evidence must be a mapping, got {type(self.evidence).__name__}")
        object.__setattr__(self, "evidence", dict(self.evidence))
        _check_json("Event.evidence", self.evidence)

    @property
    def keys(self) -> tuple[str, ...]:
        return tuple(d.key for d in self.delta)

    def to_dict(self) -> dict[str, Any]:
        return {
            "t": self.t,
            "entity": self.entity,
            "act": self.act,
            "outcome": self.outcome.value,
            "delta": [d.to_dict() for d in self.delta],
            "evidence": dict(self.evidence),
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Event:
        _require_keys("event", data, ("t", "entity", "act", "outcome"))
        return cls(
            t=data["t"],
            entity=data["entity"],
            act=data["act"],
            outcome=data["outcome"],
            delta=tuple(data.get("delta") or ()),
            evidence=data.get("evidence") or {},
        )


def _require_keys(what: str, data: Mapping[str, Any], keys: tuple[str, ...]) -> None:
    if not isinstance(data, Mapping):
        raise ValueError(f"{what} must be a JSON object, got {type(data).__name__}")
    missing = [k for k in keys if k not in data]
    if missing:
        raise ValueError(f"{what} is missing required field(s) {', '.join(missing)}")
