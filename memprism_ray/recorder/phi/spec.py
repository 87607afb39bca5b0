"""One benchmark's Phi (paper "Recorder"; appendix D.2 "Benchmark-specific Phi adapters",
appendix E.1 Phi prompts): its rule extractor, Phi prompt, answer schema and prompt inputs,
handed by the benchmark to :func:`~memprism_ray.recorder.phi.factory.build_phi`.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from memprism_ray.recorder.events import RawEvent
from memprism_ray.recorder.phi.base import Extraction, Phi
from memprism_ray.recorder.phi.config import PhiConfig
from memprism_ray.recorder.phi.llm_client import CompleteMany
from memprism_ray.recorder.phi.prompt import PhiPrompt

#: ``(raw event, known state, rule extraction) -> (prompt field values, PNG images)``.
PromptInputs = Callable[[RawEvent, Mapping[str, str], Extraction], tuple[dict[str, str], list[bytes]]]

#: Raw-event meta kept out of the prompt: the Router's view choice is bookkeeping of the
#: decision, not of the environment transition, so Phi's answer stays a function of the
#: transition (identical transitions of a GRPO group send identical prompts).
PROMPT_META_EXCLUDE: frozenset[str] = frozenset({"view"})


def prompt_json(value: Any) -> str:
    """A prompt value as the Phi prompts' JSON slots take it (non-ASCII kept)."""
    return json.dumps(value, ensure_ascii=False)


def existing_keys(known_state: Mapping[str, str]) -> str:
    """The tracked state keys as a JSON list (the prompts' "existing keys" input)."""
    return prompt_json(sorted(known_state))


@dataclass(frozen=True)
class AnswerSpec:
    """What one benchmark's Phi answer may contain."""

    fields: frozenset[str]  # the exact top-level fields of the answer
    allowed_keys: frozenset[str] | None = None  # the only ``delta_s`` keys allowed (None: open)
    entity_from_model: bool = True  # whether the answer's entity is the event's (else the rule's)
    lowercase_entity: bool = False  # EB-ALFRED asks for a lowercase entity: normalised, not rejected


@dataclass(frozen=True)
class PhiSpec:
    """One benchmark's Phi: ``rule()`` builds its rule extractor; ``prompt``, ``answer`` and ``inputs``
    make its LLM Phi, which ``llm`` replaces when given (EB-ALFRED's adds grounding)."""

    benchmark: str  # names the extractor: ``rule:<benchmark>`` in run records, ``<benchmark>-llm``
    rule: Callable[[], Phi]
    prompt: PhiPrompt
    answer: AnswerSpec
    inputs: PromptInputs
    llm: Callable[[PhiSpec, CompleteMany, PhiConfig], Phi] | None = None
