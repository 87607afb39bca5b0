"""The ``memprism`` command line: one module per subcommand exposing ``register(subparsers)``,
heavy imports inside the handlers (``memprism --help`` stays fast). A :class:`CliError` or a
library ``ValueError`` becomes one ``memprism: error: ...`` line and exit code 2. A subcommand
registered with ``overrides=True`` also gets the ``--section.key VALUE`` overrides.
"""

from __future__ import annotations

import argparse
import importlib
import importlib.util
import sys
from collections.abc import Sequence

#: Subcommand modules, in the order ``--help`` lists them; then each benchmark's own
#: (:attr:`~memprism_ray.benchmark.base.Benchmark.commands`, e.g. ALFWorld's ``memprism games``).
COMMAND_MODULES: tuple[str, ...] = (
    "memprism_ray.cli.view",
    "memprism_ray.cli.router",
    "memprism_ray.cli.eval",
)


def command_modules() -> list[str]:
    """:data:`COMMAND_MODULES` and the registered benchmarks' command modules."""
    from memprism_ray.registry import benchmark_class, known_benchmarks

    own = [getattr(benchmark_class(name), "commands", "") for name in known_benchmarks()]
    return [*COMMAND_MODULES, *(m for m in own if m)]


class CliError(Exception):
    """A user-facing error: printed as one line, exit code 2."""


def build_parser() -> argparse.ArgumentParser:
    from memprism_ray import __version__

    parser = argparse.ArgumentParser(
        prog="memprism",
        description="MemPrism on Ray: task-conditioned relational memory views for long-horizon agents.",
    )
    parser.add_argument("--version", action="version", version=f"memprism-ray {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name in command_modules():
        if importlib.util.find_spec(name) is None:
            continue
        importlib.import_module(name).register(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args, rest = parser.parse_known_args(argv)
    func = getattr(args, "func", None)
    if rest and not getattr(args, "overrides", False):
        parser.error(f"unrecognized arguments: {' '.join(rest)}")
    if func is None:
        parser.print_help()
        return 2
    try:
        return int((func(args, rest) if getattr(args, "overrides", False) else func(args)) or 0)
    except (CliError, ValueError) as exc:
        print(f"memprism: error: {exc}", file=sys.stderr)
        return 2
    except OSError as exc:  # a path the machine refuses (a file where a folder is asked, a full disk): one line
        said = f"{exc.filename}: {exc.strerror}" if exc.filename and exc.strerror else str(exc)
        print(f"memprism: error: {said}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("memprism: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
