"""Dockerfiles and their install helper (issue 6 item 6).

No Docker engine here: the Dockerfiles are checked statically (base images, install from
pyproject.toml, the GPU image never reinstalling torch, non-root user, matching Pythons), and
docker/pyproject_deps.py, which both images and GPU cluster nodes run, is tested for real.
"""

from __future__ import annotations

import fnmatch
import importlib.util
import re
import shlex
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
import tomllib

REPO = Path(__file__).resolve().parents[2]
DOCKER = REPO / "docker"
HELPER = DOCKER / "pyproject_deps.py"
PYPROJECT = tomllib.loads((REPO / "pyproject.toml").read_text())

_spec = importlib.util.spec_from_file_location("memprism_docker_pyproject_deps", HELPER)
deps = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(deps)


def instructions(name: str) -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) pairs with continuation lines joined and comments dropped."""
    lines, out, buf = (DOCKER / name).read_text().splitlines(), [], ""
    for line in lines:
        if not buf and (not line.strip() or line.lstrip().startswith("#")):
            continue
        if buf and line.lstrip().startswith("#"):
            continue
        if line.rstrip().endswith("\\"):
            buf += line.rstrip()[:-1] + " "
            continue
        buf += line
        keyword, _, args = buf.strip().partition(" ")
        out.append((keyword.upper(), args.strip()))
        buf = ""
    return out


def arg_defaults(instrs: list[tuple[str, str]]) -> dict[str, str]:
    return dict(a.split("=", 1) for k, a in instrs if k == "ARG" and "=" in a)


def expand(text: str, args: dict[str, str]) -> str:
    return re.sub(r"\$\{(\w+)\}", lambda m: args[m.group(1)], text)


def runs(instrs: list[tuple[str, str]]) -> list[str]:
    return [a for k, a in instrs if k == "RUN"]


def pip_installs(instrs: list[tuple[str, str]]) -> list[list[str]]:
    """Argument lists of every `pip install` in RUN steps, split at && / ;."""
    found = []
    for run in runs(instrs):
        for words in shell_commands(run):
            if "pip" in words and "install" in words:
                found.append(words[words.index("install") + 1 :])
    return found


def shell_commands(line: str) -> list[list[str]]:
    """Simple commands of a shell line, split at && || ; | outside quotes."""
    lexer = shlex.shlex(line, posix=True, punctuation_chars=True)
    lexer.whitespace_split = True
    commands, current = [], []
    for token in lexer:
        if token in ("&&", "||", ";", "|"):
            commands.append(current)
            current = []
        else:
            current.append(token)
    return [c for c in [*commands, current] if c]


def index_of(instrs: list[tuple[str, str]], predicate) -> int:
    return next(i for i, ins in enumerate(instrs) if predicate(ins))


@pytest.fixture(params=["Dockerfile.cpu", "Dockerfile.gpu"])
def dockerfile(request: pytest.FixtureRequest) -> tuple[str, list[tuple[str, str]]]:
    return request.param, instructions(request.param)


def test_instruction_parser_handles_continuations() -> None:
    instrs = instructions("Dockerfile.cpu")
    assert all(k.isalpha() and k.isupper() for k, _ in instrs), [k for k, _ in instrs]
    assert any(k == "RUN" and "pip install --no-deps -e ." in a for k, a in instrs)
    assert shell_commands("a 'x; y' && b \"c && d\"; e | f") == [["a", "x; y"], ["b", "c && d"], ["e"], ["f"]]


def test_base_images() -> None:
    cpu = instructions("Dockerfile.cpu")
    gpu = instructions("Dockerfile.gpu")
    (cpu_from,) = [expand(a, arg_defaults(cpu)) for k, a in cpu if k == "FROM"]
    (gpu_from,) = [expand(a, arg_defaults(gpu)) for k, a in gpu if k == "FROM"]
    assert re.fullmatch(r"python:3\.1[0-9]-slim", cpu_from), cpu_from
    assert re.fullmatch(r"vllm/vllm-openai:v[0-9.]+", gpu_from), gpu_from


def test_images_share_one_python() -> None:
    # Ray rejects a node whose Python differs from the head's: the GPU build asserts its base
    # image's Python equals the CPU image's.
    cpu, gpu = arg_defaults(instructions("Dockerfile.cpu")), arg_defaults(instructions("Dockerfile.gpu"))
    assert cpu["PYTHON_VERSION"] == gpu["EXPECTED_PYTHON"]
    assert any("${EXPECTED_PYTHON}" in r and "sys.version_info" in r for r in runs(instructions("Dockerfile.gpu")))


def test_installs_from_pyproject(dockerfile: tuple[str, list[tuple[str, str]]]) -> None:
    name, instrs = dockerfile
    copies = [a.split() for k, a in instrs if k == "COPY"]
    first_copy_files = {w for c in copies for w in c[:-1] if not w.startswith("--")}
    assert "pyproject.toml" in first_copy_files, f"{name}: COPY pyproject.toml"
    # A wildcard: COPY tolerates it matching nothing while the readme is being written.
    readme = PYPROJECT["project"]["readme"]
    assert any(fnmatch.fnmatchcase(readme, src) for src in first_copy_files), f"{name}: setuptools reads {readme}"
    assert "docker/pyproject_deps.py" in first_copy_files
    first_pip = index_of(instrs, lambda ins: ins[0] == "RUN" and "pip install" in ins[1])
    copy_pyproject = index_of(instrs, lambda ins: ins[0] == "COPY" and "pyproject.toml" in ins[1])
    assert copy_pyproject < first_pip
    assert any("pyproject_deps.py requirements" in r for r in runs(instrs)), f"{name}: deps come from pyproject"
    project = [words for words in pip_installs(instrs) if words[-2:] == ["-e", "."]]
    assert project == [["--no-deps", "-e", "."]], f"{name}: the project is installed once, editable, --no-deps"
    copy_all = index_of(instrs, lambda ins: ins[0] == "COPY" and ins[1].split() == [".", "."])
    install_project = index_of(instrs, lambda ins: ins[0] == "RUN" and "-e ." in ins[1])
    assert copy_all < install_project


def test_cpu_image_takes_torch_from_the_cpu_index() -> None:
    installs = pip_installs(instructions("Dockerfile.cpu"))
    torch = [w for w in installs if "--index-url" in w]
    assert len(torch) == 1
    assert torch[0][torch[0].index("--index-url") + 1] in ("${TORCH_INDEX_URL}", "https://download.pytorch.org/whl/cpu")
    assert arg_defaults(instructions("Dockerfile.cpu"))["TORCH_INDEX_URL"] == "https://download.pytorch.org/whl/cpu"
    assert installs.index(torch[0]) < installs.index(["-r", "/tmp/requirements.txt"]), "CPU torch before the rest"


def test_gpu_image_never_reinstalls_torch() -> None:
    instrs = instructions("Dockerfile.gpu")
    for words in pip_installs(instrs):
        named = [w for w in words if not w.startswith("-") and "/" not in w and w != "."]
        assert not [w for w in named if re.match(r"torch|vllm", w)], f"pip install {words} touches the GPU stack"
        assert not any("[vllm]" in w for w in words)
        if "-r" in words:
            assert "-c" in words, "requirements must install under the frozen stack"
        if "-e" in words:
            assert "--no-deps" in words
    all_runs = " ".join(runs(instrs))
    assert "requirements --defer-to" in all_runs, "pyproject's torch pin must be deferred to the image"
    last_pip = max(i for i, r in enumerate(runs(instrs)) if "pip install" in r)
    assert "constraints --check" in runs(instrs)[last_pip], "the stack is verified after the last install"


def test_non_root_user_and_ray_on_path(dockerfile: tuple[str, list[tuple[str, str]]]) -> None:
    name, instrs = dockerfile
    users = [expand(a, arg_defaults(instrs)) for k, a in instrs if k == "USER"]
    assert users and users[-1] not in ("root", "0"), f"{name}: must end as a non-root user"
    assert users[-1].isdigit(), f"{name}: a numeric USER lets Kubernetes verify runAsNonRoot"
    assert any("command -v ray" in r for r in runs(instrs))
    assert any("useradd" in r and "--uid" in r for r in runs(instrs))


def test_dockerignore_keeps_state_out_and_sources_in() -> None:
    patterns = [p.strip() for p in (REPO / ".dockerignore").read_text().splitlines() if p.strip() and p[0] != "#"]
    assert {".git", ".venv", "runs"} <= set(patterns)
    needed = ["pyproject.toml", PYPROJECT["project"]["readme"], "docker", "memprism_ray", "jobs", "configs"]
    for path in needed:
        assert not any(p.strip("/") in (path, f"{path}/") for p in patterns), f"{path} must reach the build"


# --- docker/pyproject_deps.py ---------------------------------------------------------------


def run_helper(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(HELPER), *args], capture_output=True, text=True, cwd=REPO)


def test_requirements_mirror_pyproject() -> None:
    out = run_helper("requirements")
    assert out.returncode == 0, out.stderr
    assert out.stdout.splitlines() == PYPROJECT["project"]["dependencies"]
    extra = run_helper("requirements", "--extra", "vllm", "--extras-only").stdout.splitlines()
    assert extra == PYPROJECT["project"]["optional-dependencies"]["vllm"]


def test_requirements_defer_to_a_stack(tmp_path: Path) -> None:
    stack = tmp_path / "stack.txt"
    stack.write_text("# frozen\ntorch==2.14.0+cu128\nTransformers==5.19.0\nvllm==0.33.0\n\n")
    out = run_helper("requirements", "--defer-to", str(stack), "--exclude", "HTTPX")
    assert out.returncode == 0, out.stderr
    dropped = {"torch", "transformers", "httpx"}
    expected = [d for d in PYPROJECT["project"]["dependencies"] if deps.requirement_name(d) not in dropped]
    assert out.stdout.splitlines() == expected
    assert len(expected) == len(PYPROJECT["project"]["dependencies"]) - 3


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["requirements", "--extra", "gpu"], "unknown extra 'gpu'"),
        (["requirements", "--pyproject", "missing/pyproject.toml"], "no such file"),
        (["requirements", "--extras-only"], "needs at least one --extra"),
        (["requirements", "--defer-to", "missing.txt"], "--defer-to missing.txt"),
    ],
)
def test_bad_input_is_a_clear_error(args: list[str], message: str) -> None:
    out = run_helper(*args)
    assert out.returncode == 2 and message in out.stderr and not out.stdout


def test_requirement_names_are_normalized() -> None:
    assert deps.requirement_name("ray[default]==2.60.0") == "ray"
    assert deps.requirement_name("Foo_Bar.baz >= 1 ; python_version > '3.10'") == "foo-bar-baz"
    with pytest.raises(ValueError, match="PEP 508"):
        deps.requirement_name("==1.0")


def test_stack_constraints_pick_the_gpu_stack_only() -> None:
    fake = [
        SimpleNamespace(metadata={"Name": n}, version=v)
        for n, v in [
            ("torch", "2.13.0+cu128"),
            ("torchvision", "0.28.0"),
            ("nvidia_cublas_cu12", "12.8.4.1"),
            ("vllm", "0.32.0"),
            ("flashinfer-python", "0.7.0.post1"),
            ("transformers", "5.19.0"),
            ("sentence-transformers", "6.2.0"),
            ("ray", "2.60.0"),
            ("numpy", "2.4.6"),
            ("torchmetrics-extra", "1.0"),
        ]
    ]
    assert deps.installed_constraints(dists=fake) == [
        "flashinfer-python==0.7.0.post1",
        "nvidia-cublas-cu12==12.8.4.1",
        "torch==2.13.0+cu128",
        "torchvision==0.28.0",
        "transformers==5.19.0",
        "vllm==0.32.0",
    ]


def test_stack_check_detects_a_change(tmp_path: Path) -> None:
    frozen = tmp_path / "stack.txt"
    assert run_helper("constraints", "--output", str(frozen)).returncode == 0
    lines = frozen.read_text().splitlines()
    assert any(line.startswith("torch==") for line in lines), "this venv has torch"
    assert run_helper("constraints", "--check", str(frozen)).returncode == 0
    frozen.write_text("\n".join(line.replace("torch==", "torch==0.0.1+was") for line in lines) + "\n")
    changed = run_helper("constraints", "--check", str(frozen))
    assert changed.returncode == 1 and "torch==" in changed.stderr
