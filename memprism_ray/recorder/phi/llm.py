"""The LLM Phi: the paper's Phi prompt answered by a model, with rules keeping the hard evidence
(paper "Recorder"; appendix D.2 "Benchmark-specific Phi adapters"; appendix E.1 Phi prompts;
appendix E "Parsing and validation").

The benchmark's rule extractor runs first; the prompts of a batch go to a
:data:`~memprism_ray.recorder.phi.llm_client.CompleteMany` backend at once. An answer is the
substring from the first ``{`` to the last ``}`` read by ``json.loads`` (data, never evaluated),
validated against the benchmark's :class:`~memprism_ray.recorder.phi.spec.AnswerSpec`;
``old_value`` is ignored ("Omit old_value"), a key given twice with different values rejects
the answer ("A key may occur at most once"), the rest is left to the stream's validation (D.1).
The rules keep ``act``, ``failed`` and a forced outcome ("If the simulator explicitly reports
failure, the outcome is forced to exception and the state delta is cleared"); the entity is the
model's where the spec says so. A failed request or unusable answer yields the rule extraction
with ``evidence["phi_fallback"]`` = the reason, counted: nothing is dropped silently.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

from memprism_ray.recorder.events import RawEvent, StateDelta
from memprism_ray.recorder.phi.base import Extraction, Phi
from memprism_ray.recorder.phi.llm_client import CompleteMany
from memprism_ray.recorder.phi.prompt import PhiPrompt
from memprism_ray.recorder.phi.spec import AnswerSpec, PhiSpec, PromptInputs


class PhiAnswerError(ValueError):
    """A Phi answer that cannot be used (no JSON object, malformed JSON or a schema violation)."""


@dataclass(frozen=True)
class ParsedAnswer:
    """A validated Phi answer."""

    entity: str | None
    act_type: str | None
    delta: tuple[StateDelta, ...]
    ignored_old_values: int = 0


def extract_json_object(text: str | Mapping[str, Any]) -> dict[str, Any]:
    """The JSON object of an answer: a mapping as is, else ``json.loads`` of the substring from
    the first ``{`` to the last ``}`` (appendix E "Parsing and validation")."""
    if isinstance(text, Mapping):
        return dict(text)
    if not isinstance(text, str):
        raise PhiAnswerError(f"answer is {type(text).__name__}, not text")
    start, end = text.find("{"), text.rfind("}")
    if start < 0 or end < start:
        raise PhiAnswerError(f"no JSON object in the answer: {_clip(text)!r}")
    try:
        data = json.loads(text[start : end + 1])
    except json.JSONDecodeError as exc:
        raise PhiAnswerError(
            f"malformed JSON ({exc.msg} at char {exc.pos}): {_clip(text[start : end + 1])!r}"
        ) from None
    if not isinstance(data, dict):  # pragma: no cover - a {...} substring always decodes to a dict
        raise PhiAnswerError(f"answer JSON is a {type(data).__name__}, not an object")
    return data


def parse_answer(text: str | Mapping[str, Any], spec: AnswerSpec) -> ParsedAnswer:
    """Parse and validate one answer against ``spec``; :class:`PhiAnswerError` names what is wrong."""
    data = extract_json_object(text)
    missing = sorted(spec.fields - set(data))
    extra = sorted(set(data) - spec.fields)
    if missing or extra:
        raise PhiAnswerError(
            f"answer fields: missing {missing or 'none'}, not allowed {extra or 'none'}; expected {sorted(spec.fields)}"
        )
    entity = act_type = None
    if "entity" in spec.fields:
        entity = data["entity"]
        if not isinstance(entity, str) or not entity.strip():
            raise PhiAnswerError(f"entity must be a non-empty string, got {_clip(repr(entity))}")
        entity = " ".join(entity.split())
        if spec.lowercase_entity:
            entity = entity.lower()
    if "act_type" in spec.fields:
        act_type = data["act_type"]
        if not isinstance(act_type, str):
            raise PhiAnswerError(f"act_type must be a string, got {_clip(repr(act_type))}")
    items = data["delta_s"]
    if not isinstance(items, list):
        raise PhiAnswerError(f"delta_s must be a list, got {type(items).__name__}")
    deltas: list[StateDelta] = []
    values: dict[str, str] = {}
    old = 0
    for i, item in enumerate(items):
        if not isinstance(item, dict):
            raise PhiAnswerError(f"delta_s[{i}] must be an object with key and new_value, got {_clip(repr(item))}")
        unknown = sorted(set(item) - {"key", "new_value", "old_value"})
        if unknown or "key" not in item or "new_value" not in item:
            raise PhiAnswerError(f"delta_s[{i}] must hold exactly key and new_value, got fields {sorted(item)}")
        old += "old_value" in item
        key, value = item["key"], item["new_value"]
        if not isinstance(key, str):
            raise PhiAnswerError(f"delta_s[{i}].key must be a string, got {_clip(repr(key))}")
        if isinstance(value, bool) or not isinstance(value, (str, int, float)):
            raise PhiAnswerError(f"delta_s[{i}].new_value must be a string, got {_clip(repr(value))}")
        key, value = key.strip(), str(value).strip()
        if spec.allowed_keys is not None and key not in spec.allowed_keys:
            raise PhiAnswerError(
                f"delta_s[{i}].key {key!r} is not allowed; allowed: {', '.join(sorted(spec.allowed_keys))}"
            )
        if key and key in values and values[key] != value:
            raise PhiAnswerError(f"delta_s key {key!r} occurs twice with different values ({values[key]!r}, {value!r})")
        values[key] = value
        deltas.append(StateDelta(key, value))
    return ParsedAnswer(entity, act_type, tuple(deltas), old)


class LLMPhi:
    """Phi by the paper's prompt on a model, rules (``fallback``) keeping the hard evidence
    (module docstring); ``inputs``, ``prompt`` replace the spec's."""

    def __init__(
        self,
        spec: PhiSpec,
        complete: CompleteMany,
        fallback: Phi,
        *,
        inputs: PromptInputs | None = None,
        prompt: PhiPrompt | None = None,
    ) -> None:
        self.benchmark = spec.benchmark
        self.name = f"{spec.benchmark}-llm"
        self.complete = complete
        self.fallback = fallback
        self.spec: AnswerSpec = spec.answer
        self.prompt = prompt or spec.prompt
        self.template = self.prompt.load()
        self.inputs = inputs or spec.inputs
        counted = ("events", "llm", "fallback", "fallback_request", "fallback_invalid", "rule_error")
        self.counters = dict.fromkeys((*counted, "ignored_old_values"), 0)

    def build_prompt(self, raw: RawEvent, known_state: Mapping[str, str], rule: Extraction) -> tuple[str, list[bytes]]:
        values, images = self.inputs(raw, known_state, rule)
        return self.prompt.fill(values, self.template), images

    def extract(self, raw: RawEvent, known_state: Mapping[str, str]) -> Extraction:
        out = self.extract_many([raw], [known_state])[0]
        if isinstance(out, BaseException):
            raise out
        return out

    def extract_many(
        self, raws: Sequence[RawEvent], states: Sequence[Mapping[str, str]]
    ) -> list[Extraction | BaseException]:
        """One result per event, in order; all prompts of the batch go to ``complete`` at once."""
        if len(raws) != len(states):
            raise ValueError(f"extract_many got {len(raws)} raw events and {len(states)} states")
        self.counters["events"] += len(raws)
        results: list[Extraction | BaseException] = []
        pending: list[int] = []
        requests: list[tuple[str, list[bytes]]] = []
        for i, (raw, known) in enumerate(zip(raws, states, strict=True)):
            try:
                rule = self.fallback.extract(raw, known)
            except Exception as exc:  # no hard evidence: the event fails as the rule Phi would
                self.counters["rule_error"] += 1
                results.append(exc)
                continue
            results.append(rule)
            try:
                requests.append(self.build_prompt(raw, known, rule))
            except Exception as exc:
                results[i] = self._fall_back(rule, "fallback_request", f"prompt not built: {type(exc).__name__}: {exc}")
                continue
            pending.append(i)
        if not pending:
            return results
        try:
            answers = list(self.complete(requests))
        except Exception as exc:  # a backend that raises instead of answering per item
            answers = [exc] * len(pending)
        if len(answers) != len(pending):
            answers = [RuntimeError(f"backend answered {len(answers)} for {len(pending)} request(s)")] * len(pending)
        for i, answer in zip(pending, answers, strict=True):
            rule = results[i]
            assert isinstance(rule, Extraction)
            if isinstance(answer, BaseException):
                reason = f"request failed: {type(answer).__name__}: {_clip(str(answer), 300)}"
                results[i] = self._fall_back(rule, "fallback_request", reason)
                continue
            try:
                parsed = parse_answer(answer, self.spec)
            except PhiAnswerError as exc:
                results[i] = self._fall_back(rule, "fallback_invalid", f"invalid answer: {exc}")
                continue
            results[i] = self._merge(rule, parsed)
        return results

    def _merge(self, rule: Extraction, parsed: ParsedAnswer) -> Extraction:
        self.counters["llm"] += 1
        self.counters["ignored_old_values"] += parsed.ignored_old_values
        evidence = {**rule.evidence, "phi": "llm"}
        if parsed.act_type is not None:
            evidence["phi_act_type"] = parsed.act_type
        entity = parsed.entity if self.spec.entity_from_model and parsed.entity is not None else rule.entity
        return Extraction(
            entity=entity,
            act=rule.act,
            delta=() if rule.failed else parsed.delta,
            failed=rule.failed,
            outcome=rule.outcome,
            evidence=evidence,
        )

    def _fall_back(self, rule: Extraction, counter: str, reason: str) -> Extraction:
        self.counters["fallback"] += 1
        self.counters[counter] += 1
        return replace(rule, evidence={**rule.evidence, "phi": "rules", "phi_fallback": reason})

    def stats(self) -> dict[str, int]:
        """Counters of this extractor and of its backend (requests, retries, tokens) when it keeps any."""
        backend = getattr(self.complete, "counters", None)
        out = dict(self.counters)
        if isinstance(backend, Mapping):
            out.update({f"backend_{k}": int(v) for k, v in backend.items()})
        return out


def _clip(text: str, n: int = 160) -> str:
    return text if len(text) <= n else text[:n] + "..."


def fallbacks_said(count: int, first: str, what: str = "Phi extraction(s)") -> str:
    """How a run says an LLM Phi's fallbacks (``evidence["phi_fallback"]``): ``count`` of ``what``
    by the rules, and the first reason, one line of it. The evaluation, GRPO and D1 say it alike."""
    reason = (str(first).splitlines() or ["?"])[0][:200]
    return f"{count} {what} by the rules after an LLM failure (first: {reason})"
