"""Action parsing and validation (paper appendix E.4 action contracts, E.5 "Parsing and
validation"): what every benchmark's parser shares. Every output needs exactly one ``<action>``
tag pair; tags inside a closed ``<think>`` block are ignored (models restate the format while
reasoning). The scanner is linear, and parsers never raise on model output."""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass

from memprism_ray.policy.base import PolicyOutput

#: Longest action text considered (ALFWorld / EB-ALFRED commands are short).
MAX_ACTION_CHARS = 1_000

_TAG = re.compile(r"<\s*(/?)\s*(think|action)\s*>", re.IGNORECASE)


@dataclass(frozen=True)
class ParseResult:
    """A parsed action (``action``) or the reason there is none (``error``)."""

    action: str | None
    error: str | None = None

    @property
    def valid(self) -> bool:
        return self.action is not None


def invalid(reason: str) -> ParseResult:
    return ParseResult(action=None, error=reason)


def extract_action_tag(text: str) -> tuple[str | None, str | None]:
    """``(content, None)`` of the single ``<action>...</action>`` pair of ``text``, or ``(None, reason)``."""
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


def short(text: str, limit: int = 80) -> str:
    """``text`` as an error message quotes it (clipped)."""
    return repr(text if len(text) <= limit else text[:limit] + "...")


def _unique(candidates: list[str], what: str, content: str) -> ParseResult | None:
    uniq = list(dict.fromkeys(candidates))
    if len(uniq) == 1:
        return ParseResult(action=uniq[0])
    if len(uniq) > 1:
        return invalid(f"action {short(content)} matches several {what}: {uniq[:3]}")
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


def match_action(
    text: str, options: tuple[str, ...] | list[str], what: str, *folds: Callable[[str], str]
) -> ParseResult | str:
    """The tagged action matched to ``options``: exactly, then under each fold in turn (a
    fold matching several options is invalid); the unmatched action text otherwise."""
    action, err = _action_text(text)
    if err is not None:
        return invalid(err)
    assert action is not None
    if action in options:
        return ParseResult(action=action)
    for fold in folds:
        key = fold(action)
        hit = _unique([o for o in options if fold(o) == key], what, action)
        if hit is not None:
            return hit
    return action


def normalized(text: str) -> str:
    """Whitespace collapsed and case folded: the looser match of the closed action sets."""
    return normalize_ws(text).casefold()


def failed_output(error: str, *, visual_tokens: int | None = None, latency_s: float = 0.0) -> PolicyOutput:
    """An invalid output for a request the backend rejected (e.g. prompt too long)."""
    return PolicyOutput("", None, False, error, visual_tokens=visual_tokens, latency_s=latency_s)
