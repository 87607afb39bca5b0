"""Recorder: persistent event memory (paper: "Recorder: Persistent Event Memory")."""

from memprism_ray.recorder.events import AGENT_ENTITY, Event, Outcome, RawEvent, StateDelta, split_key
from memprism_ray.recorder.stream import EventStream, StreamRecord
from memprism_ray.recorder.validate import UNKNOWN_VALUES, classify_outcome, validate_deltas

__all__ = [
    "AGENT_ENTITY",
    "UNKNOWN_VALUES",
    "Event",
    "EventStream",
    "Outcome",
    "RawEvent",
    "StateDelta",
    "StreamRecord",
    "classify_outcome",
    "split_key",
    "validate_deltas",
]
