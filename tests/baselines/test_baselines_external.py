"""External memory baselines (paper appendix "External baselines") against a local test
server on 127.0.0.1 that answers the prompts each library sends deterministically: Mem0's
fact-extraction and memory-update prompts (JSON), Mem0^g's entity / relation / delete tool
calls, LangMem's memory-manager tool calls, A-Mem's note-analysis and evolution prompts
(JSON schema). The tests prove that every completed step is written, that each decision
retrieves what was written into the view slot, and that the extra LLM calls and tokens the
report counts equal the ``usage`` the server returned.

Package-dependent tests skip (with the reason) when the ``baselines`` extra is absent; the
clear-error tests always run.
"""

from __future__ import annotations

import importlib.util
import json
import re
import threading
from typing import Any

import pytest
from json_endpoint import Reply, Request, chat_reply, json_endpoint

from memprism_ray.baselines import make_selector
from memprism_ray.baselines.conditions import EXTERNAL_MEMORY_CONDITIONS, condition_needs
from memprism_ray.baselines.external import BaselineUnavailable, external_selector
from memprism_ray.baselines.memory import MemoryBaselineConfig, MemoryCounters, serialize_transition
from memprism_ray.policy.base import HistoryRecord

GOAL = "put a clean mug in coffeemachine."


def _has(*modules: str) -> bool:
    return all(importlib.util.find_spec(m) is not None for m in modules)


needs_mem0 = pytest.mark.skipif(not _has("mem0"), reason="mem0ai not installed: pip install 'memprism-ray[baselines]'")
needs_kuzu = pytest.mark.skipif(
    not _has("mem0", "kuzu"), reason="mem0ai[graph] (kuzu) not installed: pip install 'memprism-ray[baselines]'"
)
needs_langmem = pytest.mark.skipif(
    not _has("langmem", "langgraph"), reason="langmem not installed: pip install 'memprism-ray[baselines]'"
)
needs_amem = pytest.mark.skipif(
    not _has("agentic_memory"), reason="a-mem not installed: pip install 'memprism-ray[baselines]'"
)

# --------------------------------------------------------------------------- the test server

_ENTITY = re.compile(r"\b([a-z]+ \d+)\b")


def _entities(text: str) -> list[str]:
    """ALFWorld object names ("mug 1", "cabinet 2"), step labels left out."""
    return list(dict.fromkeys(_ENTITY.findall(re.sub(r"\[step \d+\]", "", text.lower()))))


def _steps(text: str) -> list[tuple[str, str, str]]:
    """(step, action, result) of every serialized transition in ``text``."""
    return re.findall(r"\[Step (\d+)\] Observation: .*? Action: (.*?) Result: (.*?)(?=\\n|\n|\"|$)", text)


#: ``respond(path, request body) -> (status, extra headers, JSON reply bytes or None)``;
#: ``None`` sends the status as a plain error page.
class FakeLLM:
    """Answers chat-completion requests by what the prompt asks, deterministically; records
    each response's ``usage`` and which kind of prompt it answered."""

    def __init__(self) -> None:
        self.responses: list[dict[str, Any]] = []
        self.lock = threading.Lock()

    # Each rule returns (content, tool_calls).
    def answer(self, req: dict[str, Any]) -> tuple[str, str | None, list[dict[str, Any]] | None]:
        messages = req.get("messages", [])
        text = "\n".join(
            m["content"] if isinstance(m.get("content"), str) else json.dumps(m.get("content")) for m in messages
        )
        tools = [t["function"]["name"] for t in req.get("tools", []) or []]
        if tools:
            return self._tools(tools, text)
        fmt = (req.get("response_format") or {}).get("type")
        if "new retrieved facts" in text:  # Mem0 memory update (DEFAULT_UPDATE_MEMORY_PROMPT)
            block = text.split("The new retrieved facts", 1)[1].split("```")[1]
            facts = json.loads(block.strip())
            memory = [{"id": str(i), "text": f, "event": "ADD"} for i, f in enumerate(facts)]
            return "mem0_update", json.dumps({"memory": memory}), None
        if fmt == "json_object" and "Input:" in text:  # Mem0 fact extraction
            facts = [f"At step {s} the agent did '{a}' and saw: {r}" for s, a, r in _steps(text)]
            return "mem0_facts", json.dumps({"facts": facts}), None
        if fmt == "json_schema":
            props = req["response_format"]["json_schema"]["schema"].get("properties", {})
            if "keywords" in props:  # A-Mem note analysis
                ents = _entities(text.split("Content for analysis:")[-1])
                out = {"keywords": ents or ["none"], "context": "ALFWorld transition", "tags": ["alfworld"]}
                return "amem_analyze", json.dumps(out), None
            if "should_evolve" in props:  # A-Mem memory evolution: never evolve
                out = {
                    k: ([] if v.get("type") == "array" else False if v.get("type") == "boolean" else "")
                    for k, v in props.items()
                }
                return "amem_evolve", json.dumps(out), None
        return "other", "OK", None

    def _tools(self, tools: list[str], text: str) -> tuple[str, str | None, list[dict[str, Any]] | None]:
        def call(name: str, args: dict[str, Any]) -> list[dict[str, Any]]:
            return [
                {"id": f"call_{name}", "type": "function", "function": {"name": name, "arguments": json.dumps(args)}}
            ]

        if tools == ["memprism_tool_check"]:  # external.check_tool_calling at start
            return "tool_check", "OK", None
        if "extract_entities" in tools:
            user = "\n".join(m for m in text.split("\n") if not m.startswith("You are a smart assistant"))
            ents = [{"entity": e, "entity_type": "object"} for e in _entities(user)]
            return "graph_entities", None, call("extract_entities", {"entities": ents})
        rel = next((t for t in tools if t.startswith("establish_relation")), None)
        if rel:
            out = [
                {"source": "agent", "relationship": a.split(" ")[0], "destination": _entities(a)[0]}
                for _, a, _ in _steps(text)
                if _entities(a)
            ]
            return "graph_relations", None, call(rel, {"entities": out})
        if "delete_graph_memory" in tools:
            return "graph_delete", "", None
        # LangMem: the memory manager's tool choice (trustcall); insert one memory per step
        for name in tools:
            if "memory" in name.lower():
                contents = [f"step {s}: {a} -> {r}" for s, a, r in _steps(text)]
                if contents:
                    return "langmem_insert", None, call(name, {"content": contents[-1]})
        return "langmem_none", "", None

    def respond(self, req: dict[str, Any]) -> dict[str, Any]:
        kind, content, tool_calls = self.answer(req)
        prompt_chars = len(json.dumps(req.get("messages", [])))
        completion_chars = len(content or "") + len(json.dumps(tool_calls or []))
        usage = {
            "prompt_tokens": prompt_chars // 4 + 1,
            "completion_tokens": completion_chars // 4 + 1,
        }
        usage["total_tokens"] = usage["prompt_tokens"] + usage["completion_tokens"]
        message: dict[str, Any] = {"role": "assistant", "content": content}
        if tool_calls:
            message["tool_calls"] = tool_calls
        with self.lock:
            self.responses.append({"kind": kind, "usage": usage})
        return {
            "id": f"chatcmpl-{len(self.responses)}",
            "object": "chat.completion",
            "created": 0,
            "model": req.get("model", "fake"),
            "choices": [{"index": 0, "message": message, "finish_reason": "tool_calls" if tool_calls else "stop"}],
            "usage": usage,
        }

    def kinds(self) -> list[str]:
        return [r["kind"] for r in self.responses]

    def usage_sum(self) -> tuple[int, int]:
        return (
            sum(r["usage"]["prompt_tokens"] for r in self.responses),
            sum(r["usage"]["completion_tokens"] for r in self.responses),
        )


@pytest.fixture()
def fake_llm():
    llm = FakeLLM()

    def respond(r: Request) -> Reply:
        return (200, llm.respond(r.json())) if r.path.endswith("/chat/completions") else (404, None)

    with json_endpoint(respond) as url:
        llm.base_url = url
        yield llm


def _transitions(n: int) -> list[HistoryRecord]:
    out = []
    for i in range(n):
        out.append(
            HistoryRecord(
                i,
                f"You arrive at cabinet {i + 1}. On the cabinet {i + 1}, you see a mug {i + 1}.",
                f"take mug {i + 1} from cabinet {i + 1}",
                f"You pick up the mug {i + 1} from the cabinet {i + 1}.",
            )
        )
    return out


def _play(memory: Any, n: int) -> list[Any]:
    """Retrieve before each decision and write each completed step, as the agent does."""
    views = []
    history: list[HistoryRecord] = []
    for rec in _transitions(n):
        views.append(memory.retrieve(GOAL, rec.observation, tuple(history)))
        memory.write(rec, GOAL)
        history.append(rec)
    views.append(memory.retrieve(GOAL, "On the cabinet 2, you see a mug 2.", tuple(history)))
    return views


def _assert_accounting(counters: MemoryCounters, llm: FakeLLM) -> None:
    prompt, completion = llm.usage_sum()
    assert counters.llm_calls == len(llm.responses) > 0
    assert (counters.prompt_tokens, counters.completion_tokens) == (prompt, completion)
    assert counters.calls_without_usage == 0


# --------------------------------------------------------------------------- clear errors (always run)


@pytest.mark.parametrize("condition", EXTERNAL_MEMORY_CONDITIONS)
def test_no_endpoint_is_a_clear_error(condition: str) -> None:
    for cfg in (None, MemoryBaselineConfig()):
        with pytest.raises(BaselineUnavailable, match=r"no endpoint is configured: set eval\.memory\.base_url"):
            make_selector(condition, memory=cfg)
    assert condition_needs(condition) == frozenset({"memory_llm"})


@pytest.mark.parametrize("condition", EXTERNAL_MEMORY_CONDITIONS)
def test_missing_extra_is_a_clear_error(condition: str, monkeypatch: pytest.MonkeyPatch) -> None:
    real = importlib.util.find_spec
    blocked = {"mem0", "kuzu", "agentic_memory", "langmem", "langgraph"}
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name in blocked else real(name, *a))
    with pytest.raises(BaselineUnavailable, match=r"pip install 'memprism-ray\[baselines\]'") as err:
        external_selector(condition, MemoryBaselineConfig(base_url="http://127.0.0.1:9/v1"))
    assert "\n" not in str(err.value)


def test_memory_config_rejects_bad_values() -> None:
    with pytest.raises(ValueError, match=r"memory\.base_url"):
        MemoryBaselineConfig(base_url="127.0.0.1:8000")
    with pytest.raises(ValueError, match=r"memory\.top_k"):
        MemoryBaselineConfig(base_url="http://x/v1", top_k=-1)


#: vLLM's answer to ``tool_choice: "auto"`` on a server started without the tool flags
#: (vllm/entrypoints/openai/serving_chat.py, ``create_error_response``: HTTP 400 with an
#: ``ErrorResponse`` body; the message as users report it, github.com/vllm-project/vllm/issues/9986).
VLLM_AUTO_TOOL_ERROR = {
    "object": "error",
    "message": '"auto" tool choice requires --enable-auto-tool-choice and --tool-call-parser to be set',
    "type": "BadRequestError",
    "param": None,
    "code": 400,
}


@pytest.fixture()
def vllm_like():
    """A chat endpoint on 127.0.0.1 that, like ``vllm serve`` without the tool flags, refuses
    any request with ``tool_choice: "auto"`` (``tools_on`` = True: started with the flags)."""
    state = {"tools_on": False, "bodies": []}

    def respond(r: Request) -> Reply:
        body = r.json()
        state["bodies"].append(body)
        if body.get("tool_choice") == "auto" and not state["tools_on"]:
            return 400, VLLM_AUTO_TOOL_ERROR
        return 200, chat_reply("OK")

    with json_endpoint(respond) as url:
        state["base_url"] = url
        yield state


def _pretend_installed(monkeypatch: pytest.MonkeyPatch, *names: str) -> None:
    """The graph extra looks installed: the check under test runs after the extra's."""
    from importlib.machinery import ModuleSpec

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda n, *a: ModuleSpec(n, None) if n in names else real(n, *a))


def test_mem0_graph_refuses_to_start_on_an_endpoint_without_tool_calling(vllm_like, monkeypatch) -> None:
    _pretend_installed(monkeypatch, "mem0", "kuzu")
    cfg = MemoryBaselineConfig(base_url=vllm_like["base_url"], model="Qwen/Qwen2.5-7B-Instruct")
    with pytest.raises(BaselineUnavailable) as err:
        make_selector("mem0_graph", memory=cfg)
    msg = str(err.value)
    assert "\n" not in msg and "--enable-auto-tool-choice --tool-call-parser hermes" in msg
    assert "mem0_graph" in msg and "HTTP 400" in msg and "tool choice requires" in msg
    probe = vllm_like["bodies"][0]
    assert len(vllm_like["bodies"]) == 1  # a 400 is final: one small request
    assert probe["tool_choice"] == "auto" and probe["tools"][0]["type"] == "function" and probe["max_tokens"] == 16
    # plain mem0 sends no tools: it starts on the same server without a check
    assert make_selector("mem0", memory=cfg).name == "mem0" and len(vllm_like["bodies"]) == 1


def test_mem0_graph_starts_once_the_server_accepts_tool_calls(vllm_like, monkeypatch) -> None:
    _pretend_installed(monkeypatch, "mem0", "kuzu")
    vllm_like["tools_on"] = True
    cfg = MemoryBaselineConfig(base_url=vllm_like["base_url"], model="Qwen/Qwen2.5-7B-Instruct")
    assert make_selector("mem0_graph", memory=cfg).name == "mem0_graph"
    assert make_selector("mem0_graph", memory=cfg).name == "mem0_graph"
    assert len(vllm_like["bodies"]) == 1  # checked once per endpoint and model in a process


def test_the_documented_server_command_has_the_tool_flags() -> None:
    from pathlib import Path

    doc = (Path(__file__).resolve().parents[2] / "docs" / "baselines.md").read_text()
    commands = [ln for ln in doc.replace("\\\n", " ").splitlines() if ln.startswith("vllm serve")]
    assert commands and all("--enable-auto-tool-choice --tool-call-parser hermes" in c for c in commands)


def test_the_adapters_never_import_the_module_that_builds_them() -> None:
    """external.py builds the adapters; the pieces they share live in memory.py and local.py,
    so no import runs back (the old adapters imported external.py: an import circle)."""
    import ast
    from pathlib import Path

    import memprism_ray.baselines as pkg

    root = Path(pkg.__file__).parent
    for name in ("mem0_adapter", "amem_adapter", "langmem_adapter", "local", "memory"):
        tree = ast.parse((root / f"{name}.py").read_text())
        imported = {n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)}
        assert "memprism_ray.baselines.external" not in imported, name


def test_transitions_are_serialized_like_the_prompt_records() -> None:
    rec = _transitions(1)[0]
    assert serialize_transition(rec) == (
        "[Step 1] Observation: You arrive at cabinet 1. On the cabinet 1, you see a mug 1. "
        "Action: take mug 1 from cabinet 1 Result: You pick up the mug 1 from the cabinet 1."
    )


def test_the_relay_counts_usage_and_calls_without_it(fake_llm) -> None:
    import httpx

    from memprism_ray.baselines.local import relay_for

    relay = relay_for(MemoryBaselineConfig(base_url=fake_llm.base_url))
    counters = MemoryCounters()
    key, url = relay.register(counters)
    try:
        r = httpx.post(f"{url}/chat/completions", json={"model": "m", "messages": [{"role": "user", "content": "x"}]})
        assert r.status_code == 200 and r.json()["choices"][0]["message"]["content"] == "OK"
        r = httpx.post(f"{url}/embeddings", json={"input": "x"})  # not a completion: not charged
        assert r.status_code == 404
        _assert_accounting(counters, fake_llm)
        assert httpx.post(f"http://127.0.0.1:{relay.port}/m/unknown/v1/chat/completions", json={}).status_code == 404
    finally:
        relay.unregister(key)
    # an endpoint that is down: the relay retries, then the library sees a 502 it must not
    # retry again (x-should-retry: false) and the call is counted without usage
    down = relay_for(MemoryBaselineConfig(base_url="http://127.0.0.1:9/v1", timeout_s=5, max_retries=1, backoff_s=0))
    c2 = MemoryCounters()
    key2, url2 = down.register(c2)
    r = httpx.post(f"{url2}/chat/completions", json={"messages": []})
    assert r.status_code == 502 and "unreachable" in r.text and r.headers["x-should-retry"] == "false"
    assert (c2.llm_calls, c2.calls_without_usage, c2.prompt_tokens) == (1, 1, 0)
    assert (down.counters["requests"], down.counters["retries"], down.counters["failures"]) == (2, 1, 1)
    down.unregister(key2)


def test_the_relay_retries_as_retry_after_asks_and_counts_like_every_endpoint_user() -> None:
    """The relay sends through the one client (memprism_ray/llm_client.py): a 429's Retry-After
    is waited for, the retry is the relay's, and the episode is charged once, with the final
    reply's usage (the old relay passed the 429 back to the library)."""
    import time

    import httpx

    from memprism_ray.baselines.local import relay_for

    seen: list[float] = []

    def respond(r: Request) -> Reply:
        seen.append(time.monotonic())
        if len(seen) == 1:
            return 429, {"error": "slow down"}, {"Retry-After": "0.3"}
        return 200, chat_reply("OK", usage={"prompt_tokens": 12, "completion_tokens": 4})

    with json_endpoint(respond) as base_url:
        relay = relay_for(MemoryBaselineConfig(base_url=base_url, backoff_s=0))
        counters = MemoryCounters()
        key, url = relay.register(counters)
        r = httpx.post(f"{url}/chat/completions", json={"model": "m", "messages": []}, timeout=30)
        relay.unregister(key)
    assert r.status_code == 200 and len(seen) == 2 and seen[1] - seen[0] >= 0.3
    assert (counters.llm_calls, counters.prompt_tokens, counters.completion_tokens) == (1, 12, 4)
    c = relay.counters
    assert (c["requests"], c["retries"], c["failures"], c["prompt_tokens"], c["completion_tokens"]) == (2, 1, 0, 12, 4)


# --------------------------------------------------------------------------- Mem0 / Mem0^g


@needs_mem0
def test_mem0_writes_every_step_and_retrieves_its_facts(fake_llm) -> None:
    cfg = MemoryBaselineConfig(base_url=fake_llm.base_url, model="fake")
    selector = make_selector("mem0", memory=cfg)
    memory = selector.new_memory("ep0", GOAL)
    try:
        views = _play(memory, 3)
    finally:
        memory.close()
    kinds = fake_llm.kinds()
    # one fact extraction and one memory update per written step, nothing at retrieval
    assert kinds.count("mem0_facts") == 3 and kinds.count("mem0_update") == 3
    assert views[0].text is None  # nothing written yet
    for k in (1, 2, 3):
        shown = views[k].text.splitlines()
        assert len(shown) == min(k, 3)  # README limit=3
        assert all(line.startswith("- At step ") for line in shown)
    assert "did 'take mug 3 from cabinet 3'" in views[3].text
    _assert_accounting(memory.counters, fake_llm)
    # MiniLM: one embedding per fact written (+ one search per fact) and one per query
    assert memory.counters.embed_calls >= 3 + 4


@needs_kuzu
def test_mem0_graph_adds_relations_from_the_embedded_graph(fake_llm) -> None:
    cfg = MemoryBaselineConfig(base_url=fake_llm.base_url, model="fake")
    selector = make_selector("mem0_graph", memory=cfg)
    assert fake_llm.kinds() == ["tool_check"]  # the start-up check, charged to no episode
    fake_llm.responses.clear()
    memory = selector.new_memory("ep0", GOAL)
    try:
        views = _play(memory, 2)
    finally:
        memory.close()
    kinds = fake_llm.kinds()
    assert kinds.count("mem0_facts") == 2 and kinds.count("graph_relations") == 2
    assert "graph_entities" in kinds
    assert "agent -- take -- mug_" in views[-1].text  # Kuzu node, merged by MiniLM similarity
    _assert_accounting(memory.counters, fake_llm)


@needs_mem0
def test_mem0_episodes_do_not_share_memories(fake_llm) -> None:
    cfg = MemoryBaselineConfig(base_url=fake_llm.base_url, model="fake")
    selector = make_selector("mem0", memory=cfg)
    a, b = selector.new_memory("ep0", GOAL), selector.new_memory("ep1", GOAL)
    try:
        a.write(_transitions(1)[0], GOAL)
        assert a.retrieve(GOAL, "x", ()).text is not None
        assert b.retrieve(GOAL, "x", ()).text is None
        assert b.counters.llm_calls == 0 and a.counters.llm_calls == 2
    finally:
        a.close()
        b.close()


# --------------------------------------------------------------------------- LangMem


@needs_langmem
def test_langmem_manager_writes_every_step_and_search_retrieves(fake_llm) -> None:
    cfg = MemoryBaselineConfig(base_url=fake_llm.base_url, model="fake")
    memory = make_selector("langmem", memory=cfg).new_memory("ep0", GOAL)
    try:
        views = _play(memory, 3)
    finally:
        memory.close()
    kinds = fake_llm.kinds()
    assert kinds.count("langmem_insert") == 3  # one manager call per written step, each inserting
    assert views[0].text is None
    assert views[1].text == "- step 1: take mug 1 from cabinet 1 -> You pick up the mug 1 from the cabinet 1."
    assert len(views[3].text.splitlines()) == 3
    assert "- step 3: take mug 3 from cabinet 3" in views[3].text
    _assert_accounting(memory.counters, fake_llm)
    assert memory.counters.embed_calls >= 3 + 4  # each stored memory and each query


# --------------------------------------------------------------------------- A-Mem


@needs_amem
def test_amem_adds_a_note_per_step_and_search_agentic_retrieves(fake_llm) -> None:
    cfg = MemoryBaselineConfig(base_url=fake_llm.base_url, model="fake")
    memory = make_selector("amem", memory=cfg).new_memory("ep0", GOAL)
    workdir = memory._dir
    try:
        views = _play(memory, 3)
    finally:
        memory.close()
    kinds = fake_llm.kinds()
    assert kinds.count("amem_analyze") == 3  # one note analysis per written step
    assert kinds.count("amem_evolve") == 2  # evolution from the second note on
    assert views[0].text is None
    assert views[1].text.startswith("- [Step 1] Observation: You arrive at cabinet 1.")
    assert "keywords: cabinet 1, mug 1" in views[1].text and "tags: alfworld" in views[1].text
    assert len(views[3].text.splitlines()) == 3
    _assert_accounting(memory.counters, fake_llm)
    assert memory.counters.embed_calls >= 3 + 4  # each note stored, each query searched
    import os

    assert not os.path.exists(workdir)  # the episode's store is removed with it


# --------------------------------------------------------------------------- through the evaluation


@needs_mem0
@pytest.mark.ray
def test_mem0_eval_report_counts_the_servers_usage(ray_session, fake_llm, memprism_tiny_corpus, tmp_path) -> None:
    import pyarrow.parquet as pq

    from memprism_ray.benchmark import get_benchmark
    from memprism_ray.config import ExperimentConfig
    from memprism_ray.config_tree import from_dict
    from memprism_ray.trainer.evaluate import evaluate

    cfg = from_dict(
        ExperimentConfig,
        {
            "run": {"seed": 1},
            "corpus": {"data_root": str(memprism_tiny_corpus)},
            "eval": {"conditions": ["mem0"], "split": "eval_out_of_distribution", "episodes": 2, "slots": 2,
                     "artifacts": 0, "workers": 1, "memory": {"base_url": fake_llm.base_url, "model": "fake"}},
            "agent": {"max_steps": 4, "token_counter": "words"},
            "rollout": {"env_cpus": 0.1},
            "policy": {"backend": "scripted", "scripted": {"temperature": 0.0, "seed": 1}},
        },
    )  # fmt: skip
    summary = evaluate(cfg, get_benchmark("alfworld"), cfg.eval.conditions, None, "", tmp_path / "eval")
    rep = summary["conditions"][0]
    assert rep["failed_episodes"] == 0
    steps = pq.read_table(tmp_path / "eval" / "mem0" / "steps.parquet").to_pylist()
    writes = len(steps) - rep["n"]  # every step but each episode's last
    assert fake_llm.kinds().count("mem0_facts") == writes
    prompt, completion = fake_llm.usage_sum()
    mem = rep["memory"]
    assert (mem["llm_calls"], mem["prompt_tokens"], mem["completion_tokens"]) == (
        len(fake_llm.responses),
        prompt,
        completion,
    )
    assert sum(r["memory_llm_calls"] for r in steps) == mem["llm_calls"]
    # the retrieved memories reached the prompt: text tokens grow once something is written
    assert any(r["view_medium"] == "text" for r in steps)
    md = (tmp_path / "eval" / "summary.md").read_text()
    assert f"| mem0 | {mem['llm_calls']} |" in md
