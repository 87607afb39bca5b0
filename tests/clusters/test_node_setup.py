"""clusters/node_setup.sh (issue 6 item 6): the install plan a cluster node runs, by role.

Runs the real script in dry-run mode (MEMPRISM_DRY_RUN=1 prints each command, shell-quoted,
instead of running it) with a fake nvidia-smi on PATH to play a GPU or CPU machine.
"""

from __future__ import annotations

import json
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
import tomllib

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "clusters" / "node_setup.sh"
PYPROJECT = tomllib.loads((REPO / "pyproject.toml").read_text())
TORCH_PIN = next(d for d in PYPROJECT["project"]["dependencies"] if d.startswith("torch=="))
VLLM_REQS = PYPROJECT["project"]["optional-dependencies"]["vllm"]


def machine(tmp_path: Path, gpus: int) -> dict[str, str]:
    """Environment of a machine with `gpus` GPUs (a fake nvidia-smi shadows any real one)."""
    fakebin = tmp_path / "bin"
    fakebin.mkdir(exist_ok=True)
    smi = fakebin / "nvidia-smi"
    if gpus:
        lines = "".join(f"echo 'GPU {i}: NVIDIA H100 80GB HBM3 (UUID: GPU-{i:08d})'\n" for i in range(gpus))
        smi.write_text(f"#!/bin/sh\n{lines}")
    else:
        smi.write_text("#!/bin/sh\necho 'NVIDIA-SMI has failed' >&2\nexit 9\n")
    smi.chmod(0o755)
    return {
        "PATH": f"{fakebin}:/usr/local/bin:/usr/bin:/bin",
        "HOME": str(tmp_path / "home"),
        "MEMPRISM_PYTHON": sys.executable,
        "MEMPRISM_DRY_RUN": "1",
    }


def plan(env: dict[str, str], *args: str) -> list[list[str]]:
    out = subprocess.run(["bash", str(SCRIPT), *args], env=env, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    return [shlex.split(line) for line in out.stdout.splitlines() if line.strip()]


def pip_installs(commands: list[list[str]]) -> list[list[str]]:
    return [c[c.index("install") + 1 :] for c in commands if c[1:4] == ["-m", "pip", "install"]]


def test_script_parses() -> None:
    assert subprocess.run(["bash", "-n", str(SCRIPT)], capture_output=True).returncode == 0


def test_cpu_plan_installs_cpu_torch_then_the_project(tmp_path: Path) -> None:
    env = machine(tmp_path, gpus=0)
    commands = plan(env, "install", "cpu", str(REPO))
    venv_python = f"{env['HOME']}/memprism-venv/bin/python"
    assert commands[0] == [sys.executable, "-m", "venv", f"{env['HOME']}/memprism-venv"]
    assert all(c[0] == venv_python for c in commands[1:])
    installs = pip_installs(commands)
    torch = ["--index-url", "https://download.pytorch.org/whl/cpu", TORCH_PIN]
    assert torch in installs and ["-e", str(REPO)] in installs
    assert installs.index(torch) < installs.index(["-e", str(REPO)]), "CPU torch must be in place first"
    assert not any("vllm" in w for c in commands for w in c)
    assert not (tmp_path / "home" / "memprism-venv").exists(), "a dry run must not touch the machine"


def test_gpu_plan_keeps_vllms_stack(tmp_path: Path) -> None:
    env = machine(tmp_path, gpus=8)
    commands = plan(env, "install", "gpu", str(REPO))
    installs = pip_installs(commands)
    venv = f"{env['HOME']}/memprism-venv"
    assert installs[1] == ["-r", str(REPO / "requirements" / "gpu.txt")], "vLLM's stack from requirements/gpu.txt"
    helper = str(REPO / "docker" / "pyproject_deps.py")
    steps = [c[2:4] for c in commands if len(c) > 3 and c[1] == helper]
    assert steps == [["constraints", "--output"], ["requirements", "--pyproject"], ["constraints", "--check"]]
    deferred = next(c for c in commands if len(c) > 2 and c[1] == helper and c[2] == "requirements")
    assert deferred[deferred.index("--defer-to") + 1] == f"{venv}/memprism-gpu-stack.txt"
    assert ["-c", f"{venv}/memprism-gpu-stack.txt", "-r", f"{venv}/memprism-requirements.txt"] in installs
    assert installs[-1] == ["--no-deps", "-e", str(REPO)]
    assert not any("--index-url" in c for c in installs), "GPU nodes need the CUDA torch, not the CPU index"
    check = commands.index(next(c for c in commands if "--check" in c))
    last_install = max(i for i, c in enumerate(commands) if c[1:4] == ["-m", "pip", "install"])
    assert check > last_install, "the stack is verified after every install"


@pytest.mark.parametrize(("gpus", "role"), [(0, "cpu"), (2, "gpu")])
def test_auto_role_follows_the_hardware(tmp_path: Path, gpus: int, role: str) -> None:
    env = machine(tmp_path, gpus)
    assert plan(env, "install", "auto", str(REPO)) == plan(env, "install", role, str(REPO))


@pytest.mark.parametrize("gpus", [0, 1, 4])
def test_ray_resources_marker(tmp_path: Path, gpus: int) -> None:
    env = machine(tmp_path, gpus)
    out = subprocess.run(["bash", str(SCRIPT), "ray-resources"], env=env, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    if gpus == 0:
        assert out.stdout == ""
        return
    # The launcher splices $(...) unquoted into `ray start`: it must stay one shell word.
    (word,) = out.stdout.split()
    assert word.startswith("--resources=")
    assert json.loads(word.removeprefix("--resources=")) == {"vllm": gpus}


@pytest.mark.parametrize(
    ("args", "extra_env", "message"),
    [
        (["install", "tpu"], {}, "unknown role 'tpu'"),
        (["install"], {}, "usage"),
        (["frobnicate"], {}, "usage"),
        (["install", "cpu", "/nonexistent/repo"], {}, "no pyproject.toml in /nonexistent/repo"),
        (["install", "cpu"], {"MEMPRISM_EXPECT_PYTHON": "2.7"}, "the cluster expects 2.7"),
        (["install", "cpu"], {"MEMPRISM_PYTHON": "no-such-python"}, "interpreter 'no-such-python' not found"),
    ],
)
def test_bad_input_is_a_clear_error(tmp_path: Path, args: list[str], extra_env: dict, message: str) -> None:
    env = {**machine(tmp_path, gpus=0), **extra_env}
    out = subprocess.run(["bash", str(SCRIPT), *args], env=env, capture_output=True, text=True, timeout=60)
    assert out.returncode == 2 and message in out.stderr and not out.stdout


def test_matching_python_passes_the_check(tmp_path: Path) -> None:
    env = {**machine(tmp_path, gpus=0), "MEMPRISM_EXPECT_PYTHON": "{}.{}".format(*sys.version_info[:2])}
    assert plan(env, "install", "cpu", str(REPO))
