"""Mind2Web metrics and reports (paper "Benchmarks": "We report step-level action accuracy
and exact episode success"; Table "Main results": Test-Task, Test-Website, Test-Domain and
overall action accuracy; appendix C "Common controlled protocol": raw counts, Wilson 95%
intervals, paired comparisons on the same ordered items).

* Step action accuracy of a split: correct steps / recorded human steps of its planned tasks
  (a failed episode's unplayed steps count as wrong: never a smaller denominator).
* Exact episode success: every step of the task correct; ``overall``: all splits pooled.
* Paired bootstrap against a base condition over the common steps (``episode_id#step``) and
  the common episodes.

Beside them, under ``metric_py``, Mind2Web's metrics as its ``src/action_prediction/metric.py``
computes them from each step's element correctness and operation F1: element accuracy (a step
none of whose positives is in the pool is wrong), operation F1, step success, their macro
means over tasks (``marco_*``), task success and the positives in the pool ("Recall Cap @ 50").
They are MindAct's protocol only on MindAct's candidate pool (``mind2web.candidate_scores``);
every report names the pool it was played on. Every printed figure carries the name of its rule
(:data:`RULES`, also in each ``mind2web.json``): the paper's step accuracy and episode success;
MindAct's element accuracy, op F1, step SR and task SR (issue 41 item 3).
"""

from __future__ import annotations

import json
from collections import defaultdict
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from memprism_ray.eval import report as rpt
from memprism_ray.eval.compare import (
    OUTCOME_COLUMNS,
    Outcomes,
    episode_outcomes,
    episode_splits,
    read_episodes,
    read_table,
)
from memprism_ray.eval.stats import wilson_interval
from memprism_ray.io_atomic import atomic_write_text

OVERALL = "overall"

#: Each reported figure's rule, printed beside it (docs/mind2web.md "Metrics and reports").
RULES: dict[str, str] = {
    "step_accuracy": "paper's step accuracy (appendix E.5): the step's one valid JSON action has the human's "
    "op (upper-cased), a positive ref and the human's value (whitespace collapsed, case folded; none for CLICK)",
    "episode_success": "paper's episode success: every recorded step of the task correct by the paper's step rule",
    "element_accuracy": "MindAct element accuracy (metric.py): the ref written is a positive candidate in the pool",
    "operation_f1": "MindAct op F1 (metric.py calculate_f1): F1 of the whitespace-token sets of the 'OP value' "
    "written (also by an output the paper's parser rejects) and the recorded one, case kept",
    "step_success": "MindAct step SR (metric.py step_acc): element correct and op F1 = 1",
    "task_success": "MindAct task SR: every step of the task a MindAct step success",
    "macro": "MindAct macro (metric.py marco_*): the mean over each task's steps, then over tasks",
    "positives_in_pool": "MindAct Recall Cap @ top-k: steps with a positive candidate in the pool",
}


def _per_step(
    episodes: Sequence[Mapping[str, Any]],
    rows: Sequence[Mapping[str, Any]],
    expected_steps: Mapping[str, int],
    value: Callable[[Mapping[str, Any]], Any],
    missing: Any,
) -> dict[str, dict[int, Any]]:
    """``{episode_id: {step: value(row)}}`` over every recorded human step of every planned
    episode; ``missing`` for a step without a row (a failed or cut-off episode)."""
    got = {(str(r["episode_id"]), int(r["step"])): value(r) for r in rows}
    out: dict[str, dict[int, Any]] = {}
    for e in episodes:
        eid = str(e["episode_id"])
        out[eid] = {t: got.get((eid, t), missing) for t in range(int(expected_steps.get(eid, e.get("steps", 0))))}
    return out


def step_outcomes(
    episodes: Sequence[Mapping[str, Any]], rows: Sequence[Mapping[str, Any]], expected_steps: Mapping[str, int]
) -> dict[str, int]:
    """``{"<episode_id>#<step>": 0/1}`` over every recorded human step of every planned episode."""
    per = _per_step(episodes, rows, expected_steps, lambda r: int(bool(r.get("correct", False))), 0)
    return {f"{eid}#{t}": v for eid, steps in per.items() for t, v in steps.items()}


def metric_py_step_scores(
    episodes: Sequence[Mapping[str, Any]], rows: Sequence[Mapping[str, Any]], expected_steps: Mapping[str, int]
) -> dict[str, dict[int, tuple[bool, float]]]:
    """``{episode_id: {step: (element_correct, op_f1)}}``; an unplayed step scores ``(False, 0.0)``."""
    score = lambda r: (bool(r.get("element_correct", False)), float(r.get("op_f1", 0.0)))  # noqa: E731
    return _per_step(episodes, rows, expected_steps, score, (False, 0.0))


def _mean(values: Sequence[float]) -> float:
    return sum(values) / len(values) if values else 0.0


def metric_py_metrics(
    per_task: Mapping[str, Mapping[int, tuple[bool, float]]], in_pool: Mapping[str, Sequence[bool]] | None = None
) -> dict[str, Any]:
    """Mind2Web metric.py's metrics over ``per_task`` (see the module docstring); ``in_pool``:
    per task, whether each step has a positive candidate in the pool."""
    steps = [v for task in per_task.values() for v in task.values()]
    success = [el and f1 == 1.0 for el, f1 in steps]
    tasks = [list(t.values()) for t in per_task.values() if t]
    return {
        "element_accuracy": _rate(sum(el for el, _ in steps), len(steps)),
        "operation_f1": {"mean": _mean([f1 for _, f1 in steps]), "n": len(steps)},
        "step_success": _rate(sum(success), len(steps)),
        "macro_element_accuracy": _mean([_mean([float(el) for el, _ in t]) for t in tasks]),
        "macro_operation_f1": _mean([_mean([f1 for _, f1 in t]) for t in tasks]),
        "macro_step_success": _mean([_mean([float(el and f1 == 1.0) for el, f1 in t]) for t in tasks]),
        "task_success": _rate(sum(all(el and f1 == 1.0 for el, f1 in t) for t in tasks), len(per_task)),
        "positives_in_pool": None
        if in_pool is None
        else _rate(sum(sum(map(bool, in_pool[e])) for e in per_task), sum(len(in_pool[e]) for e in per_task)),
    }


def _rate(k: int, n: int) -> dict[str, Any]:
    lo, hi = wilson_interval(k, n)
    return {"correct": k, "n": n, "rate": k / n if n else 0.0, "wilson95": [lo, hi]}


def mind2web_metrics(
    episodes: Sequence[Mapping[str, Any]],
    rows: Sequence[Mapping[str, Any]],
    expected_steps: Mapping[str, int],
    in_pool: Mapping[str, Sequence[bool]] | None = None,
) -> dict[str, Any]:
    """Per split and ``overall``: step action accuracy and exact episode success with Wilson
    95% intervals, invalid predictions and failed episodes, and Mind2Web's own metrics
    (``metric_py``); ``in_pool``: per episode id, whether each recorded step has a positive
    candidate in the pool (optional)."""
    split_of = {str(e["episode_id"]): str(e["split"]) for e in episodes}
    steps = step_outcomes(episodes, rows, expected_steps)
    scores = metric_py_step_scores(episodes, rows, expected_steps)
    wins = episode_outcomes(episodes)
    by_split: dict[str, list[str]] = defaultdict(list)
    for e in episodes:
        by_split[str(e["split"])].append(str(e["episode_id"]))
    played = defaultdict(int)
    invalid = defaultdict(int)
    for r in rows:
        s = split_of.get(str(r["episode_id"]), "?")
        played[s] += 1
        invalid[s] += int(not r.get("valid", True))
    out: dict[str, Any] = {}
    groups = {**dict(by_split), OVERALL: [i for ids in by_split.values() for i in ids]}
    for name, ids in groups.items():
        chosen = set(ids)
        step_vals = [v for k, v in steps.items() if k.rsplit("#", 1)[0] in chosen]
        ep_vals = [wins[i] for i in ids]
        splits = list(by_split) if name == OVERALL else [name]
        failed = sum(1 for e in episodes if str(e["episode_id"]) in chosen and e["status"] == "failed")
        out[name] = {
            "step_accuracy": _rate(sum(step_vals), len(step_vals)),
            "episode_success": _rate(sum(ep_vals), len(ep_vals)),
            "steps_played": sum(played[s] for s in splits),
            "invalid_predictions": sum(invalid[s] for s in splits),
            "failed_episodes": failed,
            "metric_py": metric_py_metrics({i: scores[i] for i in ids}, in_pool),
        }
    return out


def write_condition_metrics(
    rep: dict[str, Any],
    results: Sequence[Any],
    rows: Sequence[dict[str, Any]],
    out_dir: Path,
    *,
    expected_steps: Mapping[str, int],
    candidate_pool: Mapping[str, Any],
    in_pool: Mapping[str, Sequence[bool]] | None = None,
) -> dict[str, Any]:
    """The Mind2Web metrics of one condition added to its generic report ``rep`` (under
    ``rep["mind2web"]``, the pool under ``rep["mind2web_pool"]``) and written beside it as
    ``mind2web.json`` / ``mind2web.md``."""
    condition = rep["condition"]
    episodes = [r.summary() for r in results]
    rep["mind2web"] = metrics = mind2web_metrics(episodes, rows, expected_steps, in_pool)
    rep["mind2web_pool"] = candidate_pool
    # Each planned episode's recorded steps: what `memprism compare` counts a failed or cut-off
    # episode's unplayed steps against, as the metrics above do.
    expected = {
        str(e["episode_id"]): int(expected_steps.get(str(e["episode_id"]), e.get("steps", 0))) for e in episodes
    }
    doc = {"condition": condition, "candidate_pool": candidate_pool, "rules": RULES, **metrics}
    doc["expected_steps"] = expected
    rpt.write_json(out_dir / "mind2web.json", doc)
    md = metrics_markdown(metrics, candidate_pool)
    atomic_write_text(out_dir / "mind2web.md", f"# Mind2Web: {condition}\n\n{md}\n")
    return rep


def compared_outcomes(condition_dir: Path) -> list[Outcomes]:
    """What ``memprism compare`` pairs for one Mind2Web condition: the paper's step accuracy
    per recorded step (a failed episode's unplayed steps wrong), then exact episode success."""
    episodes = read_episodes(condition_dir, (*OUTCOME_COLUMNS, "steps"))
    path = condition_dir / "mind2web.json"
    try:
        expected = json.loads(path.read_text())["expected_steps"]
    except (OSError, ValueError, KeyError) as exc:
        raise ValueError(
            f"{path}: no expected_steps ({type(exc).__name__}: {exc}): the step accuracy of a Mind2Web "
            "evaluation is compared from the mind2web.json an evaluation of this version writes"
        ) from None
    rows = read_table(condition_dir / "steps.parquet", ("episode_id", "step", "correct"))
    steps = step_outcomes(episodes, rows, expected)
    splits = episode_splits(episodes)
    step_splits = {k: splits[k.rsplit("#", 1)[0]] for k in steps if k.rsplit("#", 1)[0] in splits}
    return [
        Outcomes("step_accuracy", "step accuracy", "steps", {k: bool(v) for k, v in steps.items()}, step_splits),
        Outcomes("episode_success", "episode success", "episodes", episode_outcomes(episodes), splits),
    ]


def _pct(rate: Mapping[str, Any]) -> str:
    lo, hi = rate["wilson95"]
    return f"{100 * rate['rate']:.2f} ({rate['correct']}/{rate['n']}; [{100 * lo:.1f}, {100 * hi:.1f}])"


def _pct_mean(value: float) -> str:
    return f"{100 * value:.2f}"


def pool_note(candidate_pool: Mapping[str, Any]) -> str:
    """The sentence every Mind2Web report puts above metric.py's figures."""
    what = candidate_pool["description"]
    if candidate_pool["protocol"] == "mindact":
        return f"Candidate pool: {what}; a step none of whose positives is in it is wrong (metric.py)."
    return (
        f"Candidate pool: {what}, not MindAct's top-50 protocol: these figures are not comparable with "
        "published Mind2Web results (set mind2web.candidate_scores: docs/mind2web.md)."
    )


def rule_lines(*keys: str) -> list[str]:
    """``- <rule>`` for each figure of ``keys`` (:data:`RULES`)."""
    return [f"- {RULES[k]}." for k in keys]


def metric_py_markdown(metrics: Mapping[str, Any], candidate_pool: Mapping[str, Any]) -> str:
    """MindAct's metrics per split: micro (over steps) and macro (over tasks)."""
    lines = [
        "## MindAct's metrics (Mind2Web src/action_prediction/metric.py)",
        "",
        "The only figures here comparable with published MindAct numbers (on MindAct's candidate pool).",
        "",
        pool_note(candidate_pool),
        "",
        *rule_lines("element_accuracy", "operation_f1", "step_success", "task_success", "macro", "positives_in_pool"),
        "",
        "| split | MindAct element accuracy % (k/n; Wilson 95%) | MindAct op F1 % "
        "| MindAct step SR % (k/n; Wilson 95%) | MindAct macro element accuracy % | MindAct macro op F1 % "
        "| MindAct macro step SR % | MindAct task SR % (k/n; Wilson 95%) "
        "| MindAct positive in pool (Recall Cap) % (k/n; Wilson 95%) |",
        "|---|---|---:|---|---:|---:|---:|---|---|",
    ]
    for name, m in metrics.items():
        o = m["metric_py"]
        cover = "-" if o.get("positives_in_pool") is None else _pct(o["positives_in_pool"])
        lines.append(
            f"| {name} | {_pct(o['element_accuracy'])} | {_pct_mean(o['operation_f1']['mean'])} "
            f"| {_pct(o['step_success'])} | {_pct_mean(o['macro_element_accuracy'])} "
            f"| {_pct_mean(o['macro_operation_f1'])} | {_pct_mean(o['macro_step_success'])} "
            f"| {_pct(o['task_success'])} | {cover} |"
        )
    return "\n".join(lines)


def metrics_markdown(metrics: Mapping[str, Any], candidate_pool: Mapping[str, Any]) -> str:
    lines = [
        "## The paper's metrics (teacher-forced replay)",
        "",
        *rule_lines("step_accuracy", "episode_success"),
        "",
        "| split | paper step accuracy % (k/n; Wilson 95%) | paper episode success % (k/n; Wilson 95%) |"
        " invalid predictions (paper's parser) | failed episodes |",
        "|---|---|---|---:|---:|",
    ]
    for name, m in metrics.items():
        lines.append(
            f"| {name} | {_pct(m['step_accuracy'])} | {_pct(m['episode_success'])} | {m['invalid_predictions']} "
            f"| {m['failed_episodes']} |"
        )
    return "\n".join(lines) + "\n\n" + metric_py_markdown(metrics, candidate_pool)


def write_summary(
    out: Path,
    reports: Sequence[Mapping[str, Any]],
    results_by: Mapping[str, Sequence[Any]],
    rows_by: Mapping[str, Sequence[Mapping[str, Any]]],
    expected_steps: Mapping[str, int],
    *,
    candidate_pool: Mapping[str, Any],
    seed: int = 0,
) -> dict[str, Any]:
    """``mind2web.json`` / ``mind2web.md``: every condition's metrics per split side by side,
    and paired differences (step accuracy, episode success) against the first condition;
    ``candidate_pool``: the pool every condition was played on (one config)."""
    conditions = list(results_by)
    base = conditions[0]
    eps = {c: [r.summary() for r in rs] for c, rs in results_by.items()}
    steps = {c: step_outcomes(eps[c], rows_by.get(c, []), expected_steps) for c in conditions}
    wins = {c: episode_outcomes(eps[c]) for c in conditions}
    split_of = {str(e["episode_id"]): str(e["split"]) for e in eps[base]}
    splits = list(dict.fromkeys(split_of.values()))  # plan order
    paired: dict[str, Any] = {}
    for c in conditions:
        paired[c] = {}
        for s in [*splits, OVERALL]:
            keep = lambda eid, s=s: s == OVERALL or split_of.get(eid) == s  # noqa: E731
            step_pair = [{k: bool(v) for k, v in steps[x].items() if keep(k.rsplit("#", 1)[0])} for x in (base, c)]
            win_pair = [{k: v for k, v in wins[x].items() if keep(k)} for x in (base, c)]
            paired[c][s] = {
                "step_accuracy": rpt.paired_comparison(*step_pair, seed=seed),
                "episode_success": rpt.paired_comparison(*win_pair, seed=seed),
            }
    summary = {
        "base": base,
        "candidate_pool": candidate_pool,
        "rules": RULES,
        "splits": splits,
        "metrics": {r["condition"]: r["mind2web"] for r in reports},
        "paired_vs_base": paired,
        "failed_episodes": sum(int(r["failed_episodes"]) for r in reports),
    }
    rpt.write_json(out / "mind2web.json", summary)
    atomic_write_text(out / "mind2web.md", summary_markdown(summary))
    return summary


def _diff(c: Mapping[str, Any]) -> str:
    if c["diff"] is None:
        return "-"
    lo, hi = c["ci95"]
    return f"{100 * c['diff']:+.2f} [{100 * lo:+.1f}, {100 * hi:+.1f}]"


def _metric_py_cell(m: Mapping[str, Any]) -> str:
    o = m.get("metric_py")
    if o is None:
        return "-"
    return (
        f"{_pct_mean(o['element_accuracy']['rate'])} / {_pct_mean(o['operation_f1']['mean'])} / "
        f"{_pct_mean(o['step_success']['rate'])} / {_pct_mean(o['task_success']['rate'])}"
    )


def summary_markdown(summary: Mapping[str, Any]) -> str:
    base = summary["base"]
    cols = [*summary["splits"], OVERALL]

    def table(cell: Callable[[Mapping[str, Any]], str]) -> list[str]:
        """A row per condition, a column per split: ``cell`` of its metrics there, ``-`` without."""
        lines = ["| condition | " + " | ".join(cols) + " |", "|---|" + "---|" * len(cols)]
        for c, m in summary["metrics"].items():
            lines.append(f"| {c} | " + " | ".join(cell(m[s]) if s in m else "-" for s in cols) + " |")
        return lines

    lines = [
        "# Mind2Web: conditions side by side (teacher-forced replay)",
        "",
        "Paper step accuracy % per split (k/n; Wilson 95%). Rule: " + RULES["step_accuracy"] + ".",
        "",
        *table(lambda m: _pct(m["step_accuracy"])),
        "",
        "Paper episode success % per split (k/n; Wilson 95%). Rule: " + RULES["episode_success"] + ".",
        "",
        *table(lambda m: _pct(m["episode_success"])),
        "",
        "MindAct's metrics (Mind2Web src/action_prediction/metric.py; the only figures here comparable with "
        "published MindAct numbers) per split, micro over steps in %: MindAct element accuracy / MindAct op F1 / "
        "MindAct step SR / MindAct task SR. Rules:",
        "",
        *rule_lines("element_accuracy", "operation_f1", "step_success", "task_success"),
        "",
        pool_note(summary["candidate_pool"]),
        "",
        *table(_metric_py_cell),
        "",
        f"Paired differences vs {base} in points (paired bootstrap 95% CI): paper step accuracy / paper episode "
        "success.",
        "",
        "| condition | " + " | ".join(cols) + " |",
        "|---|" + "---|" * len(cols),
    ]
    for c, per in summary["paired_vs_base"].items():
        if c == base:
            continue
        cells = [f"{_diff(per[s]['step_accuracy'])} / {_diff(per[s]['episode_success'])}" for s in cols]
        lines.append(f"| {c} | " + " | ".join(cells) + " |")
    if summary["failed_episodes"]:
        lines += ["", f"Failed episodes (counted as failures, unplayed steps as wrong): {summary['failed_episodes']}"]
    return "\n".join(lines) + "\n"
