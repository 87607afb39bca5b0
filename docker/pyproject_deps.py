"""Install plans derived from pyproject.toml, for the images and bare cluster nodes (issue 6 item 6).

Two subcommands; each prints one requirement per line, for ``pip -r`` / ``pip -c``:

``requirements``  the project's runtime dependencies (plus chosen extras) read from
                  pyproject.toml. ``--exclude NAME`` drops a distribution; ``--defer-to FILE``
                  drops every distribution pinned in a constraints FILE, so the versions already
                  installed there win. ``--extras-only`` prints just the extras' requirements.
``constraints``   ``name==version`` for every installed distribution matching the GPU stack
                  patterns: the torch family, CUDA wheels, vLLM, and the libraries vLLM pins
                  (transformers, tokenizers). ``--check FILE`` exits 1 if the installed stack no
                  longer equals an earlier output, naming what changed.

Why a GPU node needs this (checked against the published wheels): every vLLM release pins one
exact torch and caps transformers, e.g. vLLM 0.32.0 needs torch==2.13.0 and transformers<5.20,
vLLM 0.33.0 torch==2.14.0 and transformers<5.21, while pyproject.toml pins torch==2.13.0 and
transformers==5.23.0 for CPU CI. A plain ``pip install -e ".[vllm]"`` therefore cannot resolve,
and on a vLLM image it would replace the torch vLLM's kernels were built against. GPU installs
instead keep vLLM's stack (``constraints``), install the rest of pyproject's pins around it
(``requirements --defer-to``) and the project with ``--no-deps``. Ray is deliberately not part
of the stack: every node of a cluster must run pyproject's exact Ray version.

Standard library only (tomllib: Python >= 3.11), so it runs before anything is installed.
"""

from __future__ import annotations

import argparse
import fnmatch
import re
import sys
from collections.abc import Iterable, Sequence
from importlib import metadata
from pathlib import Path

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10: supported by the package, not by this script.
    tomllib = None  # type: ignore[assignment]

#: Normalized-name patterns of the stack a vLLM install owns on a GPU node.
GPU_STACK_PATTERNS: tuple[str, ...] = (
    "torch",
    "torch-*",
    "torchvision",
    "torchaudio",
    "torchcodec",
    "triton",
    "xformers",
    "flashinfer*",
    "vllm",
    "nvidia-*",
    "cuda-*",
    "cupy*",
    "transformers",
    "tokenizers",
)

_NAME_RE = re.compile(r"^\s*([A-Za-z0-9][A-Za-z0-9._-]*)")
_PIN_RE = re.compile(r"^\s*([A-Za-z0-9][A-Za-z0-9._-]*)\s*==")


def normalize(name: str) -> str:
    """PEP 503 normalized distribution name."""
    return re.sub(r"[-_.]+", "-", name).lower()


def requirement_name(requirement: str) -> str:
    """The normalized distribution name at the start of a PEP 508 requirement string."""
    match = _NAME_RE.match(requirement)
    if match is None:
        raise ValueError(f"not a PEP 508 requirement: {requirement!r}")
    return normalize(match.group(1))


def load_pyproject(path: Path) -> dict:
    """Parse pyproject.toml; errors name the file and what is missing."""
    if tomllib is None:
        raise RuntimeError("reading pyproject.toml needs Python >= 3.11 (tomllib)")
    try:
        with path.open("rb") as f:
            data = tomllib.load(f)
    except FileNotFoundError:
        raise ValueError(f"{path}: no such file (run from the repository root or pass --pyproject)") from None
    except tomllib.TOMLDecodeError as exc:
        raise ValueError(f"{path}: not valid TOML: {exc}") from None
    if "dependencies" not in data.get("project", {}):
        raise ValueError(f"{path}: no [project] dependencies list")
    return data


def pinned_names(constraints_text: str) -> set[str]:
    """Normalized names pinned with ``==`` in a constraints file's text (comments ignored)."""
    names = set()
    for line in constraints_text.splitlines():
        match = _PIN_RE.match(line.split("#", 1)[0])
        if match:
            names.add(normalize(match.group(1)))
    return names


def project_requirements(
    pyproject: dict, extras: Sequence[str] = (), exclude: Iterable[str] = (), extras_only: bool = False
) -> list[str]:
    """Runtime dependencies plus the named extras, without the excluded distributions."""
    project = pyproject["project"]
    reqs = [] if extras_only else list(project["dependencies"])
    optional = project.get("optional-dependencies", {})
    for extra in extras:
        if extra not in optional:
            known = ", ".join(sorted(optional)) or "(none)"
            raise ValueError(f"unknown extra {extra!r}; pyproject.toml defines: {known}")
        reqs.extend(optional[extra])
    dropped = {normalize(e) for e in exclude}
    return [r for r in reqs if requirement_name(r) not in dropped]


def installed_constraints(
    patterns: Sequence[str] = GPU_STACK_PATTERNS, dists: Iterable[metadata.Distribution] | None = None
) -> list[str]:
    """``name==version`` for installed distributions whose normalized name matches a pattern."""
    wanted = [normalize(p) for p in patterns]
    pins: dict[str, str] = {}
    for dist in metadata.distributions() if dists is None else dists:
        name = dist.metadata["Name"]
        if not name:
            continue
        norm = normalize(name)
        if any(fnmatch.fnmatchcase(norm, pattern) for pattern in wanted):
            pins[norm] = dist.version
    return [f"{name}=={version}" for name, version in sorted(pins.items())]


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Install plans derived from pyproject.toml.")
    sub = parser.add_subparsers(dest="command", required=True)
    req = sub.add_parser("requirements", help="runtime requirements from pyproject.toml")
    req.add_argument("--pyproject", type=Path, default=Path("pyproject.toml"), help="path to pyproject.toml")
    req.add_argument("--extra", action="append", default=[], help="optional-dependency group to add (repeatable)")
    req.add_argument("--extras-only", action="store_true", help="print only the --extra groups' requirements")
    req.add_argument("--exclude", action="append", default=[], help="distribution to leave out (repeatable)")
    req.add_argument("--defer-to", type=Path, help="constraints file whose pinned distributions are left out")
    req.add_argument("--output", type=Path, help="write here instead of stdout")
    con = sub.add_parser("constraints", help="pins of the installed GPU stack (torch, CUDA, vLLM, ...)")
    con.add_argument("--pattern", action="append", help="normalized-name glob to pin (repeatable; default: GPU stack)")
    con.add_argument("--output", type=Path, help="write here instead of stdout")
    con.add_argument("--check", type=Path, help="exit 1 unless the installed stack equals this earlier output")
    args = parser.parse_args(argv)
    try:
        if args.command == "requirements":
            exclude = list(args.exclude)
            if args.defer_to is not None:
                try:
                    exclude += sorted(pinned_names(args.defer_to.read_text()))
                except FileNotFoundError:
                    raise ValueError(f"--defer-to {args.defer_to}: no such file") from None
            pyproject = load_pyproject(args.pyproject)
            if args.extras_only and not args.extra:
                raise ValueError("--extras-only needs at least one --extra")
            lines = project_requirements(pyproject, args.extra, exclude, extras_only=args.extras_only)
        else:
            lines = installed_constraints(args.pattern or GPU_STACK_PATTERNS)
            if args.check is not None:
                try:
                    before = [line for line in args.check.read_text().splitlines() if line.strip()]
                except FileNotFoundError:
                    raise ValueError(f"--check {args.check}: no such file") from None
                if before != lines:
                    changed = sorted(set(before) ^ set(lines))
                    print(
                        f"pyproject_deps: the GPU stack changed since {args.check}: {', '.join(changed)}",
                        file=sys.stderr,
                    )
                    return 1
    except (ValueError, RuntimeError) as exc:
        print(f"pyproject_deps: error: {exc}", file=sys.stderr)
        return 2
    text = "".join(f"{line}\n" for line in lines)
    if args.output is not None:
        args.output.parent.mkdir(parents=True, exist_ok=True)
        args.output.write_text(text)
    else:
        sys.stdout.write(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
