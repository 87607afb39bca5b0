"""all-MiniLM-L6-v2 in plain torch (paper appendix A.2: the Router's frozen text backbone).

The model is a 6-layer BERT encoder (hidden 384, 12 heads, GELU, post-LayerNorm); this module
reads the packaged copy's ``config.json``, ``model.safetensors`` and ``tokenizer.json`` and runs
the same operations in the same order as ``transformers``' ``BertModel`` with its default SDPA
attention, so its hidden states equal that model's bit for bit (``tests/router/test_minilm.py``
compares them on the corpus's texts, batched and one by one).

Why not ``transformers``: importing its BERT and sentence-transformers costs every process that
embeds text (each rollout worker, evaluation worker, D1 task, Serve replica) about 6 s of CPU
on these machines, more than the rest of such an actor's start together
(``benchmarks/bench_encoder_start.py`` records it); this module imports torch, safetensors and
tokenizers only. Other backbones (``encoder.model_name_or_path``) still load through
``transformers``.
"""

from __future__ import annotations

import json
from dataclasses import MISSING, dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn
from torch.nn import functional as F

#: The files a plain-torch BERT directory must hold.
FILES = ("config.json", "model.safetensors", "tokenizer.json")


@dataclass(frozen=True)
class BertShape:
    """The fields of a BERT ``config.json`` this encoder reads."""

    vocab_size: int
    hidden_size: int
    num_hidden_layers: int
    num_attention_heads: int
    intermediate_size: int
    max_position_embeddings: int
    type_vocab_size: int
    layer_norm_eps: float
    pad_token_id: int = 0

    @classmethod
    def read(cls, path: Path) -> BertShape:
        raw = json.loads(path.read_text())
        if raw.get("model_type") != "bert" or raw.get("hidden_act", "gelu") != "gelu":
            raise ValueError(f"{path}: not a BERT encoder with GELU (model_type {raw.get('model_type')!r})")
        if raw.get("position_embedding_type", "absolute") != "absolute":
            raise ValueError(f"{path}: only absolute position embeddings are supported")
        needed = [k for k, f in cls.__dataclass_fields__.items() if f.default is MISSING and k not in raw]
        if needed:
            raise ValueError(f"{path}: lacks {', '.join(needed)}")
        return cls(**{k: raw[k] for k in cls.__dataclass_fields__ if k in raw})


class _Layer(nn.Module):
    def __init__(self, s: BertShape) -> None:
        super().__init__()
        h = s.hidden_size
        self.heads = s.num_attention_heads
        self.head_size = h // s.num_attention_heads
        self.query, self.key, self.value = nn.Linear(h, h), nn.Linear(h, h), nn.Linear(h, h)
        self.attn_out = nn.Linear(h, h)
        self.attn_norm = nn.LayerNorm(h, eps=s.layer_norm_eps)
        self.up = nn.Linear(h, s.intermediate_size)
        self.down = nn.Linear(s.intermediate_size, h)
        self.out_norm = nn.LayerNorm(h, eps=s.layer_norm_eps)

    def forward(self, x: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
        shape = (*x.shape[:-1], -1, self.head_size)
        q = self.query(x).view(*shape).transpose(1, 2)
        k = self.key(x).view(*shape).transpose(1, 2)
        v = self.value(x).view(*shape).transpose(1, 2)
        a = F.scaled_dot_product_attention(
            q, k, v, attn_mask=mask, dropout_p=0.0, scale=self.head_size**-0.5, is_causal=False
        )
        a = a.transpose(1, 2).contiguous().reshape(*x.shape[:-1], -1).contiguous()
        x = self.attn_norm(self.attn_out(a) + x)
        return self.out_norm(self.down(F.gelu(self.up(x))) + x)


@dataclass
class _Output:
    last_hidden_state: torch.Tensor


class MiniLM(nn.Module):
    """A BERT encoder's ``last_hidden_state`` (``model(input_ids=..., attention_mask=...)``)."""

    def __init__(self, shape: BertShape) -> None:
        super().__init__()
        self.config = shape
        h = shape.hidden_size
        self.word = nn.Embedding(shape.vocab_size, h, padding_idx=shape.pad_token_id)
        self.position = nn.Embedding(shape.max_position_embeddings, h)
        self.token_type = nn.Embedding(shape.type_vocab_size, h)
        self.norm = nn.LayerNorm(h, eps=shape.layer_norm_eps)
        self.layers = nn.ModuleList(_Layer(shape) for _ in range(shape.num_hidden_layers))

    def forward(
        self, input_ids: torch.Tensor, attention_mask: torch.Tensor, token_type_ids: torch.Tensor | None = None
    ) -> _Output:
        n = input_ids.shape[1]
        if n > self.config.max_position_embeddings:
            raise ValueError(f"{n} tokens; this encoder takes at most {self.config.max_position_embeddings}")
        if token_type_ids is None:
            token_type_ids = torch.zeros_like(input_ids)
        x = self.word(input_ids) + self.token_type(token_type_ids)
        x = self.norm(x + self.position(torch.arange(n, device=input_ids.device)[None, :]))
        # SDPA's boolean mask (True: attend) over keys, none where nothing is padded: as BertModel.
        mask = None
        if not bool(attention_mask.all()):
            keys = attention_mask.bool()[:, None, None, :]
            mask = keys.expand(-1, 1, n, -1).contiguous()
        for layer in self.layers:
            x = layer(x, mask)
        return _Output(x)


#: ``model.safetensors`` names (BertModel's, with or without a ``bert.`` prefix) -> ours.
_RENAME = {
    "embeddings.word_embeddings": "word",
    "embeddings.position_embeddings": "position",
    "embeddings.token_type_embeddings": "token_type",
    "embeddings.LayerNorm": "norm",
    "attention.self.query": "query",
    "attention.self.key": "key",
    "attention.self.value": "value",
    "attention.output.dense": "attn_out",
    "attention.output.LayerNorm": "attn_norm",
    "intermediate.dense": "up",
    "output.dense": "down",
    "output.LayerNorm": "out_norm",
}


def _our_name(name: str) -> str | None:
    name = name.removeprefix("bert.")
    if name.startswith("encoder.layer."):
        _, _, index, rest = name.split(".", 3)
        module, _, param = rest.rpartition(".")
        return f"layers.{index}.{_RENAME[module]}.{param}" if module in _RENAME else None
    module, _, param = name.rpartition(".")
    if module in _RENAME:
        return f"{_RENAME[module]}.{param}"
    return None  # the pooler and buffers: not used by last_hidden_state


class WordPiece:
    """The model's ``tokenizer.json`` (the fast tokenizer transformers' ``BertTokenizer`` runs),
    answering as that tokenizer does for the calls :class:`~memprism_ray.router.encoder.TextEncoder` makes."""

    def __init__(self, path: Path, pad_token_id: int) -> None:
        from tokenizers import Tokenizer

        self._tok = Tokenizer.from_file(str(path))
        self._tok.no_padding()
        self.pad_token_id = pad_token_id

    def __call__(self, texts: list[str], *, truncation: bool, max_length: int) -> dict[str, list[list[int]]]:
        if truncation:
            self._tok.enable_truncation(max_length)
        else:
            self._tok.no_truncation()
        ids = [e.ids for e in self._tok.encode_batch(texts)]
        return {
            "input_ids": ids,
            "token_type_ids": [[0] * len(i) for i in ids],
            "attention_mask": [[1] * len(i) for i in ids],
        }

    def pad(self, batch: dict[str, list[list[int]]], return_tensors: str = "pt") -> dict[str, torch.Tensor]:
        if return_tensors != "pt":
            raise ValueError(f"return_tensors must be 'pt', got {return_tensors!r}")
        width = max(len(row) for row in batch["input_ids"])
        fill = {"input_ids": self.pad_token_id, "token_type_ids": 0, "attention_mask": 0}
        return {
            k: torch.tensor([row + [fill[k]] * (width - len(row)) for row in rows], dtype=torch.long)
            for k, rows in batch.items()
        }


def load_minilm(directory: Path, device: str = "cpu") -> tuple[WordPiece, MiniLM]:
    """``(tokenizer, model)`` from a directory holding :data:`FILES`; a missing file, an
    architecture other than BERT, or weights that do not fit raise ``ValueError`` naming it."""
    from safetensors.torch import load_file

    missing = [f for f in FILES if not (directory / f).is_file()]
    if missing:
        raise ValueError(f"{directory} lacks {', '.join(missing)}")
    shape = BertShape.read(directory / "config.json")
    model = MiniLM(shape)
    state: dict[str, Any] = {}
    for name, tensor in load_file(str(directory / "model.safetensors")).items():
        ours = _our_name(name)
        if ours is not None:
            state[ours] = tensor
    try:
        model.load_state_dict(state, strict=True)
    except RuntimeError as exc:
        raise ValueError(f"{directory / 'model.safetensors'} does not fit a BERT of {shape}: {exc}") from None
    return WordPiece(directory / "tokenizer.json", shape.pad_token_id), model.to(device)
