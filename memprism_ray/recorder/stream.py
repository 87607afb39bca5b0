"""The append-only event stream ``E_{<=t} = E_{<t} (+) e~_t`` (paper eq. event-append,
appendix D.1 and D.5).

Each record keeps the raw event beside the structured one and, per accepted delta, whether it
changed the tracked value (views may hide unchanged repeats; the stream never drops them).
Persistence is lossless: JSONL or Arrow/Parquet; loading re-appends every record, so a file
that breaks an invariant is rejected with the line or row that broke it.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from memprism_ray.io_atomic import json_lines
from memprism_ray.recorder.events import Event, Outcome, RawEvent, StateDelta
from memprism_ray.recorder.validate import changed_flags, classify_outcome, validate_deltas

FORMAT_NAME = "memprism-events"
FORMAT_VERSION = 1


@dataclass(frozen=True, slots=True)
class StreamRecord:
    """One appended step: the raw event, its structured event and per-delta change flags."""

    raw: RawEvent
    event: Event
    changed: tuple[bool, ...]

    def to_dict(self) -> dict[str, Any]:
        return {"raw": self.raw.to_dict(), "event": self.event.to_dict(), "changed": list(self.changed)}


def _canonical_json(value: Any) -> bytes:
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode()


class EventStream:
    """Append-only sequence of :class:`StreamRecord` with the latest value per state key;
    ``meta`` (goal, task id, benchmark) is persisted with the stream."""

    def __init__(self, meta: Mapping[str, Any] | None = None) -> None:
        meta = dict(meta or {})
        try:
            _canonical_json(meta)
        except (TypeError, ValueError) as exc:
            raise ValueError(f"stream meta must be JSON-serialisable: {exc}") from None
        self.meta: dict[str, Any] = meta
        self._records: list[StreamRecord] = []
        self._state: dict[str, str] = {}
        self._dropped = {"empty_key": 0, "unknown_value": 0, "duplicate": 0}
        self._content = hashlib.sha256(b"memprism-view-content").hexdigest()

    def __len__(self) -> int:
        return len(self._records)

    def __iter__(self) -> Iterator[StreamRecord]:
        return iter(self._records)

    def __getitem__(self, index: int) -> StreamRecord:
        return self._records[index]

    @property
    def records(self) -> tuple[StreamRecord, ...]:
        return tuple(self._records)

    @property
    def events(self) -> tuple[Event, ...]:
        return tuple(r.event for r in self._records)

    @property
    def raws(self) -> tuple[RawEvent, ...]:
        return tuple(r.raw for r in self._records)

    @property
    def next_t(self) -> int:
        """The ``t`` the next appended event must carry."""
        return len(self._records) + 1

    @property
    def state(self) -> dict[str, str]:
        """Latest observed value per state key (a copy)."""
        return dict(self._state)

    @property
    def content_digest(self) -> str:
        """Hash chain over the records without stream or raw-event meta: two trajectories with the
        same events share it, so a view of one is a view of the other (``views.ViewService``'s cache)."""
        return self._content

    @property
    def dropped(self) -> dict[str, int]:
        """Deltas removed by validation since the stream began, by reason."""
        return dict(self._dropped)

    def append(self, raw: RawEvent, event: Event) -> Event:
        """Validate ``event``'s deltas (D.1), append it with ``raw`` and return the stored event;
        a rejected input modifies nothing."""
        if not isinstance(raw, RawEvent):
            raise ValueError(f"append expects a RawEvent, got {type(raw).__name__}")
        if not isinstance(event, Event):
            raise ValueError(f"append expects an Event, got {type(event).__name__}")
        if event.t != self.next_t:
            raise ValueError(f"event t={event.t} out of order: the stream expects t={self.next_t}")
        accepted, report = validate_deltas(event.delta)
        if accepted != event.delta:
            event = Event(event.t, event.entity, event.act, event.outcome, accepted, event.evidence)
        changed = changed_flags(accepted, self._state)
        record = StreamRecord(raw, event, changed)
        data = record.to_dict()
        del data["raw"]["meta"]
        content_line = _canonical_json(data)
        # Everything that can fail has run; mutate now.
        self._records.append(record)
        for d in accepted:
            self._state[d.key] = d.new_value
        for reason in self._dropped:
            self._dropped[reason] += getattr(report, reason)
        self._content = hashlib.sha256(self._content.encode() + content_line).hexdigest()
        return event

    def record(
        self,
        raw: RawEvent,
        *,
        entity: str,
        act: str,
        delta: Iterable[StateDelta] = (),
        failed: bool = False,
        outcome: Outcome | str | None = None,
        evidence: Mapping[str, Any] | None = None,
    ) -> Event:
        """Build the next event from extractor fields and append it (``outcome`` None: classified
        against the tracked state after validation)."""
        accepted, _ = validate_deltas(
            d if isinstance(d, StateDelta) else StateDelta(str(d[0]), str(d[1])) for d in delta
        )
        if outcome is None:
            outcome = classify_outcome(accepted, self._state, failed=failed)
        event = Event(self.next_t, entity, act, Outcome.parse(outcome), tuple(delta), evidence or {})
        return self.append(raw, event)

    def _header(self) -> dict[str, Any]:
        return {"format": FORMAT_NAME, "version": FORMAT_VERSION, "meta": self.meta}

    def to_jsonl(self, path: str | Path) -> None:
        """Write the whole stream as JSONL (header line + one line per record)."""
        path = Path(path)
        with path.open("w", encoding="utf-8") as fh:
            fh.write(_canonical_json(self._header()).decode() + "\n")
            for rec in self._records:
                fh.write(_canonical_json(rec.to_dict()).decode() + "\n")

    @classmethod
    def from_jsonl(cls, path: str | Path) -> EventStream:
        path = Path(path)
        stream: EventStream | None = None
        with path.open("r", encoding="utf-8") as fh:
            for lineno, _, obj in json_lines(
                fh, lambda n, _, exc: ValueError(f"{path}:{n}: not valid JSON ({exc.msg})")
            ):
                if stream is None:
                    if isinstance(obj, dict) and obj.get("format") == FORMAT_NAME:
                        if obj.get("version") != FORMAT_VERSION:
                            raise ValueError(f"{path}: unsupported event-stream version {obj.get('version')!r}")
                        stream = cls(obj.get("meta") or {})
                        continue
                    stream = cls()
                try:
                    stream._append_dict(obj)
                except ValueError as exc:
                    raise ValueError(f"{path}:{lineno}: {exc}") from None
        if stream is None:
            raise ValueError(f"{path}: empty file, not an event stream")
        return stream

    def _append_dict(self, obj: Any) -> None:
        if not isinstance(obj, dict) or "raw" not in obj or "event" not in obj:
            raise ValueError("record must be an object with 'raw' and 'event'")
        self.append(RawEvent.from_dict(obj["raw"]), Event.from_dict(obj["event"]))

    def to_arrow(self) -> Any:
        """One row per record; ``meta`` in the schema metadata. Returns a ``pyarrow.Table``."""
        import pyarrow as pa

        rows = self._records
        delta_type = pa.list_(pa.struct([("key", pa.string()), ("new_value", pa.string())]))
        columns = {
            "t": pa.array([r.event.t for r in rows], pa.int32()),
            "entity": pa.array([r.event.entity for r in rows], pa.string()),
            "act": pa.array([r.event.act for r in rows], pa.string()),
            "outcome": pa.array([r.event.outcome.value for r in rows], pa.string()),
            "delta": pa.array([[d.to_dict() for d in r.event.delta] for r in rows], delta_type),
            "changed": pa.array([list(r.changed) for r in rows], pa.list_(pa.bool_())),
            "evidence_json": pa.array([_canonical_json(r.event.evidence).decode() for r in rows], pa.string()),
            "o_pre": pa.array([r.raw.o_pre for r in rows], pa.string()),
            "action_json": pa.array([_canonical_json(r.raw.action).decode() for r in rows], pa.string()),
            "feedback": pa.array([r.raw.feedback for r in rows], pa.string()),
            "reward": pa.array([r.raw.reward for r in rows], pa.float64()),
            "meta_json": pa.array([_canonical_json(r.raw.meta).decode() for r in rows], pa.string()),
        }
        metadata = {
            b"memprism.format": FORMAT_NAME.encode(),
            b"memprism.version": str(FORMAT_VERSION).encode(),
            b"memprism.meta": _canonical_json(self.meta),
        }
        return pa.table(columns).replace_schema_metadata(metadata)

    @classmethod
    def from_arrow(cls, table: Any) -> EventStream:
        md = table.schema.metadata or {}
        if md.get(b"memprism.format", FORMAT_NAME.encode()) != FORMAT_NAME.encode():
            raise ValueError("Arrow table is not a memprism event stream (schema metadata memprism.format)")
        version = int(md.get(b"memprism.version", b"1"))
        if version != FORMAT_VERSION:
            raise ValueError(f"unsupported event-stream version {version}")
        required = ("t", "entity", "act", "outcome", "delta", "o_pre", "action_json", "feedback")
        missing = [c for c in required if c not in table.column_names]
        if missing:
            raise ValueError(f"Arrow table lacks event-stream column(s) {', '.join(missing)}")
        stream = cls(json.loads(md[b"memprism.meta"]) if b"memprism.meta" in md else {})
        cols = table.to_pydict()
        n = table.num_rows
        for i in range(n):
            try:
                raw = RawEvent(
                    o_pre=cols["o_pre"][i],
                    action=json.loads(cols["action_json"][i]),
                    feedback=cols["feedback"][i],
                    reward=cols["reward"][i] if "reward" in cols else 0.0,
                    meta=json.loads(cols["meta_json"][i]) if "meta_json" in cols else {},
                )
                event = Event(
                    t=cols["t"][i],
                    entity=cols["entity"][i],
                    act=cols["act"][i],
                    outcome=cols["outcome"][i],
                    delta=tuple(cols["delta"][i] or ()),
                    evidence=json.loads(cols["evidence_json"][i]) if "evidence_json" in cols else {},
                )
                stream.append(raw, event)
            except (ValueError, TypeError, json.JSONDecodeError) as exc:
                raise ValueError(f"row {i}: {exc}") from None
        return stream

    def to_parquet(self, path: str | Path) -> None:
        import pyarrow.parquet as pq

        pq.write_table(self.to_arrow(), str(path))

    @classmethod
    def from_parquet(cls, path: str | Path) -> EventStream:
        import pyarrow.parquet as pq

        try:
            table = pq.read_table(str(path))
        except Exception as exc:  # pyarrow raises several unrelated types for bad files
            raise ValueError(f"{path}: cannot read as Parquet ({exc})") from None
        try:
            return cls.from_arrow(table)
        except ValueError as exc:
            raise ValueError(f"{path}: {exc}") from None

    @classmethod
    def load(cls, path: str | Path) -> EventStream:
        """Load JSONL (``.jsonl``/``.json``) or Parquet (``.parquet``/``.pq``) by suffix."""
        path = Path(path)
        if not path.exists():
            raise ValueError(f"{path}: no such file")
        return cls.from_parquet(path) if _is_parquet(path) else cls.from_jsonl(path)

    def save(self, path: str | Path) -> None:
        """Save as Parquet or JSONL by suffix (see :meth:`load`)."""
        if _is_parquet(path):
            self.to_parquet(path)
        else:
            self.to_jsonl(path)

    def copy(self) -> EventStream:
        """An independent stream with the same records."""
        other = EventStream(self.meta)
        other._records = list(self._records)
        other._state = dict(self._state)
        other._dropped = dict(self._dropped)
        other._content = self._content
        return other

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, EventStream):
            return NotImplemented
        return self.meta == other.meta and self._records == other._records

    def __repr__(self) -> str:
        return f"EventStream(len={len(self)}, keys={len(self._state)}, meta={self.meta!r})"


def _is_parquet(path: str | Path) -> bool:
    """Parquet or JSONL by the file suffix; any other suffix is an error."""
    suffix = Path(path).suffix.lower()
    if suffix not in (".parquet", ".pq", ".jsonl", ".json", ".ndjson"):
        raise ValueError(f"{path}: unknown event-stream format {suffix!r}; use .jsonl or .parquet")
    return suffix in (".parquet", ".pq")
