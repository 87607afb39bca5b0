"""The EB-ALFRED report (paper "Benchmarks": "we report per-subset success rate and average
SR"; Table "Main results on EB-ALFRED"): per subset the successes, SR with its Wilson 95%
interval, mean progress and reward; the average SR is the mean of the per-subset SRs (the
pooled SR with the paper's 50 episodes per subset). A crashed episode is a listed failure.

Beside them, what happened to the decisions (issue 41 item 2; the env's ``execution``): outputs
rejected before the simulator (no skill of EmbodiedBench's list), skills executed although the
prompt's scene-filtered list did not show them (the agent's fallback sends an output its parser
rejected), skills executed from that list; and the invalid actions as EmbodiedBench's evaluator
counts them (``num_invalid_actions``: rejected outputs plus executed skills that failed).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from memprism_ray.benchmark.ebalfred.data import SUBSETS, parse_game_id
from memprism_ray.benchmark.ebalfred.env import EXECUTIONS
from memprism_ray.eval.stats import success_summary

#: The paper's column names for the subsets.
SUBSET_LABELS = {
    "base": "Base",
    "common_sense": "Common",
    "complex_instruction": "Complex",
    "visual_appearance": "Visual",
    "spatial": "Spatial",
    "long_horizon": "Long",
}


def subset_report(episodes: Iterable[Mapping[str, Any]]) -> dict[str, Any]:
    """Per-subset and average SR of episode summaries (``episode_id``, ``game_id``, ``won``; and
    ``status``, ``progress``, ``reward`` when present)."""
    by_subset: dict[str, dict[str, bool]] = {}
    progress: dict[str, list[float]] = {}
    reward: dict[str, list[float]] = {}
    counted: dict[str, dict[str, int]] = {}
    failed: list[str] = []
    for ep in episodes:
        subset, _ = parse_game_id(str(ep["game_id"]))
        eid = str(ep["episode_id"])
        if eid in by_subset.setdefault(subset, {}):
            raise ValueError(f"episode id {eid!r} appears twice in subset {subset}")
        crashed = ep.get("status") == "failed"
        if crashed:
            failed.append(eid)
        by_subset[subset][eid] = bool(ep.get("won")) and not crashed
        progress.setdefault(subset, []).append(float(ep.get("progress", 0.0) or 0.0))
        reward.setdefault(subset, []).append(float(ep.get("reward", 0.0) or 0.0))
        totals = counted.setdefault(subset, dict.fromkeys((*EXECUTIONS, "invalid_actions"), 0))
        for key in totals:
            totals[key] += int(ep.get(key, 0) or 0)
    if not by_subset:
        raise ValueError("the EB-ALFRED report needs at least one episode")
    subsets: dict[str, Any] = {}
    for subset in SUBSETS:
        if subset not in by_subset:
            continue
        s = success_summary(by_subset[subset])
        s["mean_progress"] = sum(progress[subset]) / len(progress[subset])
        s["mean_reward"] = sum(reward[subset]) / len(reward[subset])
        s["decisions"] = dict(counted[subset])
        s["mean_invalid_actions"] = counted[subset]["invalid_actions"] / len(progress[subset])
        subsets[subset] = s
    pooled = success_summary({f"{k}/{e}": v for k, eps in by_subset.items() for e, v in eps.items()})
    return {
        "subsets": subsets,
        "average_sr": sum(s["sr"] for s in subsets.values()) / len(subsets),
        "pooled": pooled,
        "failed_episodes": sorted(failed),
    }


def report_markdown(report: Mapping[str, Any], title: str = "EB-ALFRED") -> str:
    """The report as the paper's table row: SR per subset and the average, in percent."""
    names = list(report["subsets"])
    head = "| " + " | ".join(["Condition", *(SUBSET_LABELS[n] for n in names), "Avg"]) + " |"
    rule = "|" + "---|" * (len(names) + 2)
    cells = [f"{100 * report['subsets'][n]['sr']:.1f}" for n in names]
    row = "| " + " | ".join([title, *cells, f"{100 * report['average_sr']:.1f}"]) + " |"
    lines = [
        head,
        rule,
        row,
        "",
        "| Subset | successes / n | SR | Wilson 95% | mean progress | mean reward |",
        "|---|---|---|---|---|---|",
    ]
    for n in names:
        s = report["subsets"][n]
        lines.append(
            f"| {SUBSET_LABELS[n]} | {s['successes']} / {s['n']} | {100 * s['sr']:.1f} | "
            f"[{100 * s['wilson_low']:.1f}, {100 * s['wilson_high']:.1f}] | {s['mean_progress']:.3f} | "
            f"{s['mean_reward']:.3f} |"
        )
    lines += [
        "",
        "Decisions: rejected before the simulator (no skill of EmbodiedBench's list; no step taken), executed "
        "outside the scene-filtered list the prompt showed (sent through the fallback), executed from that list; "
        "invalid actions as EmbodiedBench's evaluator counts them (rejected outputs + failed skills).",
        "",
        "| Subset | rejected | executed outside the list | executed | invalid actions | per episode |",
        "|---|---|---|---|---|---|",
    ]
    for n in names:
        s = report["subsets"][n]
        d = s.get("decisions", {})
        lines.append(
            f"| {SUBSET_LABELS[n]} | {d.get('rejected', 0)} | {d.get('executed_outside_list', 0)} | "
            f"{d.get('executed', 0)} | {d.get('invalid_actions', 0)} | {s.get('mean_invalid_actions', 0.0):.2f} |"
        )
    p = report["pooled"]
    lines.append(f"\nPooled: {p['successes']} / {p['n']} episodes succeeded.")
    if report["failed_episodes"]:
        lines.append(
            f"Failed (crashed) episodes, counted as failures: {len(report['failed_episodes'])}: "
            + ", ".join(report["failed_episodes"][:20])
        )
    return "\n".join(lines) + "\n"


def episode_rows(results: Sequence[Any]) -> list[dict[str, Any]]:
    """Summaries of ``EpisodeResult`` s with the last step's goal-condition ``progress``, the
    decisions per ``execution`` and the episode's ``invalid_actions`` (the last step row's)."""
    rows = []
    for r in results:
        row = r.summary()
        raws = r.stream.raws if r.stream is not None else ()
        row["progress"] = float(raws[-1].meta.get("progress", 0.0)) if raws else 0.0
        for kind in EXECUTIONS:
            row[kind] = sum(1 for step in r.rows if step.get("execution") == kind)
        row["invalid_actions"] = int(r.rows[-1].get("invalid_actions", 0)) if r.rows else 0
        rows.append(row)
    return rows
