"""Dashboard metrics (``ray.util.metrics``), exported by every Ray process as
``ray_memprism_<name>``: the driver records per-iteration values, rollout workers per-decision
ones. Metric objects are created lazily, once per process, because they must live in the
process that records them.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from ray.util import metrics as rm

_LATENCY_MS = [0.5, 1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 5000]
_TOKENS = [64, 128, 256, 512, 768, 1024, 1536, 2048, 4096]

_GAUGES = {
    "iteration": "GRPO iteration just finished",
    "success_rate": "fraction of trajectories that succeeded in the iteration",
    "mean_return": "mean trajectory return in the iteration",
    "mean_episode_length": "mean trajectory length (steps) in the iteration",
    "grpo_loss": "GRPO loss",
    "grpo_kl": "KL(pi_ref || pi) of the update",
    "grpo_entropy": "Router entropy of the update",
    "grpo_clip_fraction": "fraction of clipped ratios",
    "zero_std_group_fraction": "fraction of groups whose returns had zero std",
    "iteration_seconds": "wall time of the iteration",
    "weights_version": "Router weights version used by the rollouts",
    "fleet_size": "rollout workers playing when the iteration's groups were dispatched",
    "rollout_phase_seconds": "wall time of the iteration's rollouts",
    "update_phase_seconds": "wall time of the iteration's learner update",
}
#: The iteration statistic each gauge shows, where its name differs.
_STAT_OF_GAUGE = {
    "grpo_loss": "loss",
    "grpo_kl": "kl",
    "grpo_entropy": "entropy",
    "grpo_clip_fraction": "clip_frac",
    "zero_std_group_fraction": "zero_std_group_frac",
}
_COUNTERS = {
    "trajectories": "trajectories played",
    "failed_trajectories": "trajectories failed by infrastructure (actor death, timeout)",
    "groups_rerun": "groups re-run after failed trajectories",
    "workers_replaced": "rollout workers replaced (hung, dead, failing)",
    "workers_lost": "rollout workers lost with their node",
    "learner_restarts": "times a lost Learner was started again from the last checkpoint",
    "iterations_replayed": "iterations played again (after a Learner restart, or step tables lost with a node)",
    "decisions": "view decisions taken",
    "view_selections": "view decisions by factor value",
}
_HISTOGRAMS = {
    "render_ms": ("compose + render latency per view (ms)", _LATENCY_MS),
    "policy_ms": ("task-policy latency per decision (ms)", _LATENCY_MS),
    "env_ms": ("environment step latency per decision (ms)", _LATENCY_MS),
    "prompt_tokens": ("prompt tokens per decision", _TOKENS),
    "visual_tokens": ("visual tokens of the view per decision", _TOKENS),
}

_cache: dict[str, Any] = {}


def _metric(name: str) -> Any:
    m = _cache.get(name)
    if m is not None:
        return m
    full = f"memprism_{name}"
    if name in _GAUGES:
        m = rm.Gauge(full, description=_GAUGES[name], tag_keys=("run",))
    elif name == "view_selections":
        m = rm.Counter(full, description=_COUNTERS[name], tag_keys=("run", "factor", "value"))
    elif name in _COUNTERS:
        m = rm.Counter(full, description=_COUNTERS[name], tag_keys=("run",))
    elif name in _HISTOGRAMS:
        desc, bounds = _HISTOGRAMS[name]
        m = rm.Histogram(full, description=desc, boundaries=bounds, tag_keys=("run",))
    else:  # pragma: no cover - programming error
        raise KeyError(name)
    _cache[name] = m
    return m


def record_iteration(run: str, stats: Mapping[str, float]) -> None:
    """Driver side: one GRPO iteration's statistics."""
    tags = {"run": run}
    for metric in _GAUGES:
        key = _STAT_OF_GAUGE.get(metric, metric)
        if key in stats and stats[key] is not None:
            _metric(metric).set(float(stats[key]), tags=tags)
    for counter in (
        "trajectories",
        "failed_trajectories",
        "groups_rerun",
        "workers_replaced",
        "workers_lost",
        "learner_restarts",
        "iterations_replayed",
    ):
        if stats.get(counter):
            _metric(counter).inc(float(stats[counter]), tags=tags)


def record_steps(run: str, rows: Sequence[Mapping[str, Any]]) -> None:
    """Rollout side: per-decision latencies, tokens and view choices."""
    if not rows:
        return
    tags = {"run": run}
    _metric("decisions").inc(float(len(rows)), tags=tags)
    for r in rows:
        if r.get("view_index", -1) >= 0:
            if not r.get("view_cached"):
                _metric("render_ms").observe(float(r["compose_ms"]) + float(r["render_ms"]), tags=tags)
            tau, window, filt, gamma = str(r["view"]).split("/")
            for factor, value in (("tau", tau), ("window", window), ("filter", filt), ("gamma", gamma)):
                _metric("view_selections").inc(1.0, tags={"run": run, "factor": factor, "value": value})
        _metric("policy_ms").observe(float(r.get("policy_ms", 0.0)), tags=tags)
        _metric("env_ms").observe(float(r.get("env_ms", 0.0)), tags=tags)
        _metric("prompt_tokens").observe(float(r["prompt_tokens"]), tags=tags)
        _metric("visual_tokens").observe(float(r["visual_tokens"]), tags=tags)
