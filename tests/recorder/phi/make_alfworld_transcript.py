"""Regenerate ``data/alfworld_transcript.json``: real ALFWorld engine feedback for the Phi tests.

Builds a small generated corpus in a temporary folder, then plays at least 200 episodes on
the real TextWorld engine: per game one handcoded-expert episode, expert episodes with 25%
and 50% random commands, and random episodes (admissible commands, plus a few
non-admissible ones and ``help``). Every feedback is reduced to its template
(:func:`feedback_template`, which the Phi tests import from here); the file keeps each
distinct template with its count and up to three real (command, feedback) examples.

Generating takes a few minutes on 2 cores, which is why the tests read the file instead:

    .venv/bin/python tests/recorder/phi/make_alfworld_transcript.py

Regenerate it when the alfworld version, the grammar or the game generator changes.
"""

from __future__ import annotations

import json
import random
import re
import sys
import tempfile
import time
from pathlib import Path

from memprism_ray.benchmark.alfworld.phi import INST

OUT = Path(__file__).with_name("data") / "alfworld_transcript.json"
SEED = 5
EPISODE_MIX = (0.0, 0.25, 0.25, 0.5, 0.5, 1.0, 1.0, 1.0, 1.0)  # random-command rate per episode of a game
JUNK = ("jump", "take unicorn 1 from sofa 1", "dance", "go to moon 1")
MAX_STEPS = 40
_NAME = re.compile(INST)
_TEMPLATE_ITEM = re.compile(rf"\b(?:a|an|some) {INST}")
_TEMPLATE_ITEMS = re.compile(r"\{item\}(?:, (?:and )?\{item\})*")
_TEMPLATE_NAMES = re.compile(r"\{x\}(?:, (?:and )?\{x\})+")


def feedback_template(feedback: str) -> str:
    """Feedback with names abstracted: instances -> ``{x}``, article lists -> ``{items}``,
    bare name lists -> ``{xs}``, location numbers -> ``loc {n}``."""
    t = feedback.strip()
    t = re.sub(r"\bloc \d+\b", "loc {n}", t)
    t = _TEMPLATE_ITEM.sub("{item}", t)
    t = _TEMPLATE_ITEMS.sub("{items}", t)
    t = _NAME.sub("{x}", t)
    return _TEMPLATE_NAMES.sub("{xs}", t)


def main() -> None:
    from importlib.metadata import version

    from memprism_ray.benchmark.alfworld.corpus import CorpusConfig, build_corpus
    from memprism_ray.benchmark.alfworld.data import SPLITS, list_games
    from memprism_ray.benchmark.alfworld.env import AlfworldEnv

    rng = random.Random(SEED)
    templates: dict[str, dict] = {}
    episodes = steps = 0
    t0 = time.time()
    with tempfile.TemporaryDirectory() as tmp:
        build_corpus(CorpusConfig(out=Path(tmp), train=12, eval=6, seed=SEED, workers=2), progress=True)
        games = [g for split in SPLITS for g in list_games(split, tmp)]
        with AlfworldEnv(1, expert=True) as env:
            for game in games:
                for eps in EPISODE_MIX:
                    obs = env.reset(game)
                    admissible, meta = obs.admissible, obs.meta
                    episodes += 1
                    for _ in range(MAX_STEPS):
                        if rng.random() < eps or not meta.get("expert_action"):
                            r = rng.random()
                            action = rng.choice(JUNK) if r < 0.08 else "help" if r < 0.1 else rng.choice(admissible)
                        else:
                            action = meta["expert_action"]
                        tr = env.step(action)
                        steps += 1
                        entry = templates.setdefault(feedback_template(tr.feedback), {"count": 0, "examples": []})
                        entry["count"] += 1
                        if (
                            len(entry["examples"]) < 3
                            and {"action": action, "feedback": tr.feedback} not in entry["examples"]
                        ):
                            entry["examples"].append({"action": action, "feedback": tr.feedback})
                        admissible, meta = tr.admissible, tr.meta
                        if tr.done:
                            break
                print(f"{episodes} episodes, {steps} steps, {len(templates)} templates", file=sys.stderr)
    data = {
        "about": "Real ALFWorld engine feedback templates; regenerate with make_alfworld_transcript.py",
        "alfworld_version": version("alfworld"),
        "seed": SEED,
        "games": len(games),
        "episodes": episodes,
        "steps": steps,
        "seconds": round(time.time() - t0, 1),
        "templates": dict(sorted(templates.items())),
    }
    OUT.parent.mkdir(parents=True, exist_ok=True)
    OUT.write_text(json.dumps(data, indent=1, sort_keys=True) + "\n")
    print(f"wrote {OUT}: {episodes} episodes, {steps} steps, {len(templates)} templates", file=sys.stderr)


if __name__ == "__main__":
    main()
