"""Action parsing and validation (paper appendix E.4 action contracts, E.5 "Parsing and
validation").

* ALFWorld: the text inside ``<action></action>``, matched to the current admissible set:
  exact, then case- and whitespace-normalised; anything else is invalid.
* EB-ALFRED: matched in order by exact string, case-insensitive string and normalised
  whitespace; any ``put down ...`` form becomes ``put down the object in hand`` when that
  skill is available.
* Mind2Web: exactly one tagged JSON action; ``op`` in CLICK/TYPE/SELECT (any case: the
  paper scores "the normalized operation"), ``ref`` present in the current snapshot, a string
  ``value`` required for TYPE and SELECT (the empty string included: a recorded human TYPE can
  have an empty value, and the recorded action must be expressible); a CLICK's value is
  dropped from the canonical action. JSON is parsed as data (``json.loads``), never evaluated.
  :func:`parse_mind2web_written` also returns the op and value as written, which Mind2Web's
  own metric reads (docs/mind2web.md "Edge cases").

Every output needs exactly one ``<action>`` tag pair. Tags inside a closed ``<think>``
block are ignored, because models often restate the output format while reasoning. The
tag scanner is linear in the output length, so huge or adversarial outputs cannot stall it.
Parsers never raise on model output; they return a :class:`ParseResult` with a reason.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from memprism_ray.policy.base import PolicyInput, PolicyOutput
from memprism_ray.policy.prompts import snapshot_refs

#: Longest action text considered (ALFWorld / EB-ALFRED commands are short).
MAX_ACTION_CHARS = 1_000
#: Longest Mind2Web JSON payload considered.
MAX_JSON_CHARS = 20_000

MIND2WEB_OPS: tuple[str, ...] = ("CLICK", "TYPE", "SELECT")
EBALFRED_PUT_DOWN = "put down the object in hand"

_TAG = re.compile(r"<\s*(/?)\s*(think|action)\s*>", re.IGNORECASE)


@dataclass(frozen=True)
class ParseResult:
    """A parsed action (``action``) or the reason there is none (``error``)."""

    action: str | None
    error: str | None = None

    @property
    def valid(self) -> bool:
        return self.action is not None


def _invalid(reason: str) -> ParseResult:
    return ParseResult(action=None, error=reason)


def extract_action_tag(text: str) -> tuple[str | None, str | None]:
    """The content of the single ``<action>...</action>`` pair of ``text``, or an error.

    Returns ``(content, None)`` or ``(None, reason)``.
    """
    if not isinstance(text, str):
        return None, f"model output is {type(text).__name__}, not text"
    tokens = [(m.group(2).lower(), m.group(1) == "/", m.start(), m.end()) for m in _TAG.finditer(text)]
    # Closed <think> blocks; an unclosed one is not a block (its action tags still count).
    blocks: list[tuple[int, int]] = []
    open_at: int | None = None
    for kind, closing, start, end in tokens:
        if kind != "think":
            continue
        if not closing and open_at is None:
            open_at = start
        elif closing and open_at is not None:
            blocks.append((open_at, end))
            open_at = None
    pairs: list[tuple[int, int]] = []
    depth_start: int | None = None
    stray_close = 0
    b = 0
    for kind, closing, start, end in tokens:
        if kind != "action":
            continue
        while b < len(blocks) and blocks[b][1] <= start:
            b += 1
        if b < len(blocks) and blocks[b][0] <= start:
            continue
        if not closing:
            if depth_start is not None:
                return None, "nested <action> tags"
            depth_start = end
        elif depth_start is None:
            stray_close += 1
        else:
            pairs.append((depth_start, start))
            depth_start = None
    if depth_start is not None:
        return None, "unclosed <action> tag"
    if stray_close:
        return None, "</action> without a matching <action>"
    if not pairs:
        return None, "no <action>...</action> tag in the output"
    if len(pairs) > 1:
        return None, f"found {len(pairs)} <action> tags; expected exactly one"
    start, end = pairs[0]
    return text[start:end], None


def normalize_ws(text: str) -> str:
    """Collapse runs of (any Unicode) whitespace to one space and trim."""
    return " ".join(text.split())


def _short(text: str, limit: int = 80) -> str:
    return repr(text if len(text) <= limit else text[:limit] + "...")


def _unique(candidates: list[str], what: str, content: str) -> ParseResult | None:
    uniq = list(dict.fromkeys(candidates))
    if len(uniq) == 1:
        return ParseResult(action=uniq[0])
    if len(uniq) > 1:
        return _invalid(f"action {_short(content)} matches several {what}: {uniq[:3]}")
    return None


def _action_text(text: str) -> tuple[str | None, str | None]:
    content, err = extract_action_tag(text)
    if err is not None:
        return None, err
    assert content is not None
    stripped = content.strip()
    if not stripped:
        return None, "empty <action> tag"
    if len(stripped) > MAX_ACTION_CHARS:
        return None, f"action text too long ({len(stripped)} chars > {MAX_ACTION_CHARS})"
    return stripped, None


def _match(
    text: str, options: tuple[str, ...] | list[str], what: str, *folds: Callable[[str], str]
) -> ParseResult | str:
    """The tagged action matched to ``options``: exactly, then under each fold in turn (a
    fold matching several options is invalid); the unmatched action text otherwise."""
    action, err = _action_text(text)
    if err is not None:
        return _invalid(err)
    assert action is not None
    if action in options:
        return ParseResult(action=action)
    for fold in folds:
        key = fold(action)
        hit = _unique([o for o in options if fold(o) == key], what, action)
        if hit is not None:
            return hit
    return action


def _normalized(text: str) -> str:
    return normalize_ws(text).casefold()


def parse_alfworld(text: str, admissible: tuple[str, ...] | list[str]) -> ParseResult:
    """ALFWorld: the tagged action must be one of ``admissible`` (exact, then normalised)."""
    got = _match(text, admissible, "admissible actions", _normalized)
    if isinstance(got, ParseResult):
        return got
    return _invalid(f"action {_short(got)} is not in the admissible set ({len(admissible)} actions)")


def parse_ebalfred(text: str, skills: tuple[str, ...] | list[str]) -> ParseResult:
    """EB-ALFRED: exact, case-insensitive, normalised whitespace; ``put down ...`` canonicalised."""
    got = _match(text, skills, "skills", str.casefold, _normalized)
    if isinstance(got, ParseResult):
        return got
    if _normalized(got).startswith("put down") and EBALFRED_PUT_DOWN in skills:
        return ParseResult(action=EBALFRED_PUT_DOWN)
    return _invalid(f"action {_short(got)} is not one of the {len(skills)} available skills")


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
        raise ValueError(f"not a canonical Mind2Web action: {_short(action)}")
    return data


@dataclass(frozen=True)
class Mind2WebParse:
    """A Mind2Web parse: the validated canonical action (``result``) and the op and value as
    the model wrote them (``None`` where absent or not a string). Mind2Web's metric.py reads
    the output as written (a CLICK's value included, the op case-sensitively), the paper's rule
    the normalised action, so the replay env needs both (envs/mind2web/env.py)."""

    result: ParseResult
    written_op: str | None = None
    written_value: str | None = None


def parse_mind2web_written(text: str, refs: tuple[str, ...] | list[str] | set[str]) -> Mind2WebParse:
    """:func:`parse_mind2web` plus the op and value as written (see :class:`Mind2WebParse`)."""
    content, err = extract_action_tag(text)
    if err is not None:
        return Mind2WebParse(_invalid(err))
    assert content is not None
    first, last = content.find("{"), content.rfind("}")
    if first < 0 or last < first:
        return Mind2WebParse(_invalid("no JSON object inside <action>"))
    payload = content[first : last + 1]
    if len(payload) > MAX_JSON_CHARS:
        return Mind2WebParse(_invalid(f"JSON action too long ({len(payload)} chars > {MAX_JSON_CHARS})"))
    try:
        data = json.loads(payload, parse_constant=_no_constants, object_pairs_hook=_pairs_no_duplicates)
    except (ValueError, RecursionError) as exc:
        return Mind2WebParse(_invalid(f"invalid JSON action: {str(exc)[:120]}"))
    if not isinstance(data, dict):
        return Mind2WebParse(_invalid(f"JSON action must be an object, got {type(data).__name__}"))
    op, value = data.get("op"), data.get("value")
    written = {
        "written_op": op if isinstance(op, str) else None,
        "written_value": value if isinstance(value, str) else None,
    }
    if not isinstance(op, str):
        return Mind2WebParse(_invalid("JSON action needs a string 'op'"), **written)
    # Appendix E.5: "scores the normalized operation": "click" is CLICK.
    op_norm = op.strip().upper()
    if op_norm not in MIND2WEB_OPS:
        return Mind2WebParse(_invalid(f"unknown op {_short(op)}; allowed: {', '.join(MIND2WEB_OPS)}"), **written)
    ref = data.get("ref")
    if not isinstance(ref, str) or not ref.strip():
        return Mind2WebParse(_invalid("JSON action needs a non-empty string 'ref'"), **written)
    ref = ref.strip()
    if ref not in refs:
        return Mind2WebParse(_invalid(f"ref {_short(ref)} is not in the current snapshot"), **written)
    if op_norm == "CLICK":
        value = None  # the contract's CLICK has no value (appendix E.3: "value":null)
    else:
        # Appendix E.4: "TYPE and SELECT also require value": a string, which may be empty
        # (Mind2Web records TYPE steps with an empty value; their human action must be valid).
        if not isinstance(value, str):
            return Mind2WebParse(_invalid(f"{op_norm} needs a string 'value'"), **written)
        if len(value) > MAX_ACTION_CHARS:
            return Mind2WebParse(_invalid(f"value too long ({len(value)} chars > {MAX_ACTION_CHARS})"), **written)
    return Mind2WebParse(ParseResult(action=encode_mind2web_action(op_norm, ref, value)), **written)


def parse_mind2web(text: str, refs: tuple[str, ...] | list[str] | set[str]) -> ParseResult:
    """Mind2Web: exactly one tagged JSON action with a known op (any case) and a ref of the
    snapshot; TYPE and SELECT need a string value (possibly empty).

    Extra JSON fields are ignored and dropped from the canonical action; a CLICK's value is
    always ``null``.
    """
    return parse_mind2web_written(text, refs).result


def mind2web_refs(inp: PolicyInput) -> tuple[str, ...]:
    """The refs a Mind2Web action may use: ``admissible`` if given, else the snapshot's markers."""
    return inp.admissible if inp.admissible else snapshot_refs(inp.observation)


def parse_action(inp: PolicyInput, text: str) -> ParseResult:
    """Parse ``text`` under the action contract of ``inp.benchmark``."""
    if inp.benchmark == "alfworld":
        return parse_alfworld(text, inp.admissible)
    if inp.benchmark == "ebalfred":
        return parse_ebalfred(text, inp.admissible)
    return parse_mind2web(text, set(mind2web_refs(inp)))


def to_output(
    inp: PolicyInput,
    text: str,
    *,
    prompt_tokens: int | None = None,
    completion_tokens: int | None = None,
    visual_tokens: int | None = None,
    latency_s: float = 0.0,
) -> PolicyOutput:
    """A :class:`PolicyOutput` for model ``text``: parsed, validated, never raising."""
    text = text if isinstance(text, str) else ""
    result = parse_action(inp, text)
    return PolicyOutput(
        text, result.action, result.valid, result.error, prompt_tokens, completion_tokens, visual_tokens, latency_s
    )


def failed_output(error: str, *, visual_tokens: int | None = None, latency_s: float = 0.0) -> PolicyOutput:
    """An invalid output for a request the backend rejected (e.g. prompt too long)."""
    return PolicyOutput("", None, False, error, visual_tokens=visual_tokens, latency_s=latency_s)
