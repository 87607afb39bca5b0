"""``memprism games``: build the offline ALFWorld corpus, list games, record expert data
(ALFWorld's own commands: :attr:`Alfworld.commands <memprism_ray.benchmark.base.Benchmark.commands>`).

    memprism games build --out DIR [--train N] [--eval N] [--seed S] [--workers K]
    memprism games list --split SPLIT [--data-root DIR]
    memprism games expert --split train --out DIR [--games N] [--data-root DIR]

``build`` is resumable: rerun the same command after an interruption and finished games
are kept. ``--data-root`` defaults to ``$ALFWORLD_DATA``, else the embedded default corpus.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

from memprism_ray.config_tree import int_at_least, seed_arg

_SPLITS = ("train", "eval_in_distribution", "eval_out_of_distribution")


_positive, _non_negative = int_at_least(1), int_at_least(0)


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser("games", help="ALFWorld games: build the offline corpus, list, expert data")
    sub = parser.add_subparsers(dest="games_command", metavar="ACTION")
    parser.set_defaults(func=lambda args: (parser.print_help(), 2)[1])

    b = sub.add_parser(
        "build",
        help="generate and validate an ALFWorld-style corpus (resumable)",
        description="Write ALFWorld-style games from the layouts packaged in alfworld, each won by ALFWorld's "
        "handcoded expert, in the alfworld-download layout (json_2.1.1/{train,valid_seen,valid_unseen}).",
    )
    b.add_argument("--out", required=True, type=Path, help="output folder (use it as ALFWORLD_DATA)")
    b.add_argument("--train", type=_non_negative, default=3827, help="training games (default: 3827, as ALFWorld)")
    b.add_argument("--eval", type=_non_negative, default=140, help="games per eval split (default: 140)")
    b.add_argument("--seed", type=seed_arg, default=0, help="corpus seed (default: 0)")
    b.add_argument("--workers", type=_positive, default=os.cpu_count() or 1, help="worker processes (default: cores)")
    b.add_argument("--max-attempts", type=_positive, default=8, help="games tried per slot (default: 8)")
    b.add_argument("--quiet", action="store_true", help="no progress output")
    b.set_defaults(func=_build)

    ls = sub.add_parser("list", help="list the playable games of a split")
    ls.add_argument("--split", choices=_SPLITS, default="train")
    ls.add_argument("--data-root", type=Path, default=None, help="alfworld-download tree (default: $ALFWORLD_DATA)")
    ls.add_argument("--json", action="store_true", help="one JSON object per line")
    ls.set_defaults(func=_list)

    e = sub.add_parser("expert", help="record handcoded-expert trajectories as Parquet (view-teacher labels, D1)")
    e.add_argument("--split", choices=_SPLITS, default="train")
    e.add_argument("--out", required=True, type=Path, help="output folder")
    e.add_argument("--games", type=_positive, default=None, help="first N games of the split (default: all)")
    e.add_argument("--data-root", type=Path, default=None, help="alfworld-download tree (default: $ALFWORLD_DATA)")
    e.add_argument("--max-steps", type=_positive, default=120, help="step budget per game (default: 120)")
    e.add_argument("--quiet", action="store_true", help="no progress output")
    e.set_defaults(func=_expert)


def _build(args: argparse.Namespace) -> int:
    from memprism_ray.benchmark.alfworld.corpus import CorpusConfig, build_corpus

    keys = ("out", "train", "eval", "seed", "workers", "max_attempts")
    cfg = CorpusConfig(**{k: getattr(args, k) for k in keys})
    try:
        manifest_path = build_corpus(cfg, progress=not args.quiet)
    except RuntimeError as exc:
        raise ValueError(str(exc)) from None  # the command line prints it as one line
    except KeyboardInterrupt:
        built = len(list((cfg.out / ".build" / "slots").glob("*.json")))
        print(f"memprism games build: interrupted; the {built} game(s) built are kept: run the same command to "
              "finish", file=sys.stderr)  # fmt: skip
        return 130
    manifest = json.loads(manifest_path.read_text())
    for split, counts in manifest["counts"].items():
        print(f"{split}: {sum(counts.values())} games " + ", ".join(f"{t}={n}" for t, n in counts.items()))
    print(f"manifest: {manifest_path}")
    print(f"use it: export ALFWORLD_DATA={cfg.out.resolve()}")
    return 0


def _list(args: argparse.Namespace) -> int:
    from memprism_ray.benchmark.alfworld.data import list_games

    for g in list_games(args.split, args.data_root):
        if args.json:
            print(json.dumps(g.to_dict(), sort_keys=True))
        else:
            print(f"{g.game_id}\t{g.task_type}")
    return 0


def _expert(args: argparse.Namespace) -> int:
    from memprism_ray.benchmark.alfworld.data import list_games
    from memprism_ray.benchmark.alfworld.expert_data import collect_expert_trajectories

    games = list_games(args.split, args.data_root)
    if args.games is not None:
        games = games[: args.games]
    path = collect_expert_trajectories(games, args.out, max_steps=args.max_steps, progress=not args.quiet)
    summary = json.loads((path.parent / "expert_trajectories.json").read_text())
    print(f"{summary['episodes']} of {summary['games']} game(s), {summary['steps']} decision states -> {path}")
    return 0
