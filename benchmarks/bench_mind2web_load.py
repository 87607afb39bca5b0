"""Why ``benchmark/mind2web/data.py`` keeps the last few parsed split files (``load_file``'s cache).

A GRPO group replays one task 16 times and an evaluation worker resets its slots on tasks
of the same split file over and over; without the cache each reset re-reads and re-parses
the whole JSON file, and the official files are large because every step carries the page
(``raw_html`` and ``cleaned_html``). This writes one synthetic split file in the release
schema (``--tasks`` tasks x ``--steps`` steps, ``--raw-kb`` / ``--clean-kb`` of HTML per step)
and times ``Mind2WebReplayEnv.reset`` + one episode over ``--resets`` resets, uncached
(the cache cleared before every reset) and cached, side by side.

    python benchmarks/bench_mind2web_load.py [--tasks 20] [--steps 8] [--raw-kb 200] [--clean-kb 40] [--resets 16]

The last line is ``RESULT {json}``; the same figures are recorded in
``benchmarks/results/bench_mind2web_load.json`` (``_results.write_result``).
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path

from _results import write_result

from memprism_ray.benchmark.mind2web import data
from memprism_ray.benchmark.mind2web.env import Mind2WebReplayEnv
from memprism_ray.config_tree import int_at_least
from memprism_ray.envs.base import GameRef


def _file(root: Path, tasks: int, steps: int, raw_kb: int, clean_kb: int) -> Path:
    filler = "<div><span>filler text</span></div>"
    raw = filler * (raw_kb * 1024 // len(filler))
    clean_pad = filler * (clean_kb * 1024 // len(filler))
    out = []
    for i in range(tasks):
        actions = []
        for s in range(steps):
            html = f'<html>{clean_pad}<button backend_node_id="{s}">Go {s}</button></html>'
            cand = {"tag": "button", "backend_node_id": str(s), "attributes": json.dumps({"text": f"Go {s}"})}
            actions.append(
                {
                    "action_uid": f"t{i}-{s}",
                    "raw_html": raw,
                    "cleaned_html": html,
                    "operation": {"op": "CLICK", "original_op": "CLICK", "value": ""},
                    "pos_candidates": [cand],
                    "neg_candidates": [],
                }
            )
        out.append({"annotation_id": f"t{i}", "confirmed_task": "go", "website": "w", "domain": "d",
                    "subdomain": "s", "action_reprs": [], "actions": actions})  # fmt: skip
    (root / "train").mkdir(parents=True)
    path = root / "train" / "train_0.json"
    path.write_text(json.dumps(out))
    return path


def _play(env: Mind2WebReplayEnv, game: GameRef, steps: int) -> None:
    env.reset(game)
    for s in range(steps):
        env.step(json.dumps({"op": "CLICK", "ref": f"e{s}", "value": None}))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--tasks", type=int_at_least(1), default=20)
    ap.add_argument("--steps", type=int_at_least(1), default=8)
    ap.add_argument("--raw-kb", type=int_at_least(1), default=200)
    ap.add_argument("--clean-kb", type=int_at_least(1), default=40)
    ap.add_argument("--resets", type=int_at_least(1), default=16)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        path = _file(Path(tmp), args.tasks, args.steps, args.raw_kb, args.clean_kb)
        game = GameRef("t3", path, "d", "train")
        env = Mind2WebReplayEnv()
        t0 = time.perf_counter()
        for _ in range(args.resets):
            data._load_file.cache_clear()
            _play(env, game, args.steps)
        uncached = (time.perf_counter() - t0) / args.resets
        data._load_file.cache_clear()
        t0 = time.perf_counter()
        for _ in range(args.resets):
            _play(env, game, args.steps)
        cached = (time.perf_counter() - t0) / args.resets
        mb = path.stat().st_size / 2**20
    result = {"file_mb": round(mb, 1), "episode_s_uncached": uncached, "episode_s_cached": cached,
              "speedup": uncached / cached}  # fmt: skip
    print(f"split file {mb:.1f} MB, {args.steps}-step episode: uncached {uncached * 1000:.0f} ms, "
          f"cached {cached * 1000:.0f} ms (first reset parses), x{uncached / cached:.1f}")  # fmt: skip
    print("RESULT " + json.dumps(result))
    write_result("bench_mind2web_load", result)


if __name__ == "__main__":
    main()
