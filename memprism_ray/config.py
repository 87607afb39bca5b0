"""The one config tree of a memprism-ray job (docs/architecture.md "Configuration"). Each section
is the dataclass of the component it configures (``grpo`` is the adapter's ``GRPOConfig``, ...);
this module adds the jobs' own sections and loads presets::

    cfg = load_config("configs/local.yaml", ["--grpo.lr", "1e-6"])
"""

from __future__ import annotations

import dataclasses
import math
import os
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar, Literal

from memprism_ray.adapter.grpo_update import GRPOConfig
from memprism_ray.adapter.sft import SFTConfig
from memprism_ray.agent import AgentConfig
from memprism_ray.baselines.conditions import canonical_conditions, condition_needs
from memprism_ray.baselines.external import MemoryBaselineConfig
from memprism_ray.config_tree import (
    Seed,
    field,
    from_dict,
    load_yaml,
    loadable_sections,
    merge,
    parse_overrides,
    sections_field,
)
from memprism_ray.policy.config import PolicyConfig
from memprism_ray.recorder.phi.config import PhiConfig
from memprism_ray.registry import DEFAULT_BENCHMARK, section_types
from memprism_ray.render.config import RenderConfig
from memprism_ray.router.encoder import EncoderConfig
from memprism_ray.router.model import RouterConfig
from memprism_ray.router.teacher import CounterfactualConfig, LLMTeacherConfig

_RUN_NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")


def check_run_name(name: str) -> str:
    """``name`` if it is one plain directory name (no ``/``, no ``..``, not absolute)."""
    if not isinstance(name, str) or not _RUN_NAME_RE.match(name):
        raise ValueError(
            f"run.name {name!r}: must be a single directory name of letters, digits, '.', '_' and '-' "
            "starting with a letter or digit (no '/', no '..', not an absolute path)"
        )
    return name


def joins_cluster(address: str, environ: Mapping[str, str] = os.environ) -> bool:
    """Whether a job with ``run.ray_address`` ``address`` joins a running cluster (``"auto"``
    under ``ray job submit``, which sets ``RAY_ADDRESS``) rather than starting a local Ray on
    this machine: then its actors may run on other nodes (docs/gpu.md "Placement")."""
    return address == "auto" and bool(environ.get("RAY_ADDRESS"))


#: Settings that say where and how a run executes, not what it computes: a resumed run
#: (trainer/run_dir.py) and a continued evaluation (trainer/evaluate.py) may change them.
RESUME_FREE_KEYS = frozenset(
    {
        "run.name",
        "run.out_dir",
        "run.resume",
        "run.allow_config_change",
        "run.ray_address",
        "run.num_cpus",
        "run.call_timeout_s",
        "run.tensorboard",
        "run.checkpoint_every",
        "run.learner_restarts",
    }
)


@dataclass
class RunConfig:
    """Where a job writes and how it resumes."""

    name: str = field(f"grpo-{DEFAULT_BENCHMARK}", help="run name: the run directory is <out_dir>/<name>")
    out_dir: str = field("runs", help="parent directory of run directories ('~': the driver's home)")
    seed: Seed = field(0, help="job seed: task sampling, rollout sampling, final evaluation order")
    resume: str = field("", help="'' (fresh; refuses a non-empty run dir), 'auto' (latest checkpoint) or a path")
    allow_config_change: bool = field(
        False, help="resume from a checkpoint made with a different config (e.g. a new --grpo.lr)"
    )
    checkpoint_every: int = field(1, help="learner checkpoint every K iterations (and at the end)")
    learner_restarts: int = field(
        3,
        help="times a lost Learner (its actor or node) is started again from the last checkpoint, "
        "replaying the iterations since; past it the job ends with the --resume command",
    )
    ray_address: str = field("auto", help="'auto': join the job's cluster or start a local one; 'local': always local")
    num_cpus: int = field(0, help="CPUs of a locally started Ray (0: all)")
    call_timeout_s: float = field(300.0, help="timeout of every ray.get on a worker call")
    tensorboard: bool = field(True, help="write TensorBoard event files beside the JSONL log")

    def __post_init__(self) -> None:
        check_run_name(self.name)
        if self.checkpoint_every < 1:
            raise ValueError(f"run.checkpoint_every must be >= 1, got {self.checkpoint_every}")
        if self.learner_restarts < 0:
            raise ValueError(f"run.learner_restarts must be >= 0, got {self.learner_restarts}")
        if not 0 < self.call_timeout_s < math.inf:
            raise ValueError(f"run.call_timeout_s must be a finite number of seconds > 0, got {self.call_timeout_s}")
        if self.ray_address not in ("auto", "local"):
            raise ValueError(
                f"run.ray_address must be 'auto' (join the cluster of `ray job submit`, else start a local Ray) "
                f"or 'local', got {self.ray_address!r}; to use a cluster, submit the job to it (clusters/README.md)"
            )

    @property
    def dir(self) -> Path:
        # `~` expanded here: under `ray job submit` (which quotes its arguments) it is the
        # head's home, not the submitting machine's.
        return Path(self.out_dir).expanduser() / self.name


@dataclass
class CorpusSection:
    """Which games the job plays: an ALFWorld data root, or the embedded generated corpus."""

    benchmark: str = field(
        DEFAULT_BENCHMARK, help="benchmark the job trains and evaluates on (memprism_ray/benchmark/)"
    )
    data_root: str = field("", help="ALFWorld data root ('' : $ALFWORLD_DATA, else the embedded generated corpus)")
    train_games: int = field(48, help="embedded corpus: training games built on first use")
    eval_games: int = field(48, help="embedded corpus: games per evaluation split built on first use")
    seed: Seed = field(0, help="embedded corpus seed")
    cache_dir: str = field("", help="embedded corpus location ('' : $MEMPRISM_CACHE or ~/.cache/memprism)")

    def __post_init__(self) -> None:
        if self.train_games < 1 or self.eval_games < 0:
            raise ValueError("corpus.train_games must be >= 1 and corpus.eval_games >= 0")
        # The benchmark's name is checked where it is looked up (get_benchmark, above this layer).


@dataclass
class LabelConfig:
    """D1 data: reference trajectories labelled by a view teacher (appendix A.3); each teacher's
    settings are the dataclass it takes (``label.counterfactual``, ``label.llm``)."""

    #: The flat keys of the one-section label config, each refused with its new key.
    RENAMED: ClassVar[dict[str, str]] = {
        "samples_per_view": "counterfactual.samples_per_view",
        "cost_temperature": "counterfactual.cost_temperature",
        "uninformative": "counterfactual.uninformative",
        "tie_break_temperature": "counterfactual.tie_break_temperature",
        "page_token_temperature": "counterfactual.page_token_temperature",
        "llm_source": "llm.source",
        "llm_base_url": "llm.base_url",
        "llm_model": "llm.model",
        "llm_max_tokens": "llm.max_tokens",
        "llm_concurrency": "llm.concurrency",
        "top_k": "llm.top_k",
    }

    teacher: str = field(
        "counterfactual", help="view teacher: counterfactual (label.counterfactual, no LLM) or llm (label.llm)"
    )
    games: int = field(24, help="training games whose expert trajectories are labelled")
    rollin_games: int = field(
        0,
        help="further training games the task policy plays itself (a random view per step) with the handcoded "
        "expert's next command as each state's reference: D1 then sees the long searches that the expert's short "
        "trajectories never reach (counterfactual teacher on the scripted policy only; else D1 says it skips them)",
    )
    policy_temperature: float = field(
        0.5, help="temperature of the scripted task policy D1 labels with and plays its roll-ins with"
    )
    workers: int = field(2, help="Ray tasks labelling in parallel")
    counterfactual: CounterfactualConfig = field(
        default_factory=CounterfactualConfig, help="the counterfactual teacher (label.teacher: counterfactual)"
    )
    llm: LLMTeacherConfig = field(
        default_factory=LLMTeacherConfig, help="the LLM view teacher and its endpoint (label.teacher: llm)"
    )

    def __post_init__(self) -> None:
        if self.teacher not in ("counterfactual", "llm"):
            raise ValueError(f"label.teacher must be 'counterfactual' or 'llm', got {self.teacher!r}")
        if self.rollin_games < 0:
            raise ValueError(f"label.rollin_games must be >= 0, got {self.rollin_games}")
        if self.games < 1 or self.workers < 1:
            raise ValueError("label.games and label.workers must be >= 1")
        if not self.policy_temperature >= 0:
            raise ValueError(f"label.policy_temperature must be >= 0 (0 = greedy), got {self.policy_temperature}")
        if self.counterfactual.page_token_temperature > 0 and self.teacher != "counterfactual":
            raise ValueError(
                "label.counterfactual.page_token_temperature shades the counterfactual teacher's labels; "
                f"label.teacher={self.teacher!r} does not use it (set it to 0)"
            )


@dataclass
class RolloutConfig:
    """Placement of the rollout actors (docs/architecture.md "Distributed rollout")."""

    num_workers: int | Literal["auto"] = field(
        2,
        help="RolloutWorker actors; each runs one group at a time. auto: one seat per group of an iteration "
        "(grpo.groups_per_iteration), as many playing as the cluster can place at each iteration: a lost node "
        "shrinks the fleet, a node that joins grows it (docs/cluster.md)",
    )
    env_slots_per_worker: int = field(16, help="game slots per rollout worker (>= grpo.group_size)")
    env_workers_per_rollout: int = field(1, help="EnvWorker actors per rollout worker (slots split among them)")
    env_cpus: float = field(0.5, help="CPUs reserved by each EnvWorker")
    rollout_cpus: float = field(0.5, help="CPUs reserved by each RolloutWorker (Router + encoder)")
    phi_workers: int = field(1, help="PhiWorker actors (0: extract inside the rollout worker)")
    view_workers: int = field(1, help="ViewWorker actors (0: compose + render inside the rollout worker)")
    view_cache_size: int = field(2048, help="content-addressed view cache entries per ViewWorker")
    policy_cpus: float = field(0.25, help="CPUs reserved by each policy replica (besides its GPUs)")
    learner_gpus: float = field(
        0.0, help="GPUs of the Learner and the D1 SFT task (a fraction shares a GPU, e.g. 0.1; 0: CPU)"
    )
    learner_cpus: float = field(0.25, help="CPUs reserved by the Learner and the D1 SFT task")
    learner_threads: int = field(
        0,
        help="torch threads of the Learner and the D1 SFT task (0: torch's default under Ray's CPU reservation); "
        "both compute while no rollout runs, so one machine can give them every core",
    )
    helper_cpus: float = field(0.25, help="CPUs reserved by each Phi/View worker")
    max_restarts: int = field(
        3, help="automatic restarts of a dead actor; for a rollout worker, replacements before it is retired"
    )
    rerun_failed: bool = field(True, help="re-run a group once when some of its trajectories failed")
    group_timeout_s: float = field(
        900.0, help="longest wait for one group; then its rollout worker is killed and replaced, the group played again"
    )

    @property
    def elastic(self) -> bool:
        """``num_workers: auto``: the fleet follows the cluster (docs/cluster.md "An elastic fleet")."""
        return self.num_workers == "auto"

    def seat_cpus(self) -> float:
        """CPUs one rollout worker reserves: its own and its EnvWorkers' (a seat is placed whole)."""
        return self.rollout_cpus + self.env_workers_per_rollout * self.env_cpus

    def __post_init__(self) -> None:
        workers = self.num_workers
        if not self.elastic and (isinstance(workers, bool) or not isinstance(workers, int) or workers < 1):
            raise ValueError(f"rollout.num_workers must be an int >= 1 or auto, got {workers!r}")
        if self.env_slots_per_worker < 1 or self.env_workers_per_rollout < 1:
            raise ValueError("rollout.env_slots_per_worker and env_workers_per_rollout must be >= 1")
        if self.env_workers_per_rollout > self.env_slots_per_worker:
            raise ValueError("rollout.env_workers_per_rollout cannot exceed rollout.env_slots_per_worker")
        if min(self.env_cpus, self.rollout_cpus, self.policy_cpus, self.helper_cpus) < 0:
            raise ValueError("rollout CPU reservations must be >= 0")
        if self.learner_gpus < 0 or self.learner_cpus < 0:
            raise ValueError("rollout.learner_gpus and rollout.learner_cpus must be >= 0")
        threads = self.learner_threads
        if isinstance(threads, bool) or not isinstance(threads, int) or threads < 0:
            raise ValueError(f"rollout.learner_threads must be an int >= 0, got {self.learner_threads!r}")
        if min(self.phi_workers, self.view_workers, self.max_restarts, self.view_cache_size) < 0:
            raise ValueError("rollout.phi_workers, view_workers, max_restarts and view_cache_size must be >= 0")
        t = self.group_timeout_s
        if isinstance(t, bool) or not isinstance(t, (int, float)) or not math.isfinite(t) or t <= 0:
            raise ValueError(f"rollout.group_timeout_s must be a positive finite number of seconds, got {t!r}")


@dataclass
class FinalEvalConfig:
    """The evaluation a training job ends with (and ``jobs/eval_<benchmark>.py`` and ``memprism eval`` run)."""

    enabled: bool = field(True, help="evaluate the trained Router at the end of the job")
    episodes: int = field(0, help="episodes (0: every game of the split once)")
    conditions: tuple[str, ...] = field(
        ("memprism", "freq_random"), help="conditions; freq_random uses the memprism run's view marginal"
    )
    workers: int = field(2, help="Ray actors playing evaluation episodes in parallel")
    slots: int = field(8, help="episodes per actor played step-synchronously")
    artifacts: int = field(2, help="episodes per condition with full artifacts (views, HTML)")
    marginal: str = field(
        "",
        help="freq_random's view marginal: '' (this run's memprism), a report.json or its folder, an evaluation's "
        "summary.json or --out (its memprism's), or a JSON list",
    )
    memory: MemoryBaselineConfig = field(
        default_factory=MemoryBaselineConfig, help="LLM endpoint of the external memory baselines (mem0, amem, ...)"
    )

    def __post_init__(self) -> None:
        if self.workers < 1 or self.slots < 1 or self.episodes < 0:
            raise ValueError("eval.workers and eval.slots must be >= 1, eval.episodes >= 0")
        if self.artifacts < 0:
            raise ValueError(f"eval.artifacts must be >= 0, got {self.artifacts}")
        # by their canonical names: the folders `memprism compare` pairs across runs
        self.conditions = canonical_conditions(self.conditions, "eval.conditions")
        for condition in self.conditions:
            if "memory_llm" in condition_needs(condition) and not self.memory.base_url:
                raise ValueError(
                    f"eval.conditions: {condition!r} calls an LLM for its memory and no endpoint is configured: "
                    "set eval.memory.base_url to an OpenAI-compatible server (docs/baselines.md)"
                )
        for i, condition in enumerate(self.conditions):
            # Without eval.marginal, freq_random samples the marginal this run's memprism measured.
            if "marginal" in condition_needs(condition) and not self.marginal and "memprism" not in self.conditions[:i]:
                raise ValueError(
                    f"eval.conditions: {condition!r} samples the view marginal of this run's memprism condition; "
                    f"list memprism before it (got {', '.join(self.conditions)}), or name one in eval.marginal"
                )


@dataclass
class ExperimentConfig:
    """Everything one job reads."""

    run: RunConfig = field(default_factory=RunConfig, help="run directory, resume and Ray connection")
    corpus: CorpusSection = field(default_factory=CorpusSection, help="games")
    agent: AgentConfig = field(default_factory=AgentConfig, help="decision loop")
    render: RenderConfig = field(default_factory=RenderConfig, help="optical renderer")
    encoder: EncoderConfig = field(default_factory=EncoderConfig, help="frozen MiniLM encoder")
    router: RouterConfig = field(default_factory=RouterConfig, help="Router architecture")
    label: LabelConfig = field(default_factory=LabelConfig, help="D1 view-teacher labelling")
    sft: SFTConfig = field(default_factory=SFTConfig, help="D1 optimisation")
    grpo: GRPOConfig = field(default_factory=GRPOConfig, help="D2 grouped GRPO")
    rollout: RolloutConfig = field(default_factory=RolloutConfig, help="rollout actor placement")
    policy: PolicyConfig = field(default_factory=PolicyConfig, help="frozen task policy")
    eval: FinalEvalConfig = field(default_factory=FinalEvalConfig, help="final evaluation")
    phi: PhiConfig = field(default_factory=PhiConfig, help="event extractor Phi: rules or LLM (docs/phi.md)")
    init_checkpoint: str = field("", help="Router checkpoint GRPO starts from ('' : run D1 first, in this job)")
    sections: dict[str, Any] = sections_field(
        section_types, help="each benchmark's own settings section (its Benchmark.section), read as --<name>.<key>"
    )

    def __post_init__(self) -> None:
        types = loadable_sections(section_types)
        self.sections = dict(self.sections)  # a replace() must not share the dict it fills
        for name, section in self.sections.items():
            if name not in types or not isinstance(section, types[name]):
                raise ValueError(f"{name}: not a benchmark settings section (known: {', '.join(types)})")
        for name, tp in types.items():
            self.sections.setdefault(name, tp())
        for name, device in (("grpo.device", self.grpo.device), ("sft.device", self.sft.device)):
            if device.startswith("cuda") and self.rollout.learner_gpus <= 0:
                raise ValueError(f"{name}={device} needs rollout.learner_gpus > 0 (e.g. 0.1), got 0")
            if device == "cpu" and self.rollout.learner_gpus > 0:
                raise ValueError(
                    f"{name}=cpu contradicts rollout.learner_gpus={self.rollout.learner_gpus}: set one of them"
                )
        if self.label.teacher == "llm" and self.label.llm.source == "pool" and self.policy.backend != "vllm":
            raise ValueError(
                f"label.llm.source=pool serves the teacher on the policy pool's vLLM engines, but policy.backend is "
                f"{self.policy.backend!r}: use label.llm.source: endpoint"
            )
        if self.phi.kind == "llm" and self.phi.llm_source == "pool" and self.policy.backend != "vllm":
            raise ValueError(
                f"phi.llm_source=pool sends the Phi prompts to the policy pool's vLLM engines, but policy.backend is "
                f"{self.policy.backend!r}: use phi.llm_source: endpoint"
            )
        if self.rollout.env_slots_per_worker < self.grpo.group_size:
            raise ValueError(
                f"rollout.env_slots_per_worker ({self.rollout.env_slots_per_worker}) must be >= grpo.group_size "
                f"({self.grpo.group_size}): a rollout worker plays a whole group step-synchronously"
            )

    def __getattr__(self, name: str) -> Any:
        # A benchmark's section reads as a section of the tree (cfg.mind2web); only called for
        # names that are not attributes, and never for dunders (pickle, copy probe those first).
        sections = self.__dict__.get("sections")
        if name.startswith("__") or sections is None or name not in sections:
            raise AttributeError(f"{type(self).__name__!r} has no attribute or benchmark section {name!r}")
        return sections[name]

    def with_section(self, name: str, section: Any) -> ExperimentConfig:
        """This config with benchmark ``name``'s settings section replaced by ``section``."""
        return dataclasses.replace(self, sections={**self.sections, name: section})


def load_config(path: str | Path | None = None, overrides: Sequence[str] = ()) -> ExperimentConfig:
    """A preset (YAML, optional ``base:`` inheritance) plus dotted ``--section.key value`` overrides."""
    data = load_yaml(path) if path else {}
    data = merge(data, parse_overrides(overrides))
    return from_dict(ExperimentConfig, data)
