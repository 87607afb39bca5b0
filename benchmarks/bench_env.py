"""Stock ALFWorld engine vs ``AlfworldEnv`` on the same games and the same commands.

Plays N games (default 20, spread over the six task types) twice, side by side in one run:

1. **stock**: a child Python process that never imports memprism's engine caches and plays
   through ALFWorld's own ``AlfredTWEnv.init_env`` gym environment (``batch_size=1``, no
   expert), exactly as ALFWorld ships. Per game it resets ``--stock-resets`` times (every
   stock reset loads the game: grammar parse + 4 PDDL translations, so all cost the same),
   then plays S commands chosen by a seeded random agent from the admissible commands, with
   some non-admissible ones mixed in. It records every observation, admissible list and
   ``won`` flag.
2. **fast**: this process, ``AlfworldEnv(1)`` (engine caches on), resetting each game
   ``--group`` times (default 16: a GRPO group of the paper plays one task 16 times) and
   replaying the stock run's commands.

It asserts identical observations, admissible sets (stock minus ``help``, which
``AlfworldEnv`` hides) and won flags, then prints the speed-ups:

* ``step_speedup``: mean stock step time / mean ``AlfworldEnv`` step time;
* ``reset_speedup``: mean stock reset / mean ``AlfworldEnv`` reset over a group of
  ``--group`` resets of the same game, its first (cold) reset included;
* ``disk_cold_reset_speedup``: a game's first reset in a process that translates it / in a
  process that reads the translations another one left on disk (same games, transcripts
  compared with the stock run too);
* ``command_memo_step_speedup``: the same commands replayed game by game without and with
  the command memo (the other caches on in both), mean step time without / with;
* ``reset_speedup_cold`` (first reset of a game in the process: the PDDL translations are
  still paid, twice instead of four times) and ``reset_speedup_warm`` (later resets).

Memory: PSS of this process before and after the first env (with a game loaded), and of a
4-slot env with a game in every slot.

    python benchmarks/bench_env.py [--games 20] [--group 16] [--stock-resets 2] [--steps 20] [--data-root DIR]

The last line is ``RESULT {json}``; the same figures are recorded in
``benchmarks/results/bench_env.json`` (``_results.write_result``).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from _results import write_result

from memprism_ray.config_tree import int_at_least

JUNK_COMMANDS = ("jump", "take unicorn 1 from sofa 1", "open the pod bay doors", "go to moon 1")


def _stock_config(train_path: str) -> dict[str, Any]:
    return {
        "env": {
            "type": "AlfredTWEnv",
            "goal_desc_human_anns_prob": 0.0,
            "task_types": [1, 2, 3, 4, 5, 6],
            "domain_randomization": False,
            "expert_type": "handcoded",
        },
        "dataset": {
            "data_path": train_path,
            "eval_id_data_path": train_path,
            "eval_ood_data_path": train_path,
            "num_train_games": -1,
            "num_eval_games": -1,
        },
        "logic": {"domain": "", "grammar": ""},
        "general": {"training_method": "dqn"},
        "rl": {"training": {"max_nb_steps_per_episode": 1000}},
        "dagger": {"training": {"max_nb_steps_per_episode": 1000}},
    }


def stock_worker(games_file: str, out_file: str, resets: int, steps: int, seed: int) -> None:
    """Runs in a fresh interpreter: stock alfworld only (no memprism engine module)."""
    import contextlib
    import io

    from alfworld.agents.environment.alfred_tw_env import AlfredTWEnv

    games = json.loads(Path(games_file).read_text())
    results = []
    for g in games:
        # AlfredTWEnv prints and draws progress bars while it collects games.
        with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
            tw = AlfredTWEnv(_stock_config(str(Path(g).parent)), train_eval="train")
            tw.game_files = [g]
            env = tw.init_env(batch_size=1)
        reset_times, intros = [], []
        for _ in range(resets):
            t0 = time.perf_counter()
            obs, infos = env.reset()
            reset_times.append(time.perf_counter() - t0)
            intros.append(obs[0])
        rng = random.Random(f"{seed}:{g}")
        admissible = list(infos["admissible_commands"][0])
        record = {"game": g, "intro": intros, "reset_s": reset_times, "start_admissible": admissible, "steps": []}
        for _ in range(steps):
            offered = [c for c in admissible if c != "help"]
            command = rng.choice(JUNK_COMMANDS) if rng.random() < 0.1 or not offered else rng.choice(offered)
            t0 = time.perf_counter()
            obs, _scores, dones, infos = env.step([command])
            dt = time.perf_counter() - t0
            admissible = list(infos["admissible_commands"][0])
            won = bool(infos["won"][0])
            step = {"command": command, "feedback": obs[0], "admissible": admissible, "won": won, "s": dt}
            record["steps"].append(step)
            if dones[0]:
                break
        env.close()
        results.append(record)
        print(f"stock: {Path(g).parent.parent.name[:60]} reset {statistics.mean(reset_times):.2f}s", file=sys.stderr)
    Path(out_file).write_text(json.dumps(results))


def _pss_mb() -> float:
    """Proportional set size of this process (Linux ``smaps_rollup``), in MiB."""
    try:
        for line in Path("/proc/self/smaps_rollup").read_text().splitlines():
            if line.startswith("Pss:"):
                return int(line.split()[1]) / 1024
    except OSError:
        pass
    import resource

    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def pick_games(data_root: str | None, n: int) -> list[Any]:
    from memprism_ray.benchmark.alfworld.data import SPLITS, list_games
    from memprism_ray.benchmark.alfworld.generator import TASK_TYPES

    pool = [g for split in SPLITS for g in list_games(split, data_root)]
    by_type = {t: [g for g in pool if g.task_type == t] for t in TASK_TYPES}
    picked: list[Any] = []
    while len(picked) < n and any(by_type.values()):
        for t in TASK_TYPES:
            if by_type[t] and len(picked) < n:
                picked.append(by_type[t].pop(0))
    return picked


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--games", type=int_at_least(1), default=20)
    ap.add_argument(
        "--group", type=int_at_least(2), default=16, help="AlfworldEnv resets per game (>= 2; default 16 = G)"
    )
    ap.add_argument(
        "--stock-resets", type=int_at_least(1), default=2, help="stock resets per game (each loads the game)"
    )
    ap.add_argument("--steps", type=int_at_least(1), default=20, help="commands per game")
    ap.add_argument("--seed", type=int_at_least(0), default=0)
    ap.add_argument("--data-root", default=None, help="alfworld-download tree (default: the embedded corpus)")
    ap.add_argument("--stock-worker", nargs=2, metavar=("GAMES_JSON", "OUT_JSON"), help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.stock_worker:
        stock_worker(args.stock_worker[0], args.stock_worker[1], args.stock_resets, args.steps, args.seed)
        return

    games = pick_games(args.data_root, args.games)
    print(
        f"bench_env: {len(games)} games; stock: {args.stock_resets} resets, fast: {args.group} resets; "
        f"up to {args.steps} commands each",
        file=sys.stderr,
    )
    with tempfile.TemporaryDirectory() as tmp:
        games_file, out_file = Path(tmp) / "games.json", Path(tmp) / "stock.json"
        games_file.write_text(json.dumps([str(g.path) for g in games]))
        t0 = time.perf_counter()
        subprocess.run(
            [sys.executable, __file__, "--stock-resets", str(args.stock_resets), "--steps", str(args.steps), "--seed",
             str(args.seed), "--stock-worker", str(games_file), str(out_file)],
            check=True,
        )  # fmt: skip
        stock_wall = time.perf_counter() - t0
        stock = json.loads(out_file.read_text())

    from memprism_ray.benchmark.alfworld import engine
    from memprism_ray.benchmark.alfworld.env import AlfworldEnv

    # An empty translation directory: the first reset of a game translates it, as in a
    # process that meets the game first; the "disk" pass below reads those files back.
    sas_dir = Path(tempfile.mkdtemp(prefix="bench-env-sas-"))
    engine.install_engine_caches(sas_dir=sas_dir)
    mem0 = _pss_mb()
    env = AlfworldEnv(1)
    mismatches: list[str] = []
    fast_cold, fast_warm, fast_steps, stock_resets, stock_steps = [], [], [], [], []
    mem_first = None
    t0 = time.perf_counter()
    for g, rec in zip(games, stock, strict=True):
        assert rec["game"] == str(g.path)
        if len(set(rec["intro"])) != 1:
            mismatches.append(f"{g.game_id}: the stock engine's intro changed between resets")
        for r in range(args.group):
            t1 = time.perf_counter()
            obs = env.reset(g)
            (fast_cold if r == 0 else fast_warm).append(time.perf_counter() - t1)
            if obs.text != rec["intro"][0]:
                mismatches.append(f"{g.game_id}: intro differs on reset {r}")
        if mem_first is None:
            mem_first = _pss_mb()
        stock_resets.extend(rec["reset_s"])
        if list(obs.admissible) != [c for c in rec["start_admissible"] if c != "help"]:
            mismatches.append(f"{g.game_id}: admissible differs at start")
        for i, st in enumerate(rec["steps"]):
            t1 = time.perf_counter()
            tr = env.step(st["command"])
            fast_steps.append(time.perf_counter() - t1)
            stock_steps.append(st["s"])
            if tr.feedback != st["feedback"]:
                mismatches.append(f"{g.game_id} step {i + 1}: feedback {tr.feedback[:60]!r} != {st['feedback'][:60]!r}")
            if list(tr.admissible) != [c for c in st["admissible"] if c != "help"]:
                mismatches.append(f"{g.game_id} step {i + 1}: admissible differs")
            if tr.won != st["won"]:
                mismatches.append(f"{g.game_id} step {i + 1}: won {tr.won} != {st['won']}")
    fast_wall = time.perf_counter() - t0

    # The command memo alone: the same commands with and without it, game by game in turn
    # (the memo warm from the pass above, as in a GRPO group's later episodes).
    memo_steps: dict[bool, list[float]] = {True: [], False: []}
    for g, rec in zip(games, stock, strict=True):
        for memo in (False, True):
            engine.uninstall_engine_caches()
            engine.install_engine_caches(command_memo=memo, sas_dir=sas_dir)
            env.reset(g)
            for st in rec["steps"]:
                t1 = time.perf_counter()
                tr = env.step(st["command"])
                memo_steps[memo].append(time.perf_counter() - t1)
                if tr.feedback != st["feedback"] or list(tr.admissible) != [c for c in st["admissible"] if c != "help"]:
                    mismatches.append(f"{g.game_id}: memo={memo} replay differs")
    env.close()

    # Another process's first reset of each game: translations read from disk, not made.
    engine.uninstall_engine_caches()
    engine.install_engine_caches(sas_dir=sas_dir)
    disk_cold: list[float] = []
    with AlfworldEnv(1) as disk_env:
        for g, rec in zip(games, stock, strict=True):
            t1 = time.perf_counter()
            obs = disk_env.reset(g)
            disk_cold.append(time.perf_counter() - t1)
            if obs.text != rec["intro"][0]:
                mismatches.append(f"{g.game_id}: intro differs after a translation read from disk")
            for st in rec["steps"]:
                tr = disk_env.step(st["command"])
                if tr.feedback != st["feedback"] or list(tr.admissible) != [c for c in st["admissible"] if c != "help"]:
                    mismatches.append(f"{g.game_id}: replay differs after a translation read from disk")
    engine.uninstall_engine_caches()
    engine.install_engine_caches()
    shutil.rmtree(sas_dir, ignore_errors=True)

    # Memory of further slots: a 4-slot env with a game in every slot.
    mem_before_multi = _pss_mb()
    multi = AlfworldEnv(4)
    for s in range(4):
        multi.reset(games[s % len(games)], slot=s)
    mem_multi = _pss_mb()
    multi.close()

    mean = statistics.mean
    fast_all = fast_cold + fast_warm
    result = {
        "games": len(games),
        "stock_resets_per_game": args.stock_resets,
        "fast_resets_per_game": args.group,
        "steps": len(fast_steps),
        "transcripts_identical": not mismatches,
        "step_speedup": round(mean(stock_steps) / mean(fast_steps), 2),
        "reset_speedup": round(mean(stock_resets) / mean(fast_all), 2),  # over a group of --group resets
        "reset_speedup_cold": round(mean(stock_resets) / mean(fast_cold), 2),
        "reset_speedup_warm": round(mean(stock_resets) / mean(fast_warm), 2),
        "command_memo_step_speedup": round(mean(memo_steps[False]) / mean(memo_steps[True]), 2),
        "memo_off_step_ms": round(1000 * mean(memo_steps[False]), 1),
        "memo_on_step_ms": round(1000 * mean(memo_steps[True]), 1),
        "stock_step_ms": round(1000 * mean(stock_steps), 1),
        "fast_step_ms": round(1000 * mean(fast_steps), 1),
        "stock_reset_s": round(mean(stock_resets), 3),
        "fast_reset_cold_s": round(mean(fast_cold), 3),
        "fast_reset_warm_s": round(mean(fast_warm), 3),
        "fast_reset_cold_disk_s": round(mean(disk_cold), 3),
        "disk_cold_reset_speedup": round(mean(fast_cold) / mean(disk_cold), 2),
        "stock_wall_s": round(stock_wall, 1),
        "fast_wall_s": round(fast_wall, 1),
        "env_first_pss_mb": round((mem_first or mem0) - mem0, 1),
        "env_4slot_pss_mb": round(mem_multi - mem_before_multi, 1),
        "cpu_count": os.cpu_count(),
    }
    for m in mismatches[:10]:
        print(f"MISMATCH {m}", file=sys.stderr)
    print(json.dumps(result, indent=1), file=sys.stderr)
    print("RESULT " + json.dumps(result, sort_keys=True))
    write_result("bench_env", result)
    if mismatches:
        sys.exit(1)


if __name__ == "__main__":
    main()
