"""ALFWorld (paper "Benchmarks"; Table A.4 "D1, ALFWorld" and "GRPO, ALFWorld"): games of an
ALFWorld data tree, or the embedded corpus generated from the layouts the ``alfworld``
package ships; D1 from the handcoded expert plus the task policy's roll-ins; binary success;
the side-by-side table against the trained Router."""

from __future__ import annotations

import dataclasses
import os
import tempfile
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

from memprism_ray.benchmark.base import Benchmark, DataTree, EvalPlan
from memprism_ray.config_tree import field

if TYPE_CHECKING:
    from memprism_ray.config import ExperimentConfig
    from memprism_ray.envs.base import GameRef
    from memprism_ray.recorder.phi.base import Phi


@dataclass
class AlfworldSection:
    """ALFWorld's own settings (``--alfworld.<key>``): which splits it trains and evaluates on."""

    #: shared keys these settings were before they were ALFWorld's (issue 42): refused naming
    #: the new key, and read under it from an older checkpoint's config
    MOVED_FROM: ClassVar[dict[str, str]] = {"corpus.train_split": "train_split", "eval.split": "eval_split"}

    train_split: str = field("train", help="split whose games form GRPO groups and D1 data")
    eval_split: str = field("eval_out_of_distribution", help="split the final evaluation plays")

    def __post_init__(self) -> None:
        from memprism_ray.benchmark.alfworld.data import check_split

        check_split(self.train_split, "alfworld.train_split")
        check_split(self.eval_split, "alfworld.eval_split")


class Alfworld(Benchmark):
    name = "alfworld"
    env_factory = "memprism_ray.benchmark.alfworld:AlfworldEnv"
    section = "memprism_ray.benchmark.alfworld.benchmark:AlfworldSection"
    commands = "memprism_ray.benchmark.alfworld.cli"  # memprism games build / list / expert
    eval_options = {"split": ("alfworld.eval_split", "ALFWorld split: eval_out_of_distribution (default), train, ...")}  # noqa: RUF012
    train_keys = ("alfworld.train_split",)
    eval_keys = ("alfworld.eval_split", "corpus.data_root")
    d1_keys = ("alfworld.train_split",)  # D1 plays the training split's games
    contract = "memprism_ray.benchmark.alfworld.contract:ALFWORLD"
    phi = "memprism_ray.benchmark.alfworld.phi:ALFWORLD_PHI"
    table_a4_row = "alfworld"
    sft_row = {"epochs": 50, "lambda_cost": 0.02, "bf16": True}  # noqa: RUF012 - a class constant
    job_supports = {"grpo": {"label.teacher": ("counterfactual", "llm")}}  # noqa: RUF012

    def prepare(self, cfg: ExperimentConfig, log: Callable[[str], None] = print) -> ExperimentConfig:
        """``corpus.data_root`` (or ``$ALFWORLD_DATA``) checked, or the embedded corpus built on first use."""
        root = cfg.corpus.data_root or _official_root()
        if not root:
            from memprism_ray.benchmark.alfworld.corpus import ensure_default_corpus

            c = cfg.corpus
            cache = _embedded_root(cfg)
            log(
                f"games: embedded corpus ({c.train_games} train, {c.eval_games} per eval split, seed {c.seed}); "
                "built on first use"
            )
            root = str(ensure_default_corpus(cache, train=c.train_games, eval=c.eval_games, seed=c.seed))
        log(f"games: {root}")
        from memprism_ray.benchmark.alfworld.data import resolve_data_root

        root = str(resolve_data_root(root))  # checked: a clear error if it holds no games
        return dataclasses.replace(cfg, corpus=dataclasses.replace(cfg.corpus, data_root=root))

    def data_trees(self, cfg: ExperimentConfig) -> list[DataTree]:
        """The embedded corpus is the job's (10 MB for the default 144 games); a user's tree is checked."""
        root = cfg.corpus.data_root
        if root == str(_embedded_root(cfg)):
            return [DataTree(root, "the embedded ALFWorld corpus", owned=True)]
        fix = (
            "mount it at this path on every node (shared storage), or run alfworld-download (or the same "
            "`memprism games build` command) there"
        )
        return [DataTree(root, "corpus.data_root", owned=False, fix=fix)]

    def train_games(self, cfg: ExperimentConfig) -> list[GameRef]:
        from memprism_ray.benchmark.alfworld import list_games

        return list_games(cfg.alfworld.train_split, cfg.corpus.data_root)

    def eval_plan(self, cfg: ExperimentConfig) -> EvalPlan:
        episodes, specs, broken = plan_episodes(
            cfg.alfworld.eval_split, cfg.corpus.data_root, cfg.eval.episodes, cfg.run.seed
        )
        return EvalPlan(episodes, specs, cfg.eval.workers, cfg.eval.slots, broken=broken)

    def printed_summary(self, out_dir: Path) -> Path:
        """The side-by-side table against the trained Router, when the run evaluated one."""
        table = out_dir / "final_table.md"
        return table if table.exists() else out_dir / "summary.md"

    def rollins_apply(self, cfg: ExperimentConfig) -> bool:
        # A roll-in through the policy pool is not built: only the scripted policy plays them.
        return (
            bool(cfg.label.rollin_games) and cfg.label.teacher == "counterfactual" and cfg.policy.backend == "scripted"
        )

    def reference_table(
        self, cfg: ExperimentConfig, games: Sequence[GameRef], rollin: Sequence[GameRef], phi: Phi | None
    ) -> bytes:
        """ALFWorld's handcoded expert on ``games``, then the scripted policy's roll-ins on ``rollin``
        (a uniform view per step; the expert's next command is each reached state's reference)."""
        from memprism_ray.benchmark.alfworld import collect_expert_trajectories

        rollin_args: dict[str, Any] = {}
        if rollin:
            from memprism_ray.adapter.d1_labels import rollin_chooser, scripted_label_policy

            rollin_args = {
                "rollin_games": list(rollin),
                "choose": rollin_chooser(
                    scripted_label_policy(cfg, self.task_contract()),
                    cfg.render,
                    seed=cfg.run.seed,
                    short_history=cfg.agent.short_history,
                    benchmark=self.name,
                ),
                "rollin_steps": cfg.agent.max_steps,
            }
        with tempfile.TemporaryDirectory() as tmp:
            path = collect_expert_trajectories(list(games), tmp, max_steps=120, progress=False, phi=phi, **rollin_args)
            return Path(path).read_bytes()


def plan_episodes(
    split: str, data_root: str = "", n_episodes: int = 0, seed: int = 0
) -> tuple[Any, list[Any], dict[str, str]]:
    """``(episode list, specs in plan order, {game_id: error})`` of ``split`` over every game of it:
    a broken game stays in the plan (and every denominator) with the error its episodes fail with."""
    from memprism_ray.agent import EpisodeSpec
    from memprism_ray.benchmark.alfworld.data import scan_split
    from memprism_ray.eval.episodes import build_episode_list

    scan = scan_split(split, data_root or None)
    refs = {g.game_id: g for g in scan.games} | {b.game.game_id: b.game for b in scan.broken}
    episode_list = build_episode_list(split, sorted(refs), n_episodes or None, seed=seed)
    specs = [
        EpisodeSpec(eid, refs[gid]) for eid, gid in zip(episode_list.episode_ids, episode_list.game_ids, strict=True)
    ]
    broken = {b.game.game_id: f"broken game: {b.reason}" for b in scan.broken}
    return episode_list, specs, broken


def _embedded_root(cfg: ExperimentConfig) -> Path:
    """Where the embedded corpus of ``cfg.corpus`` is built and cached."""
    from memprism_ray.benchmark.alfworld.corpus import default_cache_dir

    c = cfg.corpus
    return default_cache_dir(c.seed, c.train_games, c.eval_games, base=Path(c.cache_dir) if c.cache_dir else None)


def _official_root() -> str:
    """``$ALFWORLD_DATA`` unless it is alfworld's own empty placeholder folder."""
    env = os.environ.get("ALFWORLD_DATA", "")
    if not env:
        return ""
    from memprism_ray.benchmark.alfworld.data import _is_alfworld_placeholder

    path = Path(os.path.expandvars(env)).expanduser()
    return "" if _is_alfworld_placeholder(path) else str(path)
