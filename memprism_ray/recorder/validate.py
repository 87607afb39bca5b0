"""Deterministic validators for extractor output (appendix D.1).

"Validation drops empty keys, unknown values, and exact duplicates within one extractor
response, but it retains accepted deltas on repeated events." The Recorder keeps the
latest value of each key, so whether a delta *changes* known state is decided against
that record, not by asking the extractor for old values.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from memprism_ray.recorder.events import Outcome, StateDelta

#: Values that carry no information and are dropped. ``"none"`` and ``"(none)"`` are
#: legitimate values (an empty hand), so they are kept.
UNKNOWN_VALUES: frozenset[str] = frozenset({"", "unknown", "null", "n/a", "?", "unk"})


@dataclass(frozen=True, slots=True)
class ValidationReport:
    """What one extractor response lost in validation, by reason."""

    empty_key: int = 0
    unknown_value: int = 0
    duplicate: int = 0

    @property
    def dropped(self) -> int:
        return self.empty_key + self.unknown_value + self.duplicate


def validate_deltas(deltas: Iterable[StateDelta]) -> tuple[tuple[StateDelta, ...], ValidationReport]:
    """Apply the D.1 rules to one extractor response; order of the survivors is kept. Deltas that
    repeat a value recorded by *earlier* events are kept."""
    accepted: list[StateDelta] = []
    seen: set[tuple[str, str]] = set()
    empty = unknown = dup = 0
    for d in deltas:
        key = d.key.strip()
        value = d.new_value.strip()
        if not key:
            empty += 1
            continue
        if value.lower() in UNKNOWN_VALUES:
            unknown += 1
            continue
        if (key, value) in seen:
            dup += 1
            continue
        seen.add((key, value))
        accepted.append(StateDelta(key, value))
    return tuple(accepted), ValidationReport(empty, unknown, dup)


def changed_flags(deltas: Iterable[StateDelta], known: Mapping[str, str]) -> tuple[bool, ...]:
    """For each delta, whether it changes the latest known value of its key (applied in order)."""
    state = dict(known)
    flags = []
    for d in deltas:
        flags.append(state.get(d.key) != d.new_value)
        state[d.key] = d.new_value
    return tuple(flags)


def classify_outcome(deltas: Iterable[StateDelta], known: Mapping[str, str], *, failed: bool) -> Outcome:
    """``exception`` on explicit failure; ``state_update`` when some accepted delta changes
    known state; otherwise ``no_observed_change``."""
    if failed:
        return Outcome.EXCEPTION
    return Outcome.STATE_UPDATE if any(changed_flags(deltas, known)) else Outcome.NO_OBSERVED_CHANGE
