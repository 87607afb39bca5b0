"""Rule Phi for Mind2Web (paper appendix D.2 "Mind2Web"; prompt "Mind2Web Phi Event
Extraction").

"The hard action metadata is normalized into operation, target, and value. Phi may emit
only page_state, overlay_state, field_value, choice_value, result_state, or
workflow_state. Because replay follows a valid human trajectory, an event may remain a
state_update even when no member of this restricted semantic key set is extracted."

The raw action is the recorded human action (``{"op", "ref", "value"}``), ``o_pre`` / ``feedback``
the page snapshots before / after it (:mod:`memprism_ray.benchmark.mind2web.snapshot_format`). ``act`` is
the lower-cased operation, ``entity`` the target element as the snapshot names it, and feedback
starting with ``Action failed`` is a failure. The keys come from comparing the two snapshots with
the action as the causal hint (:meth:`Mind2WebPhi.extract`); an LLM Phi keeps the rule's entity (the
prompt asks for deltas only).
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from memprism_ray.benchmark.mind2web.snapshot_format import Element, describe, parse_snapshot
from memprism_ray.recorder.events import Outcome, RawEvent, StateDelta
from memprism_ray.recorder.phi.base import Extraction
from memprism_ray.recorder.phi.prompt import PhiPrompt
from memprism_ray.recorder.phi.spec import AnswerSpec, PhiSpec, prompt_json

KEYS: tuple[str, ...] = ("page_state", "overlay_state", "field_value", "choice_value", "result_state", "workflow_state")
FAILURE_PREFIX = "Action failed"
_OVERLAY = re.compile(r"\b(dialog|modal|menu|listbox|dropdown|popup|popover)\b", re.IGNORECASE)
_WORKFLOW = re.compile(
    r"\b(submit|search|go|find|continue|next|checkout|check out|book|reserve|confirm|apply|sign in|log in|"
    r"add to cart|show times|pay|place order|done|save)\b",
    re.IGNORECASE,
)
_RESULT_TAGS = {"li", "tr", "article", "option"}
#: Fewer shared refs than this fraction of the larger page counts as a new page.
PAGE_CHANGE = 0.5


def _action(raw: RawEvent) -> tuple[str, str, str | None]:
    data: Any = raw.action
    if isinstance(data, str):
        try:
            data = json.loads(data)
        except json.JSONDecodeError:
            return "other", "", None
    if not isinstance(data, Mapping):
        return "other", "", None
    op = str(data.get("op", "")).strip().upper()
    ref = str(data.get("ref") or "")
    value = data.get("value")
    return (op if op in ("CLICK", "TYPE", "SELECT") else "other"), ref, (str(value) if value is not None else None)


def _is_overlay(e: Element) -> bool:
    return bool(_OVERLAY.search(" ".join([e.tag, e.attrs.get("role", ""), e.attrs.get("class", "")])))


def _is_result(e: Element) -> bool:
    return e.tag in _RESULT_TAGS or e.attrs.get("role", "") in ("option", "listitem", "row", "article")


def _is_choice(e: Element | None) -> bool:
    if e is None:
        return False
    kind = e.attrs.get("type", "").lower()
    return e.tag == "option" or kind in ("checkbox", "radio") or e.attrs.get("role", "") in ("option", "radio")


class Mind2WebPhi:
    """Rule-based Phi for Mind2Web; see the module docstring. Stateless and deterministic."""

    name = "mind2web-rule"

    def extract(self, raw: RawEvent, known_state: Mapping[str, str]) -> Extraction:
        op, ref, value = _action(raw)
        before, after = parse_snapshot(raw.o_pre), parse_snapshot(raw.feedback)
        target = before.get(ref)
        entity = describe(target, ref) if ref else "page"
        act = op.lower()
        if raw.feedback.startswith(FAILURE_PREFIX):
            return Extraction(entity=entity, act=act, failed=True, evidence={"rule": "explicit_failure"})
        deltas: dict[str, str] = {}
        if op == "TYPE" and value:
            deltas["field_value"] = value
        elif op == "SELECT" and value:
            deltas["choice_value"] = value
        elif op == "CLICK" and _is_choice(target):
            deltas["choice_value"] = describe(target, ref)
        opened = [e for r, e in after.items() if r not in before and _is_overlay(e)]
        closed = [e for r, e in before.items() if r not in after and _is_overlay(e)]
        if opened:
            deltas["overlay_state"] = f"open: {describe(opened[0], opened[0].ref)}"
        elif closed:
            deltas["overlay_state"] = "closed"
        if before and after:
            shared = len(set(before) & set(after))
            if shared < PAGE_CHANGE * max(len(before), len(after)):
                deltas["page_state"] = "; ".join(describe(e, e.ref) for e in list(after.values())[:3])
        n_before = sum(_is_result(e) for e in before.values())
        n_after = sum(_is_result(e) for e in after.values())
        if n_after != n_before and after:
            deltas["result_state"] = f"{n_after} results"
        if op == "CLICK" and target is not None and _WORKFLOW.search(describe(target, ref)):
            deltas["workflow_state"] = describe(target, ref)
        delta = tuple(StateDelta(k, v) for k, v in deltas.items() if k in KEYS and v)
        valid_human_step = op != "other"
        return Extraction(
            entity=entity,
            act=act,
            delta=delta,
            outcome=Outcome.STATE_UPDATE if (valid_human_step and not delta) else None,
            evidence={"rule": "snapshot_diff", "op": op, "ref": ref, "target_found": target is not None},
        )


def mind2web_inputs(
    raw: RawEvent, known_state: Mapping[str, str], rule: Extraction
) -> tuple[dict[str, str], list[bytes]]:
    """Mind2Web fields: the before / after cleaned HTML and the action slot (as JSON)."""
    act = raw.action if isinstance(raw.action, Mapping) else {"op": raw.action}
    target = act.get("target", act.get("ref", rule.entity))
    action = {"op": act.get("op"), "target": target, "value": act.get("value")}
    return {
        "before_html": prompt_json(raw.o_pre),
        "action": prompt_json(action),
        "after_html": prompt_json(raw.feedback),
    }, []


#: The paper's Mind2Web EVENT action slot (no ``{name}`` placeholder there).
MIND2WEB_ACTION_SLOT = '{"op": ..., "target": ..., "value": ...}'
MIND2WEB_PROMPT = PhiPrompt(
    "mind2web",
    ("before_html", "action", "after_html"),
    literal_slots=(("action", MIND2WEB_ACTION_SLOT),),
    path=Path(__file__).resolve().with_name("prompts") / "phi.txt",
)
MIND2WEB_PHI = PhiSpec(
    "mind2web",
    Mind2WebPhi,
    MIND2WEB_PROMPT,
    AnswerSpec(frozenset({"delta_s"}), allowed_keys=frozenset(KEYS), entity_from_model=False),
    mind2web_inputs,
)
