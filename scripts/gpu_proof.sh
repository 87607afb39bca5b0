#!/usr/bin/env bash
# The GPU proof of issue 9 item 7, in one go, on a machine with one NVIDIA GPU and vLLM 0.24.0
# importable (pip install -r requirements/gpu.txt && pip install --no-deps -e . ; or, offline,
# shared/gpu/install_on_gpu.sh and its export line). From the repository root:
#
#   bash scripts/gpu_proof.sh            # writes everything under $PROOF (default /tmp/memprism-gpu-proof)
#   PROOF_STEPS="bench tests" bash scripts/gpu_proof.sh   # some steps only, in this order
#
# Environment: PROOF_STEPS (default "tests bench smoke"); TESTS_TIMEOUT_S, BENCH_TIMEOUT_S,
# SMOKE_TIMEOUT_S (a step running longer is stopped and counted failed; default: no limit);
# GPU_PROOF_EAGER=1 (tests and smoke start their engines with enforce_eager: no CUDA graphs,
# a shorter start; the bench always measures the default engine).
#
# 1. tests/gpu/            the pool on a real engine (7B-shaped Qwen2.5-VL, random weights)
# 2. bench_policy_pool.py  all_at_once vs pool (8 callers x groups of 16) on one AsyncLLM engine, then
#                          the layout, rollout-loop and front-end stages (issue 31; for a 15-minute
#                          lease use scripts/gpu_bench.sh, which budgets the time)
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

STEPS=${PROOF_STEPS:-tests bench smoke}
EAGER=${GPU_PROOF_EAGER:-0}
export GPU_PROOF_EAGER="${EAGER}"
has_step() { [[ " ${STEPS} " == *" $1 "* ]]; }
# A step's command under its time limit (0: none); exit 124 when stopped.
limited() { local t=$1; shift; if [[ ${t} -gt 0 ]]; then timeout --kill-after=15 "${t}" "$@"; else "$@"; fi; }
# vLLM's engine core process has no check for its parent's death: one that outlived its step
# (its Ray actor killed without stop_policy_replicas) would hold GPU memory the next step
# needs. Reported, stopped and counted (the proof should end with 0); engine cores that were
# running before this script started are not its own and are left alone.
LEFTOVER=0
ENGINES_BEFORE=" $( (pgrep -f "VLLM::EngineCore" || true) | tr '\n' ' ') "
reap_engines() {
  local pids="" pid
  for pid in $(pgrep -f "VLLM::EngineCore" || true); do
    [[ "${ENGINES_BEFORE}" == *" ${pid} "* ]] || pids+="${pid} "
  done
  if [[ -n "${pids}" ]]; then
    echo "gpu_proof: vLLM engine core(s) left after $1: ${pids}(stopped)"
    LEFTOVER=$((LEFTOVER + $(wc -w <<<"${pids}")))
    kill -9 ${pids} 2>/dev/null || true
    sleep 3
  fi
  nvidia-smi --query-gpu=memory.used,memory.total --format=csv,noheader 2>/dev/null | sed "s|^|gpu_proof: GPU memory after $1: |" || true
}

"${PY}" - <<'PYEOF'
import torch, vllm
assert torch.cuda.is_available(), "no CUDA GPU visible"
print(f"gpu_proof: {torch.cuda.get_device_name(0)}, torch {torch.__version__}, vllm {vllm.__version__}", flush=True)
PYEOF

echo "gpu_proof: building the weightless 7B-shaped model directory ${MODEL}"
"${PY}" -m memprism_ray.testing.dummy_qwen "${MODEL}"

tests_rc=- bench_rc=- smoke_rc=-
run_tests() {
  echo "gpu_proof: tests/gpu"
  tests_rc=0
  limited "${TESTS_TIMEOUT_S:-0}" "${PY}" -m pytest tests/gpu -q -p no:cacheprovider 2>&1 | tee "${PROOF}/tests_gpu.log" || tests_rc=$?
  reap_engines tests/gpu
}
run_bench() {
  echo "gpu_proof: benchmarks/bench_policy_pool.py --engine vllm"
  bench_rc=0
  limited "${BENCH_TIMEOUT_S:-0}" "${PY}" benchmarks/bench_policy_pool.py --engine vllm --model "${MODEL}" 2>&1 | tee "${PROOF}/bench.log" || bench_rc=$?
  reap_engines bench
}
run_smoke() {
  echo "gpu_proof: configs/gpu_smoke.yaml through ray job submit"
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
  EXTRA=()
  [[ "${EAGER}" == 1 ]] && EXTRA=(--policy.vllm.enforce_eager true)
  limited "${SMOKE_TIMEOUT_S:-0}" "${PY}" scripts/run_local.py --config configs/gpu_smoke.yaml --name "${NAME}" -- \
      --init_checkpoint "${REF}" --policy.vllm.model "${MODEL}" --policy.vllm.tokenizer "${MODEL}" "${EXTRA[@]}" \
      2>&1 | tee "${PROOF}/smoke.log" || smoke_rc=$?
  reap_engines smoke
}

for step in ${STEPS}; do
  case "${step}" in
    tests) run_tests ;;
    bench) run_bench ;;
    smoke) run_smoke ;;
    *) echo "gpu_proof: unknown step ${step} (tests, bench, smoke)" >&2; exit 2 ;;
  esac
done

echo
echo "================ gpu_proof figures ================"
has_step tests && { grep -E "passed|failed|skipped|error" "${PROOF}/tests_gpu.log" | tail -n 1 || true; }
has_step bench && { grep -E "^(all_at_once|pool|ratio|rollout|scheduler)" "${PROOF}/bench.log" || true; grep -E "^RESULT " "${PROOF}/bench.log" || true; }
has_step smoke && { grep -E "job (SUCCEEDED|FAILED|STOPPED)" "${PROOF}/smoke.log" || true; }
echo "logs: ${PROOF}/{tests_gpu,bench,smoke}.log"
echo "steps: ${STEPS}; exit codes (- = not run): tests ${tests_rc}, bench ${bench_rc}, smoke ${smoke_rc}; engine cores left over: ${LEFTOVER}"
for rc in "${tests_rc}" "${bench_rc}" "${smoke_rc}"; do [[ "${rc}" == - || "${rc}" == 0 ]] || exit 1; done
