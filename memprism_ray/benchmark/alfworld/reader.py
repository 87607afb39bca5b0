"""What a reader can learn about an ALFWorld episode from text it is shown.

The scripted stand-in (docs/architecture.md "The scripted policy") sees only what a prompt holds
(paper eq. task-policy); this module reads that text with regular expressions over ALFWorld's own
language and the rule Phi's ``"<entity>.<attribute> -> value"`` keys, in text order (later mentions
win). A value chain is read as a VLM reads it: every place visited, the last one current."""

from __future__ import annotations

import re
from dataclasses import dataclass, field

# An object or receptacle instance: lowercase words then an instance number ("mug 1",
# "butter knife 2" never occurs: ALFWorld names are single tokens like "butterknife 2").
_INST = r"[a-z]+ \d+"

_SEE_LIST = re.compile(
    rf"(?:On the (?P<on>{_INST}), you see|The (?P<in>{_INST}) is open\. In it, you see|"
    rf"You open the (?P<op>{_INST})\. The (?P=op) is open\. In it, you see)"
    r" (?P<items>[^.]*)\."
)
_ARRIVE = re.compile(rf"You arrive at (?P<r>{_INST})\.")
_OPENED = re.compile(rf"You open the (?P<r>{_INST})\.")
_CLOSED_SEEN = re.compile(rf"The (?P<r>{_INST}) is closed\.")
_CLOSE = re.compile(rf"You close the (?P<r>{_INST})\.")
_PICK = re.compile(rf"You pick up the (?P<o>{_INST}) from the (?P<r>{_INST})\.")
_MOVE = re.compile(rf"You (?:move|put) the (?P<o>{_INST}) (?:to|in|on) the (?P<r>{_INST})\.")
_TREAT = re.compile(rf"You (?P<verb>clean|heat|cool) the (?P<o>{_INST}) using the (?P<r>{_INST})\.")
_TURN_ON = re.compile(rf"You turn on the (?P<o>{_INST})\.")
# Commands as they appear in histories and views.
_CMD_GO = re.compile(rf"\bgo to (?P<r>{_INST})\b")
_CMD_TREAT = re.compile(rf"\b(?P<verb>clean|heat|cool) (?P<o>{_INST}) with (?P<r>{_INST})\b")
# State keys written by the rule Phi ("mug 1.location -> countertop 2", "agent.location: a -> b").
_DELTA = re.compile(rf"(?P<ent>{_INST}|agent)\.(?P<attr>[a-z_]+)\s*(?:->|=|:)\s*(?P<val>[^|;\n]*)")
_ARROW_TAIL = re.compile(r"->\s*")
# Row annotations the text renderer appends ("... egg 1.hot: true [goal]").
_ROW_MARK = re.compile(r"\s*\[[a-z ]+\]\s*$")
# Elided middle of a chain ("a -> (3 more) -> d").
_ELIDED = re.compile(r"\(\d+ more\)")

_TREAT_STATE = {"clean": "clean", "heat": "hot", "cool": "cool"}
_STATE_WORDS = {
    **dict.fromkeys(("clean", "cleaned"), "clean"),
    **dict.fromkeys(("hot", "heated"), "hot"),
    **dict.fromkeys(("cool", "cold", "cooled"), "cool"),
}
_EMPTY_HAND = {"nothing", "none", "(none)", "empty", "-"}


def instance_type(name: str) -> str:
    """``"mug 1" -> "mug"``."""
    return name.rsplit(" ", 1)[0] if name and name[-1].isdigit() else name


def _items(text: str) -> list[str]:
    return re.findall(rf"(?:an?|the|some) ({_INST})", text)


@dataclass
class EpisodeFacts:
    """Facts read from text; see the module docstring."""

    seen_at: dict[str, str] = field(default_factory=dict)
    visited: list[str] = field(default_factory=list)
    opened: set[str] = field(default_factory=set)
    closed: set[str] = field(default_factory=set)
    states: dict[str, set[str]] = field(default_factory=dict)
    placed: dict[str, str] = field(default_factory=dict)
    holding: str | None = None
    location: str | None = None
    lamp_on: bool = False

    def _visit(self, recep: str) -> None:
        if recep in self.visited:
            self.visited.remove(recep)
        self.visited.append(recep)
        self.location = recep

    def _looked_into(self, recep: str) -> None:
        # Known contents mean the place was visited, without moving the agent there now.
        if recep not in self.visited:
            self.visited.insert(0, recep)

    def _see(self, recep: str, items: list[str]) -> None:
        # Objects no longer listed at a receptacle we looked into have moved.
        for obj, where in list(self.seen_at.items()):
            if where == recep and obj not in items:
                del self.seen_at[obj]
        for obj in items:
            self.seen_at[obj] = recep

    def read(self, text: str) -> EpisodeFacts:
        """Update the facts from ``text`` (feedback, history, a rendered view)."""
        events: list[tuple[int, str, re.Match[str]]] = []
        patterns = {"see": _SEE_LIST, "arrive": _ARRIVE, "opened": _OPENED, "closed_seen": _CLOSED_SEEN}
        patterns |= {"close": _CLOSE, "pick": _PICK, "move": _MOVE, "treat": _TREAT, "turn_on": _TURN_ON}
        patterns |= {"cmd_go": _CMD_GO, "cmd_treat": _CMD_TREAT, "delta": _DELTA}
        for kind, pattern in patterns.items():
            events.extend((m.start(), kind, m) for m in pattern.finditer(text))
        events.sort(key=lambda e: e[0])
        for _, kind, m in events:
            self._apply(kind, m)
        return self

    def _apply(self, kind: str, m: re.Match[str]) -> None:
        if kind == "see":
            recep = m.group("on") or m.group("in") or m.group("op")
            self._see(recep, _items(m.group("items")))
            self._visit(recep)
        elif kind in ("arrive", "cmd_go"):
            self._visit(m.group("r"))
        elif kind == "opened":
            self.opened.add(m.group("r"))
            self.closed.discard(m.group("r"))
        elif kind == "closed_seen":
            if m.group("r") not in self.opened:
                self.closed.add(m.group("r"))
        elif kind == "close":
            self.opened.discard(m.group("r"))
            self.closed.add(m.group("r"))
        elif kind == "pick":
            self.seen_at.pop(m.group("o"), None)
            self.placed.pop(m.group("o"), None)
            self.holding = m.group("o")
        elif kind == "move":
            self.seen_at[m.group("o")] = m.group("r")
            self.placed[m.group("o")] = m.group("r")
            if self.holding == m.group("o"):
                self.holding = None
        elif kind in ("treat", "cmd_treat"):
            # A command alone does not prove success; the feedback line does. A command in
            # a view row is followed by its outcome; an exception row is handled below.
            if kind == "treat" or not _row_failed(m.string, m.end()):
                self.states.setdefault(m.group("o"), set()).add(_TREAT_STATE[m.group("verb")])
        elif kind == "turn_on":
            self.lamp_on = True
        elif kind == "delta":
            self._apply_delta(m.group("ent"), m.group("attr"), m.group("val"))

    def _apply_delta(self, entity: str, attr: str, value: str) -> None:
        # A chain "a -> b -> c" ends in the latest value; a row marker is not part of it,
        # nor is an elision marker "(3 more)".
        chain = [
            v.strip().strip(",").strip()
            for v in _ARROW_TAIL.split(_ROW_MARK.sub("", value.strip()))
            if v.strip() and not _ELIDED.fullmatch(v.strip())
        ]
        if not chain:
            return
        low = chain[-1].lower()
        if entity == "agent":
            if attr in ("location", "at"):
                # Every place of the chain was visited, in order; the last is where it is.
                for place in chain:
                    if re.fullmatch(_INST, place.lower()):
                        self._visit(place.lower())
            elif attr in ("holding", "held_object", "inventory"):
                self.holding = None if low in _EMPTY_HAND else (low if re.fullmatch(_INST, low) else self.holding)
            return
        if attr == "location":
            where = re.search(_INST, low)
            if where:
                self.seen_at[entity] = where.group(0)
            elif low in ("agent", "held", "in hand", "inventory"):
                self.seen_at.pop(entity, None)
        elif attr in ("open", "is_open", "state") and low in ("open", "true", "opened"):
            self.opened.add(entity)
            self.closed.discard(entity)
        elif attr in ("open", "is_open", "state") and low in ("closed", "false"):
            self.closed.add(entity)
        elif attr == "contents":
            self._see(entity, re.findall(_INST, low))
            self._looked_into(entity)
        elif attr in _STATE_WORDS and low in ("true", "yes", "1", attr):
            self.states.setdefault(entity, set()).add(_STATE_WORDS[attr])
        elif attr in ("state", "temperature", "cleanliness") and low in _STATE_WORDS:
            self.states.setdefault(entity, set()).add(_STATE_WORDS[low])
        elif attr in ("on", "toggled", "light") and low in ("true", "on", "yes"):
            self.lamp_on = True


def _row_failed(text: str, pos: int) -> bool:
    """Whether the view row containing ``pos`` reports a failure for its command."""
    end = text.find("\n", pos)
    row = text[pos : end if end >= 0 else len(text)].lower()
    return "exception" in row or "nothing happens" in row or "fail" in row


def read_facts(*texts: str) -> EpisodeFacts:
    """Facts from several texts read in order (e.g. view, then history, then observation)."""
    facts = EpisodeFacts()
    for t in texts:
        if t:
            facts.read(t)
    return facts
