"""D1 on the driver (memprism_ray/trainer/d1.py): what it says of the reference data it collects."""

from __future__ import annotations

import json

import pyarrow as pa

from memprism_ray.trainer.d1 import say_phi_fallbacks


def test_reference_events_the_rules_wrote_for_a_failing_llm_phi_are_said() -> None:
    """An LLM Phi re-recording the expert streams (phi.kind llm) falls back to the rules on a
    failed request, with the reason in the event's evidence: D1 labelled such streams silently."""
    evidence = [{}, {"phi": "llm"}, {"phi": "rules", "phi_fallback": "request failed: LLMUnavailable: down\nmore"},
                {"phi": "rules", "phi_fallback": "invalid answer: x"}]  # fmt: skip
    table = pa.table({"evidence_json": [json.dumps(e) for e in evidence]})
    said: list[str] = []
    say_phi_fallbacks(table, said.append)
    assert said == [
        "D1: 2 of 4 reference event(s) by the rules after an LLM failure (first: request failed: LLMUnavailable: down)"
    ]
    said.clear()
    say_phi_fallbacks(table.slice(0, 2), said.append)
    assert said == []
