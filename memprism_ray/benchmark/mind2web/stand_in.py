"""The scripted Mind2Web task policy: a CPU stand-in for the frozen VLM under teacher-forced
replay (docs/mind2web.md; paper eq. task-policy ``u_t ~ pi_task(. | X_t, g, H_short, V_t)``).

Every snapshot element is a candidate, scored by the words it shares with the task; the memory
view lowers what it shows as done and picks the next value to type, so without one it retypes the
first value. It samples from a seeded softmax (:meth:`Mind2WebScriptedPolicy.input_distribution`)."""

from __future__ import annotations

import re
import time
from collections.abc import Sequence

from memprism_ray.benchmark.mind2web.contract import MIND2WEB, encode_mind2web_action
from memprism_ray.benchmark.mind2web.snapshot_format import Element, describe, parse_snapshot
from memprism_ray.policy.base import PolicyInput, PolicyOutput
from memprism_ray.policy.stand_in import TemperedStandIn, seeded_rng, tempered_distribution, view_texts

_WORD = re.compile(r"[a-z0-9]+")
_PHRASE = re.compile(r"\b([A-Z][a-zA-Z0-9]*(?:\s+[A-Z][a-zA-Z0-9]*)*)")
_SUBMIT = re.compile(r"\b(search|find|submit|go|book|show|add|continue|next)\b", re.IGNORECASE)
_STOP = {"a", "an", "the", "to", "for", "of", "in", "on", "and", "from", "with", "at", "by"}


def _words(text: str) -> set[str]:
    return {w for w in _WORD.findall(text.casefold()) if w not in _STOP}


def goal_values(goal: str) -> list[str]:
    """Capitalised phrases of the task sentence after its first word: the values a form may need."""
    _, _, rest = goal.strip().partition(" ")
    return [m.group(1) for m in _PHRASE.finditer(rest)]


def _select_value(e: Element, goal: str) -> str:
    """The option text sharing most words with the goal (options are the element's text)."""
    goal_words = _words(goal)
    tokens = e.text.split()
    best, best_score = tokens[0] if tokens else "", -1
    # Options may be several words ("4 guests", "Blue Harbor"): try runs of 1-3 tokens.
    for n in (3, 2, 1):
        for i in range(len(tokens) - n + 1):
            cand = " ".join(tokens[i : i + n])
            words = _words(cand)
            if not words:
                continue
            score = len(words & goal_words) / len(words) + 0.1 * len(words & goal_words)
            if score > best_score:
                best, best_score = cand, score
    return best


def score_actions(goal: str, observation: str, memory: Sequence[str]) -> dict[str, float]:
    """Scores of candidate actions (canonical JSON) for one prompt; pure function."""
    elements = parse_snapshot(observation)
    memory_text = "\n".join(memory)
    mem = memory_text.casefold()
    goal_words = _words(goal)
    remaining = [v for v in goal_values(goal) if v.casefold() not in mem]
    typed_any = len(remaining) < len(goal_values(goal))
    scores: dict[str, float] = {}
    for idx, (ref, e) in enumerate(elements.items()):
        name = describe(e, ref)
        acted = f'"{ref}"' in memory_text or f"{name}".casefold() in mem
        overlap = len(_words(f"{e.text} {' '.join(e.attrs.values())}") & goal_words)
        base = overlap - (2.0 if acted else 0.0) - 0.15 * idx  # forms are filled top to bottom
        if e.tag in ("input", "textarea"):
            if e.attrs.get("type", "").lower() in ("checkbox", "radio", "submit", "button"):
                scores[encode_mind2web_action("CLICK", ref, None)] = base
                continue
            filled = bool(e.attrs.get("input_value"))
            value = remaining[0] if remaining else (goal_values(goal) or [goal])[0]
            bonus = 2.5 if remaining else -1.0
            scores[encode_mind2web_action("TYPE", ref, value)] = base + bonus - (1.5 if filled else 0.0)
        elif e.tag == "select":
            scores[encode_mind2web_action("SELECT", ref, _select_value(e, goal))] = base + 1.0
        else:
            submit = bool(_SUBMIT.search(e.text or name))
            bonus = (1.0 if typed_any else -0.5) if submit else 0.0
            scores[encode_mind2web_action("CLICK", ref, None)] = base + bonus
    return scores


class Mind2WebScriptedPolicy(TemperedStandIn):
    """See the module docstring."""

    name = "scripted-mind2web"
    contract = MIND2WEB

    @staticmethod
    def memory_texts(inp: PolicyInput) -> list[str]:
        """The view (text form) and the short history, oldest first."""
        return view_texts(inp) + [rec.action for rec in inp.history]

    def input_distribution(self, inp: PolicyInput) -> dict[str, float]:
        """The probability of each candidate action for one prompt (exact, for the teacher)."""
        scores = score_actions(inp.goal, inp.observation, self.memory_texts(inp))
        return tempered_distribution(scores, self.temperature) if scores else {}

    def act_one(self, inp: PolicyInput) -> PolicyOutput:
        start = time.perf_counter()
        dist = self.input_distribution(inp)
        if not dist:
            text = "<reasoning>the snapshot shows no element</reasoning>\n<action>{}</action>"
            return self.contract.to_output(inp, text, latency_s=time.perf_counter() - start)
        rng = seeded_rng(self.seed, str(inp.meta.get("episode_id", "")), inp.step)
        actions = list(dist)
        if self.temperature == 0:
            action = actions[0]
        else:
            action = rng.choices(actions, weights=[dist[a] for a in actions])[0]
        reason = f"best-matching element for the task (p={dist[action]:.2f})"
        text = f"<reasoning>{reason}</reasoning>\n<action>{action}</action>"
        return self.contract.to_output(inp, text, latency_s=time.perf_counter() - start)
