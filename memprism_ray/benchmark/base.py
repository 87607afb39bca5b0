"""The Benchmark interface (paper "Benchmarks": ALFWorld, EB-ALFRED, Mind2Web; appendix C
evaluation protocols; Table A.4 per-benchmark D1 and GRPO settings).

Everything the trainer (:func:`memprism_ray.trainer.fit`) needs to know about a benchmark is
one :class:`Benchmark`: where its training and evaluation tasks come from, how its
environment is built, its task contract (the task-policy prompt, parser and CPU stand-in) and
its Phi (rule extractor, Phi prompt), where D1's reference trajectories come from (an expert,
human replay) and which view teacher labels them, its Table A.4 D1 and GRPO settings, what its
jobs support, the GRPO return of a trajectory, and how the final evaluation is planned and
reported. The shared packages hold no table or branch keyed by a benchmark's name
(``tests/test_benchmark_knowledge.py``): a new benchmark is one subclass and one entry in
:data:`memprism_ray.benchmark.BENCHMARKS` (``tests/benchmark/toy_benchmark.py`` is one).

No ray here: the actors call these methods inside their processes.
"""

from __future__ import annotations

import importlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

if TYPE_CHECKING:
    from memprism_ray.config import ExperimentConfig
    from memprism_ray.router.teacher import LLMTeacherConfig, LLMViewTeacher


class BenchmarkConfigError(ValueError):
    """A config this benchmark refuses before any work starts (one line: what and which keys)."""


@dataclass
class EvalPlan:
    """The final evaluation's ordered plan: every condition plays exactly these episodes."""

    episodes: Any
    """the :class:`~memprism_ray.eval.episodes.EpisodeList` the manifest records"""
    specs: list[Any]
    """:class:`~memprism_ray.agent.EpisodeSpec` per episode, in plan order"""
    workers: int
    """evaluation actors"""
    slots: int
    """episodes each actor plays step-synchronously"""
    broken: dict[str, str] = field(default_factory=dict)
    """game id -> error: episodes that fail without being played (kept in every denominator)"""
    expected_steps: dict[str, int] = field(default_factory=dict)
    """episode id -> recorded steps (Mind2Web's step-accuracy denominators)"""


@dataclass(frozen=True)
class DataTree:
    """A file or folder the actors read (docs/cluster.md "What each node needs on disk").

    ``owned``: the job built it or holds it (the embedded corpus, a fixture, a checkpoint), so
    the driver ships it to every node that needs it (:mod:`memprism_ray.actors.node_data`);
    otherwise the user gave it, and an actor refuses to start where it is missing, in one line
    with ``fix``."""

    path: str
    """absolute, as the driver sees it; the actors' configs and games name it so"""
    what: str
    """what it is, in a refusal or a progress line (``the embedded ALFWorld corpus``, ``corpus.data_root``)"""
    owned: bool
    fix: str = ""
    """for user data: how to put it on every node"""
    files: tuple[str, ...] = ()
    """of a folder the job owns, only these files (relative names) are shipped; empty: all"""


@dataclass
class Played:
    """One condition played on the whole plan: a result per planned episode, and the step rows."""

    condition: str
    results: list[Any]
    rows: list[dict[str, Any]]


@dataclass
class EvalRun:
    """What every report of one evaluation shares."""

    plan: EvalPlan
    cfg: ExperimentConfig
    out_dir: Path
    tokenizer: str
    """the task model's tokenizer that counted the prompt tokens"""


def rerecord_episodes(episodes: list[Any], phi: Any) -> list[Any]:
    """``episodes`` (``ExpertEpisode``) with their streams re-extracted by ``phi`` (an LLM
    Phi, docs/phi.md) from the kept raw events, so D1 data and rollouts are recorded by the
    same Phi; unchanged when ``phi`` is ``None`` (the rule Phi recorded them)."""
    if phi is None:
        return episodes
    from dataclasses import replace

    from memprism_ray.recorder.phi.factory import rerecord

    streams = rerecord([e.stream for e in episodes], phi)
    return [replace(e, stream=st) for e, st in zip(episodes, streams, strict=True)]


def _load(target: str) -> Any:
    module, _, attr = target.partition(":")
    return getattr(importlib.import_module(module), attr)


class Benchmark:
    """One benchmark. Subclasses set the class attributes and implement the task lists, the
    D1 source and the evaluation report; the rest is shared."""

    name: ClassVar[str]
    env_factory: ClassVar[str]
    """``module:attribute`` of ``(num_slots, **env_options) -> Env``: imported only when an
    actor builds its env, so reading the table loads no simulator"""
    train_keys: ClassVar[tuple[str, ...]]
    """config keys that choose the training tasks (named when train and eval overlap)"""
    eval_keys: ClassVar[tuple[str, ...]]
    """config keys that choose the evaluation episodes"""
    d1_keys: ClassVar[tuple[str, ...]] = ()
    """dotted config keys outside the shared D1 sections (``trainer.run_dir.D1_SECTIONS``) that
    change D1's data (its tasks, reference trajectories or labels): the D1 directory is keyed by
    them too, and by no other key of the benchmark's section, so an evaluation setting never
    reruns D1"""
    reference_source: ClassVar[str] = "expert trajectories"
    """what D1's reference trajectories are (printed before D1)"""
    task_noun: ClassVar[str] = "games"
    success_label: ClassVar[str] = "success"
    """what the training plot calls a trajectory's success"""
    summary_file: ClassVar[str] = "summary.md"
    """the evaluation file printed at the end of a job"""
    rewards: ClassVar[tuple[str, ...]] = ("success",)
    """the ``grpo.reward`` values this benchmark defines (:meth:`trajectory_return`)"""
    contract: ClassVar[str]
    """``module:attribute`` of its task contract (appendix E.3-E.5: the task-policy prompt,
    parser and scripted CPU stand-in, :class:`~memprism_ray.policy.contract.TaskContract`)"""
    phi: ClassVar[str]
    """``module:attribute`` of its Phi (appendix D.2, E.1: rule extractor, Phi prompt and answer
    schema, :class:`~memprism_ray.recorder.phi.spec.PhiSpec`)"""
    table_a4_row: ClassVar[str]
    """its row of Table A.4 (``--preset`` of ``memprism router sft``)"""
    sft_row: ClassVar[Mapping[str, Any]] = {}
    """Table A.4's D1 settings of the row, beside :class:`~memprism_ray.adapter.sft.SFTConfig`'s defaults"""
    grpo_row: ClassVar[Mapping[str, Any]] = {}
    """Table A.4's GRPO settings of the row, beside :class:`~memprism_ray.adapter.grpo_update.GRPOConfig`'s
    defaults (the ALFWorld row)"""
    job_supports: ClassVar[Mapping[str, Mapping[str, tuple[Any, ...]]]] = {}
    """what its jobs implement where the config accepts more, per job (``grpo``, ``eval``):
    dotted key -> the values the job implements (:meth:`job_spec`)"""

    # ------------------------------------------------------------------ config and tasks
    def check(self, cfg: ExperimentConfig) -> None:
        """``corpus.benchmark`` and ``agent.benchmark`` must both name this benchmark."""
        for key, value in (("corpus.benchmark", cfg.corpus.benchmark), ("agent.benchmark", cfg.agent.benchmark)):
            if value != self.name:
                raise BenchmarkConfigError(
                    f"{key}={value!r}: the {self.name} jobs need {self.name} (set corpus.benchmark and "
                    f"agent.benchmark, or use the {value} job)"
                )
        if cfg.grpo.reward not in self.rewards:
            raise BenchmarkConfigError(
                f"grpo.reward={cfg.grpo.reward!r} is not defined for {self.name}; it defines: {', '.join(self.rewards)}"
            )

    def prepare(self, cfg: ExperimentConfig, log: Any = print) -> ExperimentConfig:
        """The config with its data resolved (a corpus built, a fixture generated, a release
        root checked); called once by the driver before Ray starts."""
        return cfg

    def data_trees(self, cfg: ExperimentConfig) -> list[DataTree]:
        """What the actors read besides the config, once :meth:`prepare` resolved it: the
        trees the job owns are shipped to every node, the user's are checked where an actor
        starts (a cluster whose nodes have their own disks, issue 34)."""
        return []

    def train_games(self, cfg: ExperimentConfig) -> list[Any]:
        """The training tasks GRPO groups are drawn from."""
        raise NotImplementedError

    def d1_games(self, cfg: ExperimentConfig) -> list[Any]:
        """The tasks D1's reference trajectories are played on (first ``label.games``, then
        the roll-ins); by default the GRPO training tasks."""
        return self.train_games(cfg)

    def eval_plan(self, cfg: ExperimentConfig) -> EvalPlan:
        """The ordered evaluation plan."""
        raise NotImplementedError

    def check_disjoint(self, cfg: ExperimentConfig) -> None:
        """Refuse a config whose evaluation episodes are among its training tasks (D1 or GRPO):
        the count and the keys to change, in one line."""
        train = {g.game_id for g in self.train_games(cfg)} | {g.game_id for g in self.d1_games(cfg)}
        plan = self.eval_plan(cfg)
        shared = sorted({s.game.game_id for s in plan.specs} & train)
        if shared:
            keys = ", ".join(self.train_keys + self.eval_keys)
            raise BenchmarkConfigError(
                f"{len(shared)} of the {len({s.game.game_id for s in plan.specs})} {self.name} evaluation tasks are "
                f"also training tasks (e.g. {shared[0]}): change {keys} so they do not overlap"
            )

    def job_spec(self, kind: str) -> Any:
        """What ``jobs/<kind>_<name>.py`` can do (``kind``: ``grpo`` or ``eval``), checked when
        its arguments are parsed, before Ray or D1 start."""
        from memprism_ray.benchmark.job_spec import JobSpec

        return JobSpec(f"{kind}_{self.name}", dict(self.job_supports.get(kind, {})))

    def sft_preset(self, **overrides: Any) -> Any:
        """Table A.4's D1 settings of this benchmark's row (:class:`~memprism_ray.adapter.sft.SFTConfig`)."""
        from memprism_ray.adapter.sft import SFTConfig

        return SFTConfig.from_row(self.table_a4_row, self.sft_row, **overrides)

    def grpo_preset(self, **overrides: Any) -> Any:
        """Table A.4's GRPO settings of this benchmark's row
        (:class:`~memprism_ray.adapter.grpo_update.GRPOConfig`)."""
        from memprism_ray.adapter.grpo_update import GRPOConfig

        return GRPOConfig.from_row(self.table_a4_row, self.grpo_row, **overrides)

    # ------------------------------------------------------------------ env, task contract, Phi, reward
    def env_options(self, cfg: ExperimentConfig) -> dict[str, Any]:
        """Keyword arguments of the env factory from the job's config (sent with each actor's
        constructor, so no setting travels by environment variable)."""
        return {}

    def make_env(self, num_slots: int, options: Mapping[str, Any] | None = None) -> Any:
        return _load(self.env_factory)(num_slots=num_slots, **dict(options or {}))

    def task_contract(self) -> Any:
        """Its :class:`~memprism_ray.policy.contract.TaskContract`: what every task policy of a
        job on this benchmark is built with (``policy.factory.make_policy``) and the agent counts
        prompt tokens by."""
        return _load(self.contract)

    def phi_spec(self) -> Any:
        """Its :class:`~memprism_ray.recorder.phi.spec.PhiSpec`, which
        ``recorder.phi.factory.build_phi`` builds the configured Phi from."""
        return _load(self.phi)

    def trajectory_return(self, result: Any, grpo: Any) -> float:
        """The GRPO return of one played trajectory (Table A.4 ``grpo.reward``): ``success`` is
        the binary terminal success, or with ``grpo.progress_reward_coef > 0`` (EB-ALFRED, 0.2)
        the environment's summed reward, success + coef x goal-condition progress (the
        coefficient reaches the env with its options); ``action_correct`` (Mind2Web) is the
        reward 1[action correct] of each replayed decision averaged over the trajectory's
        decisions, so that groups of one task compare like with like."""
        if grpo.reward == "action_correct":
            return float(result.reward) / result.steps if result.steps else 0.0
        if grpo.progress_reward_coef > 0:
            return float(result.reward)
        return 1.0 if result.won else 0.0

    # ------------------------------------------------------------------ D1
    def reference_table(self, cfg: ExperimentConfig, games: Sequence[Any], rollin: Sequence[Any], phi: Any) -> bytes:
        """D1's reference trajectories of ``games`` (and the task policy's roll-ins on
        ``rollin``, where the benchmark has them) as the expert-trajectory Parquet
        (``envs/alfworld/expert_data.py`` schema: one row per decision state with its
        admissible actions and reference action). ``phi``: an LLM Phi to re-record the streams
        with (``None``: the rule Phi's records)."""
        raise NotImplementedError

    def rollins_apply(self, cfg: ExperimentConfig) -> bool:
        """Whether D1 plays ``label.rollin_games`` roll-ins (only where the benchmark has them)."""
        return False

    def llm_teacher(self, config: LLMTeacherConfig) -> LLMViewTeacher:
        """The LLM view teacher of appendix E.2 for this benchmark, with the ``label.llm`` settings."""
        from memprism_ray.router.teacher import LLMViewTeacher

        return LLMViewTeacher(config)

    # ------------------------------------------------------------------ evaluation report
    def write_condition(self, played: Played, out_dir: Path, manifest: Any, ctx: EvalRun) -> dict[str, Any]:
        """One condition's report (the shared tables, artifacts, manifest, plots)."""
        from memprism_ray.eval.report import write_condition

        cfg = ctx.cfg
        return write_condition(
            played.condition, played.results, played.rows, out_dir, manifest,
            tokenizer=ctx.tokenizer, max_steps=cfg.agent.max_steps, artifacts=cfg.eval.artifacts,
        )  # fmt: skip

    def condition_line(self, rep: Mapping[str, Any]) -> str:
        """One progress line for a finished condition."""
        failed = f", {rep['failed_episodes']} failed" if rep["failed_episodes"] else ""
        return f"{rep['successes']}/{rep['n']} = {100 * rep['sr']:.1f}%{failed}"

    def write_summary(self, reports: list[dict[str, Any]], played: list[Played], ctx: EvalRun) -> dict[str, Any]:
        """The side-by-side summary of every condition; returns it (``failed_episodes`` set)."""
        from memprism_ray.eval.report import write_summary

        return write_summary(ctx.out_dir, reports, {p.condition: p.results for p in played}, seed=ctx.cfg.run.seed)

    def eval_metrics(self, summary: Mapping[str, Any]) -> list[dict[str, Any]]:
        """Per-condition metrics rows the run's metrics log records after the evaluation."""
        return [{"condition": rep["condition"], "sr": rep["sr"]} for rep in summary["conditions"]]

    def failures(self, summary: Mapping[str, Any]) -> str | None:
        """One line on the evaluation's failed episodes (``None`` when none failed)."""
        from memprism_ray.eval.report import failure_message

        return failure_message(dict(summary))

    def printed_summary(self, out_dir: Path) -> Path:
        """The file a job prints when the evaluation ends."""
        return out_dir / self.summary_file
