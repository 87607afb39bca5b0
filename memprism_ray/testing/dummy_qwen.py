"""A Qwen2.5-VL model directory without weights, for proving the GPU path offline
(tests/gpu/, benchmarks/bench_policy_pool.py, configs/gpu_smoke.yaml; docs/gpu.md).

vLLM builds random weights from a config (``load_format="dummy"``): the *shape* of
Qwen2.5-VL-7B-Instruct (paper "Experiment Setup"), a byte-level BPE tokenizer with Qwen's special
ids and the processor files measure plumbing and speed where no checkpoint can be downloaded.

    python -m memprism_ray.testing.dummy_qwen /tmp/memprism-dummy-qwen25vl-7b"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from memprism_ray.policy.chat_format import QWEN2_VL_CHAT_TEMPLATE

#: Qwen2 special tokens in id order, from 151643.
SPECIAL_TOKENS: tuple[str, ...] = (
    "<|endoftext|>",
    "<|im_start|>",
    "<|im_end|>",
    "<|object_ref_start|>",
    "<|object_ref_end|>",
    "<|box_start|>",
    "<|box_end|>",
    "<|quad_start|>",
    "<|quad_end|>",
    "<|vision_start|>",
    "<|vision_end|>",
    "<|vision_pad|>",
    "<|image_pad|>",
    "<|video_pad|>",
)
FIRST_SPECIAL_ID = 151643

#: Layer sizes of Qwen2.5-VL-7B-Instruct's text and vision towers (and a tiny one for CPU tests).
SIZES: dict[str, dict[str, Any]] = {
    "7b": {
        "text": {
            "hidden_size": 3584,
            "num_hidden_layers": 28,
            "num_attention_heads": 28,
            "num_key_value_heads": 4,
            "intermediate_size": 18944,
        },
        "vision": {
            "depth": 32,
            "hidden_size": 1280,
            "intermediate_size": 3420,
            "num_heads": 16,
            "out_hidden_size": 3584,
            "fullatt_block_indexes": [7, 15, 23, 31],
        },
    },
    "tiny": {
        "text": {
            "hidden_size": 64,
            "num_hidden_layers": 1,
            "num_attention_heads": 4,
            "num_key_value_heads": 2,
            "intermediate_size": 128,
        },
        "vision": {
            "depth": 1,
            "hidden_size": 32,
            "intermediate_size": 64,
            "num_heads": 2,
            "out_hidden_size": 64,
            "fullatt_block_indexes": [0],
        },
    },
}
TEXT_VOCAB = 152064


def bytes_to_unicode() -> dict[int, str]:
    """GPT-2's reversible byte -> printable character map (byte-level BPE alphabet)."""
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return dict(zip(bs, (chr(c) for c in cs), strict=True))


def build_tokenizer() -> Any:
    """The byte-level BPE tokenizer described in the module docstring."""
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    symbols = [bytes_to_unicode()[b] for b in range(256)]
    vocab: dict[str, int] = {s: i for i, s in enumerate(symbols)}

    def fillers():
        for a in symbols:
            for b in symbols:
                yield a + b
        for a in symbols:
            for b in symbols:
                for c in symbols:
                    yield a + b + c

    gen = fillers()
    while len(vocab) < FIRST_SPECIAL_ID:
        vocab.setdefault(next(gen), len(vocab))
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens([AddedToken(s, special=True, normalized=False) for s in SPECIAL_TOKENS])
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        model_max_length=32768,
    )
    fast.chat_template = QWEN2_VL_CHAT_TEMPLATE
    return fast


def build_config(size: str = "7b") -> Any:
    from transformers import Qwen2_5_VLConfig

    s = SIZES[size]
    text = {
        **s["text"],
        "vocab_size": TEXT_VOCAB,
        "max_position_embeddings": 128000,
        "rope_theta": 1000000.0,
        "rms_norm_eps": 1e-6,
        "hidden_act": "silu",
        "rope_scaling": {"type": "mrope", "rope_type": "default", "mrope_section": [16, 24, 24]},
        "tie_word_embeddings": False,
        "use_sliding_window": False,
        "sliding_window": 32768,
        "max_window_layers": 28,
        "bos_token_id": FIRST_SPECIAL_ID,
        "eos_token_id": FIRST_SPECIAL_ID + 2,
        "torch_dtype": "bfloat16",
    }
    if size == "tiny":
        text["rope_scaling"]["mrope_section"] = [2, 3, 3]
    vision = {
        **s["vision"],
        "patch_size": 14,
        "spatial_merge_size": 2,
        "temporal_patch_size": 2,
        "window_size": 112,
        "in_chans": 3,
        "hidden_act": "silu",
        "tokens_per_second": 2,
    }
    ids = {name: FIRST_SPECIAL_ID + SPECIAL_TOKENS.index(tok) for name, tok in (
        ("image_token_id", "<|image_pad|>"),
        ("video_token_id", "<|video_pad|>"),
        ("vision_start_token_id", "<|vision_start|>"),
        ("vision_end_token_id", "<|vision_end|>"),
    )}  # fmt: skip
    cfg = Qwen2_5_VLConfig(text_config=text, vision_config=vision, **ids)
    cfg.architectures = ["Qwen2_5_VLForConditionalGeneration"]
    return cfg


#: Qwen2.5-VL's image / video processor settings (its preprocessor_config.json).
PROCESSOR_SETTINGS: dict[str, Any] = {
    "min_pixels": 3136,
    "max_pixels": 12845056,
    "patch_size": 14,
    "temporal_patch_size": 2,
    "merge_size": 2,
    "image_mean": [0.48145466, 0.4578275, 0.40821073],
    "image_std": [0.26862954, 0.26130258, 0.27577711],
    "do_resize": True,
    "do_rescale": True,
    "rescale_factor": 1 / 255,
    "do_normalize": True,
    "do_convert_rgb": True,
}


def build_dummy_qwen25vl(out_dir: str | Path, size: str = "7b") -> Path:
    """Write the model directory (idempotent). The processor files are written as JSON, since
    ``Qwen2_5_VLProcessor`` needs torchvision (absent on CPU CI)."""
    out = Path(out_dir)
    marker = out / "memprism_dummy.json"
    if marker.exists() and json.loads(marker.read_text()).get("size") == size:
        return out
    if size not in SIZES:
        raise ValueError(f"size must be one of {', '.join(SIZES)}, got {size!r}")
    out.mkdir(parents=True, exist_ok=True)
    build_config(size).save_pretrained(out)
    build_tokenizer().save_pretrained(out)
    common = {**PROCESSOR_SETTINGS, "processor_class": "Qwen2_5_VLProcessor"}
    (out / "preprocessor_config.json").write_text(
        json.dumps({"image_processor_type": "Qwen2VLImageProcessor", **common}, indent=2)
    )
    (out / "video_preprocessor_config.json").write_text(
        json.dumps({"video_processor_type": "Qwen2VLVideoProcessor", **common}, indent=2)
    )
    (out / "chat_template.json").write_text(json.dumps({"chat_template": QWEN2_VL_CHAT_TEMPLATE}, indent=2))
    marker.write_text(json.dumps({"size": size, "weights": "none (load_format=dummy)"}))
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("out_dir")
    parser.add_argument("--size", default="7b", choices=sorted(SIZES))
    args = parser.parse_args(argv)
    print(build_dummy_qwen25vl(args.out_dir, args.size))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
