"""Evaluation reports (paper appendix C "Common controlled protocol", section "Long-Horizon
Behavior" and appendix C.6 "View-selection distributions").

Per condition: successes over every planned episode (a failed one is a failure, with its
reason) with a Wilson 95% interval and SR per task type; efficiency (prompt and visual tokens,
latencies, stored bytes, invalid actions); ``SR(<=L)`` and the prompt tokens of steps 1..L; the
view-selection marginals of Table C.3 and the joint 144-way ``view_marginal``; the memory
baselines' auxiliary calls and tokens ("All auxiliary model calls and their token or API costs
are included in the efficiency results"). Conditions are compared by paired bootstrap. Reports
are written once: a directory that already holds an evaluation is refused (issue 10).
"""

from __future__ import annotations

import io
import json
import math
from collections import Counter, defaultdict
from collections.abc import Callable, Collection, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from memprism_ray.baselines.memory import memory_totals
from memprism_ray.eval.stats import paired_bootstrap_diff, wilson_interval
from memprism_ray.io_atomic import atomic_write_bytes, atomic_write_text
from memprism_ray.view_space import ALL_ACTIONS, FILTERS, GAMMAS, NUM_ACTIONS, TAUS, WINDOWS, ViewAction

THRESHOLDS: tuple[int, ...] = (5, 10, 15, 20, 25, 30, 35, 40, 45, 50)
#: Failed episodes listed by name in report.md (all of them are in report.json).
_MAX_LISTED = 20


def _mean(xs: Sequence[float]) -> float | None:
    return float(np.mean(xs)) if len(xs) else None


def _pct(xs: Sequence[float], q: float) -> float | None:
    return float(np.percentile(xs, q)) if len(xs) else None


def marginal_entropy(counts: Sequence[float] | np.ndarray) -> float:
    """Entropy in nats of the distribution proportional to ``counts`` (0 for no counts):
    0 when one view is chosen at every decision, ln 144 = 4.97 for a uniform choice."""
    c = np.asarray(counts, dtype=np.float64)
    total = c.sum()
    if total <= 0:
        return 0.0
    p = c[c > 0] / total
    return float(-(p * np.log(p)).sum()) + 0.0  # + 0.0: never print -0.00


def view_marginals(rows: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """Marginal view-selection distributions over the decisions that showed a view."""
    idx = [int(r["view_index"]) for r in rows if int(r.get("view_index", -1)) >= 0]
    joint = np.zeros(NUM_ACTIONS)
    for i in idx:
        joint[i] += 1
    n = len(idx)
    actions = [ALL_ACTIONS[i] for i in idx]
    by_tau = Counter(a.tau for a in actions)
    by_wf = Counter(f"{a.window} / {a.filter}" for a in actions)
    by_gamma = Counter(a.gamma for a in actions)

    def pct(counter: Counter[str], keys: Sequence[str]) -> dict[str, float]:
        return {k: (100.0 * counter[k] / n if n else 0.0) for k in keys}

    return {
        "decisions_with_view": n,
        "entropy_nats": marginal_entropy(joint),
        "tau": pct(by_tau, TAUS),
        "window_filter": pct(by_wf, [f"{w} / {f}" for w in WINDOWS for f in FILTERS]),
        "gamma": pct(by_gamma, GAMMAS),
        "view_marginal": (joint / n).tolist() if n else [0.0] * NUM_ACTIONS,
    }


def condition_report(
    condition: str,
    episodes: Sequence[dict[str, Any]],
    rows: Sequence[dict[str, Any]],
    *,
    tokenizer: str,
    stored_bytes: int | None = None,
    max_steps: int = 50,
) -> dict[str, Any]:
    """Everything appendix C asks of one condition's run; ``episodes`` is the whole plan (issue 10:
    a failed episode stays in every denominator, listed with its error)."""
    done = [e for e in episodes if e["status"] != "failed"]
    failed = [e for e in episodes if e["status"] == "failed"]
    n = len(episodes)
    wins = sum(1 for e in done if e["won"])
    low, high = wilson_interval(wins, n)  # (0, 1) for an empty plan: no information
    per_type: dict[str, dict[str, Any]] = {}
    by_type: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for e in episodes:
        by_type[e["task_type"]].append(e)
    for t in sorted(by_type):
        k = sum(1 for e in by_type[t] if e["won"] and e["status"] != "failed")
        lo, hi = wilson_interval(k, len(by_type[t]))
        per_type[t] = {"successes": k, "n": len(by_type[t]), "sr": k / len(by_type[t]), "wilson95": [lo, hi]}

    prompt = [float(r["prompt_tokens"]) for r in rows]
    visual = [float(r["visual_tokens"]) for r in rows]
    shown = [r for r in rows if r.get("view_medium") == "optical"]
    viewed = [r for r in rows if r.get("view_index", -1) >= 0]
    render = [float(r["compose_ms"]) + float(r["render_ms"]) for r in viewed]
    render_fresh = [float(r["compose_ms"]) + float(r["render_ms"]) for r in viewed if not r.get("view_cached")]
    policy = [float(r["policy_latency_ms"]) for r in rows]
    invalid = sum(1 for r in rows if not r["valid"])
    phi_fallbacks = [r["phi_fallback"] for r in rows if r.get("phi_fallback")]

    # The last threshold is the step limit itself, so the curve ends at the final SR: it counts
    # the steps the limit counts (EB-ALFRED's invalid outputs take no simulator step).
    thresholds = [L for L in THRESHOLDS if max_steps > L] + [max_steps]
    by_len = []
    for L in thresholds:
        won_by = sum(1 for e in done if e["won"] and e.get("env_steps", e["steps"]) <= L)
        tok = [float(r["prompt_tokens"]) for r in rows if int(r["step"]) < L]
        by_len.append({"threshold": L, "sr": (won_by / n if n else 0.0), "prompt_tokens_mean": _mean(tok)})

    return {
        "condition": condition,
        "successes": wins,
        "n": n,
        "sr": (wins / n if n else 0.0),
        "wilson95": [low, high],
        "failed_episodes": len(failed),
        "failure_reasons": failure_reasons(failed),
        "failed": [{"episode_id": e["episode_id"], "error": e.get("error")} for e in failed],
        "per_task_type": per_type,
        "efficiency": {
            "tokenizer": tokenizer,
            "decisions": len(rows),
            "prompt_tokens_mean": _mean(prompt),
            "prompt_tokens_max": max(prompt) if prompt else None,
            "visual_tokens_mean": _mean(visual),
            "pixels_mean": _mean([float(r["pixels"]) for r in shown]),
            "compose_render_ms_mean": _mean(render),
            "compose_render_ms_p50_uncached": _pct(render_fresh, 50),
            "policy_ms_mean": _mean(policy),
            "stored_bytes": stored_bytes,
            "invalid_actions": invalid,
            "invalid_action_rate": (invalid / len(rows) if rows else 0.0),
            "phi_fallbacks": len(phi_fallbacks),
            "phi_fallback_first": phi_fallbacks[0] if phi_fallbacks else None,
            "mean_steps": _mean([float(e["steps"]) for e in done]),
        },
        "by_length": by_len,
        "view_selection": view_marginals(rows),
        "memory": memory_totals(rows),
    }


def failure_kind(error: str | None) -> str:
    """The stage an episode failed in: the prefix of its error (``"policy: ConnectionError:
    ..."`` -> ``"policy"``; ``"broken game: ..."`` -> ``"broken game"``)."""
    if not error:
        return "unknown"
    return error.split(":", 1)[0].strip() or "unknown"


def failure_reasons(failed: Sequence[dict[str, Any]]) -> dict[str, int]:
    """Failed episodes counted by :func:`failure_kind`, most frequent first."""
    return dict(Counter(failure_kind(e.get("error")) for e in failed).most_common())


def _first_line(text: str | None) -> str:
    return (str(text or "").strip().splitlines() or ["(no error recorded)"])[0]


def _reasons_text(reasons: dict[str, int]) -> str:
    return ", ".join(f"{v} {k}" for k, v in reasons.items())


def failure_message(summary: dict[str, Any]) -> str | None:
    """One line saying how many episodes failed and why, or ``None`` when none did."""
    parts = [
        f"{r['condition']}: {r['failed_episodes']} of {r['n']} ({_reasons_text(r['failure_reasons'])})"
        for r in summary["conditions"]
        if r["failed_episodes"]
    ]
    if not parts:
        return None
    total = sum(r["failed_episodes"] for r in summary["conditions"])
    return f"{total} episode(s) failed and count as failures: " + "; ".join(parts)


def _fmt(x: float | None, digits: int = 1) -> str:
    return "-" if x is None or (isinstance(x, float) and math.isnan(x)) else f"{x:.{digits}f}"


def _sr_cells(r: dict[str, Any]) -> str:
    """``successes / n | SR % | [Wilson 95%]`` table cells of one condition's report."""
    low, high = r["wilson95"]
    return f"{r['successes']} / {r['n']} | {100 * r['sr']:.1f} | [{100 * low:.1f}, {100 * high:.1f}]"


def _diff_ci(c: dict[str, Any]) -> str:
    """A paired comparison as ``+d.d [+l.l, +h.h]`` percentage points."""
    if c["diff"] is None:
        return "no common episodes"
    return f"{100 * c['diff']:+.1f} [{100 * c['ci95'][0]:+.1f}, {100 * c['ci95'][1]:+.1f}]"


def _pyplot() -> Any:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _phi_fallback_row(e: Mapping[str, Any]) -> list[str]:
    """The efficiency table's row of an LLM Phi's fallbacks to the rules (none: no row)."""
    if not e.get("phi_fallbacks"):
        return []
    return [f"| Phi extractions by the rules after an LLM failure | {e['phi_fallbacks']} (first: "
            f"{_first_line(e['phi_fallback_first'])}) |"]  # fmt: skip


def condition_markdown(rep: dict[str, Any]) -> str:
    e = rep["efficiency"]
    lines = [
        f"# Evaluation: {rep['condition']}",
        "",
        f"Success: **{rep['successes']} / {rep['n']}** = {100 * rep['sr']:.2f}% "
        f"(Wilson 95% [{100 * rep['wilson95'][0]:.1f}, {100 * rep['wilson95'][1]:.1f}]); "
        f"failed episodes (counted as failures): {rep['failed_episodes']}"
        + (f" ({_reasons_text(rep['failure_reasons'])})" if rep["failed_episodes"] else ""),
        "",
        "| task type | successes | n | SR % |",
        "|---|---:|---:|---:|",
    ]
    for t, v in rep["per_task_type"].items():
        lines.append(f"| {t} | {v['successes']} | {v['n']} | {100 * v['sr']:.1f} |")
    lines += [
        "",
        f"Efficiency (prompt text tokens counted with {e['tokenizer']}):",
        "",
        "| metric | value |",
        "|---|---:|",
        f"| decisions | {e['decisions']} |",
        f"| prompt tokens mean / max | {_fmt(e['prompt_tokens_mean'])} / {_fmt(e['prompt_tokens_max'], 0)} |",
        f"| visual tokens mean | {_fmt(e['visual_tokens_mean'])} |",
        f"| rendered pixels mean | {_fmt(e['pixels_mean'], 0)} |",
        f"| compose+render ms mean (p50 uncached) | {_fmt(e['compose_render_ms_mean'], 2)} "
        f"({_fmt(e['compose_render_ms_p50_uncached'], 2)}) |",
        f"| task-policy ms mean | {_fmt(e['policy_ms_mean'], 2)} |",
        f"| stored event-stream bytes | {e['stored_bytes'] if e['stored_bytes'] is not None else '-'} |",
        f"| invalid actions | {e['invalid_actions']} ({100 * e['invalid_action_rate']:.2f}%) |",
        f"| mean episode length | {_fmt(e['mean_steps'])} |",
        *_phi_fallback_row(e),
        "",
        "SR and prompt tokens by cumulative trajectory-length threshold:",
        "",
        "| steps <= | SR % | prompt tokens |",
        "|---:|---:|---:|",
    ]
    for b in rep["by_length"]:
        lines.append(f"| {b['threshold']} | {100 * b['sr']:.1f} | {_fmt(b['prompt_tokens_mean'])} |")
    if rep.get("memory"):
        lines += _memory_table([rep], "Memory baseline's auxiliary costs (not in the prompt tokens above):")
    if rep["failed"]:
        lines += ["", "Failed episodes:", ""]
        lines += [f"- `{f['episode_id']}`: {_first_line(f['error'])}" for f in rep["failed"][:_MAX_LISTED]]
        if len(rep["failed"]) > _MAX_LISTED:
            lines.append(f"- ... and {len(rep['failed']) - _MAX_LISTED} more (report.json, episodes.parquet)")
    vs = rep["view_selection"]
    if vs["decisions_with_view"]:
        lines += [
            "",
            f"View selection over {vs['decisions_with_view']} decisions (%):",
            "",
            "| choice | % |",
            "|---|---:|",
        ]
        for group in ("tau", "window_filter", "gamma"):
            for k, v in vs[group].items():
                lines.append(f"| {k} | {v:.2f} |")
    return "\n".join(lines) + "\n"


def plot_condition(rep: dict[str, Any], out_dir: Path) -> list[Path]:
    """SR and prompt tokens vs length threshold; view marginals. Returns the PNG paths."""
    plt = _pyplot()
    paths = [out_dir / "sr_tokens_by_length.png"]
    fig, ax = plt.subplots(figsize=(6, 3.5))
    xs = [b["threshold"] for b in rep["by_length"]]
    ax.plot(xs, [100 * b["sr"] for b in rep["by_length"]], "o-", label="SR %")
    ax.set_xlabel("trajectory length threshold (steps <=)")
    ax.set_ylabel("SR %")
    ax2 = ax.twinx()
    ax2.plot(xs, [b["prompt_tokens_mean"] or 0 for b in rep["by_length"]], "^--", color="tab:orange")
    ax2.set_ylabel("prompt tokens")
    ax.set_title(rep["condition"])
    fig.tight_layout()
    save_figure(fig, paths[0])
    vs = rep["view_selection"]
    if vs["decisions_with_view"]:
        fig, axes = plt.subplots(1, 3, figsize=(11, 3.5), gridspec_kw={"width_ratios": [4, 12, 3]})
        for ax, group in zip(axes, ("tau", "window_filter", "gamma"), strict=True):
            keys = list(vs[group])
            ax.bar(range(len(keys)), [vs[group][k] for k in keys])
            ax.set_xticks(range(len(keys)), keys, rotation=70, fontsize=7)
            ax.set_title(group)
        fig.tight_layout()
        paths.append(out_dir / "view_marginals.png")
        save_figure(fig, paths[-1])
    return paths


def paired_comparison(a: dict[str, bool], b: dict[str, bool], *, n_boot: int = 10000, seed: int = 0) -> dict[str, Any]:
    """Paired bootstrap of SR(b) - SR(a) on the common episode ids (none: ``diff`` and ``ci95``
    ``None``, ``n_common`` 0)."""
    if not set(a) & set(b):
        return {"diff": None, "ci95": None, "n_common": 0}
    # paired_bootstrap_diff(x, y) estimates SR(x) - SR(y).
    diff, low, high, n_common = paired_bootstrap_diff(
        {k: int(v) for k, v in b.items()}, {k: int(v) for k, v in a.items()}, n_boot=n_boot, seed=seed
    )
    return {"diff": diff, "ci95": [low, high], "n_common": n_common}


def summary_markdown(reports: Sequence[dict[str, Any]], comparisons: dict[str, dict[str, Any]], base: str) -> str:
    lines = [
        "# Conditions side by side",
        "",
        "| condition | successes / n | SR % | Wilson 95% | failed | prompt tokens mean | visual tokens mean |"
        f" mean steps | diff vs {base} (paired 95% CI) |",
        "|---|---:|---:|---|---:|---:|---:|---:|---|",
    ]
    for r in reports:
        e = r["efficiency"]
        c = comparisons.get(r["condition"])
        cmp = "-" if not c or r["condition"] == base else _diff_ci(c)
        lines.append(
            f"| {r['condition']} | {_sr_cells(r)} | {r['failed_episodes']} | {_fmt(e['prompt_tokens_mean'])} | "
            f"{_fmt(e['visual_tokens_mean'])} | {_fmt(e['mean_steps'])} | {cmp} |"
        )
    lines += _memory_table([r for r in reports if r.get("memory")])
    failed = [r for r in reports if r["failed_episodes"]]
    if failed:
        lines += ["", "Failed episodes count as failures in every SR above:", ""]
        lines += [
            f"- {r['condition']}: {r['failed_episodes']} of {r['n']} ({_reasons_text(r['failure_reasons'])}); "
            "see its report.md"
            for r in failed
        ]
    return "\n".join(lines) + "\n"


_MEMORY_TITLE = "Auxiliary costs of the memory baselines (not in the prompt tokens above):"


def _memory_table(reports: Sequence[dict[str, Any]], title: str = _MEMORY_TITLE) -> list[str]:
    """The memory baselines' auxiliary calls and tokens under ``title`` (nothing without any)."""
    if not reports:
        return []
    lines = [
        "",
        title,
        "",
        "| condition | extra LLM calls | per decision | prompt tokens | completion tokens | tokens per decision |"
        " embedding calls | calls without usage |",
        "|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in reports:
        m = r["memory"]
        lines.append(
            f"| {r['condition']} | {m['llm_calls']} | {m['llm_calls_per_decision']:.2f} | {m['prompt_tokens']} | "
            f"{m['completion_tokens']} | {m['tokens_per_decision']:.1f} | {m['embed_calls']} | "
            f"{m['calls_without_usage']} |"
        )
    return lines


def final_table_markdown(
    reports: Sequence[dict[str, Any]],
    wins_by: dict[str, dict[str, bool]],
    *,
    router: str = "memprism",
    n_boot: int = 10000,
    seed: int = 0,
) -> tuple[str, dict[str, Any]]:
    """The final evaluation of a training run as one table (issue 11, item 3): per condition SR
    and ``router - condition`` (paired bootstrap CI); under it the best minus the worst fixed
    view and the Router's view marginal. Returns the markdown and the figures as a dict."""
    by_name = {r["condition"]: r for r in reports}
    if router not in by_name:
        raise ValueError(f"final table: no {router!r} condition among {sorted(by_name)}")
    figures: dict[str, Any] = {"router": router, "vs_router": {}}
    lines = [
        "| condition | successes / n | SR % | Wilson 95% | Router - this (paired 95% CI) | prompt tokens | "
        "visual tokens | mean steps |",
        "|---|---:|---:|---|---|---:|---:|---:|",
    ]
    for r in reports:
        name = r["condition"]
        e = r["efficiency"]
        if name == router:
            cmp = "-"
        else:
            c = paired_comparison(wins_by[name], wins_by[router], n_boot=n_boot, seed=seed)
            figures["vs_router"][name] = c
            cmp = _diff_ci(c)
        lines.append(
            f"| {name} | {_sr_cells(r)} | {cmp} | "
            f"{_fmt(e['prompt_tokens_mean'])} | {_fmt(e['visual_tokens_mean'])} | {_fmt(e['mean_steps'])} |"
        )
    tokenizers = sorted({r["efficiency"]["tokenizer"] for r in reports})
    lines += ["", f"Prompt text tokens counted with {'; '.join(tokenizers)}; visual tokens of the view image."]
    fixed = [r for r in reports if r["condition"].startswith("fixed:")]
    if len(fixed) >= 2:
        best = max(fixed, key=lambda r: r["sr"])
        worst = min(fixed, key=lambda r: r["sr"])
        c = paired_comparison(wins_by[worst["condition"]], wins_by[best["condition"]], n_boot=n_boot, seed=seed)
        figures["fixed_spread"] = {"best": best["condition"], "worst": worst["condition"], **c}
        if c["diff"] is not None:
            lines.append(
                f"Fixed views: best {best['condition']} ({100 * best['sr']:.1f}%) - worst {worst['condition']} "
                f"({100 * worst['sr']:.1f}%) = {_diff_ci(c)} (paired 95% CI)."
            )
    vs = by_name[router]["view_selection"]
    marginal = np.asarray(vs["view_marginal"], dtype=np.float64)
    entropy = marginal_entropy(marginal)
    figures["router_entropy_nats"] = entropy
    figures["router_distinct_views"] = int((marginal > 0).sum())
    top = [(ALL_ACTIONS[i].name, marginal[i]) for i in np.argsort(-marginal)[:5] if marginal[i] > 0]
    lines.append(
        f"{router} view marginal over {vs['decisions_with_view']} decisions: entropy {entropy:.2f} nats "
        f"(one view: 0; uniform over 144: {math.log(NUM_ACTIONS):.2f}), {figures['router_distinct_views']} "
        "distinct views; top: " + ", ".join(f"{n} {100 * p:.0f}%" for n, p in top) + "."
    )
    with_memory = [r for r in reports if r.get("memory")]
    if with_memory:
        figures["memory"] = {r["condition"]: r["memory"] for r in with_memory}
    lines += _memory_table(with_memory)
    return "\n".join(lines) + "\n", figures


def replayed_span(replay_first: int, iterations: int) -> int:
    """The first/last span that played the same games (``grpo.replay_first``) among ``iterations``
    logged ones: ``replay_first`` when both spans fit without overlapping, else 0 (no span)."""
    return replay_first if 0 < replay_first <= iterations // 2 else 0


def plot_training_success(iterations: Sequence[dict[str, Any]], path: Path, replay_first: int = 0) -> Path:
    """Success rate (and zero-std group fraction, when logged) per GRPO iteration, as a PNG;
    ``replay_first`` N shades the first and the last N iterations, which played the same games."""
    plt = _pyplot()
    its = sorted(iterations, key=lambda r: int(r["step"]))
    xs = [int(r["step"]) for r in its]
    fig, ax = plt.subplots(figsize=(6, 3.5))
    ax.plot(xs, [float(r["success_rate"]) for r in its], "o-", label="training success rate")
    if any("zero_std_group_frac" in r for r in its):
        ax.plot(
            xs, [float(r.get("zero_std_group_frac", float("nan"))) for r in its], "s--", label="zero-std group fraction"
        )
    span = replayed_span(replay_first, len(xs))
    if span:
        for lo, hi, label in ((xs[0], xs[span - 1], "same games"), (xs[-span], xs[-1], None)):
            ax.axvspan(lo - 0.5, hi + 0.5, color="tab:green", alpha=0.12, label=label)
    ax.set_xlabel("GRPO iteration")
    ax.set_ylim(-0.02, 1.02)
    ax.legend(fontsize=8)
    ax.set_title("D2 (grouped GRPO) training")
    fig.tight_layout()
    save_figure(fig, path)
    return path


def save_figure(fig: Any, path: Path) -> None:
    """A PNG written atomically, never over an existing file (issue 10); the figure is closed."""
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=100)
    atomic_write_bytes(path, buf.getvalue())
    _pyplot().close(fig)


def write_json(path: Path, data: Any) -> None:
    """JSON written atomically, never over an existing file (issue 10)."""
    atomic_write_text(path, json.dumps(data, indent=2, sort_keys=False, default=_json_default))


def _json_default(o: Any) -> Any:
    if isinstance(o, (np.floating, np.integer)):
        return o.item()
    if isinstance(o, np.ndarray):
        return o.tolist()
    if isinstance(o, ViewAction):
        return o.to_dict()
    if isinstance(o, Path):
        return str(o)
    raise TypeError(f"not JSON-serialisable: {type(o).__name__}")


class InterruptedEvaluation(FileExistsError):
    """An output directory with some conditions' reports and no summary: an evaluation that was
    stopped (or failed) before its last condition; or one whose summary counts failed episodes
    (a lost worker's, an endpoint's) that a continuation plays again."""


def written_conditions(out: Path) -> list[str]:
    """The conditions (folder names) whose report an evaluation in ``out`` has written."""
    return sorted(p.parent.name for p in out.glob("*/report.json"))


def check_fresh_output(out: Path, *, resume: bool = False) -> None:
    """Refuse an output directory that already holds an evaluation (issue 10), finished or, unless
    the evaluation continues it (``resume``), interrupted or ended with failed episodes a new
    play may finish (:class:`InterruptedEvaluation`: its :data:`PROGRESS` record is kept), and
    one that a file stands in the way of (``out`` itself, or a folder above it)."""
    blocking = next((p for p in (out, *out.parents) if p.exists() and not p.is_dir()), None)
    if blocking is not None:
        raise FileExistsError(f"--out {out}: {blocking} is a file, not a folder; choose another --out")
    if out.exists() and any(out.glob("summary.*")):
        if (out / PROGRESS).exists() and not resume:  # kept by an evaluation that ended with failed episodes
            raise InterruptedEvaluation(
                f"{out} holds an evaluation with failed episodes (its summary says which): play them again with "
                "--run.resume auto (only they are played), or choose another --out"
            )
        if not (out / PROGRESS).exists():
            raise FileExistsError(f"{out} already holds an evaluation (its summary); choose another --out")
        return
    done = written_conditions(out)
    if done and not resume:
        raise InterruptedEvaluation(
            f"{out} holds an interrupted evaluation (report.json of {', '.join(done)}; no summary): "
            "continue it with --run.resume auto (the conditions it finished are kept), remove it or choose another "
            "--out"
        )


#: The reports of the conditions an evaluation has finished, rewritten after each one and removed
#: with the summary (kept when episodes failed that a new play may finish): what a continued
#: evaluation keeps (``evaluate(resume=True)``).
PROGRESS = "progress.json"


def write_progress(out: Path, reports: Mapping[str, Any], summary_files: Sequence[str] = ()) -> None:
    """``summary_files``: the files of the summary of an evaluation that ended with failed
    episodes, which its continuation writes anew."""
    record = {"reports": reports, "summary_files": list(summary_files)}
    atomic_write_text(out / PROGRESS, json.dumps(record, default=_json_default) + "\n", overwrite=True)


def summary_files(out: Path) -> list[str]:
    """The summary files :func:`write_progress` recorded in ``out`` ([] for none or unreadable)."""
    try:
        return [str(name) for name in json.loads((out / PROGRESS).read_text()).get("summary_files", [])]
    except (OSError, ValueError, AttributeError, TypeError):
        return []


def read_progress(out: Path, say: Callable[[str], None] = print) -> dict[str, Any]:
    """The finished conditions' reports an interrupted evaluation in ``out`` recorded ({} for none;
    an unreadable record is a line saying so: its conditions are played again, not silently)."""
    path = out / PROGRESS
    if not path.exists():
        return {}
    try:
        return dict(json.loads(path.read_text())["reports"])
    except (OSError, ValueError, KeyError, TypeError) as exc:
        say(f"eval: {path} unreadable ({type(exc).__name__}: {exc}): the conditions it recorded are played again")
        return {}


def write_condition(
    condition: str,
    results: Sequence[Any],
    rows: Sequence[dict[str, Any]],
    out_dir: Path,
    manifest: Any,
    *,
    tokenizer: str,
    max_steps: int,
    artifacts: int,
    on_disk: Collection[str] = (),
) -> dict[str, Any]:
    """Write one condition's tables, the first ``artifacts`` episodes' artifacts (but those of
    the episodes ``on_disk`` names, written by the evaluation it continues), the manifest, report
    and plots; return the report. ``results``: an ``EpisodeResult`` per planned episode."""
    import shutil

    import pyarrow as pa

    from memprism_ray.agent import rows_to_arrow
    from memprism_ray.eval.artifacts import STREAMS, safe_name, streams_table, write_episode_artifacts

    out_dir.mkdir(parents=True, exist_ok=True)
    episodes = [r.summary() for r in results]
    _write_parquet(pa.Table.from_pylist(episodes), out_dir / "episodes.parquet")
    if rows:
        _write_parquet(rows_to_arrow(rows), out_dir / "steps.parquet")
    _write_parquet(streams_table(results), out_dir / STREAMS)
    stored = sum(r.stream.to_arrow().nbytes for r in results)
    for r in results[:artifacts]:
        if r.spec.episode_id not in on_disk:
            shutil.rmtree(out_dir / "episodes" / safe_name(r.spec.episode_id), ignore_errors=True)  # a failed try's
            write_episode_artifacts(r, out_dir / "episodes")
    manifest.save(out_dir / "manifest.json")
    rep = condition_report(condition, episodes, rows, tokenizer=tokenizer, stored_bytes=stored, max_steps=max_steps)
    write_json(out_dir / "report.json", rep)
    atomic_write_text(out_dir / "report.md", condition_markdown(rep))
    plot_condition(rep, out_dir)
    return rep


def write_summary(
    out: Path, reports: Sequence[dict[str, Any]], results_by: Mapping[str, Sequence[Any]], *, seed: int
) -> dict[str, Any]:
    """Write and return ``summary.json`` / ``summary.md``: conditions side by side, paired against
    the first (a failed episode is a failure there too)."""
    outcomes = {c: {r.spec.episode_id: bool(r.won and not r.failed) for r in rs} for c, rs in results_by.items()}
    base = next(iter(outcomes))
    comparisons = {c: paired_comparison(outcomes[base], outcomes[c], seed=seed) for c in outcomes}
    summary = {
        "base": base,
        "conditions": list(reports),
        "paired_vs_base": comparisons,
        "failed_episodes": sum(r["failed_episodes"] for r in reports),
    }
    if "memprism" in outcomes:
        # One table of every condition against the trained Router (issue 11, item 3).
        table, figures = final_table_markdown(list(reports), outcomes, router="memprism", seed=seed)
        summary["final_table"] = figures
        atomic_write_text(out / "final_table.md", table)
    write_json(out / "summary.json", summary)
    atomic_write_text(out / "summary.md", summary_markdown(list(reports), comparisons, base))
    return summary


def _write_parquet(table: Any, path: Path) -> None:
    import pyarrow.parquet as pq

    buf = io.BytesIO()
    pq.write_table(table, buf)
    atomic_write_bytes(path, buf.getvalue())
