"""Prompt text tokens are counted with the task model's tokenizer when one is configured;
the MiniLM tokenizer is a fallback and is labelled as such (issue 11, item 4)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from memprism_ray.agent import AgentConfig, TokenCounter
from memprism_ray.policy.config import PolicyConfig
from memprism_ray.policy.tokens import MINILM_NAME, PromptTokenCounter, task_model_of


def _word_level_tokenizer(root: Path) -> Path:
    """A tiny offline tokenizer directory (word level, whitespace split) standing for a task
    model's tokenizer: every word is one token, so counts differ from WordPiece."""
    from tokenizers import Tokenizer, models, pre_tokenizers

    vocab = {"[UNK]": 0, "go": 1, "to": 2, "desk": 3, "1": 4}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    root.mkdir(parents=True, exist_ok=True)
    tok.save(str(root / "tokenizer.json"))
    (root / "tokenizer_config.json").write_text(json.dumps({"tokenizer_class": "PreTrainedTokenizerFast"}))
    return root


def test_the_task_model_tokenizer_counts_when_configured(tmp_path: Path) -> None:
    model = str(_word_level_tokenizer(tmp_path / "task-model"))
    from memprism_ray.config_tree import from_dict

    cfg = from_dict(PolicyConfig, {"backend": "hf", "hf": {"model_path": model}})
    assert task_model_of(cfg) == model
    counter = PromptTokenCounter("auto", model=task_model_of(cfg))
    assert counter.fallback is None and counter.name == f"{model} tokenizer (task model)"
    text = "go to desk 1 unbelievably"
    assert counter.count(text) == 5  # one token per word, unknown words included
    assert PromptTokenCounter("minilm").count(text) != 5  # WordPiece splits the long word
    assert TokenCounter("task", model=model).count(text) == 5


def test_minilm_is_a_labelled_fallback() -> None:
    scripted = PromptTokenCounter("auto", model=task_model_of(PolicyConfig(backend="scripted")))
    assert scripted.name.startswith(MINILM_NAME) and "fallback" in scripted.name
    missing = PromptTokenCounter("auto", model="/nonexistent/model-dir")
    assert "fallback" in missing.name and "/nonexistent/model-dir" in missing.name
    assert missing.count("go to desk 1") == PromptTokenCounter("minilm").count("go to desk 1")
    assert "fallback" not in PromptTokenCounter("minilm").name
    with pytest.raises(ValueError, match="not available offline"):
        PromptTokenCounter("task", model="/nonexistent/model-dir")
    with pytest.raises(ValueError, match="scripted policy has none"):
        PromptTokenCounter("task", model=None)
    with pytest.raises(ValueError, match="token_counter"):
        AgentConfig(token_counter="bpe")
    assert AgentConfig().token_counter == "auto"
