#!/usr/bin/env bash
# Set up one bare cluster node for memprism-ray (issue 6 item 6; see clusters/README.md).
# The Ray cluster launcher calls it from setup_commands / worker_start_ray_commands after it
# has synced the repository to the node (file_mounts).
#
#   node_setup.sh install cpu|gpu|auto [REPO]   venv + the project from REPO/pyproject.toml
#   node_setup.sh ray-resources                  "--resources={...}" for `ray start` on a GPU
#                                                node ({"vllm": <GPUs>}), nothing on a CPU node
#
# cpu: torch at pyproject's exact pin from the PyTorch CPU index first, then `pip install -e
#      REPO`, which finds that torch satisfied and never pulls the CUDA build.
# gpu: requirements/gpu.txt (vLLM 0.24.0 with the CUDA torch it pins, 2.11.0, and the rest of
#      pyproject's pins that fit it); the stack frozen and checked; the project with --no-deps.
# auto: gpu when nvidia-smi lists a GPU, else cpu (on-prem clusters with mixed machines).
#
# Environment: MEMPRISM_VENV (default ~/memprism-venv), MEMPRISM_PYTHON (default python3),
# MEMPRISM_EXPECT_PYTHON (e.g. 3.12: fail unless the interpreter is that minor version; Ray
# rejects nodes whose Python differs from the head's), MEMPRISM_TORCH_INDEX (CPU wheel index),
# MEMPRISM_DRY_RUN=1 (print the commands instead of running them).
set -euo pipefail

die() {
    echo "node_setup.sh: error: $*" >&2
    exit 2
}

usage() {
    die "usage: node_setup.sh install cpu|gpu|auto [REPO] | node_setup.sh ray-resources"
}

run() {
    if [[ "${MEMPRISM_DRY_RUN:-0}" == 1 ]]; then
        printf '%q ' "$@"
        printf '\n'
    else
        "$@"
    fi
}

gpu_count() {
    if command -v nvidia-smi >/dev/null 2>&1; then
        # nvidia-smi -L prints one "GPU <i>: <name> (UUID: ...)" line per device.
        nvidia-smi -L 2>/dev/null | grep -c '^GPU ' || true
    else
        echo 0
    fi
}

install() {
    local role="${1:-}" repo="${2:-}"
    [[ -n "${role}" ]] || usage
    if [[ -z "${repo}" ]]; then
        repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
    fi
    [[ -f "${repo}/pyproject.toml" ]] || die "no pyproject.toml in ${repo}: sync the repository first (file_mounts)"
    case "${role}" in
        cpu | gpu) ;;
        auto) if [[ "$(gpu_count)" -gt 0 ]]; then role=gpu; else role=cpu; fi ;;
        *) die "unknown role '${role}' (expected cpu, gpu or auto)" ;;
    esac

    local python="${MEMPRISM_PYTHON:-python3}" venv="${MEMPRISM_VENV:-${HOME}/memprism-venv}"
    local index="${MEMPRISM_TORCH_INDEX:-https://download.pytorch.org/whl/cpu}"
    command -v "${python}" >/dev/null 2>&1 || die "interpreter '${python}' not found (set MEMPRISM_PYTHON)"
    if [[ -n "${MEMPRISM_EXPECT_PYTHON:-}" ]]; then
        local have
        have="$("${python}" -c 'import sys; print("%d.%d" % sys.version_info[:2])')"
        [[ "${have}" == "${MEMPRISM_EXPECT_PYTHON}" ]] ||
            die "${python} is Python ${have}, the cluster expects ${MEMPRISM_EXPECT_PYTHON} (Ray needs one Python on all nodes)"
    fi
    # The exact pin pyproject.toml gives torch, e.g. torch==2.13.0.
    local torch_pin
    torch_pin="$(grep -oE '"torch==[^"]+"' "${repo}/pyproject.toml" | head -n 1 | tr -d '"')"
    [[ -n "${torch_pin}" ]] || die "${repo}/pyproject.toml has no exact torch==X pin"

    echo "node_setup.sh: installing memprism-ray (${role}) from ${repo} into ${venv}" >&2
    if [[ ! -x "${venv}/bin/python" ]]; then
        run "${python}" -m venv "${venv}"
    fi
    local pip=("${venv}/bin/python" -m pip)
    run "${pip[@]}" install --upgrade pip
    if [[ "${role}" == cpu ]]; then
        run "${pip[@]}" install --index-url "${index}" "${torch_pin}"
        run "${pip[@]}" install -e "${repo}"
    else
        # vLLM owns torch, CUDA and transformers here (see docker/pyproject_deps.py for why a plain
        # `pip install -e "REPO[vllm]"` cannot resolve): install vLLM at pyproject's torch pin,
        # freeze that stack, add the rest of pyproject's pins around it, then the project itself.
        local helper="${repo}/docker/pyproject_deps.py"
        local stack="${venv}/memprism-gpu-stack.txt" reqs="${venv}/memprism-requirements.txt"
        # vLLM pins its own torch (0.24.0: torch==2.11.0), never pyproject's CPU pin.
        [[ -f "${repo}/requirements/gpu.txt" ]] || die "no requirements/gpu.txt in ${repo}"
        run "${pip[@]}" install -r "${repo}/requirements/gpu.txt"
        run "${venv}/bin/python" "${helper}" constraints --output "${stack}"
        run "${venv}/bin/python" "${helper}" requirements --pyproject "${repo}/pyproject.toml" --defer-to "${stack}" --output "${reqs}"
        run "${pip[@]}" install -c "${stack}" -r "${reqs}"
        run "${pip[@]}" install --no-deps -e "${repo}"
        run "${venv}/bin/python" "${helper}" constraints --check "${stack}"
    fi
    run "${venv}/bin/python" -c "import memprism_ray, ray, torch; print('memprism-ray ready: ray', ray.__version__, 'torch', torch.__version__)"
}

ray_resources() {
    local n
    n="$(gpu_count)"
    # No spaces: the launcher splices this unquoted into the `ray start` command line.
    if [[ "${n}" -gt 0 ]]; then
        printf -- '--resources={"vllm":%d}\n' "${n}"
    fi
}

case "${1:-}" in
    install) shift; install "$@" ;;
    ray-resources) ray_resources ;;
    *) usage ;;
esac
