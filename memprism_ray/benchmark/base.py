"""The Benchmark interface (paper "Benchmarks": ALFWorld, EB-ALFRED, Mind2Web; appendix C
evaluation protocols; Table A.4 per-benchmark D1 and GRPO settings).

Everything the trainer (:func:`memprism_ray.trainer.fit`) needs to know about a benchmark is
one :class:`Benchmark`: its tasks, env, task contract, Phi, D1 source and view teacher, Table
A.4 settings, what its jobs support, the GRPO return, and its evaluation plan and reports. The
shared packages hold no table or branch keyed by a benchmark's name
(``tests/test_benchmark_knowledge.py``): a new benchmark is one subclass and one entry in
:data:`memprism_ray.benchmark.BENCHMARKS`. No ray here: the actors call these methods.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar, Protocol, TypeVar

from memprism_ray.registry import known_benchmarks, load

if TYPE_CHECKING:
    from memprism_ray.adapter.grpo_update import GRPOConfig
    from memprism_ray.adapter.sft import SFTConfig
    from memprism_ray.agent import EpisodeResult, EpisodeSpec
    from memprism_ray.benchmark.job_spec import JobSpec
    from memprism_ray.config import ExperimentConfig
    from memprism_ray.envs.base import Env, GameRef
    from memprism_ray.eval.compare import Outcomes
    from memprism_ray.eval.episodes import EpisodeList
    from memprism_ray.eval.manifest import RunManifest
    from memprism_ray.policy.contract import TaskContract
    from memprism_ray.recorder.phi.base import Phi
    from memprism_ray.recorder.phi.spec import PhiSpec
    from memprism_ray.recorder.stream import EventStream
    from memprism_ray.router.teacher import LLMTeacherConfig, LLMViewTeacher

#: A JSON-like report or metrics row (what the evaluation files and ``metrics.jsonl`` hold).
Report = dict[str, Any]

#: A GRPO return (Table A.4 ``grpo.reward``; TRL's ``reward_funcs`` are callables too): a played
#: trajectory's result and the GRPO settings -> the trajectory's return. A module-level function,
#: so Ray ships it by reference to the rollout workers.
Reward = Callable[["EpisodeResult", "GRPOConfig"], float]


def success_reward(result: EpisodeResult, grpo: GRPOConfig) -> float:
    """Terminal success; with ``grpo.progress_reward_coef > 0`` (EB-ALFRED) the env's summed
    reward (success + coef x goal-condition progress)."""
    if grpo.progress_reward_coef > 0:
        return float(result.reward)
    return 1.0 if result.won else 0.0


class BenchmarkConfigError(ValueError):
    """A config this benchmark refuses before any work starts (one line: what and which keys)."""


@dataclass
class EvalPlan:
    """The final evaluation's ordered plan: every condition plays exactly these episodes."""

    episodes: EpisodeList  # what the manifest records
    specs: list[EpisodeSpec]  # one per episode, in plan order
    workers: int  # evaluation actors
    slots: int  # episodes each actor plays step-synchronously
    #: game id -> error: episodes that fail without being played (kept in every denominator)
    broken: dict[str, str] = field(default_factory=dict)
    expected_steps: dict[str, int] = field(default_factory=dict)  # episode id -> recorded steps (Mind2Web)


@dataclass(frozen=True)
class DataTree:
    """A file or folder the actors read (docs/cluster.md "What each node needs on disk"):
    ``owned`` (the job built or holds it) is shipped to every node that needs it
    (:mod:`memprism_ray.cluster.node_data`); the user's is checked where an actor starts."""

    path: str  # absolute, as the driver sees it; the actors' configs and games name it so
    what: str  # what it is, in a refusal or a progress line ("corpus.data_root")
    owned: bool
    fix: str = ""  # for user data: how to put it on every node
    files: tuple[str, ...] = ()  # of an owned folder, only these files are shipped; empty: all


@dataclass
class Played:
    """One condition played on the whole plan: a result per planned episode, and the step rows."""

    condition: str
    results: list[EpisodeResult]
    rows: list[Report]
    #: episodes kept from the evaluation this one continues: their artifacts are on disk already
    kept: frozenset[str] = frozenset()


@dataclass
class EvalRun:
    """What every report of one evaluation shares."""

    plan: EvalPlan
    cfg: ExperimentConfig
    out_dir: Path
    tokenizer: str  # the task model's tokenizer that counted the prompt tokens


class Recorded(Protocol):
    """A recorded episode (a D1 reference's ``ExpertEpisode``): a dataclass with its stream."""

    stream: EventStream


E = TypeVar("E", bound=Recorded)


def rerecord_episodes(episodes: list[E], phi: Phi | None) -> list[E]:
    """``episodes`` with their streams re-extracted from the raw events by ``phi`` (an LLM Phi), so
    D1 data and rollouts are recorded by the same Phi; unchanged when ``phi`` is ``None``."""
    if phi is None:
        return episodes
    from dataclasses import replace

    from memprism_ray.recorder.phi.factory import rerecord

    streams = rerecord([e.stream for e in episodes], phi)
    return [replace(e, stream=st) for e, st in zip(episodes, streams, strict=True)]


class Benchmark:
    """One benchmark. Subclasses set the class attributes and implement the task lists, the
    D1 source and the evaluation report; the rest is shared."""

    name: ClassVar[str]
    #: ``module:attribute`` of ``(num_slots, **env_options) -> Env``, imported only when an actor
    #: builds its env (reading the table loads no simulator)
    env_factory: ClassVar[str]
    train_keys: ClassVar[tuple[str, ...]]  # config keys that choose the training tasks
    eval_keys: ClassVar[tuple[str, ...]]  # config keys that choose the evaluation episodes
    #: dotted keys outside the shared D1 sections (``trainer.run_dir.D1_SECTIONS``) that change D1's
    #: data: the D1 directory is keyed by them and by no other key of the benchmark's section, so
    #: an evaluation setting never reruns D1
    d1_keys: ClassVar[tuple[str, ...]] = ()
    reference_source: ClassVar[str] = "expert trajectories"  # what D1's references are (printed)
    task_noun: ClassVar[str] = "games"
    success_label: ClassVar[str] = "success"  # what the training plot calls a trajectory's success
    summary_file: ClassVar[str] = "summary.md"  # the evaluation file printed at the end of a job
    #: its ``grpo.reward`` values, each a :data:`Reward` (:meth:`trajectory_return` calls it)
    rewards: ClassVar[Mapping[str, Reward]] = {"success": success_reward}
    #: ``module:attribute`` of its task contract (appendix E.3-E.5: prompt, parser, CPU stand-in)
    contract: ClassVar[str]
    #: ``module:attribute`` of its Phi (appendix D.2, E.1: rule extractor, Phi prompt, answer schema)
    phi: ClassVar[str]
    #: ``module:Class`` of its own settings section (a config dataclass, ``config_tree.field`` per
    #: setting), read as ``--<name>.<key>`` and reached as ``cfg.<name>``; empty: none
    section: ClassVar[str] = ""
    #: its own options of ``memprism eval``: option -> (the config key it sets, help text)
    eval_options: ClassVar[Mapping[str, tuple[str, str]]] = {}
    #: module of its own ``memprism`` subcommands (a ``register(subparsers)`` function); empty: none
    commands: ClassVar[str] = ""
    table_a4_row: ClassVar[str]  # its row of Table A.4 (``--preset`` of ``memprism router sft``)
    sft_row: ClassVar[Mapping[str, object]] = {}  # the row's D1 settings beside SFTConfig's defaults
    grpo_row: ClassVar[Mapping[str, object]] = {}  # the row's GRPO settings beside GRPOConfig's (ALFWorld's)
    #: per job (``grpo``, ``eval``), dotted key -> the values the job implements where the config
    #: accepts more (:meth:`job_spec`)
    job_supports: ClassVar[Mapping[str, Mapping[str, tuple[object, ...]]]] = {}

    # ------------------------------------------------------------------ config and tasks
    def check(self, cfg: ExperimentConfig) -> None:
        """``corpus.benchmark`` must name this benchmark, and ``grpo.reward`` one of its rewards."""
        if cfg.corpus.benchmark != self.name:
            given, known = cfg.corpus.benchmark, known_benchmarks()
            if given not in known:
                raise BenchmarkConfigError(
                    f"corpus.benchmark={given!r} names no benchmark (known: {', '.join(known)}); the {self.name} "
                    f"jobs need {self.name}"
                )
            raise BenchmarkConfigError(
                f"corpus.benchmark={given!r}: the {self.name} jobs need {self.name} (set corpus.benchmark, or use "
                f"the {given} job)"
            )
        if cfg.grpo.reward not in self.rewards:
            raise BenchmarkConfigError(
                f"grpo.reward={cfg.grpo.reward!r} is not defined for {self.name}; it defines: {', '.join(self.rewards)}"
            )
        for name, section in cfg.sections.items():  # --mind2web.eval_tasks 3 on an ALFWorld job did nothing, unsaid
            if name == self.name or not dataclasses.is_dataclass(section):
                continue
            default = type(section)()
            changed = [
                f.name for f in dataclasses.fields(section) if getattr(section, f.name) != getattr(default, f.name)
            ]
            if changed:
                keys = ", ".join(f"{name}.{k}" for k in changed)
                raise BenchmarkConfigError(
                    f"{keys}: the {self.name} jobs do not read the {name} settings (corpus.benchmark={self.name}); "
                    f"remove {'them' if len(changed) > 1 else 'it'}, or run the {name} job"
                )

    def prepare(self, cfg: ExperimentConfig, log: Callable[[str], None] = print) -> ExperimentConfig:
        """The config with its data resolved (a corpus built, a fixture generated, a release
        root checked); called once by the driver before Ray starts."""
        return cfg

    def data_trees(self, cfg: ExperimentConfig) -> list[DataTree]:
        """What the actors read besides the config, once :meth:`prepare` resolved it (issue 34)."""
        return []

    def train_games(self, cfg: ExperimentConfig) -> list[GameRef]:
        """The training tasks GRPO groups are drawn from."""
        raise NotImplementedError

    def d1_games(self, cfg: ExperimentConfig) -> list[GameRef]:
        """The tasks D1's reference trajectories are played on (first ``label.games``, then
        the roll-ins); by default the GRPO training tasks."""
        return self.train_games(cfg)

    def eval_plan(self, cfg: ExperimentConfig) -> EvalPlan:
        """The ordered evaluation plan."""
        raise NotImplementedError

    def check_disjoint(self, cfg: ExperimentConfig) -> None:
        """Refuse a config that selects no training task, or whose evaluation episodes are among
        its training tasks (D1 or GRPO)."""
        games = self.train_games(cfg)
        if not games:  # GRPO ran its first iteration on none: "no group produced a decision"
            raise BenchmarkConfigError(
                f"no {self.name} training {self.task_noun}: {', '.join(self.train_keys)} select none"
            )
        train = {g.game_id for g in games} | {g.game_id for g in self.d1_games(cfg)}
        plan = self.eval_plan(cfg)
        shared = sorted({s.game.game_id for s in plan.specs} & train)
        if shared:
            keys = ", ".join(self.train_keys + self.eval_keys)
            raise BenchmarkConfigError(
                f"{len(shared)} of the {len({s.game.game_id for s in plan.specs})} {self.name} evaluation tasks are "
                f"also training tasks (e.g. {shared[0]}): change {keys} so they do not overlap"
            )

    def job_spec(self, kind: str) -> JobSpec:
        """What ``jobs/<kind>_<name>.py`` can do (``kind``: ``grpo`` or ``eval``)."""
        from memprism_ray.benchmark.job_spec import JobSpec

        return JobSpec(f"{kind}_{self.name}", dict(self.job_supports.get(kind, {})))

    def sft_preset(self, **overrides: object) -> SFTConfig:
        """Table A.4's D1 settings of this benchmark's row (:class:`~memprism_ray.adapter.sft.SFTConfig`)."""
        from memprism_ray.adapter.sft import SFTConfig

        return SFTConfig.from_row(self.table_a4_row, self.sft_row, **overrides)

    def grpo_preset(self, **overrides: object) -> GRPOConfig:
        """Table A.4's GRPO settings of this benchmark's row (``GRPOConfig``)."""
        from memprism_ray.adapter.grpo_update import GRPOConfig

        return GRPOConfig.from_row(self.table_a4_row, self.grpo_row, **overrides)

    # ------------------------------------------------------------------ env, task contract, Phi, reward
    def env_options(self, cfg: ExperimentConfig) -> dict[str, object]:
        """Keyword arguments of the env factory (sent with each actor's constructor)."""
        return {}

    def make_env(self, num_slots: int, options: Mapping[str, object] | None = None) -> Env:
        return load(self.env_factory, f"{self.name} env")(num_slots=num_slots, **dict(options or {}))

    def task_contract(self) -> TaskContract:
        """Its :class:`~memprism_ray.policy.contract.TaskContract`, which every task policy is built with."""
        return load(self.contract, f"{self.name} task contract")

    def phi_spec(self) -> PhiSpec:
        """Its :class:`~memprism_ray.recorder.phi.spec.PhiSpec`, which the configured Phi is built from."""
        return load(self.phi, f"{self.name} Phi")

    def trajectory_return(self, result: EpisodeResult, grpo: GRPOConfig) -> float:
        """The GRPO return of one played trajectory: the :data:`Reward` ``grpo.reward`` names in
        :attr:`rewards` (checked at load by :meth:`check`)."""
        return self.rewards[grpo.reward](result, grpo)

    # ------------------------------------------------------------------ D1
    def reference_table(
        self, cfg: ExperimentConfig, games: Sequence[GameRef], rollin: Sequence[GameRef], phi: Phi | None
    ) -> bytes:
        """D1's reference trajectories of ``games`` (and roll-ins on ``rollin``) as the
        expert-trajectory Parquet (``benchmark/alfworld/expert_data.py``); ``phi``: an LLM Phi to
        re-record the streams with (``None``: the rule Phi's records)."""
        raise NotImplementedError

    def rollins_apply(self, cfg: ExperimentConfig) -> bool:
        """Whether D1 plays ``label.rollin_games`` roll-ins (only where the benchmark has them)."""
        return False

    def llm_teacher(self, config: LLMTeacherConfig) -> LLMViewTeacher:
        """The LLM view teacher of appendix E.2 for this benchmark, with the ``label.llm`` settings."""
        from memprism_ray.router.teacher import LLMViewTeacher

        return LLMViewTeacher(config)

    # ------------------------------------------------------------------ evaluation report
    def write_condition(self, played: Played, out_dir: Path, manifest: RunManifest, ctx: EvalRun) -> Report:
        """One condition's report (the shared tables, artifacts, manifest, plots)."""
        from memprism_ray.eval.report import write_condition

        cfg = ctx.cfg
        return write_condition(
            played.condition, played.results, played.rows, out_dir, manifest,
            tokenizer=ctx.tokenizer, max_steps=cfg.agent.max_steps, artifacts=cfg.eval.artifacts, on_disk=played.kept,
        )  # fmt: skip

    def condition_line(self, rep: Report) -> str:
        """One progress line for a finished condition."""
        failed = f", {rep['failed_episodes']} failed" if rep["failed_episodes"] else ""
        return f"{rep['successes']}/{rep['n']} = {100 * rep['sr']:.1f}%{failed}"

    def write_summary(self, reports: list[Report], played: list[Played], ctx: EvalRun) -> Report:
        """The side-by-side summary of every condition; returns it (``failed_episodes`` set)."""
        from memprism_ray.eval.report import write_summary

        return write_summary(ctx.out_dir, reports, {p.condition: p.results for p in played}, seed=ctx.cfg.run.seed)

    def eval_metrics(self, summary: Report) -> list[Report]:
        """Per-condition metrics rows the run's metrics log records after the evaluation."""
        return [{"condition": rep["condition"], "sr": rep["sr"]} for rep in summary["conditions"]]

    def failures(self, summary: Report) -> str | None:
        """One line on the evaluation's failed episodes (``None`` when none failed)."""
        from memprism_ray.eval.report import failure_message

        return failure_message(dict(summary))

    def compared(self, condition_dir: Path) -> list[Outcomes]:
        """What ``memprism compare`` pairs between two evaluations of one condition, measure by
        measure, read from the condition's directory: task success per episode."""
        from memprism_ray.eval.compare import success

        return success(condition_dir)

    def printed_summary(self, out_dir: Path) -> Path:
        """The file a job prints when the evaluation ends."""
        return out_dir / self.summary_file
