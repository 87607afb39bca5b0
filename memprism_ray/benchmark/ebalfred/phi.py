"""Phi for EB-ALFRED in two stages (paper appendix D.2 "Benchmark-specific Phi adapters",
EB-ALFRED paragraph; prompts "EB-ALFRED Phi Semantic Stage" and "... Grounding Stage").

"Stage 1 extracts the primary entity, normalized action, and sparse state updates. If the
simulator explicitly reports failure, the outcome is forced to exception and the state delta is
cleared. Stage 2 uses the post-action image to localize at most three validated, visible
candidate entities. Invalid or missing boxes remove only visual evidence; they cannot alter
Stage 1 semantics. A stale-frame flag prevents unsynchronized pixels from being treated as
grounded evidence."

:class:`EbAlfredRulePhi` is stage 1 by rules over EB-ALFRED's fixed skill grammar and its
"Last action executed successfully." / "Last action is invalid. <reason>" feedback (also the
LLM stage 1's fallback); :class:`GroundingStage` is stage 2; :class:`EbAlfredPhi` composes them.
State keys: ``agent.held_object``, ``agent.location`` (the object last found),
``<obj>.location`` (``held``, its receptacle, ``floor``), ``<obj>.open``, ``<obj>.power``,
``<obj>.sliced``; entities are the skill's object in lowercase.
"""

from __future__ import annotations

import base64
import binascii
import json
import math
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from memprism_ray.recorder.events import RawEvent, StateDelta
from memprism_ray.recorder.phi.base import Extraction, Phi
from memprism_ray.recorder.phi.config import PhiConfig
from memprism_ray.recorder.phi.llm import LLMPhi
from memprism_ray.recorder.phi.llm_client import CompleteMany
from memprism_ray.recorder.phi.prompt import PhiPrompt
from memprism_ray.recorder.phi.spec import AnswerSpec, PhiSpec, existing_keys

PROMPTS = Path(__file__).resolve().with_name("prompts")
PROMPT_PATH = PROMPTS / "phi_grounding.txt"
MAX_BOXES = 3
SCALE = 1000.0
NONE = "none"

_SUCCESS = "Last action executed successfully"
_INVALID = "Last action is invalid"
_HELD = re.compile(r"Held objects: (?P<held>[^.]*)\.")

#: (act type, pattern): the act type is the verb phrase copied from the skill (prompt rule 2).
_SKILLS: tuple[tuple[str, re.Pattern[str]], ...] = (
    ("find", re.compile(r"find (?:a|an|the) (?P<target>\S+)$")),
    ("pick up", re.compile(r"pick up (?:a|an|the) (?P<target>\S+)$")),
    ("put down", re.compile(r"put down\b.*$")),
    ("drop", re.compile(r"drop\b.*$")),
    ("open", re.compile(r"open (?:a|an|the) (?P<target>\S+)$")),
    ("close", re.compile(r"close (?:a|an|the) (?P<target>\S+)$")),
    ("turn on", re.compile(r"turn on (?:a|an|the) (?P<target>\S+)$")),
    ("turn off", re.compile(r"turn off (?:a|an|the) (?P<target>\S+)$")),
    ("slice", re.compile(r"slice (?:a|an|the) (?P<target>\S+)$")),
)


def parse_skill(action: str) -> tuple[str, str | None]:
    """``"pick up the Ladle"`` -> ``("pick up", "ladle")``; unknown skills -> ``("other", None)``."""
    text = " ".join(action.strip().split())
    for act, pattern in _SKILLS:
        m = pattern.match(text)
        if m:
            target = m.groupdict().get("target")
            return act, target.lower() if target else None
    return "other", None


def held_in(text: str) -> str | None:
    """The held object named by ``"Held objects: Ladle (held)."`` (``None`` when the text says
    none or does not say)."""
    m = _HELD.search(text)
    if not m:
        return None
    names = [h.replace("(held)", "").strip().lower() for h in m.group("held").split(",")]
    names = [n for n in names if n and n != NONE]
    return names[0] if names else None


def feedback_kind(raw: RawEvent) -> str:
    """``success``, ``invalid`` or ``unknown``: hard evidence from the simulator's report."""
    flag = raw.meta.get("last_action_success")
    if flag is not None and not bool(flag):
        return "invalid"
    if raw.feedback.startswith(_INVALID):
        return "invalid"
    if raw.feedback.startswith(_SUCCESS) or flag:
        return "success"
    return "unknown"


@dataclass
class EbAlfredRulePhi:
    """Stage 1 by rules: entity, normalised action and sparse state updates."""

    name: str = "ebalfred-rules"

    def extract(self, raw: RawEvent, known_state: Mapping[str, str]) -> Extraction:
        act, target = parse_skill(raw.action_text)
        held = held_in(raw.o_pre) or _known(known_state.get("agent.held_object"))
        entity = target if target is not None else (held if act in ("put down", "drop") and held else "unknown")
        kind = feedback_kind(raw)
        evidence = {"feedback_kind": kind, "skill": act}
        if kind == "invalid":  # the simulator reported failure: exception, no delta
            return Extraction(entity, act, (), failed=True, evidence=evidence)
        if kind == "unknown" or act == "other":  # nothing is made up from unexplained text
            return Extraction(entity, act, (), evidence=evidence)
        return Extraction(entity, act, tuple(_deltas(act, entity, held, known_state)), evidence=evidence)


def _known(value: str | None) -> str | None:
    return None if value in (None, "", NONE, "unknown") else value


def _deltas(act: str, entity: str, held: str | None, state: Mapping[str, str]) -> list[StateDelta]:
    d: list[StateDelta] = []
    if act == "find":
        d.append(StateDelta("agent.location", entity))
    elif act == "pick up":
        d += [StateDelta("agent.held_object", entity), StateDelta(f"{entity}.location", "held")]
    elif act in ("put down", "drop"):
        d.append(StateDelta("agent.held_object", NONE))
        where = "floor" if act == "drop" else _known(state.get("agent.location"))
        if held and where and where != held:  # found the held object itself: no receptacle known
            d.append(StateDelta(f"{held}.location", where))
    elif act in ("open", "close"):
        d.append(StateDelta(f"{entity}.open", "open" if act == "open" else "closed"))
    elif act in ("turn on", "turn off"):
        d.append(StateDelta(f"{entity}.power", "on" if act == "turn on" else "off"))
    elif act == "slice":
        d.append(StateDelta(f"{entity}.sliced", "true"))
    return d


@dataclass(frozen=True)
class Frame:
    """The post-action frame of one event and what says whether it is synchronized."""

    png: bytes | None
    step: int | None = None  # the env step it was taken after (None: unknown)
    changed: bool | None = None  # whether it differs from the previous frame (None: unknown)


def candidates_of(ex: Extraction) -> list[str]:
    """Stage-1 entities to localise: the event's entity, then delta entities, in order."""
    out: list[str] = []
    for name in [ex.entity, *(d.entity for d in ex.delta)]:
        if name and name not in ("agent", "unknown", NONE) and name not in out:
            out.append(name)
    return out


def _json_object(text: str) -> Any:
    """The JSON value from the first ``{`` to the last ``}`` (paper E: Phi parsing); data only."""
    start, end = text.find("{"), text.rfind("}")
    if start < 0 or end <= start:
        raise ValueError("no JSON object in the answer")
    return json.loads(text[start : end + 1])


def validate_boxes(answer: Any, candidates: Sequence[str]) -> tuple[list[dict[str, Any]], list[dict[str, str]]]:
    """``(accepted, rejected)``: at most :data:`MAX_BOXES` boxes on the 0-1000 scale, inside
    the frame, non-degenerate, one per known candidate; each rejected box says why."""
    if not isinstance(answer, Mapping) or set(answer) != {"entities"} or not isinstance(answer["entities"], list):
        raise ValueError("the root must be an object with exactly one field 'entities' holding a list")
    accepted: list[dict[str, Any]] = []
    rejected: list[dict[str, str]] = []
    for item in answer["entities"]:
        name = item.get("entity") if isinstance(item, Mapping) else None
        label = name if isinstance(name, str) else repr(item)[:40]
        reason = _box_problem(item, candidates, accepted)
        if reason is None and len(accepted) >= MAX_BOXES:
            reason = f"more than {MAX_BOXES} boxes"
        if reason:
            rejected.append({"entity": label, "reason": reason})
        else:
            accepted.append({"entity": name, "bbox_2d": [float(v) for v in item["bbox_2d"]]})
    return accepted, rejected


def _box_problem(item: Any, candidates: Sequence[str], accepted: Sequence[Mapping[str, Any]]) -> str | None:
    if not isinstance(item, Mapping) or set(item) != {"entity", "bbox_2d"}:
        return "an item must hold exactly 'entity' and 'bbox_2d'"
    name, box = item["entity"], item["bbox_2d"]
    if not isinstance(name, str) or name not in candidates:
        return "not a candidate entity"
    if any(a["entity"] == name for a in accepted):
        return "second box for the same entity"
    if not isinstance(box, list) or len(box) != 4:
        return "bbox_2d must be four numbers"
    if any(isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) for v in box):
        return "bbox_2d must be four finite numbers"
    left, top, right, bottom = box
    if min(box) < 0 or max(box) > SCALE:
        return "outside the frame (0-1000 scale)"
    if right <= left or bottom <= top:
        return "degenerate box"
    return None


@dataclass
class GroundingStage:
    """Stage 2: at most three validated boxes on the post-action frame per event. A stale frame
    (another step's, or identical to the previous one) or a missing one is never sent to the model."""

    complete_many: CompleteMany
    prompt: str = field(default_factory=lambda: PROMPT_PATH.read_text())

    def __post_init__(self) -> None:
        if "{candidate_list}" not in self.prompt:
            raise ValueError("the grounding prompt must contain the {candidate_list} placeholder")

    def prompt_for(self, candidates: Sequence[str]) -> str:
        return self.prompt.replace("{candidate_list}", json.dumps(list(candidates)))

    def ground_many(self, items: Sequence[tuple[Extraction, Frame, int | None]]) -> list[dict[str, Any]]:
        """``(stage-1 extraction, frame, event step)`` per event -> its ``grounding`` evidence."""
        results: list[dict[str, Any]] = []
        calls: list[tuple[str, Sequence[bytes]]] = []
        owners: list[int] = []
        for i, (ex, frame, step) in enumerate(items):
            cands = candidates_of(ex)
            stale = frame.png is None or (frame.step is not None and step is not None and frame.step != step)
            stale = stale or frame.changed is False
            res: dict[str, Any] = {"candidates": cands, "boxes": [], "rejected": [], "stale_frame": bool(stale)}
            if frame.png is None:
                res["status"] = "no_frame"
            elif stale:
                res["status"] = "stale_frame"
            elif not cands:
                res["status"] = "no_candidates"
            else:
                res["status"] = "pending"
                calls.append((self.prompt_for(cands), [frame.png]))
                owners.append(i)
            results.append(res)
        answers = self.complete_many(calls) if calls else []
        if len(answers) != len(calls):
            raise RuntimeError(f"grounding model returned {len(answers)} answer(s) for {len(calls)} prompt(s)")
        for i, answer in zip(owners, answers, strict=True):
            res = results[i]
            if isinstance(answer, BaseException):
                res["status"] = "model_error"
                res["error"] = f"{type(answer).__name__}: {answer}"[:200]
                continue
            try:
                res["boxes"], res["rejected"] = validate_boxes(_json_object(str(answer)), res["candidates"])
                res["status"] = "ok"
            except ValueError as exc:  # json.JSONDecodeError is a ValueError
                res["status"] = "parse_error"
                res["error"] = str(exc)[:200]
        return results


def frame_from_meta(raw: RawEvent) -> Frame:
    """The post-action frame an event's metadata points at (``frame_path`` or ``frame_png_b64``,
    docs/ebalfred.md); an unreadable or non-PNG frame counts as missing."""
    meta = raw.meta
    png: bytes | None = None
    if meta.get("frame_path"):
        try:
            png = Path(str(meta["frame_path"])).read_bytes()
        except OSError:
            png = None
    elif meta.get("frame_png_b64"):
        try:
            png = base64.b64decode(str(meta["frame_png_b64"]), validate=True)
        except (binascii.Error, ValueError):
            png = None
    if png is not None and not png.startswith(b"\x89PNG\r\n\x1a\n"):
        png = None
    step = meta.get("frame_step")
    changed = meta.get("frame_changed")
    return Frame(png, int(step) if isinstance(step, int) else None, bool(changed) if changed is not None else None)


def _event_step(raw: RawEvent) -> int | None:
    # The agent records the pre-action step count; the env stamps frames with the count after it.
    step = raw.meta.get("step")
    return step + 1 if isinstance(step, int) and not isinstance(step, bool) else None


class EbAlfredPhi:
    """Stage 1 (any Phi: the rules or the LLM semantic stage) plus optional grounding."""

    def __init__(
        self,
        stage1: Phi | None = None,
        grounding: GroundingStage | None = None,
        frame_of: Callable[[RawEvent], Frame] = frame_from_meta,
    ) -> None:
        self.stage1 = stage1 if stage1 is not None else EbAlfredRulePhi()
        self.grounding = grounding
        self.frame_of = frame_of
        self.name = f"ebalfred[{getattr(self.stage1, 'name', 'stage1')}{'+grounding' if grounding else ''}]"
        self.grounding_counts: dict[str, int] = {}

    def extract(self, raw: RawEvent, known_state: Mapping[str, str]) -> Extraction:
        return self.extract_many([raw], [known_state])[0]

    def extract_many(self, raws: Sequence[RawEvent], states: Sequence[Mapping[str, str]]) -> list[Extraction]:
        """Stage 1 per event, then one batched grounding call for the whole batch."""
        if len(raws) != len(states):
            raise ValueError(f"extract_many got {len(raws)} raw event(s) and {len(states)} state(s)")
        many = getattr(self.stage1, "extract_many", None)
        if callable(many):  # an LLM semantic stage: the whole batch in flight at once
            firsts = list(many(raws, states))
        else:
            firsts = [self.stage1.extract(raw, state) for raw, state in zip(raws, states, strict=True)]
        if self.grounding is None:
            return firsts
        grounded = self.grounding.ground_many(
            [(ex, self.frame_of(raw), _event_step(raw)) for ex, raw in zip(firsts, raws, strict=True)]
        )
        for g in grounded:
            key = f"grounding_{g['status']}"
            self.grounding_counts[key] = self.grounding_counts.get(key, 0) + 1
        return [
            Extraction(ex.entity, ex.act, ex.delta, ex.failed, ex.outcome, {**ex.evidence, "grounding": g})
            for ex, g in zip(firsts, grounded, strict=True)
        ]

    def stats(self) -> dict[str, int]:
        """Stage 1's counters (an LLM stage: fallbacks, tokens) and the grounding outcomes by status."""
        stage1 = getattr(self.stage1, "stats", None)
        return {**(stage1() if callable(stage1) else {}), **self.grounding_counts}


def ebalfred_inputs(
    raw: RawEvent, known_state: Mapping[str, str], rule: Extraction
) -> tuple[dict[str, str], list[bytes]]:
    """EB-ALFRED stage-1 fields, plain text (the prompt's CURRENT lines are not JSON); the
    ``post_frame_path`` PNG is sent as the image."""
    meta = raw.meta
    success = meta.get("last_action_success")
    flag = "unknown" if success is None else (str(int(success)) if isinstance(success, bool) else str(success))
    images: list[bytes] = []
    frame = meta.get("post_frame_path")
    if frame:
        images.append(Path(str(frame)).read_bytes())
    return {
        "existing_keys": existing_keys(known_state),
        "before_text": raw.o_pre,
        "action": raw.action_text,
        "result_text": raw.feedback,
        "feedback_text": str(meta.get("env_feedback", "")),
        "success_flag": flag,
    }, images


def ebalfred_llm_phi(spec: PhiSpec, backend: CompleteMany, cfg: PhiConfig) -> EbAlfredPhi:
    """Appendix D.2 "EB-ALFRED": the LLM semantic stage, then grounding (left out with
    ``phi.llm_source: pool``: the pool completes text only)."""
    stage1 = LLMPhi(spec, backend, EbAlfredRulePhi())
    grounding = GroundingStage(backend) if cfg.llm_source == "endpoint" else None
    return EbAlfredPhi(stage1, grounding)


EBALFRED_SEMANTIC_PROMPT = PhiPrompt(
    "ebalfred_semantic",
    ("existing_keys", "before_text", "action", "result_text", "feedback_text", "success_flag"),
    path=PROMPTS / "phi_semantic.txt",
)
EBALFRED_PHI = PhiSpec(
    "ebalfred",
    EbAlfredPhi,
    EBALFRED_SEMANTIC_PROMPT,
    AnswerSpec(frozenset({"entity", "act_type", "delta_s"}), lowercase_entity=True),
    ebalfred_inputs,
    llm=ebalfred_llm_phi,
)
