"""transformers task policy from a local checkpoint, on CPU or GPU (paper "Experiment Setup":
frozen Qwen2.5-VL-style VLM, greedy decoding; appendix E.3 prompts).

When ``AutoProcessor`` cannot be built (transformers 5.x's Qwen2-VL processor needs torchvision,
absent on CPU installs), Qwen2-VL-style checkpoints fall back to the tokenizer plus the image
processor, expanding each ``<|image_pad|>`` as the processor does. Token counts read the input ids."""

from __future__ import annotations

import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from PIL import Image

from memprism_ray.policy.base import PolicyBackendError, PolicyInput, PolicyOutput
from memprism_ray.policy.config import HFConfig
from memprism_ray.policy.contract import TaskContract

IMAGE_PAD = "<|image_pad|>"


def _resolve_device(device: str) -> str:
    import torch

    if device == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    if device.startswith("cuda") and not torch.cuda.is_available():
        raise PolicyBackendError(f"hf.device={device} but CUDA is not available")
    return device


def _resolve_dtype(dtype: str, device: str) -> Any:
    import torch

    if dtype == "auto":
        return torch.bfloat16 if device.startswith("cuda") else torch.float32
    return getattr(torch, dtype)


class HFPolicy:
    """Batched task policy on a transformers image-text-to-text model, speaking ``contract``."""

    name = "hf"

    def __init__(self, config: HFConfig, contract: TaskContract) -> None:
        import torch
        import transformers

        self.config = config
        self.contract = contract
        path = Path(config.model_path)
        if not path.is_dir():
            raise ValueError(f"hf.model_path {str(path)!r} is not a local model directory")
        self.device = _resolve_device(config.device)
        common = {"local_files_only": True, "trust_remote_code": config.trust_remote_code}
        pixels = {"min_pixels": config.min_pixels, "max_pixels": config.max_pixels}
        self.processor: Any = None
        self.image_processor: Any = None
        try:
            self.processor = transformers.AutoProcessor.from_pretrained(path, **common, **pixels)
            self.tokenizer = self.processor.tokenizer
        except (ImportError, ValueError, OSError, TypeError, AttributeError, KeyError) as exc:
            self.tokenizer = transformers.AutoTokenizer.from_pretrained(path, **common)
            try:
                self.image_processor = transformers.AutoImageProcessor.from_pretrained(path, **common, **pixels)
            except (ImportError, ValueError, OSError) as exc2:
                raise PolicyBackendError(f"cannot load a processor from {path}: {exc}; {exc2}") from exc2
            if getattr(self.image_processor, "merge_size", None) is None or IMAGE_PAD not in self.tokenizer.get_vocab():
                raise PolicyBackendError(
                    f"AutoProcessor failed for {path} ({exc}) and the fallback supports Qwen2-VL-style processors only"
                ) from exc
        self.tokenizer.padding_side = "left"
        if self.tokenizer.pad_token_id is None:
            self.tokenizer.pad_token = self.tokenizer.eos_token
        has_processor_template = self.processor is not None and getattr(self.processor, "chat_template", None)
        template_owner = self.processor if has_processor_template else self.tokenizer
        if not getattr(template_owner, "chat_template", None):
            raise PolicyBackendError(f"{path} has no chat template (tokenizer or processor)")
        self._template_owner = template_owner
        self.model = transformers.AutoModelForImageTextToText.from_pretrained(
            path, dtype=_resolve_dtype(config.dtype, self.device), **common
        )
        self.model.to(self.device).eval()
        gen_cfg = self.model.generation_config
        eos = gen_cfg.eos_token_id if gen_cfg.eos_token_id is not None else self.tokenizer.eos_token_id
        self.eos_ids: set[int] = set(eos if isinstance(eos, list) else [eos]) - {None}
        vocab = self.tokenizer.get_vocab()
        self.visual_ids = [vocab[t] for t in (IMAGE_PAD, "<|vision_start|>", "<|vision_end|>") if t in vocab]
        self._calls = 0
        self._torch = torch

    def _encode(self, texts: list[str], images: list[Image.Image]) -> dict[str, Any]:
        if self.processor is not None:
            return dict(self.processor(text=texts, images=images or None, padding=True, return_tensors="pt"))
        extra: dict[str, Any] = {}
        if images:
            extra = dict(self.image_processor(images=images, return_tensors="pt"))
            counts = (extra["image_grid_thw"].prod(dim=-1) // self.image_processor.merge_size**2).tolist()
            it = iter(counts)
            expanded = []
            for text in texts:
                pieces = text.split(IMAGE_PAD)
                out = [pieces[0]]
                for piece in pieces[1:]:
                    out.append(IMAGE_PAD * int(next(it)) + piece)
                expanded.append("".join(out))
            texts = expanded
        enc = dict(self.tokenizer(texts, padding=True, return_tensors="pt"))
        enc.update(extra)
        return enc

    def _batch(self, inputs: Sequence[PolicyInput]) -> list[PolicyOutput]:
        torch = self._torch
        t0 = time.perf_counter()
        texts: list[str] = []
        images: list[Image.Image] = []
        for inp in inputs:
            messages, ims = self.contract.build_messages(inp)
            texts.append(self._template_owner.apply_chat_template(messages, tokenize=False, add_generation_prompt=True))
            images.extend(ims)
        enc = self._encode(texts, images)
        enc = {k: (v.to(self.device) if hasattr(v, "to") else v) for k, v in enc.items()}
        greedy = self.config.temperature == 0.0
        gen_kwargs: dict[str, Any] = {
            "max_new_tokens": self.config.max_tokens,
            "do_sample": not greedy,
            "pad_token_id": self.tokenizer.pad_token_id,
        }
        if not greedy:
            gen_kwargs.update(temperature=self.config.temperature, top_p=self.config.top_p)
            torch.manual_seed(self.config.seed + self._calls)
        self._calls += 1
        try:
            with torch.inference_mode():
                out = self.model.generate(**enc, **gen_kwargs)
        except (RuntimeError, ValueError) as exc:
            raise PolicyBackendError(f"transformers generate failed: {type(exc).__name__}: {exc}") from exc
        latency = time.perf_counter() - t0
        input_ids = enc["input_ids"].cpu()
        mask = enc["attention_mask"].cpu()
        width = input_ids.shape[1]
        results = []
        for row, inp in enumerate(inputs):
            gen = out[row, width:].tolist()
            n = next((k + 1 for k, tok in enumerate(gen) if tok in self.eos_ids), len(gen))  # up to the first EOS
            text = self.tokenizer.decode(gen[:n], skip_special_tokens=True)
            ids = input_ids[row][mask[row].bool()]
            visual = int(sum(int((ids == v).sum()) for v in self.visual_ids)) if self.visual_ids else None
            results.append(
                self.contract.to_output(
                    inp,
                    text,
                    prompt_tokens=int(mask[row].sum()),
                    completion_tokens=n,
                    visual_tokens=visual,
                    latency_s=latency,
                )
            )
        return results

    def act(self, inputs: Sequence[PolicyInput]) -> list[PolicyOutput]:
        results: list[PolicyOutput] = []
        step = self.config.batch_size
        for start in range(0, len(inputs), step):
            results.extend(self._batch(inputs[start : start + step]))
        return results
