"""EB-ALFRED's training episodes from the official ALFRED training annotations (paper
appendix "Training dataset setup": "The ALFRED path uses the official ALFRED training
annotations for learning and reserves EB-ALFRED episodes for evaluation"; docs/ebalfred.md).

EmbodiedBench ships the trajectory files of its 300 evaluation episodes only, so training on
ALFRED's ``train`` needs both an EmbodiedBench-format list (key ``alfred_train``, evaluation
trajectories left out) and each ``traj_data.json`` placed where ``EBAlfEnv`` reads it
(``json_2.1.0/<task>/pp/ann_<r>.json``; it reads only fields ALFRED's file has). Run once per
simulator image::

    python -m memprism_ray.benchmark.ebalfred.training --alfred /data/json_2.1.0 --out /data/alfred_train.json
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from memprism_ray.benchmark.ebalfred.data import (
    ALFRED_DOWNLOAD,
    TRAIN_SUBSET,
    default_alfred_root,
    default_splits_path,
    load_splits,
    parse_game_id,
    plan_from_trajectory,
)
from memprism_ray.benchmark.ebalfred.skills import AlfredNameError
from memprism_ray.envs.base import GameRef
from memprism_ray.io_atomic import atomic_write_text


def read_alfred_split(root: str | Path, split: str = "train") -> tuple[list[dict[str, Any]], dict[str, str]]:
    """The list entries of ``split`` and the trajectories left out as unplayable (``task ->
    reason``: the plan needs an object no EB-ALFRED skill names, so no policy could solve it
    and no D1 expert plan can be written); a damaged file is an error naming it."""
    base = Path(root) / split
    if not base.is_dir():
        raise FileNotFoundError(
            f"ALFRED {split} annotations not found at {base}: download {ALFRED_DOWNLOAD}, unpack it and pass "
            "its json_2.1.0 folder (--alfred, or $MEMPRISM_ALFRED_DATA)"
        )
    entries: list[dict[str, Any]] = []
    unplayable: dict[str, str] = {}
    for path in sorted(base.glob("*/*/traj_data.json")):
        data = json.loads(path.read_text())
        anns = data.get("turk_annotations", {}).get("anns", [])
        if not anns or not all(isinstance(a, dict) and isinstance(a.get("task_desc"), str) for a in anns):
            raise ValueError(f"{path}: no turk_annotations.anns[*].task_desc; not an ALFRED trajectory file")
        task = f"{path.parent.parent.name}/{path.parent.name}"
        try:
            plan_from_trajectory(data)
        except AlfredNameError as exc:
            if not exc.known:
                raise AlfredNameError(f"{path}: {exc}", exc.name, exc.known) from None
            unplayable[task] = str(exc)
            continue
        except (KeyError, TypeError) as exc:
            raise ValueError(f"{path}: no plan.high_pddl; not an ALFRED trajectory file ({exc!r})") from None
        entries.extend({"task": task, "repeat_idx": r, "instruction": a["task_desc"]} for r, a in enumerate(anns))
    return entries, unplayable


def evaluation_tasks(splits: str | Path) -> set[str]:
    """The trajectories (``task``) of the six evaluation subsets of an EmbodiedBench list."""
    return {str(ep.get("task", "")) for eps in load_splits(splits).values() for ep in eps}


def _place(src: Path, dst: Path) -> bool:
    """``dst`` as a hard link to ``src`` (a copy across filesystems); ``False`` if it exists."""
    if dst.exists():
        return False
    dst.parent.mkdir(parents=True, exist_ok=True)
    try:
        os.link(src, dst)
    except OSError:
        shutil.copyfile(src, dst)
    return True


def write_training_list(
    alfred_root: str | Path,
    out: str | Path,
    *,
    eb_data: str | Path | None = None,
    exclude_splits: str | Path | None = None,
    split: str = "train",
) -> dict[str, int]:
    """Write the training list to ``out`` (without the trajectories ``exclude_splits`` names) and,
    with ``eb_data`` (EmbodiedBench's ``envs/eb_alfred/data``), the trajectory files; the counts."""
    entries, unplayable = read_alfred_split(alfred_root, split)
    held_out = evaluation_tasks(exclude_splits) if exclude_splits else set()
    kept = [e for e in entries if e["task"] not in held_out]
    if not kept:  # a list of 0 episodes was written, and reported as done
        why = f"all {len(entries)} are evaluation trajectories of {exclude_splits}" if entries else "it holds none"
        raise ValueError(
            f"no playable training trajectory under {Path(alfred_root) / split} ({why}; {len(unplayable)} "
            "unplayable): point --alfred at ALFRED's unpacked json_2.1.0 folder"
        )
    placed = 0
    if eb_data is not None:
        for e in kept:
            src = Path(alfred_root) / split / e["task"] / "traj_data.json"
            placed += _place(src, Path(eb_data) / "json_2.1.0" / e["task"] / "pp" / f"ann_{e['repeat_idx']}.json")
    atomic_write_text(out, json.dumps({TRAIN_SUBSET: kept}, indent=1) + "\n", overwrite=True)
    return {
        "episodes": len(kept),
        "trajectories": len({e["task"] for e in kept}),
        "excluded_episodes": len(entries) - len(kept),
        "files_placed": placed,
        "unplayable_trajectories": len(unplayable),
    }


def trajectories(games: Sequence[GameRef]) -> dict[str, str]:
    """``game_id -> task`` (the ALFRED trajectory) of each game, from the list it came from."""
    tables: dict[tuple[Path, str], list[dict[str, Any]]] = {}
    out = {}
    for g in games:
        subset, index = parse_game_id(g.game_id)
        key = (Path(g.path), subset)
        if key not in tables:
            tables[key] = load_splits(g.path, (subset,))[subset]
        out[g.game_id] = str(tables[key][index].get("task", ""))
    return out


def shared_trajectories(train: Sequence[GameRef], evaluation: Sequence[GameRef]) -> list[str]:
    """ALFRED trajectories both lists play (sorted); game ids cannot show this (EmbodiedBench's
    subsets reuse trajectories: 300 episodes over 130 in ``splits.json`` at ``b247936``)."""
    return sorted(set(trajectories(train).values()) & set(trajectories(evaluation).values()))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m memprism_ray.benchmark.ebalfred.training",
        description="Write EB-ALFRED training episodes from the ALFRED training annotations (docs/ebalfred.md).",
    )
    parser.add_argument("--alfred", default=str(default_alfred_root() or ""), help="unpacked json_2.1.0 folder")
    parser.add_argument("--out", required=True, help="the training list to write (ebalfred.train_splits)")
    splits = default_splits_path()
    eb_default = splits.parent.parent if splits is not None else None
    parser.add_argument(
        "--eb-data",
        default=str(eb_default) if eb_default else "",
        help="EmbodiedBench's envs/eb_alfred/data folder ('' : only the list, no trajectory files)",
    )
    parser.add_argument(
        "--exclude", default=str(splits) if splits else "", help="evaluation list whose trajectories are left out"
    )
    args = parser.parse_args(argv)
    try:
        if not args.alfred:
            raise FileNotFoundError(f"no ALFRED annotations given: --alfred <json_2.1.0> (download {ALFRED_DOWNLOAD})")
        counts = write_training_list(
            args.alfred, args.out, eb_data=args.eb_data or None, exclude_splits=args.exclude or None
        )
    except (OSError, ValueError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(
        f"{counts['episodes']} training episodes ({counts['trajectories']} trajectories) -> {args.out}; "
        f"{counts['excluded_episodes']} left out as evaluation trajectories; "
        f"{counts['files_placed']} trajectory files placed" + ("" if args.eb_data else " (no --eb-data: none)")
    )
    if counts["unplayable_trajectories"]:
        print(
            f"note: {counts['unplayable_trajectories']} trajectories left out: their plans need an object no "
            "EB-ALFRED skill names (skills.ALFRED_ONLY_OBJS)"
        )
    if not args.eb_data:
        print(
            "note: EmbodiedBench's env reads each episode from its data folder: rerun with --eb-data on simulator nodes"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
