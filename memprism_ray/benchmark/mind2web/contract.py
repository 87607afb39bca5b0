"""Mind2Web's task contract (paper appendix E.3 "Mind2Web Task Policy", E.4 action definitions,
E.5 parsing; docs/mind2web.md): the verbatim ``mind2web.txt`` prompt, and the parser: exactly one
tagged JSON action (``json.loads``, never evaluated); ``op`` in CLICK/TYPE/SELECT in any case (the
paper scores "the normalized operation"), ``ref`` in the snapshot, a string ``value`` for TYPE and
SELECT (possibly empty: a recorded human TYPE can be); a CLICK's value is dropped."""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any

from memprism_ray.policy.base import HistoryRecord, PolicyInput
from memprism_ray.policy.contract import TaskContract
from memprism_ray.policy.parsing import MAX_ACTION_CHARS, ParseResult, extract_action_tag, invalid, short
from memprism_ray.policy.prompts import NO_HISTORY, Part, load_template, split_and_fill

#: Longest Mind2Web JSON payload considered.
MAX_JSON_CHARS = 20_000

MIND2WEB_OPS: tuple[str, ...] = ("CLICK", "TYPE", "SELECT")

_REF = re.compile(r"\[ref=([^\]\s]+)\]")


def snapshot_refs(observation: str) -> tuple[str, ...]:
    """The element refs (``[ref=e12]``) of a Mind2Web snapshot, in order of appearance."""
    return tuple(dict.fromkeys(_REF.findall(observation)))


def format_mind2web_history(history: tuple[HistoryRecord, ...]) -> str:
    if not history:
        return NO_HISTORY
    lines = []
    for r in history:
        line = f"[Step {r.step + 1}] Observation: {r.observation} | Expert action: {r.action}"
        if r.feedback:
            line += f" | Result: {r.feedback}"
        lines.append(line)
    return "\n".join(lines)


def _no_constants(name: str) -> Any:
    raise ValueError(f"JSON constant {name} is not allowed")


def _pairs_no_duplicates(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for k, v in pairs:
        if k in out:
            raise ValueError(f"duplicate JSON key {k!r}")
        out[k] = v
    return out


def encode_mind2web_action(op: str, ref: str, value: str | None) -> str:
    """The canonical one-line JSON form of a Mind2Web action."""
    return json.dumps({"op": op, "ref": ref, "value": value}, ensure_ascii=False, separators=(",", ":"))


def decode_mind2web_action(action: str) -> dict[str, Any]:
    """The ``{"op", "ref", "value"}`` mapping of a canonical action string."""
    data = json.loads(action)
    if not isinstance(data, dict) or set(data) != {"op", "ref", "value"}:
        raise ValueError(f"not a canonical Mind2Web action: {short(action)}")
    return data


@dataclass(frozen=True)
class Mind2WebParse:
    """A Mind2Web parse: the canonical action (``result``) and the op, ref and value as written,
    which Mind2Web's metric.py reads (its regexes read an output whatever its shape) while the
    paper's rule reads the normalised action (benchmark/mind2web/env.py)."""

    result: ParseResult
    written_op: str | None = None
    written_value: str | None = None
    written_ref: str | None = None


#: A ``"key": "string"`` field of a JSON-like text (what an output that does not parse still wrote).
_WRITTEN = {key: re.compile(rf'"{key}"\s*:\s*"((?:[^"\\\n]|\\.)*)"') for key in ("op", "ref", "value")}


def written_fields(text: str) -> dict[str, str | None]:
    """``{"written_op", "written_ref", "written_value"}`` read from ``text`` field by field, first
    occurrence, as metric.py's ``postprocess_action`` reads ``Action:``/``Value:`` lines from an
    output that need not parse (issue 41 item 3); a field not written is ``None``."""
    out: dict[str, str | None] = {}
    for key, pattern in _WRITTEN.items():
        m = pattern.search(text)
        value = None
        if m is not None:
            try:
                value = json.loads(f'"{m.group(1)}"')
            except ValueError:  # a bad escape: the characters as written
                value = m.group(1)
        out[f"written_{key}"] = value
    return out


def parse_mind2web_written(text: str, refs: tuple[str, ...] | list[str] | set[str]) -> Mind2WebParse:
    """:func:`parse_mind2web` plus the op, ref and value as written (see :class:`Mind2WebParse`):
    the JSON object's string fields, or, when there is none to read, :func:`written_fields` of
    the tagged text (of the whole output without one tag)."""
    content, err = extract_action_tag(text)
    if err is not None:
        return Mind2WebParse(invalid(err), **written_fields(text if isinstance(text, str) else ""))
    assert content is not None
    first, last = content.find("{"), content.rfind("}")
    if first < 0 or last < first:
        return Mind2WebParse(invalid("no JSON object inside <action>"), **written_fields(content))
    payload = content[first : last + 1]
    if len(payload) > MAX_JSON_CHARS:
        return Mind2WebParse(
            invalid(f"JSON action too long ({len(payload)} chars > {MAX_JSON_CHARS})"), **written_fields(content)
        )
    try:
        data = json.loads(payload, parse_constant=_no_constants, object_pairs_hook=_pairs_no_duplicates)
    except (ValueError, RecursionError) as exc:
        return Mind2WebParse(invalid(f"invalid JSON action: {str(exc)[:120]}"), **written_fields(content))
    if not isinstance(data, dict):
        return Mind2WebParse(
            invalid(f"JSON action must be an object, got {type(data).__name__}"), **written_fields(content)
        )
    op, value, written_ref = data.get("op"), data.get("value"), data.get("ref")
    written = {
        "written_op": op if isinstance(op, str) else None,
        "written_value": value if isinstance(value, str) else None,
        "written_ref": written_ref.strip() if isinstance(written_ref, str) else None,
    }
    if not isinstance(op, str):
        return Mind2WebParse(invalid("JSON action needs a string 'op'"), **written)
    # Appendix E.5: "scores the normalized operation": "click" is CLICK.
    op_norm = op.strip().upper()
    if op_norm not in MIND2WEB_OPS:
        return Mind2WebParse(invalid(f"unknown op {short(op)}; allowed: {', '.join(MIND2WEB_OPS)}"), **written)
    ref = data.get("ref")
    if not isinstance(ref, str) or not ref.strip():
        return Mind2WebParse(invalid("JSON action needs a non-empty string 'ref'"), **written)
    ref = ref.strip()
    if ref not in refs:
        return Mind2WebParse(invalid(f"ref {short(ref)} is not in the current snapshot"), **written)
    if op_norm == "CLICK":
        value = None  # the contract's CLICK has no value (appendix E.3: "value":null)
    else:
        # Appendix E.4: "TYPE and SELECT also require value": a string, which may be empty
        # (Mind2Web records TYPE steps with an empty value; their human action must be valid).
        if not isinstance(value, str):
            return Mind2WebParse(invalid(f"{op_norm} needs a string 'value'"), **written)
        if len(value) > MAX_ACTION_CHARS:
            return Mind2WebParse(invalid(f"value too long ({len(value)} chars > {MAX_ACTION_CHARS})"), **written)
    return Mind2WebParse(ParseResult(action=encode_mind2web_action(op_norm, ref, value)), **written)


def parse_mind2web(text: str, refs: tuple[str, ...] | list[str] | set[str]) -> ParseResult:
    """Mind2Web: exactly one tagged JSON action with a known op (any case) and a ref of the
    snapshot; TYPE and SELECT need a string value. Extra fields and a CLICK's value are dropped."""
    return parse_mind2web_written(text, refs).result


def mind2web_refs(inp: PolicyInput) -> tuple[str, ...]:
    """The refs a Mind2Web action may use: ``admissible`` if given, else the snapshot's markers."""
    return inp.admissible if inp.admissible else snapshot_refs(inp.observation)


class Mind2WebContract(TaskContract):
    name = "mind2web"
    stand_in = "memprism_ray.benchmark.mind2web.stand_in:Mind2WebScriptedPolicy"

    def template_parts(self, inp: PolicyInput, layout: str) -> list[Part]:
        """The prompt already opens with its instructions: ``layout`` changes nothing."""
        values = {
            "step_idx": inp.step + 1,
            "goal": inp.goal,
            "html_field": inp.meta.get("html_field", "cleaned_html"),
            "observation": inp.observation,
            "recent_observation_and_expert_action_records": format_mind2web_history(inp.history),
        }
        return split_and_fill(load_template("mind2web.txt"), values, inp, attach=False)

    def parse(self, inp: PolicyInput, text: str) -> ParseResult:
        return parse_mind2web(text, set(mind2web_refs(inp)))


MIND2WEB = Mind2WebContract()
