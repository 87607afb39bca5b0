#!/usr/bin/env bash
# Issue 31's GPU check in one call on a device lease: install vLLM 0.24.0 + Ray 2.60.0 the
# offline way (shared/gpu/README.md), run tests/gpu, then benchmarks/bench_policy_pool.py on
# ONE AsyncLLM engine, everything under a wall-clock budget, results as JSON under $OUT.
#
#   bash scripts/gpu_bench.sh prep        # HERE, on the CPU machine: fill tmp/gpu/ (ignored by git)
#   bash scripts/gpu_bench.sh run         # ON THE DEVICE MACHINE, from the repository root
#   bash scripts/gpu_bench.sh --dry-run run   # print the stages, their budgets and commands; run nothing
#
# prep builds, in tmp/gpu/: vp/site.part00..03 (the packages the GPU image lacks, xz, <= 56 MiB
# each: shared/gpu/build_site.sh, plus pytest for tests/gpu), unpack_site.sh and stubs.py from
# shared/gpu, src.tar.gz (git archive HEAD) and COMMIT. It prints the device-tool calls that
# carry the parts one at a time (docs/gpu.md "To run on a GPU lease").
#
# run, stage by stage, each printed with its seconds ("[gpu_bench] ..."):
#   install  reassemble the parts from $PARTS (default /root/vp) into /tmp/site unless a warm
#            machine has it already; stub xgrammar; one `import vllm` (stubs.py)
#   source   unpack src.tar.gz (the committed code, whatever else the working copy holds)
#   model    the weightless 7B-shaped Qwen2.5-VL directory (memprism_ray.testing.dummy_qwen)
#   bench    bench_policy_pool.py --engine vllm, its --deadline-s = the budget left less
#            TESTS_RESERVE_S (default 170) for the tests; eager engines unless GPU_BENCH_COMPILED=1
#            (a compiled start took 150-176 s on an H100: it does not fit beside the tests);
#            VLLM_CACHE_ROOT (default /root/vllm-cache) keeps torch.compile's artefacts, so a
#            second compiled start on the same warm machine is shorter
#   tests    tests/gpu with eager engines, in the time left (at most TESTS_TIMEOUT_S, default 240)
# The bench goes first: its figures are what the lease is for, and it drives the new code paths
# (explicit scheduler, front-end threads, both prompt layouts) on the real engine itself.
# Environment: GPU_BENCH_BUDGET_S (whole run, default 540: a `run` call's 600 s limit less a margin),
# GPU_BENCH_STAGES (default "install source model bench tests"), BENCH_ARGS (extra bench flags),
# GPU_BENCH_ENGINE=fake (a CPU rehearsal of the flow: the bench on the fake engine),
# OUT (default /tmp/gpu-bench-out). Writes $OUT/gpu_bench.json (stage seconds, exit codes, device),
# $OUT/bench_policy_pool.json (the bench's RESULT, rewritten after each of its stages),
# $OUT/results/bench_policy_pool.json (the record for benchmarks/results/), and the logs.
set -euo pipefail

DRY=0
if [[ "${1:-}" == "--dry-run" ]]; then DRY=1; shift; fi
CMD=${1:-run}
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
GPU_DIR="${ROOT}/tmp/gpu"
SHARED=${MEMPRISM_SHARED_GPU:-${ROOT}/../shared/gpu}

say() { echo "[gpu_bench] $*"; }
run_or_show() { if [[ ${DRY} == 1 ]]; then echo "    \$ $*"; else "$@"; fi; }

prep() {
  [[ ${DRY} == 1 ]] || mkdir -p "${GPU_DIR}/vp"
  if ! ls "${GPU_DIR}"/vp/site.part* >/dev/null 2>&1; then
    say "building the site archive (vLLM 0.24.0, Ray 2.60.0, pytest) into tmp/gpu/vp: minutes"
    run_or_show bash "${SHARED}/build_site.sh" "${GPU_DIR}/vp" pytest==9.2.0 pytest-timeout==2.4.0 \
      pluggy==1.7.0 iniconfig==2.3.1 pygments==2.21.0
  fi
  run_or_show cp "${SHARED}/unpack_site.sh" "${SHARED}/stubs.py" "${GPU_DIR}/"
  if [[ ${DRY} == 0 ]]; then
    git -C "${ROOT}" archive --format=tar HEAD | gzip -1 > "${GPU_DIR}/src.tar.gz"
    git -C "${ROOT}" rev-parse HEAD > "${GPU_DIR}/COMMIT"
    [[ -z "$(git -C "${ROOT}" status --porcelain --untracked-files=no -- memprism_ray benchmarks scripts tests/gpu)" ]] \
      || say "note: uncommitted changes in the measured code are NOT in src.tar.gz (HEAD $(cat "${GPU_DIR}/COMMIT"))"
  else
    echo "    \$ git archive --format=tar HEAD | gzip -1 > tmp/gpu/src.tar.gz; git rev-parse HEAD > tmp/gpu/COMMIT"
  fi
  local parts
  parts=$(cd "${GPU_DIR}/vp" 2>/dev/null && ls site.part* 2>/dev/null || echo "site.part00 site.part01 site.part02 site.part03")
  local last
  last=$(tr ' ' '\n' <<<"${parts}" | tail -n 1)
  echo
  say "device-tool calls, back to back while the machine stays warm (30 s idle release):"
  for p in ${parts}; do
    [[ "${p}" == "${last}" ]] && continue
    echo "  run(command=\"mkdir -p /root/vp && cp tmp/gpu/vp/${p} /root/vp/\", carry=[\"tmp/gpu/vp/${p}\"], timeout_s=60)"
  done
  echo "  run(command=\"bash scripts/gpu_bench.sh run\", carry=[\"tmp/gpu/vp/${last}\", \"tmp/gpu/unpack_site.sh\"," \
       "\"tmp/gpu/stubs.py\", \"tmp/gpu/src.tar.gz\", \"tmp/gpu/COMMIT\"], timeout_s=590)"
}

# --- on the device machine ------------------------------------------------------------------
BUDGET=${GPU_BENCH_BUDGET_S:-540}
STAGES=${GPU_BENCH_STAGES:-install source model bench tests}
TESTS_RESERVE=${TESTS_RESERVE_S:-170}
OUT=${OUT:-/tmp/gpu-bench-out}
PARTS=${PARTS:-/root/vp}
MODEL=${MEMPRISM_DUMMY_MODEL:-/tmp/memprism-dummy-qwen25vl-7b}
SRC=/tmp/memprism-src
T0=$(date +%s)
declare -A STAGE_S=() STAGE_RC=()
elapsed() { echo $(( $(date +%s) - T0 )); }
has_stage() { [[ " ${STAGES} " == *" $1 "* ]]; }
# vLLM's engine core has no check for its parent's death (docs/gpu.md): one left by a step would
# hold the GPU memory the next one needs. Only processes this run started are stopped.
ENGINES_BEFORE=""
reap_engines() {
  local pid pids=""
  for pid in $(pgrep -f "VLLM::EngineCore" || true); do
    [[ " ${ENGINES_BEFORE} " == *" ${pid} "* ]] || pids+="${pid} "
  done
  if [[ -n "${pids}" ]]; then say "engine core(s) left after $1: ${pids}(stopped)"; kill -9 ${pids} 2>/dev/null || true; sleep 3; fi
  nvidia-smi --query-gpu=memory.used,memory.total --format=csv,noheader 2>/dev/null | sed "s|^|[gpu_bench] GPU memory after $1: |" || true
}
declare -A PLAN=(
  [install]="cat \${PARTS}/site.part* | xz -d | tar x -C /tmp/site; xgrammar stub; stubs.py (one import vllm); ~40-60 s"
  [source]="tar xzf tmp/gpu/src.tar.gz -C ${SRC}; MEMPRISM_COMMIT=\$(cat tmp/gpu/COMMIT); ~1 s"
  [model]="python3 -m memprism_ray.testing.dummy_qwen ${MODEL}; ~5 s"
  [bench]="python3 benchmarks/bench_policy_pool.py --engine vllm --model ${MODEL} --enforce-eager --compile-cache \${VLLM_CACHE_ROOT} --deadline-s <budget left - ${TESTS_RESERVE}s - 25s> --out ${OUT}/bench_policy_pool.json; stages core (3 x all_at_once + pool, 768 decisions each), decode probe, layout, rollout (sync, ready, sync2x), frontend: each only if it fits"
  [tests]="GPU_PROOF_EAGER=1 python3 -m pytest tests/gpu -q (timeout: budget left - 10 s, at most ${TESTS_TIMEOUT_S:-240} s); ~100-160 s"
)
stage() {  # stage NAME COMMAND...: runs, times and records one stage; a failure is recorded, not fatal
  local name=$1; shift
  local t=$(date +%s) rc=0
  say "stage ${name} at $(elapsed)s of ${BUDGET}s"
  if [[ ${DRY} == 1 ]]; then echo "    ${PLAN[${name}]}"; STAGE_S[${name}]=0; STAGE_RC[${name}]=dry; return 0; fi
  "$@" || rc=$?
  STAGE_S[${name}]=$(( $(date +%s) - t )); STAGE_RC[${name}]=${rc}
  say "stage ${name}: ${STAGE_S[${name}]}s, exit ${rc}"
}

do_install() {
  if PYTHONPATH=/tmp/site:/tmp/stubs python3 -c "import vllm" >/dev/null 2>&1; then
    say "vLLM already importable from /tmp/site (warm machine): no unpack"
    return 0
  fi
  mkdir -p "${PARTS}"
  cp -n "${GPU_DIR}"/vp/site.part* "${PARTS}/" 2>/dev/null || true
  local n
  n=$(ls "${PARTS}"/site.part* 2>/dev/null | wc -l)
  [[ ${n} -ge 1 ]] || { say "no site.part* in ${PARTS}: carry them first (bash scripts/gpu_bench.sh prep prints the calls)"; return 3; }
  bash "${GPU_DIR}/unpack_site.sh" "${PARTS}"
}
do_source() {
  if [[ -f "${GPU_DIR}/src.tar.gz" ]]; then
    rm -rf "${SRC}" && mkdir -p "${SRC}" && tar xzf "${GPU_DIR}/src.tar.gz" -C "${SRC}"
    export MEMPRISM_COMMIT; MEMPRISM_COMMIT=$(cat "${GPU_DIR}/COMMIT" 2>/dev/null || echo unknown)
  else
    say "no tmp/gpu/src.tar.gz: running the working copy as carried (commit unknown)"
    SRC=${ROOT}
  fi
}
do_model() {  # from the source snapshot: the working copy's cwd would shadow it on sys.path
  (cd "${SRC}" && python3 -m memprism_ray.testing.dummy_qwen "${MODEL}")
}
do_tests() {
  local left=$(( BUDGET - $(elapsed) - 10 )) cap=${TESTS_TIMEOUT_S:-240}
  [[ ${left} -lt ${cap} ]] && cap=${left}
  if [[ ${cap} -lt 60 ]]; then say "tests: only ${cap}s left of the budget, not started"; return 4; fi
  (cd "${SRC}" && GPU_PROOF_EAGER=1 timeout --kill-after=15 "${cap}" \
     python3 -m pytest tests/gpu -q -p no:cacheprovider 2>&1 | tee "${OUT}/tests_gpu.log"; exit "${PIPESTATUS[0]}")
}
do_bench() {
  local left=$(( BUDGET - $(elapsed) - 25 ))
  has_stage tests && left=$(( left - TESTS_RESERVE ))
  if [[ ${left} -lt 120 ]]; then say "bench: only ${left}s left of the budget, not started"; return 4; fi
  local eager=(--enforce-eager)
  [[ "${GPU_BENCH_COMPILED:-0}" == 1 ]] && eager=()
  # shellcheck disable=SC2086
  (cd "${SRC}" && MEMPRISM_BENCH_RESULTS="${OUT}/results" timeout --kill-after=15 $(( left + 20 )) \
     python3 benchmarks/bench_policy_pool.py --engine "${GPU_BENCH_ENGINE:-vllm}" --model "${MODEL}" "${eager[@]}" \
       --compile-cache "${VLLM_CACHE_ROOT}" --deadline-s "${left}" --out "${OUT}/bench_policy_pool.json" ${BENCH_ARGS:-} \
       2>&1 | tee "${OUT}/bench.log"; exit "${PIPESTATUS[0]}")
}

run_device() {
  mkdir -p "${OUT}"
  export PYTHONPATH=/tmp/site:/tmp/stubs VLLM_USE_FLASHINFER_SAMPLER=0 HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 \
         RAY_USAGE_STATS_ENABLED=0 RAY_AUTH_MODE=disabled TOKENIZERS_PARALLELISM=false MEMPRISM_DUMMY_MODEL="${MODEL}"
  export VLLM_CACHE_ROOT=${VLLM_CACHE_ROOT:-/root/vllm-cache}
  say "budget ${BUDGET}s; stages: ${STAGES}; OUT ${OUT}; bench $( [[ "${GPU_BENCH_COMPILED:-0}" == 1 ]] && echo compiled || echo eager)"
  [[ ${DRY} == 1 ]] || ENGINES_BEFORE=$(pgrep -f "VLLM::EngineCore" | tr '\n' ' ' || true)
  has_stage install && stage install do_install
  has_stage source && stage source do_source
  [[ ${DRY} == 1 ]] || export PYTHONPATH="${SRC}:${PYTHONPATH}"
  has_stage model && stage model do_model
  if has_stage bench; then stage bench do_bench; [[ ${DRY} == 1 ]] || reap_engines bench; fi
  if has_stage tests; then stage tests do_tests; [[ ${DRY} == 1 ]] || reap_engines tests; fi
  [[ ${DRY} == 1 ]] && { say "dry run: nothing ran"; return 0; }
  local device
  device=$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -n 1 || echo unknown)
  python3 - "${OUT}/gpu_bench.json" "${device}" "${MEMPRISM_COMMIT:-unknown}" "$(elapsed)" \
      "$(for k in "${!STAGE_S[@]}"; do echo "${k}=${STAGE_S[$k]}:${STAGE_RC[$k]}"; done)" <<'PYEOF'
import json, sys
path, device, commit, total, stages = sys.argv[1:6]
rows = dict(line.split("=", 1) for line in stages.split() if "=" in line)
doc = {"device": device, "commit": commit, "total_s": int(total),
       "stages": {k: {"seconds": int(v.split(":")[0]), "exit": v.split(":")[1]} for k, v in rows.items()}}
open(path, "w").write(json.dumps(doc, indent=1) + "\n")
print("[gpu_bench] " + json.dumps(doc))
PYEOF
  grep -E "^RESULT " "${OUT}/bench.log" 2>/dev/null | tail -n 1 | cut -c1-2000 || true
  grep -E "passed|failed|error" "${OUT}/tests_gpu.log" 2>/dev/null | tail -n 1 || true
  for k in "${!STAGE_RC[@]}"; do [[ "${STAGE_RC[$k]}" == 0 ]] || return 1; done
}

case "${CMD}" in
  prep) prep ;;
  run) run_device ;;
  *) echo "usage: bash scripts/gpu_bench.sh [--dry-run] prep|run" >&2; exit 2 ;;
esac
