#!/usr/bin/env bash
# The GPU proof of issue 9 item 7, in one go, on a machine with one NVIDIA GPU and vLLM 0.24.0
# importable (pip install -r requirements/gpu.txt && pip install --no-deps -e . ; or, offline,
# shared/gpu/install_on_gpu.sh and its export line). From the repository root:
#
#   bash scripts/gpu_proof.sh            # writes everything under $PROOF (default /tmp/memprism-gpu-proof)
#
# 1. tests/gpu/            the pool on a real engine (7B-shaped Qwen2.5-VL, random weights)
# 2. bench_policy_pool.py  pool decisions/s (8 callers x groups of 16) vs one engine batch of 128
# 3. gpu_smoke.yaml        jobs/grpo_alfworld.py through `ray job submit` on a local head -> SUCCEEDED
# and prints the figures to paste into README.md / docs/gpu.md. Only processes it started are
# stopped (the Ray head by its own process group, never `ray stop`).
set -euo pipefail

PY=${PYTHON:-python3}
PROOF=${PROOF:-/tmp/memprism-gpu-proof}
MODEL=${MEMPRISM_DUMMY_MODEL:-/tmp/memprism-dummy-qwen25vl-7b}
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "${ROOT}"
mkdir -p "${PROOF}"
export PYTHONPATH="${ROOT}${PYTHONPATH:+:${PYTHONPATH}}"
export RAY_USAGE_STATS_ENABLED=0 RAY_AUTH_MODE=${RAY_AUTH_MODE:-disabled} HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1
# flashinfer's sampler is not in the offline install (shared/gpu/README.md).
export VLLM_USE_FLASHINFER_SAMPLER=${VLLM_USE_FLASHINFER_SAMPLER:-0}
export MEMPRISM_DUMMY_MODEL="${MODEL}"

"${PY}" - <<'PYEOF'
import torch, vllm
assert torch.cuda.is_available(), "no CUDA GPU visible"
print(f"gpu_proof: {torch.cuda.get_device_name(0)}, torch {torch.__version__}, vllm {vllm.__version__}", flush=True)
PYEOF

echo "gpu_proof: building the weightless 7B-shaped model directory ${MODEL}"
"${PY}" -m memprism_ray.policy.dummy_qwen "${MODEL}"

echo "gpu_proof: [1/3] tests/gpu"
tests_rc=0
"${PY}" -m pytest tests/gpu -q -p no:cacheprovider 2>&1 | tee "${PROOF}/tests_gpu.log" || tests_rc=$?

echo "gpu_proof: [2/3] benchmarks/bench_policy_pool.py --engine vllm"
bench_rc=0
"${PY}" benchmarks/bench_policy_pool.py --engine vllm --model "${MODEL}" 2>&1 | tee "${PROOF}/bench.log" || bench_rc=$?

echo "gpu_proof: [3/3] configs/gpu_smoke.yaml through ray job submit"
REF="${PROOF}/router-init"
"${PY}" - "${REF}" <<'PYEOF'
import sys
from pathlib import Path

import torch

from memprism_ray.adapter.checkpoint import save_checkpoint
from memprism_ray.router.model import RouterConfig, ViewPolicyModel

# GRPO starts from a seeded, untrained Router: D1 with a random-weight teacher would label
# nothing (its replies are random text), and the smoke run proves plumbing, not learning.
if not (Path(sys.argv[1]) / "config.json").exists():
    torch.manual_seed(0)
    save_checkpoint(Path(sys.argv[1]), ViewPolicyModel(RouterConfig()), stage="init")
print(f"gpu_proof: Router checkpoint {sys.argv[1]}")
PYEOF
smoke_rc=0
NAME="gpu-smoke-$(date +%Y%m%d-%H%M%S)"
"${PY}" scripts/run_local.py --config configs/gpu_smoke.yaml --name "${NAME}" -- \
    --init_checkpoint "${REF}" --policy.vllm.model "${MODEL}" --policy.vllm.tokenizer "${MODEL}" \
    2>&1 | tee "${PROOF}/smoke.log" || smoke_rc=$?

echo
echo "================ gpu_proof figures ================"
grep -E "passed|failed|skipped" "${PROOF}/tests_gpu.log" | tail -n 1 || true
grep -E "^(solo|pool|ratio)" "${PROOF}/bench.log" || true
grep -E "^RESULT " "${PROOF}/bench.log" || true
grep -E "job (SUCCEEDED|FAILED|STOPPED)" "${PROOF}/smoke.log" || true
echo "logs: ${PROOF}/{tests_gpu,bench,smoke}.log"
echo "exit codes: tests ${tests_rc}, bench ${bench_rc}, smoke ${smoke_rc}"
[[ ${tests_rc} -eq 0 && ${bench_rc} -eq 0 && ${smoke_rc} -eq 0 ]]
