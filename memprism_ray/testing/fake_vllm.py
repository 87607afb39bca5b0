"""A CPU stand-in for ``vllm.v1.engine.async_llm.AsyncLLM``: the same ``generate(prompt,
sampling_params, request_id)`` contract, continuous batching simulated with a step clock
(tests/actors/test_policy_pool.py, ``benchmarks/bench_policy_pool.py --engine fake``). A step
costs ``step_s + seq_s * running`` seconds and gives each running request a token. ``FAKE_REJECT``
prompts are refused (``ValueError``), ``FAKE_CRASH`` ones fail mid-way."""

from __future__ import annotations

import asyncio
import re
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from memprism_ray.policy.chat_format import format_qwen_chat
from memprism_ray.policy.vllm_backend import engine_kwargs

_ACTIONS = re.compile(r"\[\s*'([^']+)'")


def first_admissible(prompt: dict[str, Any]) -> str:
    """Default reply: ``<action>`` + the first quoted admissible action in the prompt (else ``look``)."""
    m = _ACTIONS.search(prompt.get("prompt", ""))
    return f"<action>{m.group(1) if m else 'look'}</action>"


@dataclass
class FakeCompletion:
    text: str
    token_ids: list[int]


@dataclass
class FakeRequestOutput:
    request_id: str
    prompt_token_ids: list[int]
    outputs: list[FakeCompletion]
    finished: bool = True


class FakeTokenizer:
    chat_template = "qwen2_vl (fake)"

    def apply_chat_template(self, messages: list[dict[str, Any]], tokenize: bool = False, **kw: Any) -> str:
        return format_qwen_chat(messages, add_generation_prompt=kw.get("add_generation_prompt", True))


@dataclass
class FakeInputProcessor:
    """``AsyncLLM.input_processor``: its ``process_inputs`` blocks for ``seconds``."""

    seconds: float = 0.0
    calls: int = 0

    def process_inputs(self, request_id: str, prompt: dict[str, Any], params: Any) -> dict[str, Any]:
        self.calls += 1
        if self.seconds > 0:
            time.sleep(self.seconds)  # blocking on purpose: the event loop waits, as in vLLM 0.24
        return prompt


@dataclass
class _Running:
    request_id: str
    tag: str
    prompt: dict[str, Any]
    left: int
    done: asyncio.Future
    crash: bool = False
    total: int = 0


@dataclass
class FakeAsyncEngine:
    """See the module docstring. ``steps`` holds one sorted tuple of caller tags per step."""

    step_s: float = 0.002
    seq_s: float = 0.0
    tokens: int = 4
    max_batch: int = 256
    reply: Callable[[dict[str, Any]], str] = first_admissible
    steps: list[tuple[str, ...]] = field(default_factory=list)
    max_running: int = 0
    submitted: int = 0
    stopped: bool = False
    preprocess_s: float = 0.0
    #: The first step waits until this many requests are queued (at most ``gate_s``): callers'
    #: requests are then in flight together however late the machine schedules their threads,
    #: so a test of their overlap in one step does not hang on timing (under a CPU hog, four
    #: callers' batches of 8 arrived more than a 50 ms batch apart and never shared a step).
    gate: int = 0
    gate_s: float = 30.0
    engine_kwargs: dict[str, Any] = field(default_factory=dict)
    input_processor: FakeInputProcessor = field(default_factory=FakeInputProcessor)
    _queue: list[_Running] = field(default_factory=list)
    _task: Any = None

    def __post_init__(self) -> None:
        self.input_processor.seconds = self.preprocess_s

    def get_tokenizer(self) -> FakeTokenizer:
        return FakeTokenizer()

    def shutdown(self) -> None:
        self.stopped = True

    async def _loop(self) -> None:
        running: list[_Running] = []
        deadline = time.monotonic() + self.gate_s
        while not self.steps and len(self._queue) < self.gate and time.monotonic() < deadline:
            await asyncio.sleep(0.005)
        while self._queue or running:
            while self._queue and len(running) < self.max_batch:
                running.append(self._queue.pop(0))
            self.max_running = max(self.max_running, len(running))
            self.steps.append(tuple(sorted({r.tag for r in running})))
            await asyncio.sleep(self.step_s + self.seq_s * len(running))
            still = []
            for r in running:
                r.left -= 1
                if r.crash and r.left <= r.total // 2:
                    r.done.set_exception(RuntimeError(f"fake engine step failed for {r.request_id}"))
                elif r.left <= 0:
                    text = self.reply(r.prompt)
                    r.done.set_result(
                        FakeRequestOutput(
                            r.request_id,
                            list(range(len(r.prompt.get("prompt", "")) // 4)),
                            [FakeCompletion(text, list(range(r.total)))],
                        )
                    )
                else:
                    still.append(r)
            running = still
        self._task = None

    async def generate(self, prompt: dict[str, Any], sampling_params: Any, request_id: str):
        text = prompt.get("prompt", "")
        if "FAKE_REJECT" in text:
            raise ValueError(f"request {request_id}: prompt refused (FAKE_REJECT)")
        self.input_processor.process_inputs(request_id, prompt, sampling_params)
        parts = request_id.split("-", 2)
        loop = asyncio.get_running_loop()
        limit = sampling_params.get("max_tokens") if isinstance(sampling_params, dict) else None
        tokens = min(self.tokens, limit) if limit else self.tokens
        tag = parts[2] if len(parts) > 2 else ""
        item = _Running(
            request_id, tag, prompt, left=tokens, done=loop.create_future(), crash="FAKE_CRASH" in text, total=tokens
        )
        self.submitted += 1
        self._queue.append(item)
        if self._task is None:
            self._task = asyncio.ensure_future(self._loop())
        yield await item.done

    def overlapping_tags(self) -> int:
        """The most distinct caller tags that ran in one engine step."""
        return max((len(s) for s in self.steps), default=0)


def fake_engine_factory(config: Any = None, **overrides: Any) -> FakeAsyncEngine:
    """Picklable engine factory for ``PolicyReplica(engine_factory=...)``: keeps the engine keywords
    of ``config`` and, like vLLM's scheduler, runs at most ``max_num_seqs`` sequences a step."""
    if config is not None:
        kwargs = engine_kwargs(config)
        overrides.setdefault("engine_kwargs", kwargs)
        if kwargs.get("max_num_seqs"):
            overrides.setdefault("max_batch", kwargs["max_num_seqs"])
    return FakeAsyncEngine(**overrides)


def marked_reply(replies: tuple[tuple[str, str], ...], default: str, prompt: dict[str, Any]) -> str:
    """``functools.partial(marked_reply, ((marker, text), ...), default)``: the text of the first
    marker the prompt contains, else ``default`` (one engine serving e.g. Phi and teacher prompts)."""
    body = prompt.get("prompt", "")
    return next((text for marker, text in replies if marker in body), default)


def fixed_reply(text: str, prompt: dict[str, Any]) -> str:
    """``functools.partial(fixed_reply, text)``: a picklable reply that is always ``text``."""
    return text
