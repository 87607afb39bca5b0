"""EB-ALFRED (paper "Benchmarks"; Table A.4 "D1, ALFRED path" and "GRPO, ALFRED path": 30
steps, reward success + 0.2 x goal-condition progress, no entropy bonus; docs/ebalfred.md):
AI2-THOR through EmbodiedBench, or the fixture that replays recorded transcripts on CPU; D1
from the expert plans of the training episodes; SR per subset and the average."""

from __future__ import annotations

import dataclasses
import json
import shutil
import tempfile
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from memprism_ray.benchmark.base import (
    Benchmark,
    BenchmarkConfigError,
    DataTree,
    EvalPlan,
    EvalRun,
    Played,
    rerecord_episodes,
)
from memprism_ray.io_atomic import holds_files

if TYPE_CHECKING:
    from memprism_ray.benchmark.base import Report
    from memprism_ray.config import ExperimentConfig
    from memprism_ray.envs.base import GameRef
    from memprism_ray.eval.manifest import RunManifest
    from memprism_ray.recorder.phi.base import Phi


class EbAlfred(Benchmark):
    name = "ebalfred"
    section = "memprism_ray.benchmark.ebalfred.section:EbAlfredSection"
    env_factory = "memprism_ray.benchmark.ebalfred:EbAlfredEnv"
    train_keys = ("ebalfred.train_splits", "ebalfred.train_subsets")
    eval_keys = ("ebalfred.splits", "ebalfred.subsets")
    # D1 plays the training episodes' expert plans through the env: the episodes (the fixture
    # or the training list), the env's prompt and frames, the scripted stand-in, and the reward
    # the reference streams record (success + coef x progress).
    d1_keys = (
        "ebalfred.controller",
        "ebalfred.fixture",
        "ebalfred.fixture_episodes",
        "ebalfred.train_subsets",
        "ebalfred.train_splits",
        "ebalfred.skills",
        "ebalfred.n_shots",
        "ebalfred.examples",
        "ebalfred.resolution",
        "ebalfred.policy_epsilon",
        "grpo.progress_reward_coef",
    )
    reference_source = "expert plans"
    task_noun = "episodes"
    contract = "memprism_ray.benchmark.ebalfred.contract:EBALFRED"
    phi = "memprism_ray.benchmark.ebalfred.phi:EBALFRED_PHI"
    table_a4_row = "alfred"  # "D1, ALFRED path" and "GRPO, ALFRED path"
    sft_row = {"epochs": 20, "lambda_cost": 0.0, "bf16": False}  # noqa: RUF012 - a class constant
    # The row's 30 steps are the decision loop's budget: agent.max_steps in its presets (configs/ebalfred_*.yaml).
    grpo_row = {"progress_reward_coef": 0.2, "beta_entropy": 0.0}  # noqa: RUF012
    # D1 labels with the LLM view teacher (docs/ebalfred.md "D1 and D2 on the ALFRED path").
    job_supports = {"grpo": {"label.teacher": ("llm",)}}  # noqa: RUF012

    def prepare(self, cfg: ExperimentConfig, log: Callable[[str], None] = print) -> ExperimentConfig:
        """The fixture built on first use (``ebalfred.controller: fake``), and the scripted stand-in's
        settings in ``policy.scripted`` (they reach every actor with the config)."""
        eb = cfg.ebalfred
        if eb.controller != "fake":
            return cfg
        from memprism_ray.benchmark.ebalfred.fixture import build_fixture, fixture_settings
        from memprism_ray.benchmark.ebalfred.fixture_format import FIXTURE_VERSION

        root = eb.fixture_dir(cfg.run.dir).resolve()
        built = fixture_settings(root)
        wanted = (FIXTURE_VERSION, eb.fixture_episodes, min(eb.resolution, 96))
        if built is not None and built[0] == FIXTURE_VERSION and built != wanted and eb.fixture:
            raise ValueError(
                f"ebalfred.fixture {root} holds {built[1]} episode(s) per subset at {built[2]} px; this run asks "
                f"{wanted[1]} at {wanted[2]} px (ebalfred.fixture_episodes, ebalfred.resolution): match them, or "
                "remove the folder to build it again"
            )
        if built is None and eb.fixture and holds_files(root):
            raise ValueError(
                f"ebalfred.fixture {root} holds files but no EB-ALFRED fixture (no readable transcripts.json); the "
                "fake controller builds its fixture there and would write over them: name an empty or absent folder, "
                "or the folder of a built fixture"
            )
        # The run's own fixture, or one an older version of this code built, is the job's to rebuild.
        if built != wanted:
            if built is not None and not eb.fixture:  # nothing of the run's other build left (episodes, frames)
                shutil.rmtree(root)
            build_fixture(root, episodes_per_subset=eb.fixture_episodes, resolution=wanted[2])
            log(f"EB-ALFRED fixture built at {root} ({wanted[1]} episode(s) per subset)")
        # The actors are told where the fixture is (never left to derive it from their own run
        # directory, which a worker node does not have): data_trees ships it.
        cfg = cfg.with_section("ebalfred", dataclasses.replace(eb, fixture=str(root)))
        if cfg.policy.backend != "scripted":
            return cfg
        scripted = {**cfg.policy.scripted, "ebalfred_fixture": str(root), "ebalfred_epsilon": eb.policy_epsilon}
        log(f"the fixture stand-in plays {root} with a random skill at rate {eb.policy_epsilon}")
        return dataclasses.replace(cfg, policy=dataclasses.replace(cfg.policy, scripted=scripted))

    def data_trees(self, cfg: ExperimentConfig) -> list[DataTree]:
        """The fixture (``controller: fake``) is the job's; episode lists the user names are checked
        on each node (AI2-THOR and EmbodiedBench are each node's installation)."""
        eb = cfg.ebalfred
        trees = []
        if eb.controller == "fake":
            trees.append(DataTree(eb.fixture, "the EB-ALFRED fixture", owned=True))
        fix = "mount it at this path on every node (shared storage), or copy it there on each node"
        for key in ("splits", "train_splits"):
            path = getattr(eb, key)
            if path:
                trees.append(DataTree(path, f"ebalfred.{key}", owned=False, fix=fix))
        return trees

    def train_games(self, cfg: ExperimentConfig) -> list[GameRef]:
        from memprism_ray.benchmark.ebalfred.data import list_games

        eb = cfg.ebalfred
        return list_games(eb.train_subsets, eb.train_splits_path(cfg.run.dir))  # ALFRED's, never evaluation ones

    def _eval_games(self, cfg: ExperimentConfig) -> list[Any]:
        from memprism_ray.benchmark.ebalfred.data import list_games

        eb = cfg.ebalfred
        return list_games(eb.subsets, eb.splits_path(cfg.run.dir), per_subset=eb.episodes_per_subset)

    def check_disjoint(self, cfg: ExperimentConfig) -> None:
        """Game ids first, then the ALFRED trajectories behind them (one listed under two ids)."""
        super().check_disjoint(cfg)
        from memprism_ray.benchmark.ebalfred.training import shared_trajectories

        shared = shared_trajectories(self.train_games(cfg), self._eval_games(cfg))
        if shared:
            raise BenchmarkConfigError(
                f"{len(shared)} ALFRED trajectories are played by both the training and the evaluation episodes "
                f"(e.g. {shared[0]}): change {', '.join(self.train_keys + self.eval_keys)} so they do not overlap"
            )

    def eval_plan(self, cfg: ExperimentConfig) -> EvalPlan:
        from memprism_ray.agent import EpisodeSpec
        from memprism_ray.eval.episodes import build_episode_list

        games = {g.game_id: g for g in self._eval_games(cfg)}
        episodes = build_episode_list("ebalfred", sorted(games), None, seed=cfg.run.seed)
        specs = [EpisodeSpec(e, games[g]) for e, g in zip(episodes.episode_ids, episodes.game_ids, strict=True)]
        return EvalPlan(episodes, specs, cfg.ebalfred.eval_workers, cfg.ebalfred.eval_slots)

    def env_options(self, cfg: ExperimentConfig) -> dict[str, object]:
        from memprism_ray.benchmark.ebalfred.section import env_options

        return env_options(cfg)

    def reference_table(
        self, cfg: ExperimentConfig, games: Sequence[GameRef], rollin: Sequence[GameRef], phi: Phi | None
    ) -> bytes:
        """The expert plans of ``games`` (ALFRED annotations or the fixture's) played through one env."""
        from memprism_ray.benchmark.ebalfred.expert import annotation_plans, play_expert, write_expert_table
        from memprism_ray.benchmark.ebalfred.fixture import ALFRED_DIR

        env = self.make_env(1, self.env_options(cfg))
        try:
            # The fixture ships ALFRED annotations of its episodes: its plans take the same path.
            root = Path(env.config.fixture) / ALFRED_DIR if cfg.ebalfred.controller == "fake" else None
            plans = annotation_plans(games[0].path, games, root)
            episodes = play_expert(env, list(games), plans, max_steps=cfg.agent.max_steps)
        finally:
            env.close()
        episodes = rerecord_episodes(episodes, phi)
        with tempfile.TemporaryDirectory() as tmp:
            return write_expert_table(episodes, Path(tmp) / "expert.parquet").read_bytes()

    # ------------------------------------------------------------------ evaluation report
    def write_condition(self, played: Played, out_dir: Path, manifest: RunManifest, ctx: EvalRun) -> Report:
        from memprism_ray.benchmark.ebalfred.report import episode_rows, subset_report

        rep = super().write_condition(played, out_dir, manifest, ctx)
        rep["ebalfred"] = subset_report(episode_rows(played.results))
        return rep

    def condition_line(self, rep: Report) -> str:
        table = rep["ebalfred"]
        failed = f", {len(table['failed_episodes'])} failed" if table["failed_episodes"] else ""
        pooled = table["pooled"]
        return f"average SR {100 * table['average_sr']:.1f}% ({pooled['successes']}/{pooled['n']}){failed}"

    def write_summary(self, reports: list[Report], played: list[Played], ctx: EvalRun) -> Report:
        """``summary.md`` (the paper's table, a row per condition) and ``ebalfred_report.json``."""
        from memprism_ray.benchmark.ebalfred.report import report_markdown
        from memprism_ray.io_atomic import atomic_write_text

        tables = {rep["condition"]: rep["ebalfred"] for rep in reports}
        header = report_markdown(next(iter(tables.values()))).splitlines()[:2]
        lines = [report_markdown(t, c).splitlines()[2] for c, t in tables.items()]
        details = "\n".join(f"## {c}\n\n{report_markdown(t, c)}" for c, t in tables.items())
        atomic_write_text(
            ctx.out_dir / "summary.md", "# EB-ALFRED evaluation\n\n" + "\n".join([*header, *lines]) + "\n\n" + details
        )
        atomic_write_text(ctx.out_dir / "ebalfred_report.json", json.dumps(tables, indent=1) + "\n")
        return {"conditions": tables, "failed_episodes": sum(len(t["failed_episodes"]) for t in tables.values())}

    def eval_metrics(self, summary: Report) -> list[Report]:
        return [{"condition": c, "sr": t["average_sr"]} for c, t in summary["conditions"].items()]

    def failures(self, summary: Report) -> str | None:
        n = summary["failed_episodes"]
        return f"{n} episode(s) failed" if n else None
