"""Expert trajectories of EB-ALFRED episodes for D1 (paper appendix "Training dataset
setup": "The ALFRED path uses the official ALFRED training annotations for learning"): the
ALFRED annotations translated to skills (the fixture ships its own), played with the
stage-1 rule Phi into the expert-trajectory table D1 labelling reads.

An annotation's plan names the instances it acts on by ALFRED objectId; at each reset they are
named as EmbodiedBench names the scene's instances (``Drawer_2``; ``data.resolve_plan``), and a
plan with an instance that cannot be named is left out and counted, never played on a guess
(issue 41 item 1). ``python -m memprism_ray.benchmark.ebalfred.expert`` audits annotation files
without the simulator (docs/ebalfred.md "Expert plans from ALFRED annotations").
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from memprism_ray.benchmark.ebalfred.data import (
    PlanStep,
    SceneInstances,
    default_alfred_root,
    load_splits,
    parse_game_id,
    plan_from_trajectory,
    resolve_plan,
)
from memprism_ray.benchmark.ebalfred.phi import EbAlfredRulePhi
from memprism_ray.benchmark.ebalfred.skills import PICK_OBJS, AlfredNameError, instance_names, language_skill_set
from memprism_ray.envs.base import GameRef

log = logging.getLogger(__name__)

#: A game's expert plan: recorded skills (played as written) or an annotation's steps (resolved at reset).
Plan = Sequence[str] | Sequence[PlanStep]


def annotation_plans(
    splits: str | Path, games: Sequence[GameRef], alfred_root: str | Path | None = None
) -> dict[str, list[PlanStep]]:
    """``game_id -> expert plan`` from the ALFRED annotation (under ``train`` then
    ``valid_seen``) each splits entry names; a missing one is an error naming the game."""
    root = Path(alfred_root) if alfred_root else default_alfred_root()
    if root is None:
        raise FileNotFoundError("ALFRED annotations: set $MEMPRISM_ALFRED_DATA to the unpacked json_2.1.0 folder")
    table = load_splits(splits, sorted({parse_game_id(g.game_id)[0] for g in games}))
    out: dict[str, list[PlanStep]] = {}
    for g in games:
        subset, index = parse_game_id(g.game_id)
        task = table[subset][index].get("task", "")
        path = next(
            (p for p in (root / s / task / "traj_data.json" for s in ("train", "valid_seen")) if p.is_file()), None
        )
        if path is None:
            raise FileNotFoundError(f"{g.game_id}: no ALFRED annotation for task {task!r} under {root}")
        try:
            out[g.game_id] = plan_from_trajectory(json.loads(path.read_text()))
        except AlfredNameError as exc:
            raise AlfredNameError(f"{g.game_id} ({path}): {exc}", exc.name, exc.known) from None
    return out


def _follow(env: Any, plan: Plan, game_id: str, unresolved: dict[str, list[str]]) -> Callable[..., Any]:
    """A ``next_action`` of ``play_episode``: ``plan`` with its instances named in the scene the
    reset showed (recorded skills as they are); nothing when an instance cannot be named."""
    skills: list[str] = []

    def next_action(t: int, *_: Any) -> tuple[str, str] | None:
        if t == 0:
            if plan and isinstance(plan[0], PlanStep):
                named, why = resolve_plan([s for s in plan if isinstance(s, PlanStep)], env.scene(0))
                if why:
                    unresolved[game_id] = why
                    return None
                skills[:] = named
            else:
                skills[:] = [str(s) for s in plan]
        return (skills[t], skills[t]) if t < len(skills) else None

    return next_action


def play_expert(
    env: Any,
    games: Sequence[GameRef],
    plans: Mapping[str, Plan],
    max_steps: int = 30,
    unresolved: dict[str, list[str]] | None = None,
) -> list:
    """Play each game's plan for at most ``max_steps`` environment steps, as the agent loop counts
    them; ``ExpertEpisode`` records, won or not (the label stage reads the ``won`` column). A plan
    whose instance cannot be named in its scene is not played: it goes into ``unresolved``
    (``game_id -> reasons``) and one warning counts them."""
    from memprism_ray.adapter.reference_table import play_episode

    phi, keys = EbAlfredRulePhi(), ("last_action_success", "progress")
    missed: dict[str, list[str]] = {} if unresolved is None else unresolved
    episodes = [
        play_episode(
            env, g, "ebalfred", phi, _follow(env, plans[g.game_id], g.game_id, missed), max_steps, "alfred", keys
        )
        for g in games
    ]
    if missed:
        first = next(iter(missed.items()))
        log.warning(
            "EB-ALFRED expert plans: %d of %d games left out of D1: an instance their ALFRED annotation acts on "
            "has no EmbodiedBench name in the scene at reset (e.g. %s: %s)",
            len(missed),
            len(games),
            first[0],
            first[1][0],
        )
    return [ep for ep in episodes if ep.reference]


def write_expert_table(episodes: Sequence[Any], path: str | Path) -> Path:
    """The expert-trajectory Parquet D1 labelling reads."""
    import pyarrow.parquet as pq

    from memprism_ray.adapter.reference_table import episodes_to_arrow

    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(episodes_to_arrow(episodes), out)
    return out


# --------------------------------------------------------------------------- the audit without the simulator


def layout_scene(traj: Mapping[str, Any], layouts: str | Path) -> list[dict[str, Any]]:
    """An approximation, without the simulator, of the objects of ``traj``'s scene: the
    receptacles of ALFRED's ``gen/layouts/FloorPlan<N>-openable.json``, the movable objects of
    the annotation's ``scene.object_poses`` (their ids where the plan names them), and every other
    object the plan names. AI2-THOR's order of them is unknown (the layout lists ids sorted), and
    objects neither listed nor named (a second desk lamp) are missing."""
    scene = traj.get("scene", {})
    path = Path(layouts) / f"FloorPlan{scene.get('scene_num')}-openable.json"
    if not path.is_file():
        raise FileNotFoundError(f"no ALFRED layout {path}: point --layouts at ALFRED's gen/layouts folder")
    objects: list[dict[str, Any]] = []
    for oid in json.loads(path.read_text()):
        parts = oid.split("|")
        objects.append({"objectId": oid, "objectType": parts[4] if len(parts) > 4 else parts[0], "receptacle": True})
    named = [s.object_id for s in plan_from_trajectory(traj) if s.object_id]
    movable = Counter(str(p.get("objectName", "")).split("_")[0] for p in scene.get("object_poses", []))
    for kind, n in movable.items():
        ids = list(dict.fromkeys(i for i in named if i.split("|")[0] == kind and len(i.split("|")) == 4))
        ids += [f"{kind}|pose|{k}|0" for k in range(len(ids), n)]
        objects += [{"objectId": oid, "objectType": kind, "pickupable": True} for oid in ids]
    known = {o["objectId"] for o in objects}
    for oid in named:
        whole = "|".join(oid.split("|")[:4])
        if oid in known or whole in known:
            continue
        kind = whole.split("|")[0]
        receptacle = any(o["objectType"] == kind and o.get("receptacle") for o in objects)
        objects.append(
            {"objectId": whole, "objectType": kind, "receptacle": receptacle, "pickupable": kind in PICK_OBJS}
        )
        known.add(whole)
    return objects


def _scene(objects: Sequence[Mapping[str, Any]]) -> SceneInstances:
    return SceneInstances(tuple(objects), instance_names(objects), tuple(language_skill_set(objects)))


def _pickup_places(skills: Sequence[str]) -> list[str | None]:
    """Per pickup of a plan, the last ``find`` before it: where the robot picks it up."""
    last, out = None, []
    for skill in skills:
        if skill.startswith("find a "):
            last = skill
        elif skill.startswith("pick up "):
            out.append(last)
    return out


def audit_annotations(files: Sequence[Path], layouts: str | Path) -> dict[str, Any]:
    """Expert plans of ALFRED annotation ``files`` resolved in :func:`layout_scene` scenes, in
    their listed order and reversed (the simulator's order is unknown here): ``resolved`` either
    way, ``order_dependent`` (e.g. the first of two sink basins: ``SinkBasin`` names no skill, the
    second is ``SinkBasin_2``), ``unresolvable`` either way; and, for ``pick_two_obj_and_place``,
    how many plans pick the two objects at two different finds (new: with instance names; old:
    with bare type names, as before issue 41)."""
    counts: Counter[str] = Counter()
    reasons: Counter[str] = Counter()
    examples: dict[str, str] = {}
    for path in files:
        traj = json.loads(Path(path).read_text())
        try:
            plan = plan_from_trajectory(traj)
        except AlfredNameError:
            counts["untranslatable"] += 1
            continue
        objects = layout_scene(traj, layouts)
        forward, why = resolve_plan(plan, _scene(objects))
        _, why_back = resolve_plan(plan, _scene(objects[::-1]))
        verdict = "resolved" if not why and not why_back else "unresolvable" if why and why_back else "order_dependent"
        counts["files"] += 1
        counts[verdict] += 1
        for reason in why or why_back:
            reasons[reason.split(":")[0]] += 1
            examples.setdefault(verdict, f"{path}: {reason}")
        if str(traj.get("task_type", "")) == "pick_two_obj_and_place":
            counts["pick_two"] += 1
            new = _pickup_places(forward) if not why else []
            counts["pick_two_distinct"] += int(len(set(new)) >= 2)
            counts["pick_two_old_same_find"] += int(len(set(_pickup_places([s.skill for s in plan]))) < 2)
    return {"counts": dict(counts), "reasons": dict(reasons.most_common()), "examples": examples}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m memprism_ray.benchmark.ebalfred.expert",
        description="Audit ALFRED annotation files: can their expert plans name every instance they act on? "
        "(without the simulator: docs/ebalfred.md)",
    )
    parser.add_argument("annotations", help="a json_2.1.0 folder (every */*/pp/ann_*.json or */*/traj_data.json)")
    parser.add_argument("--layouts", required=True, help="ALFRED's gen/layouts folder (FloorPlan<N>-openable.json)")
    args = parser.parse_args(argv)
    root = Path(args.annotations)
    files = sorted(root.glob("*/*/pp/ann_*.json")) or sorted(root.glob("**/traj_data.json"))
    if not files:
        print(f"error: no annotation files under {root}", file=sys.stderr)
        return 2
    try:
        report = audit_annotations(files, args.layouts)
    except (OSError, ValueError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(json.dumps(report, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
