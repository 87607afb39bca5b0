"""The ``ebalfred`` section of the job config tree (configs/ebalfred_*.yaml; docs/ebalfred.md);
:func:`env_options` turns it into the :class:`~memprism_ray.benchmark.ebalfred.env.EbAlfredConfig`
every ``EbAlfredEnv`` of a run is built with."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from memprism_ray.benchmark.ebalfred.data import SUBSETS, TRAIN_SUBSET, check_subset
from memprism_ray.benchmark.ebalfred.env import EbAlfredConfig, check_settings
from memprism_ray.benchmark.ebalfred.examples import N_SHOTS
from memprism_ray.config_tree import field


@dataclass
class EbAlfredSection:
    """EB-ALFRED episodes, controller and simulator (paper "Benchmarks"; Table A.4)."""

    controller: str = field("embodiedbench", help="embodiedbench (AI2-THOR 2.1.0) or fake (replays the fixture)")
    fixture: str = field("", help="fixture folder for controller fake ('' : <run dir>/ebalfred-fixture, built)")
    fixture_episodes: int = field(3, help="episodes per subset when the fixture is built")
    splits: str = field("", help="EmbodiedBench splits.json ('' : the fixture's, else the installed EmbodiedBench's)")
    subsets: tuple[str, ...] = field(SUBSETS, help="evaluation subsets (per-subset and average SR)")
    episodes_per_subset: int = field(0, help="evaluation episodes per subset (0: all; the paper: 50)")
    train_subsets: tuple[str, ...] = field(
        (TRAIN_SUBSET,), help="subsets of train_splits whose episodes D1 and GRPO train on (alfred_train: ALFRED's)"
    )
    train_splits: str = field(
        "",
        help="EmbodiedBench-format list of the training episodes, written by python -m "
        "memprism_ray.benchmark.ebalfred.training ('' : the fixture's alfred_train.json; required for embodiedbench)",
    )
    skills: str = field("scene", help="skill list the prompt shows: scene (the paper's scene-filtered) or full")
    n_shots: int = field(N_SHOTS, help="in-context task-execution examples in the prompt (EmbodiedBench: 10)")
    examples: str = field("", help="folder of the example files ('' : EmbodiedBench's evaluator/config)")
    resolution: int = field(500, help="camera frame side in pixels (EmbodiedBench: 500)")
    x_display: str = field("1", help="X display AI2-THOR renders on (Xvfb or a GPU X server)")
    local_build: str = field("", help="local AI2-THOR build executable ('' : ai2thor downloads its build)")
    frame_dir: str = field("", help="write every post-action frame here (audit frames for the grounding stage)")
    policy_epsilon: float = field(0.2, help="scripted fixture stand-in: probability of a random skill per step")
    eval_workers: int = field(2, help="Ray actors playing evaluation episodes")
    eval_slots: int = field(4, help="episodes per evaluation actor played step-synchronously")

    def __post_init__(self) -> None:
        check_settings(self)
        self.subsets = tuple(check_subset(s, "ebalfred.subsets") for s in self.subsets)
        self.train_subsets = tuple(check_subset(s, "ebalfred.train_subsets", train=True) for s in self.train_subsets)
        if not self.subsets:
            raise ValueError("ebalfred.subsets must name at least one subset")
        if self.fixture_episodes < 1 or self.episodes_per_subset < 0:
            raise ValueError("ebalfred.fixture_episodes must be >= 1 and ebalfred.episodes_per_subset >= 0")
        if self.eval_workers < 1 or self.eval_slots < 1:
            raise ValueError("ebalfred.eval_workers and ebalfred.eval_slots must be >= 1")
        if not 0.0 <= self.policy_epsilon <= 1.0:
            raise ValueError(f"ebalfred.policy_epsilon must be in [0, 1], got {self.policy_epsilon}")

    def fixture_dir(self, run_dir: Path) -> Path:
        return Path(self.fixture) if self.fixture else run_dir / "ebalfred-fixture"

    def splits_path(self, run_dir: Path) -> Path | None:
        if self.splits:
            return Path(self.splits)
        return self.fixture_dir(run_dir) / "splits.json" if self.controller == "fake" else None

    def train_splits_path(self, run_dir: Path) -> Path:
        """The list of the training episodes: ``train_splits``, else the fixture's (``controller:
        fake``); the real controller's ``splits.json`` is the benchmark, never a training list
        (paper appendix "Training dataset setup")."""
        if self.train_splits:
            return Path(self.train_splits)
        if self.controller == "fake":
            from memprism_ray.benchmark.ebalfred.fixture import TRAIN_FILE

            return self.fixture_dir(run_dir) / TRAIN_FILE
        raise ValueError(
            "ebalfred.train_splits is empty: write the ALFRED training list with python -m "
            "memprism_ray.benchmark.ebalfred.training --alfred <json_2.1.0> --out <file> and set ebalfred.train_splits "
            "to it (docs/ebalfred.md)"
        )

    def env_config(self, run_dir: Path, progress_coef: float) -> EbAlfredConfig:
        """The settings every ``EbAlfredEnv`` of a run is built with."""
        return EbAlfredConfig(
            controller=self.controller,
            fixture=str(self.fixture_dir(run_dir).resolve()) if self.controller == "fake" else "",
            resolution=self.resolution,
            x_display=self.x_display,
            local_build=self.local_build,
            frame_dir=self.frame_dir,
            progress_coef=float(progress_coef),
            skills=self.skills,
            n_shots=self.n_shots,
            examples=self.examples,
        )


def env_options(cfg: Any) -> dict[str, Any]:
    """``EbAlfredEnv`` keyword arguments of a job config (``Benchmark.env_options``)."""
    return {"config": cfg.ebalfred.env_config(cfg.run.dir, cfg.grpo.progress_reward_coef)}
