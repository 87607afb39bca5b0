"""The paper's Phi prompts, verbatim (appendix E.1 "Phi event-extraction prompts"), and
their placeholder filling.

A prompt file is the text between ``\\begin{PromptText}`` and ``\\end{PromptText}`` of the paper,
unchanged. The templates are full of literal JSON braces, so they are never ``str.format``-ed:
only the exact ``{name}`` placeholders are replaced, in one pass (Mind2Web's literal action slot
``{"op": ..., "target": ..., "value": ...}`` is filled as ``action``). The view-teacher prompts of
appendix E.2 are :class:`VerbatimPrompt` too (recorder being below router).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar

PROMPT_DIR = Path(__file__).resolve().parent / "prompts"


@dataclass(frozen=True)
class VerbatimPrompt:
    """One prompt kept verbatim: its placeholders as spelled in the paper (``fields``) and literal
    slots standing for a field (``(field, text in the template)`` pairs)."""

    name: str
    fields: tuple[str, ...]
    literal_slots: tuple[tuple[str, str], ...] = ()
    path: Path | None = None  # the template file (None: ``<prompt_dir>/<name>.txt``)
    text: str | None = None  # the template itself, for a prompt kept in its benchmark's module
    what: ClassVar[str] = "prompt"
    prompt_dir: ClassVar[Path] = PROMPT_DIR

    def load(self) -> str:
        """The verbatim prompt text."""
        if self.text is not None:
            return self.text
        path = self.path or self.prompt_dir / f"{self.name}.txt"
        if not path.is_file():
            raise ValueError(f"{self.what} {self.name!r} has no template file {path}")
        return path.read_text(encoding="utf-8")

    def fill(self, values: Mapping[str, str], template: str | None = None) -> str:
        """Fill every placeholder with ``values`` (exactly the prompt's fields) in ``template``
        (``None``: :meth:`load`)."""
        missing = sorted(set(self.fields) - set(values))
        unknown = sorted(set(values) - set(self.fields))
        if missing or unknown:
            raise ValueError(
                f"{self.what} {self.name!r} inputs: missing {missing or 'none'}, unknown {unknown or 'none'}; "
                f"expected {list(self.fields)}"
            )
        for k, v in values.items():
            if not isinstance(v, str):
                raise ValueError(f"{self.what} {self.name!r} input {k!r} must be text, got {type(v).__name__}")
        text = self.load() if template is None else template
        slots = {f"{{{k}}}": k for k in self.fields}
        for k, literal in self.literal_slots:
            del slots[f"{{{k}}}"]
            slots[literal] = k
        pattern = re.compile("|".join(re.escape(s) for s in sorted(slots, key=len, reverse=True)))
        return pattern.sub(lambda m: values[slots[m.group(0)]], text)


class PhiPrompt(VerbatimPrompt):
    """One Phi prompt of appendix E.1 (by default ``prompts/<name>.txt`` beside this module)."""

    what: ClassVar[str] = "Phi prompt"
