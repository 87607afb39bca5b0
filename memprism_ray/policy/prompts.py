"""Task-policy prompts (paper appendix E.3 "Task-policy prompts", versioned): what every
benchmark's prompt shares. The prompts are stored verbatim in ``templates/<PROMPT_VERSION>/``;
a change to a template or a contract's formatting must bump :data:`PROMPT_VERSION`. Fields are
filled in one pass and image slots found on the raw template, so no input text is interpreted."""

from __future__ import annotations

import functools
import re
from importlib import resources
from typing import Any

from memprism_ray.policy.base import PolicyInput

#: v2 (issue 35): EB-ALFRED's in-context examples by skill name, one action per step, and the
#: instruction without its final period; the templates themselves are v1's.
#: v3 (issue 41 item 4): EB-ALFRED's action ids number EmbodiedBench's full list (the listed skills
#: keep them, ``max_id`` is its last), history steps count from 0, and the examples' steps read as
#: the history does (``Step 0, action id 57, find a AlarmClock``); the templates are v1's.
PROMPT_VERSION: str = "memprism-prompts-v3"

#: Image marker lines of the templates and the slot each one stands for.
IMAGE_MARKERS: dict[str, str] = {
    "<image>": "view",
    "<image: MemPrism optical memory view>": "view",
    "<image: current synchronized simulator observation>": "camera",
}

VIEW_TEXT_BEGIN = "=== MemPrism memory view (text) ==="
VIEW_TEXT_END = "=== end of MemPrism memory view ==="
NO_HISTORY = "(none)"

_PLACEHOLDER = re.compile(r"\{([a-z_]+)\}")

#: A prompt is a list of parts: ``("text", str)`` or ``("image", marker, PIL image or None)``.
Part = tuple[Any, ...]


@functools.cache
def load_template(name: str, version: str = PROMPT_VERSION) -> str:
    """The verbatim template file ``name`` of prompt ``version``."""
    root = resources.files("memprism_ray.policy") / "templates" / version
    path = root / name
    if not path.is_file():
        raise ValueError(f"no prompt template {name!r} for prompt version {version!r} (looked in {root})")
    return path.read_text(encoding="utf-8")


def placeholders(template: str) -> set[str]:
    """The ``{name}`` fields of ``template`` (literal JSON braces are not fields)."""
    return set(_PLACEHOLDER.findall(template))


def fill(template: str, values: dict[str, Any]) -> str:
    """Replace every ``{name}`` field of ``template`` in one pass (values are never rescanned);
    a field without a value is an error."""
    missing = sorted(placeholders(template) - values.keys())
    if missing:
        raise ValueError(f"prompt template fields without a value: {', '.join(missing)}")
    return _PLACEHOLDER.sub(lambda m: str(values[m.group(1)]), template)


def replace_once(text: str, old: str, new: str) -> str:
    """``text`` with its one occurrence of ``old`` replaced (a template edit that must hit exactly once)."""
    if text.count(old) != 1:
        raise ValueError(f"prompt template {PROMPT_VERSION} does not contain {old!r} exactly once")
    return text.replace(old, new)


def split_and_fill(template: str, values: dict[str, Any], inp: PolicyInput, attach: bool) -> list[Part]:
    """Split ``template`` at its image lines, fill the text between, and resolve each slot
    (with ``attach``: appended at the end, EB-ALFRED's order)."""
    parts: list[Part] = []
    slots: list[str] = []
    chunk: list[str] = []

    def flush() -> None:
        if chunk:
            parts.append(("text", fill("".join(chunk), values)))
            chunk.clear()

    for line in template.splitlines(keepends=True):
        marker = line.rstrip("\n")
        if marker in IMAGE_MARKERS:
            if attach:
                slots.append(marker)
                continue
            flush()
            parts.extend(_resolve_slot(marker, inp))
        else:
            chunk.append(line)
    flush()
    if attach:
        attachments: list[Part] = []
        for marker in slots:
            attachments.extend(_resolve_slot(marker, inp, trailing_newline=False))
        if attachments and parts and parts[-1][0] == "text" and attachments[0][0] == "text":
            attachments[0] = ("text", "\n" + attachments[0][1])
        parts.extend(attachments)
    return parts


def _resolve_slot(marker: str, inp: PolicyInput, trailing_newline: bool = True) -> list[Part]:
    nl = "\n" if trailing_newline else ""
    if IMAGE_MARKERS[marker] == "camera":
        return [("image", marker, inp.camera_image)] if inp.camera_image is not None else []
    if inp.view_image is not None or inp.view_unpainted:
        # An unpainted page keeps its marker, so a text-only reader's prompt is unchanged.
        return [("image", marker, inp.view_image)]
    if inp.view_text is not None:
        return [("text", f"{VIEW_TEXT_BEGIN}\n{inp.view_text}\n{VIEW_TEXT_END}{nl}")]
    return []
