"""A fourth, toy benchmark (issue 36 item 1): everything a benchmark brings, in one module that
touches no file of ``memprism_ray``, registered by one line
(``register_benchmark("toy", "tests.benchmark.toy_benchmark:Toy")``, tests/benchmark/test_toy_benchmark.py).

The task: reach the number N from 0 by ``add 1`` and ``add 2``. A step that would pass N is
refused ("Nothing happens."). The feedback says what was added, never the total, so an agent that
forgets how far it got overshoots: what the memory view shows decides.

* the environment, behind the shared protocol (``envs/base.py``): :class:`ToyEnv`;
* its Phi: the rule extractor :class:`ToyPhi` (``counter.value`` from the known state) and an LLM
  Phi prompt kept here (:data:`TOY_PHI`);
* its task contract: the prompt, the parser and the scripted CPU stand-in :class:`ToyPolicy`
  (:data:`CONTRACT`);
* its own settings section, ``--toy.<key>`` (:class:`ToySection`: which targets it trains and
  evaluates on);
* the benchmark: tasks, D1's expert, its own reward (:func:`fewest_adds`) and its report (:class:`Toy`).
"""

from __future__ import annotations

import io
import re
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from memprism_ray.benchmark.base import Benchmark, EvalPlan, EvalRun, Played, Report, rerecord_episodes
from memprism_ray.config_tree import field
from memprism_ray.envs.base import GameRef, Observation, Transition
from memprism_ray.io_atomic import atomic_write_text
from memprism_ray.policy.base import PolicyInput, PolicyOutput
from memprism_ray.policy.config import PolicyConfig
from memprism_ray.policy.contract import TaskContract
from memprism_ray.policy.parsing import ParseResult, invalid, match_action, normalized, short
from memprism_ray.policy.prompts import NO_HISTORY, Part, split_and_fill
from memprism_ray.policy.stand_in import seeded_rng, tempered_distribution
from memprism_ray.recorder.events import RawEvent, StateDelta
from memprism_ray.recorder.phi.base import Extraction, record_event
from memprism_ray.recorder.phi.prompt import PhiPrompt
from memprism_ray.recorder.phi.spec import AnswerSpec, PhiSpec, prompt_json
from memprism_ray.recorder.stream import EventStream

if TYPE_CHECKING:
    from memprism_ray.adapter.grpo_update import GRPOConfig
    from memprism_ray.agent import EpisodeResult
    from memprism_ray.config import ExperimentConfig
    from memprism_ray.recorder.phi.base import Phi

MODULE = "tests.benchmark.toy_benchmark"
ACTIONS = ("add 1", "add 2")
REFUSED = "Nothing happens."


def target_of(game: GameRef) -> int:
    return int(game.game_id.removeprefix("reach-"))


def game(n: int, split: str) -> GameRef:
    return GameRef(f"reach-{n}", Path("."), "reach", split)


# --------------------------------------------------------------------------------- environment
class ToyEnv:
    """``num_slots`` counters; ``options`` none (``Benchmark.env_options``)."""

    def __init__(self, num_slots: int = 1) -> None:
        self._slots: list[list[int] | None] = [None] * num_slots  # [value, target, steps]

    @property
    def num_slots(self) -> int:
        return len(self._slots)

    def reset(self, game: GameRef, slot: int = 0) -> Observation:
        self._slots[slot] = [0, target_of(game), 0]
        goal = f"Your task is to: reach {target_of(game)}."
        return Observation(f"You start at 0. {goal}", goal, ACTIONS, {"game_id": game.game_id, "task_type": "reach"})

    def step(self, action: str, slot: int = 0) -> Transition:
        state = self._slots[slot]
        if state is None:
            raise RuntimeError(f"slot {slot}: step before reset")
        state[2] += 1
        k = {"add 1": 1, "add 2": 2}.get(action.strip())
        if k is None or state[0] + k > state[1]:
            return Transition(REFUSED, 0.0, False, False, ACTIONS, {"step": state[2]})
        state[0] += k
        won = state[0] == state[1]
        return Transition(f"You add {k}.", 1.0 if won else 0.0, won, won, ACTIONS, {"step": state[2]})

    def close(self) -> None:
        self._slots = [None] * len(self._slots)


# --------------------------------------------------------------------------------- Phi
class ToyPhi:
    """Rules: an accepted ``add k`` moves ``counter.value`` from the known state by k; the
    refusal is the failure language."""

    name = "toy-rule"

    def extract(self, raw: RawEvent, known_state: Mapping[str, str]) -> Extraction:
        m = re.fullmatch(r"You add (\d)\.", raw.feedback.strip())
        if m is None:
            return Extraction("counter", "other", failed=raw.feedback.startswith(REFUSED))
        value = int(known_state.get("counter.value", "0")) + int(m.group(1))
        return Extraction("counter", "add", (StateDelta("counter.value", str(value)),))


def toy_inputs(raw: RawEvent, known_state: Mapping[str, str], rule: Extraction) -> tuple[dict[str, str], list[bytes]]:
    return {"state": prompt_json(dict(known_state)), "action": raw.action_text, "result": raw.feedback}, []


TOY_PROMPT = PhiPrompt(
    "toy",
    ("state", "action", "result"),
    text='Known state: {state}\nAction: {action}\nResult: {result}\nReturn JSON {"delta_s": [...]} '
    "with the key counter.value only.",
)
TOY_PHI = PhiSpec(
    "toy", ToyPhi, TOY_PROMPT, AnswerSpec(frozenset({"delta_s"}), frozenset({"counter.value"}), False), toy_inputs
)


# --------------------------------------------------------------------------------- task contract
TEMPLATE = """<image>
You are counting. {goal}
Your last steps:
{history}
Now: {observation}
Choose one of {actions}. Answer <action>add 1</action> or <action>add 2</action>.
"""


class ToyContract(TaskContract):
    name = "toy"
    stand_in = f"{MODULE}:ToyPolicy"

    def template_parts(self, inp: PolicyInput, layout: str) -> list[Part]:
        history = "\n".join(f"{r.action} -> {r.feedback}" for r in inp.history) or NO_HISTORY
        values = {"goal": inp.goal, "history": history, "observation": inp.observation, "actions": inp.admissible}
        return split_and_fill(TEMPLATE, values, inp, attach=False)

    def parse(self, inp: PolicyInput, text: str) -> ParseResult:
        got = match_action(text, inp.admissible, "actions", normalized)
        return got if isinstance(got, ParseResult) else invalid(f"action {short(got)} is not add 1 or add 2")


CONTRACT = ToyContract()


class ToyPolicy:
    """The CPU stand-in: it knows how far it got only from its memory (the largest
    ``counter.value`` the view or the history shows) and adds 2 while that leaves room."""

    name = "scripted-toy"
    contract = CONTRACT
    needs_view_text = True
    needs_view_image = False

    def __init__(self, temperature: float = 1.0, seed: int = 0) -> None:
        self.temperature, self.seed = float(temperature), int(seed)

    @classmethod
    def from_config(cls, config: PolicyConfig) -> ToyPolicy:
        return cls(**{k: v for k, v in config.scripted.items() if k in ("temperature", "seed")})

    def input_distribution(self, inp: PolicyInput) -> dict[str, float]:
        view = inp.view_text if inp.view_text is not None else inp.meta.get("view_text")
        memory = [str(view or "")] if inp.view_mode != "none" else []
        seen = [int(v) for v in re.findall(r"counter\.value\D{1,6}(\d+)", "\n".join(memory))]
        left = int(re.findall(r"\d+", inp.goal)[-1]) - max(seen, default=0)
        return tempered_distribution({"add 2": 1.0 if left >= 2 else -1.0, "add 1": 0.0}, self.temperature)

    def act(self, inputs: Sequence[PolicyInput]) -> list[PolicyOutput]:
        out = []
        for inp in inputs:
            start, dist = time.perf_counter(), self.input_distribution(inp)
            rng = seeded_rng(self.seed, str(inp.meta.get("episode_id", "")), inp.step)
            action = rng.choices(list(dist), weights=list(dist.values()))[0]
            out.append(
                self.contract.to_output(inp, f"<action>{action}</action>", latency_s=time.perf_counter() - start)
            )
        return out


# --------------------------------------------------------------------------------- settings
@dataclass
class ToySection:
    """The toy's own settings (``--toy.<key>``; ``cfg.toy``): the targets of its games."""

    train_targets: tuple[int, ...] = field(tuple(range(4, 10)), help="targets N of the training games")
    eval_targets: tuple[int, ...] = field(tuple(range(10, 14)), help="targets N of the evaluation games")

    def __post_init__(self) -> None:
        if not self.train_targets or not self.eval_targets or min(*self.train_targets, *self.eval_targets) < 1:
            raise ValueError("toy.train_targets and toy.eval_targets: at least one target each, every one >= 1")
        both = sorted(set(self.train_targets) & set(self.eval_targets))
        if both:
            raise ValueError(f"toy: targets {both} are in both toy.train_targets and toy.eval_targets")


# --------------------------------------------------------------------------------- the benchmark
def fewest_adds(result: EpisodeResult, grpo: GRPOConfig) -> float:
    """The toy's own GRPO return: a win in the fewest adds (ceil(N / 2)) is 1, a longer win
    less, a loss 0 (a :data:`~memprism_ray.benchmark.base.Reward`)."""
    if not result.won or not result.steps:
        return 0.0
    return -(-target_of(result.spec.game) // 2) / result.steps


class Toy(Benchmark):
    name = "toy"
    section = f"{MODULE}:ToySection"
    rewards = {"fewest_adds": fewest_adds}  # noqa: RUF012 - a class constant
    env_factory = f"{MODULE}:ToyEnv"
    contract = f"{MODULE}:CONTRACT"
    phi = f"{MODULE}:TOY_PHI"
    train_keys = ("toy.train_targets",)
    eval_keys = ("toy.eval_targets",)
    table_a4_row = "toy"
    summary_file = "toy.md"

    def train_games(self, cfg: ExperimentConfig) -> list[GameRef]:
        return [game(n, "train") for n in cfg.toy.train_targets]

    def eval_plan(self, cfg: ExperimentConfig) -> EvalPlan:
        from memprism_ray.agent import EpisodeSpec
        from memprism_ray.eval.episodes import build_episode_list

        games = {g.game_id: g for g in (game(n, "eval") for n in cfg.toy.eval_targets)}
        episodes = build_episode_list("toy", list(games), cfg.eval.episodes or None, seed=cfg.run.seed)
        specs = [EpisodeSpec(e, games[g]) for e, g in zip(episodes.episode_ids, episodes.game_ids, strict=True)]
        return EvalPlan(episodes, specs, cfg.eval.workers, cfg.eval.slots)

    def reference_table(
        self, cfg: ExperimentConfig, games: Sequence[GameRef], rollin: Sequence[GameRef], phi: Phi | None
    ) -> bytes:
        """The expert: add 2 while two or more are left, then add 1."""
        import pyarrow.parquet as pq

        from memprism_ray.adapter.reference_table import ExpertEpisode, episodes_to_arrow

        env, rules, episodes = ToyEnv(1), ToyPhi(), []
        for g in games:
            obs, value, plan = env.reset(g), 0, []
            stream = EventStream({"benchmark": self.name, "game_id": g.game_id, "goal": obs.goal})
            o_pre = obs.text
            while value < target_of(g):
                plan.append("add 2" if target_of(g) - value >= 2 else "add 1")
                tr = env.step(plan[-1])
                record_event(stream, RawEvent(o_pre, plan[-1], tr.feedback, tr.reward, {"step": len(plan)}), rules)
                value, o_pre = value + int(plan[-1][-1]), tr.feedback
            episodes.append(ExpertEpisode(g, obs.goal, stream, (ACTIONS,) * len(plan), tuple(plan), "expert", True))
        buf = io.BytesIO()
        pq.write_table(episodes_to_arrow(rerecord_episodes(episodes, phi)), buf)
        return buf.getvalue()

    def write_summary(self, reports: list[Report], played: list[Played], ctx: EvalRun) -> Report:
        """The shared ``summary.md`` and the toy's own ``toy.md``: targets reached per condition."""
        summary = super().write_summary(reports, played, ctx)
        targets = ", ".join(map(str, ctx.cfg.toy.eval_targets))
        lines = ["# Toy: reach N", "", f"Targets: {targets}", "", "| condition | reached | SR |", "|---|---|---|"]
        for rep in reports:
            lines.append(f"| {rep['condition']} | {rep['successes']}/{rep['n']} | {100 * rep['sr']:.1f}% |")
        atomic_write_text(ctx.out_dir / self.summary_file, "\n".join(lines) + "\n")
        return summary
