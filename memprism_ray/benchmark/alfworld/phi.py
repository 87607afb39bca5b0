"""Rule Phi for ALFWorld (paper appendix D.2 "ALFWorld", prompt E.1 "ALFWorld Phi Event
Extraction"): "Rules provide hard evidence for the normalized action and explicit failure
language, while Phi extracts the primary entity and sparse semantic state updates."

ALFWorld's feedback comes from a fixed grammar (``alfred.twl2``), so every sentence it can emit
has a pattern here, as do the official games' and the paper prompt's wordings ("You arrive at
loc 5."). "Nothing happens." is the failure language: an ``exception`` with no deltas;
``state_update`` vs ``no_observed_change`` is the stream's call. State keys: ``agent.location``,
``agent.holding`` (``"nothing"``: empty hands), ``<receptacle>.open``, ``<receptacle>.contents``
and per object ``<object>.location`` (``"agent"`` once taken), ``<object>.clean`` / ``.hot`` /
``.cool`` / ``.sliced`` (heating clears a known ``cool`` and vice versa, as the PDDL domain does),
``<lamp>.on``. ``evidence["feedback_kind"]`` names the matched pattern; ``"unknown"`` feedback
makes up no delta.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from memprism_ray.recorder.events import RawEvent, StateDelta
from memprism_ray.recorder.phi.base import Extraction
from memprism_ray.recorder.phi.prompt import PhiPrompt
from memprism_ray.recorder.phi.spec import PROMPT_META_EXCLUDE, AnswerSpec, PhiSpec, existing_keys, prompt_json

#: One named instance: ALFWorld names are one lowercase token and a number ("butterknife 2").
INST = r"[a-z][a-z0-9_\-]* \d+"
_I = rf"(?:{INST})"
EMPTY_HAND = "nothing"

_COMMANDS: tuple[tuple[str, re.Pattern[str]], ...] = (
    ("go", re.compile(r"go to (?P<target>.+)")),
    ("open", re.compile(r"open (?P<target>.+)")),
    ("close", re.compile(r"close (?P<target>.+)")),
    ("take", re.compile(r"(?:take|pick up) (?P<target>.+?) from (?P<other>.+)")),
    ("put", re.compile(r"(?:move|put) (?P<target>.+?) (?:to|into|in/on|in|on) (?P<other>.+)")),
    ("heat", re.compile(r"heat (?P<target>.+?) with (?P<other>.+)")),
    ("cool", re.compile(r"cool (?P<target>.+?) with (?P<other>.+)")),
    ("clean", re.compile(r"clean (?P<target>.+?) with (?P<other>.+)")),
    ("slice", re.compile(r"slice (?P<target>.+?) with (?P<other>.+)")),
    ("use", re.compile(r"use (?P<target>.+)")),
    ("examine", re.compile(r"examine (?P<target>.+)")),
    ("look", re.compile(r"look")),
    ("inventory", re.compile(r"inventory")),
    ("help", re.compile(r"help")),
)


@dataclass(frozen=True, slots=True)
class Command:
    """A command split into its normalised act type and arguments."""

    act: str
    target: str = ""
    other: str = ""


def parse_command(action: str) -> Command:
    """``"move mug 1 to desk 1" -> Command("put", "mug 1", "desk 1")``; unknown -> ``"other"``."""
    text = " ".join(action.strip().lower().split())
    for act, pattern in _COMMANDS:
        m = pattern.fullmatch(text)
        if m:
            groups = m.groupdict()
            return Command(act, groups.get("target") or "", groups.get("other") or "")
    return Command("other")


_RECEPTACLE_VIEW = (
    ("receptacle_open", re.compile(rf"The (?P<r>{_I}) is open\. In it, you see (?P<items>.*?)\.")),
    ("receptacle_closed", re.compile(rf"The (?P<r>{_I}) is closed\.")),
    ("receptacle_on", re.compile(rf"On the (?P<r>{_I}), you see (?P<items>.*?)\.")),
)
_FEEDBACK: tuple[tuple[str, re.Pattern[str]], ...] = (
    ("nothing_happens", re.compile(r"Nothing happens\.")),
    ("arrive", re.compile(rf"You arrive at (?P<r>{_I}|loc \d+)\.(?: (?P<rest>.*))?", re.DOTALL)),
    ("open", re.compile(rf"You open the (?P<r>{_I})\.(?: (?P<rest>.*))?", re.DOTALL)),
    ("close", re.compile(rf"You close the (?P<r>{_I})\.")),
    ("take", re.compile(rf"You (?:pick up|take) the (?P<o>{_I}) from the (?P<r>{_I})\.")),
    ("put", re.compile(rf"You (?:move|put) the (?P<o>{_I}) (?:to|into|in/on|in|on) the (?P<r>{_I})\.")),
    ("treat", re.compile(rf"You (?P<verb>heat|cool|clean) the (?P<o>{_I}) using the (?P<r>{_I})\.")),
    ("slice", re.compile(rf"You slice(?:d)? the (?P<o>{_I}) with the (?P<k>{_I})\.")),
    ("turn_on", re.compile(rf"You turn on the (?P<o>{_I})\.")),
    ("turn_off", re.compile(rf"You turn off the (?P<o>{_I})\.")),
    ("no_switch", re.compile(rf"You don't see any switch on the (?P<o>{_I})\.")),
    ("inventory_empty", re.compile(r"You are not carrying anything\.")),
    ("inventory", re.compile(r"You are carrying: (?P<items>.*?)\.")),
    *_RECEPTACLE_VIEW,
    ("object_container", re.compile(rf"This is a normal (?P<o>{_I})\. In it, you see (?P<items>.*?)\.")),
    ("object_state", re.compile(rf"This is an? (?P<states>(?:hot|cool|cold|clean|sliced|and| )+?) (?P<o>{_I})\.")),
    ("object_switch", re.compile(rf"This (?P<o>{_I}) is (?P<s>on|off)\.")),
    ("object_plain", re.compile(rf"There's nothing special about (?P<o>{_I})\.")),
    ("look_facing", re.compile(r"You are facing the (?P<rs>.*?)\. Next to it, you see (?P<items>.*?)\.")),
    (
        "look_middle",
        re.compile(r"You are in the middle of a room\. Looking quickly around you, you see (?P<items>.*?)\."),
    ),
    ("help", re.compile(r"Available commands:.*", re.DOTALL)),
)

_ITEM = re.compile(rf"\b(?:a|an|some|the) ({INST})")
_NAME = re.compile(INST)
_STATE_WORDS = {"hot": "hot", "cool": "cool", "cold": "cool", "clean": "clean", "sliced": "sliced"}


def list_items(text: str) -> list[str]:
    """``"a apple 1, a mug 2, and a fork 1" -> ["apple 1", "mug 2", "fork 1"]``; ``"nothing" -> []``."""
    return _ITEM.findall(text)


def classify_feedback(feedback: str) -> tuple[str, re.Match[str] | None]:
    """The name of the feedback pattern that explains ``feedback`` completely, and its match."""
    text = feedback.strip()
    for kind, pattern in _FEEDBACK:
        m = pattern.fullmatch(text)
        if m:
            if kind in ("arrive", "open") and m.group("rest") and _receptacle_view(m.group("rest")) is None:
                continue
            return kind, m
    return "unknown", None


def _receptacle_view(text: str) -> tuple[str, re.Match[str]] | None:
    for kind, pattern in _RECEPTACLE_VIEW:
        m = pattern.fullmatch(text.strip())
        if m:
            return kind, m
    return None


class AlfworldPhi:
    """Rule-based Phi for ALFWorld; see the module docstring. Stateless and deterministic."""

    name = "alfworld-rule"

    def extract(self, raw: RawEvent, known_state: Mapping[str, str]) -> Extraction:
        cmd = parse_command(raw.action_text)
        kind, m = classify_feedback(raw.feedback)
        deltas: list[StateDelta] = []
        entity = cmd.target or ("agent" if cmd.act in ("look", "inventory") else "unknown")
        failed = kind == "nothing_happens"
        if m is not None and not failed:
            entity = self._deltas(kind, m, cmd, known_state, deltas) or entity
        return Extraction(
            entity=entity, act=cmd.act, delta=tuple(deltas), failed=failed, evidence={"feedback_kind": kind}
        )

    def _deltas(
        self, kind: str, m: re.Match[str], cmd: Command, known: Mapping[str, str], out: list[StateDelta]
    ) -> str | None:
        """Append the deltas of one matched feedback; return the entity it names, if any."""
        add = out.append
        if kind in ("arrive", "open"):
            where = m.group("r")
            if kind == "arrive":
                # "loc 5" (official games) is not a receptacle: the command names it.
                where = cmd.target if where.startswith("loc ") and cmd.act == "go" and cmd.target else where
                add(StateDelta("agent.location", where))
            if m.group("rest"):
                view = _receptacle_view(m.group("rest"))
                if view is not None:
                    self._seen(*view, out)
            elif kind == "open":
                add(StateDelta(f"{where}.open", "open"))
            return where
        if kind in ("receptacle_open", "receptacle_closed", "receptacle_on"):
            self._seen(kind, m, out)
            return m.group("r")
        if kind == "close":
            add(StateDelta(f"{m.group('r')}.open", "closed"))
            return m.group("r")
        if kind == "take":
            obj, recep = m.group("o"), m.group("r")
            add(StateDelta("agent.holding", obj))
            add(StateDelta(f"{obj}.location", "agent"))
            contents = known.get(f"{recep}.contents")
            if contents is not None:
                left = [x for x in _split_contents(contents) if x != obj]
                add(StateDelta(f"{recep}.contents", ", ".join(left) or "nothing"))
            return obj
        if kind == "put":
            obj, recep = m.group("o"), m.group("r")
            add(StateDelta("agent.holding", EMPTY_HAND))
            add(StateDelta(f"{obj}.location", recep))
            contents = known.get(f"{recep}.contents")
            if contents is not None:
                now = [x for x in _split_contents(contents) if x != obj] + [obj]
                add(StateDelta(f"{recep}.contents", ", ".join(now)))
            return obj
        if kind == "treat":
            obj, verb = m.group("o"), m.group("verb")
            state = {"heat": "hot", "cool": "cool", "clean": "clean"}[verb]
            add(StateDelta(f"{obj}.{state}", "true"))
            opposite = {"hot": "cool", "cool": "hot"}.get(state)
            if opposite and known.get(f"{obj}.{opposite}") == "true":
                add(StateDelta(f"{obj}.{opposite}", "false"))
            return obj
        if kind == "slice":
            add(StateDelta(f"{m.group('o')}.sliced", "true"))
            return m.group("o")
        if kind in ("turn_on", "turn_off"):
            add(StateDelta(f"{m.group('o')}.on", "true" if kind == "turn_on" else "false"))
            return m.group("o")
        if kind == "inventory_empty":
            add(StateDelta("agent.holding", EMPTY_HAND))
            return "agent"
        if kind == "inventory":
            held = list_items(m.group("items"))
            add(StateDelta("agent.holding", ", ".join(held) or EMPTY_HAND))
            return "agent"
        if kind == "object_container":
            obj = m.group("o")
            add(StateDelta(f"{obj}.contents", ", ".join(list_items(m.group("items"))) or "nothing"))
            return obj
        if kind == "object_state":
            obj = m.group("o")
            for word in m.group("states").split():
                if word in _STATE_WORDS:
                    add(StateDelta(f"{obj}.{_STATE_WORDS[word]}", "true"))
            return obj
        if kind == "object_switch":
            add(StateDelta(f"{m.group('o')}.on", "true" if m.group("s") == "on" else "false"))
            return m.group("o")
        if kind == "look_facing":
            facing = _NAME.findall(m.group("rs"))
            if facing:
                add(StateDelta("agent.location", facing[0]))
            return "agent"
        if kind in ("no_switch", "object_plain"):
            return m.group("o")
        return None  # look_middle, help: nothing observable changes

    @staticmethod
    def _seen(kind: str, m: re.Match[str], out: list[StateDelta]) -> None:
        recep = m.group("r")
        if kind == "receptacle_closed":
            out.append(StateDelta(f"{recep}.open", "closed"))
            return
        if kind == "receptacle_open":
            out.append(StateDelta(f"{recep}.open", "open"))
        items = list_items(m.group("items"))
        out.append(StateDelta(f"{recep}.contents", ", ".join(items) or "nothing"))
        out.extend(StateDelta(f"{obj}.location", recep) for obj in items)


def _split_contents(value: str) -> list[str]:
    return [] if value.strip() in ("", "nothing") else [x.strip() for x in value.split(",") if x.strip()]


def alfworld_inputs(
    raw: RawEvent, known_state: Mapping[str, str], rule: Extraction
) -> tuple[dict[str, str], list[bytes]]:
    """ALFWorld prompt fields: the EVENT object's values as JSON (``meta`` without
    :data:`~memprism_ray.recorder.phi.spec.PROMPT_META_EXCLUDE`), the tracked keys as a JSON list."""
    return {
        "existing_keys": existing_keys(known_state),
        "observation": prompt_json(raw.o_pre),
        "action": prompt_json(raw.action_text),
        "result": prompt_json(raw.feedback),
        "reward": prompt_json(raw.reward),
        "metadata": prompt_json({k: v for k, v in raw.meta.items() if k not in PROMPT_META_EXCLUDE}),
    }, []


ALFWORLD_PROMPT = PhiPrompt(
    "alfworld",
    ("existing_keys", "observation", "action", "result", "reward", "metadata"),
    path=Path(__file__).resolve().with_name("prompts") / "phi.txt",
)
ALFWORLD_PHI = PhiSpec(
    "alfworld", AlfworldPhi, ALFWORLD_PROMPT, AnswerSpec(frozenset({"entity", "act_type", "delta_s"})), alfworld_inputs
)
