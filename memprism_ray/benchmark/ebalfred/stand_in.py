"""The scripted EB-ALFRED stand-in (docs/ebalfred.md): a test double for the fixture the fake
controller replays, not a stand-in for a VLM. EB-ALFRED's task contract
(:mod:`memprism_ray.benchmark.ebalfred.contract`) builds it for ``policy.backend: scripted`` from
``policy.scripted`` (``ebalfred_fixture``, ``ebalfred_epsilon``; the EB-ALFRED benchmark sets
them when it builds the fixture)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from memprism_ray.benchmark.ebalfred.contract import EBALFRED
from memprism_ray.benchmark.ebalfred.fixture_format import load_transcripts
from memprism_ray.policy.config import PolicyConfig
from memprism_ray.policy.parsing import failed_output


class FixturePolicy:
    """A test double for the fixture, not a stand-in for a VLM: it answers with the episode's
    recorded expert step, or with probability ``epsilon`` a random skill (seeded by ``(seed,
    episode id, step)``), counting per episode the plan steps played so it stays in step with the fake."""

    name = "fixture-expert"
    contract = EBALFRED
    # As every scripted stand-in, it is given the view's text twin and shown unpainted pages
    # (it reads neither; the trajectory viewer shows the text).
    needs_view_text = True
    needs_view_image = False

    def __init__(self, fixture: str | Path, epsilon: float = 0.0, seed: int = 0) -> None:
        if not 0.0 <= epsilon <= 1.0:
            raise ValueError(f"FixturePolicy epsilon must be in [0, 1], got {epsilon}")
        doc = load_transcripts(fixture)
        # Keyed by what the prompt shows: the scene-filtered list or (ebalfred.skills: full) all.
        self._plans = {
            (ep["instruction"], tuple(ep[key])): [s["action"] for s in ep["steps"]]
            for ep in doc["episodes"].values()
            for key in ("admissible", "skills")
        }
        self.epsilon = epsilon
        self.seed = seed
        self._played: dict[str, int] = {}

    @classmethod
    def from_config(cls, config: PolicyConfig) -> FixturePolicy:
        """From ``policy.scripted``: the fixture, its random-skill rate and the seed."""
        s = config.scripted
        if not s.get("ebalfred_fixture"):
            raise ValueError(
                "the scripted EB-ALFRED stand-in needs a fixture: policy.scripted.ebalfred_fixture "
                "(set by the EB-ALFRED jobs with ebalfred.controller: fake)"
            )
        return cls(s["ebalfred_fixture"], epsilon=s.get("ebalfred_epsilon", 0.2), seed=s.get("seed", 0))

    def act(self, inputs: Any) -> list[Any]:
        import random

        outputs = []
        for inp in inputs:
            plan = self._plans.get((inp.goal, tuple(inp.admissible)))
            if plan is None:
                outputs.append(failed_output(f"no fixture episode has goal {inp.goal[:60]!r} with these skills"))
                continue
            key = str(inp.meta.get("episode_id", inp.goal))
            if inp.step == 0:
                self._played[key] = 0
            k = self._played.get(key, 0)
            rng = random.Random(f"{self.seed}|{key}|{inp.step}")
            if k < len(plan) and rng.random() >= self.epsilon:
                action = plan[k]
            else:
                action = rng.choice(list(inp.admissible))
            if k < len(plan) and action == plan[k]:
                self._played[key] = k + 1
            outputs.append(self.contract.to_output(inp, f"<action>{action}</action>"))
        return outputs
