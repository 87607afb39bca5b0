"""The policy pool on a real vLLM engine (issue 9 item 7): a 7B-shaped Qwen2.5-VL built with
random weights (load_format=dummy, memprism_ray/testing/dummy_qwen.py) behind one async
PolicyReplica on one GPU. Skipped without CUDA and vLLM; run by scripts/gpu_proof.sh:

    VLLM_USE_FLASHINFER_SAMPLER=0 python -m pytest tests/gpu -q

Random weights answer random text, so outputs are *invalid* actions with a parse error:
these tests check plumbing (every decision answered, concurrency, per-request failures,
the teacher path, GPU placement), not task success.
"""

from __future__ import annotations

import os
import threading
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
if not torch.cuda.is_available():
    pytest.skip("needs a CUDA GPU", allow_module_level=True)
pytest.importorskip("vllm")

from memprism_ray.policy.base import PolicyInput, PolicyOutput  # noqa: E402
from memprism_ray.policy.config import PolicyConfig, VLLMConfig  # noqa: E402

pytestmark = [pytest.mark.slow, pytest.mark.ray]

MAX_TOKENS = 16
MODEL_DIR = Path(os.environ.get("MEMPRISM_DUMMY_MODEL", "/tmp/memprism-dummy-qwen25vl-7b"))


def inputs(tag: str, n: int, **kw) -> list[PolicyInput]:
    from PIL import Image, ImageDraw

    out = []
    for i in range(n):
        img = Image.new("RGB", (672, 392), "white")
        ImageDraw.Draw(img).text((10, 10 + 20 * (i % 15)), f"{tag} view {i}", fill="black")
        out.append(
            PolicyInput(
                "alfworld",
                kw.get("goal", "put a clean mug in cabinet 1"),
                kw.get("observation", f"You are in the middle of a room ({tag} {i})."),
                admissible=("look", "go to cabinet 1"),
                view_image=img,
                meta={"episode_id": f"{tag}-{i}"},
            )
        )
    return out


@pytest.fixture(scope="module")
def replica(ray_session):
    from memprism_ray.actors.workers import PolicyReplica
    from memprism_ray.testing.dummy_qwen import build_dummy_qwen25vl

    os.environ.setdefault("VLLM_USE_FLASHINFER_SAMPLER", "0")
    build_dummy_qwen25vl(MODEL_DIR)
    cfg = PolicyConfig(
        backend="vllm",
        gpus_per_replica=1.0,
        vllm=VLLMConfig(
            model=str(MODEL_DIR),
            tokenizer=str(MODEL_DIR),
            load_format="dummy",
            max_model_len=8192,  # as bench_policy_pool.py: one torch.compile cache for both
            gpu_memory_utilization=0.8,
            limit_mm_per_prompt=1,
            max_pixels=451584,
            max_tokens=MAX_TOKENS,
            ignore_eos=True,
            # scripts/gpu_proof.sh with GPU_PROOF_EAGER=1: no CUDA graphs, a shorter start
            enforce_eager=os.environ.get("GPU_PROOF_EAGER") == "1",
            frontend_threads=2,  # PNG decode and templating off the event loop (issue 31)
        ),
    )
    opts = cfg.replica_options(1.0)
    assert opts["num_gpus"] == 1.0
    handle = PolicyReplica.options(**opts).remote(cfg, None)
    ray_session.get(handle.load.remote(), timeout=600)  # placed on the GPU, engine started
    yield handle
    from memprism_ray.actors.workers import stop_policy_replicas

    assert stop_policy_replicas([handle]) == 1  # the engine core stopped, its GPU memory free


def test_callers_share_one_real_engine_and_every_decision_is_answered(ray_session, replica) -> None:
    from memprism_ray.actors.services import PolicyPool

    results: dict[int, list] = {}

    def caller(c: int) -> None:
        pool = PolicyPool([replica], timeout_s=300, caller=f"gpu{c}")
        results[c] = pool.act(inputs(f"c{c}", 8))

    threads = [threading.Thread(target=caller, args=(c,)) for c in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    outs = [o for c in range(4) for o in results[c]]
    assert len(outs) == 32 and all(isinstance(o, PolicyOutput) for o in outs), outs
    assert all(o.completion_tokens == MAX_TOKENS for o in outs)  # ignore_eos: the full completion
    assert all(o.prompt_tokens and o.prompt_tokens > o.visual_tokens > 0 for o in outs)
    stats = ray_session.get(replica.stats.remote(), timeout=60)
    assert stats["max_in_flight"] >= 16, stats  # several callers' requests were in the engine at once
    assert stats["engine_errors"] == 0


def test_a_rejected_request_fails_alone(ray_session, replica) -> None:
    from memprism_ray.actors.services import PolicyPool

    pool = PolicyPool([replica], timeout_s=300, caller="reject")
    batch = inputs("ok", 2) + inputs("long", 1, observation="word " * 20000)  # > max_model_len
    out = pool.act(batch, group="reject")
    assert isinstance(out[0], PolicyOutput) and isinstance(out[1], PolicyOutput)
    assert out[0].completion_tokens == MAX_TOKENS
    assert not out[2].valid and "rejected" in out[2].error


def test_teacher_completion_on_the_pool(ray_session, replica) -> None:
    from memprism_ray.actors.services import PolicyPool

    pool = PolicyPool([replica], timeout_s=300, caller="teacher")
    replies = pool.complete(["Return a JSON view distribution.", "Another state."], max_tokens=8, group="d1-0")
    assert all(isinstance(r, str) for r in replies), replies


def test_the_engine_runs_the_configured_scheduler_and_both_prompt_layouts(ray_session, replica) -> None:
    """Issue 31: vLLM resolved the config's explicit scheduler (not AsyncLLM's 2,048 / 128
    defaults), and an instructions-first prompt is answered like the paper's."""
    from memprism_ray.actors.services import PolicyPool

    settings = ray_session.get(replica.engine_settings.remote(), timeout=60)
    assert settings["source"] == "engine", settings
    assert settings["max_num_batched_tokens"] == 16384 and settings["max_num_seqs"] == 1024, settings
    assert settings["frontend_threads"] == 2
    pool = PolicyPool([replica], timeout_s=300, caller="layout")
    ray_session.get(replica.configure_frontend.remote(prompt_layout="instructions_first"), timeout=60)
    try:
        outs = pool.act(inputs("layout", 4), group="layout")
    finally:
        ray_session.get(replica.configure_frontend.remote(prompt_layout="paper"), timeout=60)
    assert all(isinstance(o, PolicyOutput) and o.completion_tokens == MAX_TOKENS for o in outs)
    front = ray_session.get(replica.stats.remote(), timeout=60)["frontend"]
    assert front["decode_n"] >= 4 and front["mm_preprocess_n"] >= 4  # vLLM's input processing was timed
