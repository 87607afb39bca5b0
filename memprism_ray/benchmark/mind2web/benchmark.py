"""Mind2Web under teacher-forced replay (paper "Benchmarks"; appendix "Training dataset setup":
"Mind2Web uses its official training split to construct teacher-forced human trajectories
and action-conditioned view-teacher records"; Table A.4 "D1, Mind2Web" and "GRPO, Mind2Web";
docs/mind2web.md): the official release or the generated fixture; D1 from the human
trajectories of the training split; the return is the mean reward 1[action correct]; the
metrics per test split."""

from __future__ import annotations

import dataclasses
import functools
import io
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from memprism_ray.benchmark.base import Benchmark, DataTree, EvalPlan, EvalRun, Played, rerecord_episodes
from memprism_ray.config_tree import field
from memprism_ray.envs.base import GameRef, cache_base
from memprism_ray.router.teacher import LLMTeacherConfig, LLMViewTeacher, TeacherPrompt

if TYPE_CHECKING:
    from memprism_ray.adapter.grpo_update import GRPOConfig
    from memprism_ray.agent import EpisodeResult
    from memprism_ray.benchmark.base import Report
    from memprism_ray.config import ExperimentConfig
    from memprism_ray.eval.compare import Outcomes
    from memprism_ray.eval.manifest import RunManifest
    from memprism_ray.recorder.phi.base import Phi


def action_correct_reward(result: EpisodeResult, grpo: GRPOConfig) -> float:
    """The mean reward 1[action correct] over the trajectory's steps (Table A.4 "GRPO, Mind2Web")."""
    return float(result.reward) / result.steps if result.steps else 0.0


@dataclass
class Mind2WebSection:
    """Mind2Web jobs (docs/mind2web.md): which splits and how many tasks; the data root is
    ``corpus.data_root`` (or ``$MIND2WEB_DATA``)."""

    eval_splits: tuple[str, ...] = field(
        ("test_task", "test_website", "test_domain"), help="Mind2Web splits the evaluation reports, each separately"
    )
    eval_tasks: int = field(0, help="tasks per evaluation split (0: every task of the split)")
    train_tasks: int = field(0, help="training tasks that form GRPO groups (0: every task of the train split)")
    fixture: bool = field(False, help="build and use the small generated fixture (CPU smoke runs), not the release")
    fixture_tasks_per_site: int = field(3, help="fixture: tasks per site template and split")
    candidate_scores: str = field(
        "",
        help="converted candidate ranks of the release (scores_all_data.pkl as .parquet/.jsonl/.json; relative: "
        "under corpus.data_root): MindAct's top-k candidate pool; empty: the project's pool (docs/mind2web.md)",
    )
    candidate_top_k: int = field(50, help="MindAct's pool: candidates ranked below this (metric.py top_k)")

    def __post_init__(self) -> None:
        from memprism_ray.benchmark.mind2web.candidates import check_format
        from memprism_ray.benchmark.mind2web.data import EVAL_SPLITS

        bad = [s for s in self.eval_splits if s not in EVAL_SPLITS]
        if bad or not self.eval_splits:
            raise ValueError(f"mind2web.eval_splits={list(self.eval_splits)} is invalid; choose from {EVAL_SPLITS}")
        if self.eval_tasks < 0 or self.train_tasks < 0 or self.fixture_tasks_per_site < 1:
            raise ValueError("mind2web.eval_tasks and train_tasks must be >= 0, fixture_tasks_per_site >= 1")
        if self.candidate_top_k < 1:
            raise ValueError(f"mind2web.candidate_top_k must be >= 1, got {self.candidate_top_k}")
        if self.candidate_scores:
            check_format(self.candidate_scores)  # a pickle is refused here, before any job starts


class Mind2Web(Benchmark):
    name = "mind2web"
    section = "memprism_ray.benchmark.mind2web.benchmark:Mind2WebSection"
    env_factory = "memprism_ray.benchmark.mind2web.env:Mind2WebReplayEnv"
    train_keys = ("mind2web.train_tasks",)
    eval_keys = ("mind2web.eval_splits",)
    # D1 replays every training task (not only mind2web.train_tasks) on the candidate pool,
    # from the release or the fixture these keys name.
    d1_keys = (
        "mind2web.fixture",
        "mind2web.fixture_tasks_per_site",
        "mind2web.candidate_scores",
        "mind2web.candidate_top_k",
    )
    reference_source = "human trajectories"
    task_noun = "tasks"
    success_label = "exact success"
    summary_file = "mind2web.md"
    rewards = {"action_correct": action_correct_reward}  # noqa: RUF012 - a class constant
    contract = "memprism_ray.benchmark.mind2web.contract:MIND2WEB"
    phi = "memprism_ray.benchmark.mind2web.phi:MIND2WEB_PHI"
    table_a4_row = "mind2web"
    sft_row = {"epochs": 50, "lambda_cost": 0.02, "bf16": True}  # noqa: RUF012 - a class constant
    grpo_row = {  # noqa: RUF012
        "lr": 1e-6,
        "clip_eps_low": 0.1,
        "clip_eps_high": 0.15,
        "beta_kl": 0.01,
        "beta_entropy": 0.0,
        "top_p": 0.85,
        "iterations": 150,
        "reward": "action_correct",
    }
    # Mind2Web plans every task of mind2web.eval_splits (capped by mind2web.eval_tasks), not eval.episodes.
    job_supports = {  # noqa: RUF012
        "grpo": {"label.teacher": ("counterfactual", "llm"), "eval.episodes": (0,)},
        "eval": {"eval.episodes": (0,)},
    }

    def prepare(self, cfg: ExperimentConfig, log: Callable[[str], None] = print) -> ExperimentConfig:
        """``corpus.data_root`` set to a checked release root, or the fixture (``mind2web.fixture``)."""
        from memprism_ray.benchmark.mind2web.data import resolve_data_root
        from memprism_ray.benchmark.mind2web.fixture import ensure_fixture

        if cfg.mind2web.fixture:
            root = ensure_fixture(
                fixture_root(cfg),
                cfg.mind2web.fixture_tasks_per_site,
                cfg.corpus.seed,
                named=bool(cfg.corpus.data_root),
            )
            log(f"data: the generated Mind2Web fixture at {root} (not Mind2Web data: smoke runs only)")
        else:
            root = resolve_data_root(cfg.corpus.data_root or None)
            log(f"data: Mind2Web release at {root}")
        cfg = dataclasses.replace(cfg, corpus=dataclasses.replace(cfg.corpus, data_root=str(root)))
        pool = self.env_options(cfg)
        cfg = cfg.with_section("mind2web", dataclasses.replace(cfg.mind2web, **pool))
        if pool["candidate_scores"]:
            specs, _ = plan_episodes(root, cfg.mind2web.eval_splits, cfg.mind2web.eval_tasks)
            check_ranked(cfg, [s.game for s in specs], "the evaluation tasks")
        log(f"Mind2Web {candidate_pool(cfg)['description']}")
        return cfg

    def check_disjoint(self, cfg: ExperimentConfig) -> None:
        """The shared check (no evaluation task is a training task), and for the jobs that train,
        every step of the training split ranked by ``mind2web.candidate_scores``."""
        super().check_disjoint(cfg)
        if cfg.mind2web.candidate_scores:
            check_ranked(cfg, self.d1_games(cfg), "the training split")

    def env_options(self, cfg: ExperimentConfig) -> dict[str, object]:
        """The replay env's candidate pool: ``mind2web.candidate_scores`` resolved, and the cut."""
        from memprism_ray.benchmark.mind2web.candidates import resolve_scores_path

        m = cfg.mind2web
        path = str(resolve_scores_path(m.candidate_scores, cfg.corpus.data_root)) if m.candidate_scores else ""
        return {"candidate_scores": path, "candidate_top_k": m.candidate_top_k}

    def data_trees(self, cfg: ExperimentConfig) -> list[DataTree]:
        """The generated fixture is the job's; the release and a candidate-score file are checked."""
        root = cfg.corpus.data_root
        fix = "mount it at this path on every node (shared storage), or copy it there (docs/mind2web.md)"
        if cfg.mind2web.fixture:
            trees = [DataTree(root, "the generated Mind2Web fixture", owned=True)]
        else:
            trees = [DataTree(root, "the Mind2Web release (corpus.data_root)", owned=False, fix=fix)]
        scores = cfg.mind2web.candidate_scores
        if scores:
            trees.append(DataTree(scores, "mind2web.candidate_scores", owned=False, fix=fix))
        return trees

    def train_games(self, cfg: ExperimentConfig) -> list[GameRef]:
        """The training tasks that form GRPO groups (the first ``mind2web.train_tasks``)."""
        games = self.d1_games(cfg)
        return games[: cfg.mind2web.train_tasks] if cfg.mind2web.train_tasks else games

    def d1_games(self, cfg: ExperimentConfig) -> list[GameRef]:
        """Every task of the official training split, in file order."""
        from memprism_ray.benchmark.mind2web.data import list_games

        return list_games("train", cfg.corpus.data_root)

    def eval_plan(self, cfg: ExperimentConfig) -> EvalPlan:
        """Every task of each ``mind2web.eval_splits`` split in file order, with its recorded steps."""
        specs, expected = plan_episodes(cfg.corpus.data_root, cfg.mind2web.eval_splits, cfg.mind2web.eval_tasks)
        from memprism_ray.eval.episodes import EpisodeList

        splits = list(dict.fromkeys(s.game.split for s in specs))
        episodes = EpisodeList(
            split="mind2web",
            seed=cfg.run.seed,
            episode_ids=tuple(s.episode_id for s in specs),
            n_unique_games=len({(s.game.split, s.game.game_id) for s in specs}),
            rule=f"mind2web-file-order-v1: each task of {', '.join(splits)} once, splits and files in order",
        )
        return EvalPlan(episodes, specs, cfg.eval.workers, cfg.eval.slots, expected_steps=expected)

    # ------------------------------------------------------------------ D1
    def reference_table(
        self, cfg: ExperimentConfig, games: Sequence[GameRef], rollin: Sequence[GameRef], phi: Phi | None
    ) -> bytes:
        """Each task's human trajectory replayed and recorded with the rule Phi; a state's admissible
        set is its snapshot's element refs, its reference the human action."""
        import pyarrow.parquet as pq

        from memprism_ray.adapter.reference_table import ExpertEpisode, episodes_to_arrow
        from memprism_ray.benchmark.mind2web.snapshot_format import parse_snapshot

        episodes = []
        for game, goal, stream in human_streams(games, **(self.env_options(cfg) if cfg is not None else {})):
            admissible = tuple(tuple(parse_snapshot(r.raw.o_pre)) for r in stream.records)
            reference = tuple(r.raw.action_text for r in stream.records)
            episodes.append(ExpertEpisode(game, goal, stream, admissible, reference, "human", True))
        buf = io.BytesIO()
        pq.write_table(episodes_to_arrow(rerecord_episodes(episodes, phi)), buf)
        return buf.getvalue()

    def llm_teacher(self, config: LLMTeacherConfig) -> LLMViewTeacher:
        return Mind2WebLLMTeacher(config)

    # ------------------------------------------------------------------ evaluation report
    def write_condition(self, played: Played, out_dir: Path, manifest: RunManifest, ctx: EvalRun) -> Report:
        """The shared condition report, then the Mind2Web metrics beside it."""
        from memprism_ray.benchmark.mind2web import report as m2w

        pool, in_pool = candidate_pool(ctx.cfg), plan_positives_in_pool(ctx.plan.specs, self.env_options(ctx.cfg))
        rep = super().write_condition(played, out_dir, manifest, ctx)
        return m2w.write_condition_metrics(
            rep, played.results, played.rows, out_dir,
            expected_steps=ctx.plan.expected_steps, candidate_pool=pool, in_pool=in_pool,
        )  # fmt: skip

    def condition_line(self, rep: Report) -> str:
        o = rep["mind2web"]["overall"]
        acc, ok, mp = o["step_accuracy"], o["episode_success"], o["metric_py"]
        el, sr, task = mp["element_accuracy"], mp["step_success"], mp["task_success"]
        failed = f", {o['failed_episodes']} failed" if o["failed_episodes"] else ""
        return (
            f"paper step accuracy {acc['correct']}/{acc['n']} = {100 * acc['rate']:.1f}%, paper episode success "
            f"{ok['correct']}/{ok['n']}{failed}; MindAct (metric.py) element accuracy {el['correct']}/{el['n']}, "
            f"op F1 {100 * mp['operation_f1']['mean']:.1f}%, step SR {sr['correct']}/{sr['n']}, task SR "
            f"{task['correct']}/{task['n']} on the {rep['mind2web_pool']['protocol']} candidate pool"
        )

    def write_summary(self, reports: list[Report], played: list[Played], ctx: EvalRun) -> Report:
        """The generic ``summary.md`` and ``mind2web.md`` / ``mind2web.json``."""
        from memprism_ray.benchmark.mind2web import report as m2w

        generic = super().write_summary(reports, played, ctx)
        results_by = {p.condition: p.results for p in played}
        rows_by = {p.condition: p.rows for p in played}
        summary = m2w.write_summary(
            ctx.out_dir, reports, results_by, rows_by, ctx.plan.expected_steps,
            candidate_pool=candidate_pool(ctx.cfg), seed=ctx.cfg.run.seed,
        )  # fmt: skip
        summary["generic"] = generic
        return summary

    def failures(self, summary: Report) -> str | None:
        return super().failures(summary["generic"])

    def compared(self, condition_dir: Path) -> list[Outcomes]:
        from memprism_ray.benchmark.mind2web.report import compared_outcomes

        return compared_outcomes(condition_dir)

    def eval_metrics(self, summary: Report) -> list[Report]:
        return [
            {
                "condition": c,
                "step_accuracy": m["overall"]["step_accuracy"]["rate"],  # the paper's rules
                "episode_success": m["overall"]["episode_success"]["rate"],
                "mindact_element_accuracy": m["overall"]["metric_py"]["element_accuracy"]["rate"],  # metric.py
                "mindact_op_f1": m["overall"]["metric_py"]["operation_f1"]["mean"],
                "mindact_step_sr": m["overall"]["metric_py"]["step_success"]["rate"],
                "mindact_task_sr": m["overall"]["metric_py"]["task_success"]["rate"],
            }
            for c, m in summary["metrics"].items()
        ]


def fixture_root(cfg: ExperimentConfig) -> Path:
    """Where the fixture of ``cfg`` lives: ``corpus.data_root`` if set, else the cache."""
    if cfg.corpus.data_root:
        return Path(cfg.corpus.data_root)
    name = f"mind2web-fixture-s{cfg.corpus.seed}-k{cfg.mind2web.fixture_tasks_per_site}"
    return Path(cfg.corpus.cache_dir or cache_base()) / name


def plan_episodes(
    root: str | Path, splits: Sequence[str], tasks_per_split: int = 0
) -> tuple[list[Any], dict[str, int]]:
    """Every task of each split in file order as episodes ``mind2web/<split>/<annotation_id>#0``,
    and each episode's recorded steps."""
    from memprism_ray.agent import EpisodeSpec
    from memprism_ray.benchmark.mind2web.data import load_file, split_files

    specs: list[Any] = []
    expected: dict[str, int] = {}
    for split in splits:
        n = 0
        for f in split_files(split, root):
            for aid, task in load_file(f, split).items():
                if tasks_per_split and n >= tasks_per_split:
                    break
                # The episode-id form of eval/episodes.py ("<split>/<game_id>#<round>") with one
                # plan-wide split name, so one manifest records the plan over all test splits.
                eid = f"mind2web/{split}/{aid}#0"
                specs.append(EpisodeSpec(eid, GameRef(aid, f, task.domain or "unknown", split)))
                expected[eid] = len(task.steps)
                n += 1
    return specs, expected


def check_ranked(cfg: ExperimentConfig, games: Sequence[GameRef], what: str) -> None:
    """``mind2web.candidate_scores`` (resolved by :meth:`Mind2Web.prepare`) parsed on the driver,
    every row checked, and every step of ``games`` ranked by it (issue 40 item 3): a bad file is
    one line naming its file, line and fix before Ray starts, and the actors' later load of the
    same file cannot fail on its content (on the driver, the evaluation's pool check reuses the
    parse)."""
    from memprism_ray.benchmark.mind2web.candidates import load_candidate_ranks
    from memprism_ray.benchmark.mind2web.data import load_task

    ranks = load_candidate_ranks(cfg.mind2web.candidate_scores, cfg.mind2web.candidate_top_k)
    ranks.check_covers(((g.game_id, step.action_uid) for g in games for step in load_task(g).steps), what)


def candidate_pool(cfg: ExperimentConfig) -> dict[str, Any]:
    """The candidate pool ``cfg`` plays on, as the reports name it."""
    from memprism_ray.benchmark.mind2web.candidates import pool_info
    from memprism_ray.benchmark.mind2web.snapshot import SnapshotConfig

    m = cfg.mind2web
    return pool_info(m.candidate_scores, m.candidate_top_k, SnapshotConfig().max_candidates)


@functools.lru_cache(maxsize=1)
def _plan_in_pool(games: tuple[tuple[str, GameRef], ...], options: tuple[tuple[str, Any], ...]) -> dict[str, Any]:
    from memprism_ray.benchmark.mind2web.env import Mind2WebReplayEnv

    env = Mind2WebReplayEnv(1, **dict(options))
    return {eid: env.positives_in_pool(game) for eid, game in games}


def plan_positives_in_pool(specs: Sequence[Any], options: Mapping[str, Any]) -> dict[str, Any]:
    """Per planned episode, whether each recorded step shows a positive candidate (once per evaluation)."""
    return _plan_in_pool(tuple((s.episode_id, s.game) for s in specs), tuple(sorted(options.items())))


def human_streams(games: Sequence[GameRef], snapshot: Any = None, **env_options: Any) -> list[tuple[GameRef, str, Any]]:
    """``(game, goal, stream)`` of each task's human trajectory, replayed and recorded with the rule
    Phi on the candidate pool of ``env_options`` (so D1 sees the pages evaluation shows)."""
    from memprism_ray.benchmark.mind2web.data import load_task
    from memprism_ray.benchmark.mind2web.env import Mind2WebReplayEnv
    from memprism_ray.benchmark.mind2web.phi import Mind2WebPhi
    from memprism_ray.recorder.events import RawEvent
    from memprism_ray.recorder.phi.base import record_event
    from memprism_ray.recorder.stream import EventStream

    env = Mind2WebReplayEnv(1, snapshot, **env_options)
    phi = Mind2WebPhi()
    out = []
    for game in games:
        task = load_task(game)
        obs = env.reset(game)
        stream = EventStream({"goal": task.confirmed_task, "task_id": game.game_id, "benchmark": "mind2web"})
        o_pre = obs.text
        for t in range(len(task.steps)):
            tr = env.step(env.recorded_action())
            record_event(stream, RawEvent(o_pre, tr.meta["recorded_action"], tr.feedback, tr.reward, {"step": t}), phi)
            o_pre = tr.feedback
        out.append((game, task.confirmed_task, stream))
    return out


def _summary(observation: str, limit: int = 4000) -> str:
    return observation if len(observation) <= limit else observation[: limit - 3] + "..."


def mind2web_teacher_inputs(
    history: Sequence[Any], observation: str, goal: str, reference_next_action: Any
) -> dict[str, Any]:
    """Inputs of the Mind2Web view-teacher prompt (appendix E.2 "Mind2Web View Teacher") for one decision."""
    from memprism_ray.benchmark.mind2web.snapshot_format import parse_snapshot
    from memprism_ray.router.teacher import serialize_stream

    events = serialize_stream(history)
    for e in events:
        e.pop("feedback", None)  # pages are long; the deltas carry what changed
    elements = parse_snapshot(observation)
    return {
        "goal": goal,
        "current_summary": _summary(observation),
        "prior_summary_events": events,
        "summary_diffs": [
            {"step": rec.event.t, "delta": [d.to_dict() for d in rec.event.delta]} for rec in history if rec.event.delta
        ],
        "reference_next_action": reference_next_action,
        "observation_stats": {
            "elements": len(elements),
            "inputs": sum(e.tag in ("input", "textarea") for e in elements.values()),
            "selects": sum(e.tag == "select" for e in elements.values()),
            "prior_steps": len(history),
        },
    }


#: The Mind2Web view-teacher prompt of appendix E.2 ("Mind2Web View Teacher").
MIND2WEB_TEACHER_PROMPT = TeacherPrompt(
    "mind2web",
    (
        "goal",
        "current_summary",
        "prior_summary_events",
        "summary_diffs",
        "reference_next_action",
        "observation_stats",
        "target_vlm_spec",
        "view_action_space",
        "top_k",
    ),
    path=Path(__file__).resolve().with_name("prompts") / "view_teacher.txt",
)


class Mind2WebLLMTeacher(LLMViewTeacher):
    """The LLM view teacher with the Mind2Web prompt (appendix E.2) and its inputs."""

    prompt = MIND2WEB_TEACHER_PROMPT

    def state_inputs(self, state: Any) -> dict[str, Any]:
        return mind2web_teacher_inputs(state.history, state.observation, state.goal, state.reference_action)
