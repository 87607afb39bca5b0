"""Completion backends of the LLM Phi (paper "Recorder"; appendix E.1 Phi prompts).

Everything that asks a model for a Phi answer codes against :data:`CompleteMany`: a batch of
(prompt text, PNG images) to answer texts, an exception in place of each failed answer (a value,
never raised, so one bad event does not cost the batch its other answers).
:func:`PhiEndpoint` sends them to an OpenAI-compatible endpoint through the shared
:class:`~memprism_ray.llm_client.ChatClient`; :func:`PoolComplete` to a text-only batch completion
such as the Ray policy pool's (a plain callable: this module does not import ray).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from memprism_ray.llm_client import ChatClient, Closing, LLMCounters, LLMError, map_concurrent, user_content
from memprism_ray.recorder.phi.config import PhiConfig

#: ``[(prompt, png images), ...] -> [answer text or exception, ...]`` (same length, same order).
CompleteMany = Callable[[Sequence[tuple[str, Sequence[bytes]]]], list["str | BaseException"]]


class PhiEndpoint(Closing):
    """:data:`CompleteMany` over an OpenAI-compatible endpoint (see the module docstring).
    ``transport`` goes to ``httpx.Client`` (tests may pass ``httpx.MockTransport``)."""

    def __init__(self, cfg: PhiConfig, *, transport: Any = None) -> None:
        if not cfg.model:
            raise ValueError("phi.model is empty: set it to the model name the endpoint at phi.base_url serves")
        self.cfg = cfg
        self.client = ChatClient(cfg, transport=transport)
        self.counters = self.client.counters

    def close(self) -> None:
        self.client.close()

    def __call__(self, requests: Sequence[tuple[str, Sequence[bytes]]]) -> list[str | BaseException]:
        return map_concurrent(self._one, list(requests), self.cfg.concurrency)

    def _one(self, request: tuple[str, Sequence[bytes]]) -> str | BaseException:
        try:
            return self.complete(*request)
        except Exception as exc:  # a value in place of this answer; the batch goes on
            return exc

    def complete(self, prompt: str, images: Sequence[bytes] = ()) -> str:
        """One chat request; the assistant message text, or an :class:`~memprism_ray.llm_client.LLMError`."""
        messages = [{"role": "user", "content": user_content(prompt, images)}]
        return self.client.chat(messages, temperature=self.cfg.temperature, max_tokens=self.cfg.max_tokens).text


class PoolComplete:
    """:data:`CompleteMany` over a text-only batch completion ``complete_texts(prompts) ->
    [text or exception]``; a request carrying images gets a ``ValueError`` as its answer."""

    def __init__(self, complete_texts: Callable[[list[str]], Sequence[Any]]) -> None:
        self.complete_texts = complete_texts
        self.counters = LLMCounters()

    def __call__(self, requests: Sequence[tuple[str, Sequence[bytes]]]) -> list[str | BaseException]:
        items = list(requests)
        out: list[str | BaseException] = [
            ValueError(
                f"the policy pool completes text only; this Phi request carries {len(imgs)} image(s): "
                "use phi.llm_source: endpoint with a vision model"
            )
            for _, imgs in items
        ]
        text_idx = [i for i, (_, imgs) in enumerate(items) if not imgs]
        self.counters.add("failures", len(items) - len(text_idx))
        if not text_idx:
            return out
        self.counters.add("requests", len(text_idx))
        try:
            answers = list(self.complete_texts([items[i][0] for i in text_idx]))
        except Exception as exc:
            answers = [LLMError(f"pool completion failed: {type(exc).__name__}: {exc}")] * len(text_idx)
        if len(answers) != len(text_idx):
            answers = [LLMError(f"pool answered {len(answers)} completion(s) for {len(text_idx)} prompt(s)")] * len(
                text_idx
            )
        for i, a in zip(text_idx, answers, strict=True):
            if not isinstance(a, str):
                self.counters.add("failures")
                a = a if isinstance(a, BaseException) else LLMError(f"pool answered {type(a).__name__}, not text")
            out[i] = a
        return out
