"""Memory-interface conditions in the decision loop (paper appendix "External baselines":
the same serialized transitions reach every memory, retrieved content goes into the prompt's
view slot, auxiliary calls are counted; appendix "Optical baseline scope": AgentOCR w/o RL).

Runs on the real ALFWorld engine over the shared tiny corpus with the scripted policy."""

from __future__ import annotations

import io
from collections.abc import Sequence
from pathlib import Path

import pytest
from PIL import Image

from memprism_ray.agent import Agent, AgentConfig, EpisodeSpec, LocalServices, TokenCounter
from memprism_ray.baselines import make_selector
from memprism_ray.baselines.memory import MemoryCounters, MemorySelector, MemoryView, memory_totals
from memprism_ray.benchmark.alfworld.phi import AlfworldPhi
from memprism_ray.benchmark.alfworld.scripted import ScriptedPolicy
from memprism_ray.policy.base import HistoryRecord, PolicyInput
from memprism_ray.render.visual_tokens import qwen25vl_tokens


class RecordingPolicy(ScriptedPolicy):
    def __init__(self) -> None:
        super().__init__(temperature=0.0, seed=0)
        self.seen: dict[str, list[PolicyInput]] = {}

    def act(self, inputs: Sequence[PolicyInput]):
        for inp in inputs:
            self.seen.setdefault(inp.meta["episode_id"], []).append(inp)
        return super().act(inputs)


@pytest.fixture(scope="module")
def env():
    from memprism_ray.benchmark.alfworld import AlfworldEnv

    e = AlfworldEnv(num_slots=3)
    yield e
    e.close()


@pytest.fixture(scope="module")
def games(memprism_tiny_corpus: Path) -> list:
    from memprism_ray.benchmark.alfworld import list_games

    return list_games("eval_out_of_distribution", memprism_tiny_corpus)[:3]


def _run(env, games, selector, max_steps: int = 6, keep_views: bool = False):
    policy = RecordingPolicy()
    agent = Agent(
        LocalServices(env, AlfworldPhi(), policy),
        selector,
        AgentConfig(max_steps=max_steps, keep_views=keep_views),
        token_counter=TokenCounter("words"),
    )
    specs = [EpisodeSpec(f"ep{i}", g) for i, g in enumerate(games)]
    return agent.run(specs), policy


def test_agentocr_policy_sees_the_flat_history_image(env, games) -> None:
    results, policy = _run(env, games, make_selector("agentocr"), keep_views=True)
    for res in results:
        assert res.status == "ok"
        inputs = policy.seen[res.spec.episode_id]
        assert len(inputs) == res.steps == len(res.rows)
        for k, (inp, row) in enumerate(zip(inputs, res.rows, strict=True)):
            assert inp.view_image is not None and inp.view_text is None
            shown = inp.meta["view_text"]  # what the image shows, for the scripted perfect-OCR reader
            assert shown.count("[Observation]:") == k  # every completed step, one line each
            if k == 0:
                assert inp.view_image.size == (38, 38)
            else:
                assert inp.view_image.size[0] == 402
                assert shown.split("\n")[-1].endswith(f"[Action]: {res.rows[k - 1]['action']}")
            # the common short history rule: 2 steps of text beside the view
            assert len(inp.history) == min(k, 2)
            assert row["view_medium"] == "optical"
            assert row["visual_tokens"] == qwen25vl_tokens(*inp.view_image.size)
            assert row["prompt_tokens"] == row["text_tokens"] + row["visual_tokens"]
            assert row["pixels"] == inp.view_image.size[0] * inp.view_image.size[1]
            assert row["memory_llm_calls"] == 0 and row["memory_prompt_tokens"] == 0
            # the trajectory viewer keeps the image the policy saw
            kept = res.views[k]
            assert kept["view"] == "agentocr"
            with Image.open(io.BytesIO(kept["png"])) as im:
                assert im.size == inp.view_image.size


class CountingMemory:
    """Charges 1 LLM call (10 + 2 tokens) per write and 1 embedding per retrieve."""

    def __init__(self, log: dict, episode_id: str, fail_at: int | None = None) -> None:
        self.counters = MemoryCounters()
        self.log = log
        self.episode_id = episode_id
        self.fail_at = fail_at
        self.written: list[HistoryRecord] = []
        log[episode_id] = self

    def write(self, record: HistoryRecord, goal: str) -> None:
        self.counters.llm_calls += 1
        self.counters.prompt_tokens += 10
        self.counters.completion_tokens += 2
        self.written.append(record)

    def retrieve(self, goal: str, observation: str, history) -> MemoryView:
        self.counters.embed_calls += 1
        if self.fail_at is not None and len(self.written) == self.fail_at:
            raise RuntimeError("memory store down")
        if not self.written:
            return MemoryView()
        return MemoryView(text=f"- {len(self.written)} notes; last action {self.written[-1].action}")

    def close(self) -> None:
        self.log[self.episode_id + ":closed"] = True


def test_memory_writes_every_completed_step_and_rows_count_its_calls(env, games) -> None:
    log: dict = {}
    selector = MemorySelector("fake", lambda eid, goal: CountingMemory(log, eid))
    results, policy = _run(env, games, selector, max_steps=5)
    for res in results:
        mem = log[res.spec.episode_id]
        assert log[res.spec.episode_id + ":closed"]
        # every completed step but the last (nothing reads a write after it)
        assert [r.step for r in mem.written] == list(range(res.steps - 1))
        assert [r.action for r in mem.written] == [row["action"] for row in res.rows[:-1]]
        inputs = policy.seen[res.spec.episode_id]
        assert inputs[0].view_text is None  # an empty memory retrieves nothing
        for k, inp in enumerate(inputs[1:], start=1):
            assert inp.view_text == f"- {k} notes; last action {res.rows[k - 1]['action']}"
            assert inp.view_image is None
        assert sum(r["memory_llm_calls"] for r in res.rows) == mem.counters.llm_calls == res.steps - 1
        assert sum(r["memory_embed_calls"] for r in res.rows) == res.steps
        assert [r["memory_prompt_tokens"] for r in res.rows] == [10] * (res.steps - 1) + [0]
    rows = [r for res in results for r in res.rows]
    totals = memory_totals(rows)
    assert totals["llm_calls"] == sum(res.steps - 1 for res in results)
    assert totals["prompt_tokens"] == 10 * totals["llm_calls"]
    assert totals["completion_tokens"] == 2 * totals["llm_calls"]
    assert totals["tokens_per_decision"] == pytest.approx(12 * totals["llm_calls"] / len(rows))
    assert memory_totals([{"step": 0}]) is None


def test_a_failing_memory_fails_only_its_episode(env, games) -> None:
    log: dict = {}
    selector = MemorySelector("fake", lambda eid, goal: CountingMemory(log, eid, fail_at=2 if eid == "ep1" else None))
    results, _ = _run(env, games, selector, max_steps=5)
    by_id = {r.spec.episode_id: r for r in results}
    assert by_id["ep1"].status == "failed"
    assert by_id["ep1"].error.startswith("memory: RuntimeError: memory store down")
    assert by_id["ep1"].steps == 2
    assert by_id["ep0"].status == "ok" and by_id["ep2"].status == "ok"


def test_a_memory_that_cannot_be_built_fails_its_episodes_with_the_reason(env, games) -> None:
    def broken(eid: str, goal: str):
        raise ImportError("condition mem0 needs the baselines extra: pip install 'memprism-ray[baselines]'")

    results, _ = _run(env, games, MemorySelector("mem0", broken), max_steps=3)
    assert all(r.status == "failed" and "pip install" in r.error for r in results)
    assert all(r.error.startswith("memory: ImportError") for r in results)


# --------------------------------------------------------------------------- evaluation runs


def _eval_cfg(corpus: Path, conditions: tuple[str, ...], **memory: str):
    """The evaluation config of these tests (``memory``: ``eval.memory`` settings)."""
    from memprism_ray.config import ExperimentConfig
    from memprism_ray.config_tree import from_dict

    data = {
        "run": {"seed": 1},
        "corpus": {"data_root": str(corpus)},
        "eval": {"conditions": list(conditions), "episodes": 2, "slots": 2, "artifacts": 0, "workers": 1,
                 "memory": memory},
        "alfworld": {"eval_split": "eval_out_of_distribution"},
        "agent": {"max_steps": 6, "token_counter": "words"},
        "rollout": {"env_cpus": 0.1},
        "policy": {"backend": "scripted", "scripted": {"temperature": 0.0, "seed": 1}},
    }  # fmt: skip
    return from_dict(ExperimentConfig, data)


def _evaluate(cfg, out: Path) -> dict:
    """The evaluation (memprism_ray/trainer/evaluate.py) of ``cfg`` on ALFWorld into ``out``."""
    from memprism_ray.benchmark import get_benchmark
    from memprism_ray.trainer.evaluate import evaluate

    return evaluate(cfg, get_benchmark("alfworld"), cfg.eval.conditions, None, "", out, log=lambda _: None)


@pytest.mark.ray
def test_agentocr_runs_in_the_cpu_eval_path_and_reports_its_costs(
    ray_session, memprism_tiny_corpus: Path, tmp_path: Path
) -> None:
    import json

    out = tmp_path / "eval"
    summary = _evaluate(_eval_cfg(memprism_tiny_corpus, ("no_memory", "agentocr")), out)
    assert summary["failed_episodes"] == 0
    reps = {r["condition"]: r for r in summary["conditions"]}
    eff = reps["agentocr"]["efficiency"]
    assert eff["visual_tokens_mean"] > 0 and eff["pixels_mean"] > 0
    assert reps["no_memory"]["efficiency"]["visual_tokens_mean"] == 0
    assert reps["no_memory"]["memory"] is None
    mem = reps["agentocr"]["memory"]
    assert mem["llm_calls"] == 0 and mem["embed_calls"] == 0 and mem["tokens_per_decision"] == 0
    assert "Auxiliary costs of the memory baselines" in (out / "summary.md").read_text()
    manifest = json.loads((out / "agentocr" / "manifest.json").read_text())
    assert "width 392" in json.dumps(manifest)


def test_external_baselines_without_endpoint_fail_before_any_work(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from memprism_ray.cli import main
    from memprism_ray.config import FinalEvalConfig

    out = tmp_path / "never"
    with pytest.raises(ValueError, match=r"'mem0' calls an LLM for its memory and no endpoint is configured"):
        _eval_cfg(tmp_path / "no-corpus", ("no_memory", "mem0"))
    args = ["eval", "--condition", "no_memory,mem0", "--data-root", str(tmp_path / "no-corpus"), "--out", str(out)]
    assert main(args) == 2
    assert "no endpoint is configured" in capsys.readouterr().err
    assert not out.exists()
    with pytest.raises(ValueError, match=r"eval\.conditions: 'langmem' calls an LLM .* set eval\.memory\.base_url"):
        FinalEvalConfig(conditions=("langmem",))
    assert FinalEvalConfig(conditions=("agentocr",)).conditions == ("agentocr",)


def test_memories_are_closed_when_the_loop_crashes(env, games, monkeypatch: pytest.MonkeyPatch) -> None:
    log: dict = {}
    selector = MemorySelector("fake", lambda eid, goal: CountingMemory(log, eid))
    agent = Agent(LocalServices(env, AlfworldPhi(), RecordingPolicy()), selector, AgentConfig(max_steps=3))

    def crash(active):
        raise RuntimeError("bug in the loop")

    monkeypatch.setattr(agent, "_decide", crash)
    with pytest.raises(RuntimeError, match="bug in the loop"):
        agent.run([EpisodeSpec(f"ep{i}", g) for i, g in enumerate(games)])
    assert all(log.get(f"ep{i}:closed") for i in range(len(games)))
