"""A benchmark's task contract (paper appendix E.3 task-policy prompts, E.4 action definitions,
E.5 parsing and validation): how one benchmark's decision is put to the frozen task policy and
how the policy's answer is read back. Backends, the agent and D1 never pick a contract by
benchmark name: the benchmark provides it (:meth:`memprism_ray.benchmark.Benchmark.task_contract`)."""

from __future__ import annotations

import importlib
from typing import Any, ClassVar

from PIL import Image

from memprism_ray.policy.base import PolicyInput, PolicyOutput, TaskPolicy
from memprism_ray.policy.config import PolicyConfig
from memprism_ray.policy.parsing import ParseResult, invalid
from memprism_ray.policy.prompts import Part


class TaskContract:
    """One benchmark's prompt, parser and stand-in: subclasses set :attr:`name` and :attr:`stand_in`
    and implement :meth:`template_parts` and :meth:`parse`."""

    name: ClassVar[str]
    """the benchmark whose inputs it reads (``PolicyInput.benchmark``)"""
    stand_in: ClassVar[str]
    """``module:Class`` of the scripted CPU stand-in, built by its ``from_config(PolicyConfig)``"""

    def template_parts(self, inp: PolicyInput, layout: str) -> list[Part]:
        """The prompt of ``inp`` as parts, before adjacent text is merged."""
        raise NotImplementedError

    def parse(self, inp: PolicyInput, text: str) -> ParseResult:
        """The action of model output ``text`` under this contract; never raises on model output."""
        raise NotImplementedError

    def mismatch(self, inp: PolicyInput) -> str | None:
        """Why ``inp`` is not this contract's to read (``None`` when it is)."""
        if inp.benchmark != self.name:
            return f"the {self.name} task contract reads {self.name} inputs, not {inp.benchmark}"
        return None

    def prompt_parts(self, inp: PolicyInput, layout: str = "paper") -> list[Part]:
        """The prompt of ``inp`` as ordered parts; a camera frame without a camera slot is an error."""
        problem = self.mismatch(inp)
        if problem:
            raise ValueError(problem)
        merged: list[Part] = []
        for part in self.template_parts(inp, layout):
            if part[0] == "text" and merged and merged[-1][0] == "text":
                merged[-1] = ("text", merged[-1][1] + part[1])
            elif part[0] != "text" or part[1]:
                merged.append(part)
        if inp.camera_image is not None and not any(p[0] == "image" and p[2] is inp.camera_image for p in merged):
            raise ValueError(f"camera_image is not part of the {self.name} prompt (it has no camera slot)")
        return merged

    def build_messages(self, inp: PolicyInput, layout: str = "paper") -> tuple[list[dict[str, Any]], list[Image.Image]]:
        """Chat messages (one ``user`` turn; the i-th ``{"type": "image"}`` part refers to
        ``images[i]``, as HF chat templates and vLLM expect) and the images."""
        content: list[dict[str, Any]] = []
        images: list[Image.Image] = []
        for part in self.prompt_parts(inp, layout):
            if part[0] == "text":
                content.append({"type": "text", "text": part[1]})
            else:
                if part[2] is None:
                    raise ValueError(
                        "the memory view was laid out without pixels (PolicyInput.view_unpainted); a policy that "
                        "sends images must say needs_view_image = True so that its pages are painted"
                    )
                content.append({"type": "image"})
                images.append(part[2])
        return [{"role": "user", "content": content}], images

    def build_prompt_text(self, inp: PolicyInput) -> str:
        """The prompt as a text-only reader sees it: images appear as their marker line."""
        return "".join(part[1] if part[0] == "text" else part[1] + "\n" for part in self.prompt_parts(inp))

    def parse_action(self, inp: PolicyInput, text: str) -> ParseResult:
        """:meth:`parse`, or an invalid result for an input of another benchmark."""
        problem = self.mismatch(inp)
        return invalid(problem) if problem else self.parse(inp, text)

    def to_output(
        self,
        inp: PolicyInput,
        text: str,
        *,
        prompt_tokens: int | None = None,
        completion_tokens: int | None = None,
        visual_tokens: int | None = None,
        latency_s: float = 0.0,
    ) -> PolicyOutput:
        """A :class:`PolicyOutput` for model ``text``: parsed, validated, never raising."""
        text = text if isinstance(text, str) else ""
        result = self.parse_action(inp, text)
        return PolicyOutput(
            text, result.action, result.valid, result.error, prompt_tokens, completion_tokens, visual_tokens, latency_s
        )

    def stand_in_class(self) -> type:
        """The scripted stand-in's class (:attr:`stand_in`)."""
        module, _, cls = self.stand_in.partition(":")
        return getattr(importlib.import_module(module), cls)

    def scripted_policy(self, config: PolicyConfig) -> TaskPolicy:
        """The scripted CPU stand-in of this benchmark, from ``policy.scripted``."""
        policy = self.stand_in_class().from_config(config)
        if not isinstance(policy, TaskPolicy):
            raise ValueError(f"{self.stand_in} does not implement TaskPolicy (name, act(inputs))")
        return policy
