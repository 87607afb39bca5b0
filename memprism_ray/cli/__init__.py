"""The ``memprism`` command line.

Each subcommand lives in its own module ``memprism_ray.cli.<name>`` exposing
``register(subparsers)``; modules import their heavy dependencies inside the handler so
``memprism --help`` stays fast. A handler returns an exit code; a :class:`CliError` or a
``ValueError`` raised by the library becomes one ``memprism: error: ...`` line on stderr
and exit code 2.
"""

from __future__ import annotations

import argparse
import importlib
import importlib.util
import sys
from collections.abc import Sequence

#: Subcommand modules, in the order ``--help`` lists them.
COMMAND_MODULES: tuple[str, ...] = (
    "memprism_ray.cli.view",
    "memprism_ray.cli.games",
    "memprism_ray.cli.router",
    "memprism_ray.cli.eval",
)


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
    for name in COMMAND_MODULES:
        if importlib.util.find_spec(name) is None:
            continue
        importlib.import_module(name).register(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    func = getattr(args, "func", None)
    if func is None:
        parser.print_help()
        return 2
    try:
        return int(func(args) or 0)
    except (CliError, ValueError, FileNotFoundError, FileExistsError) as exc:
        print(f"memprism: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("memprism: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
