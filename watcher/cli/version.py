"""`version` and `--version`: the package's version, with the commit of a git checkout."""

from __future__ import annotations

import argparse
import subprocess
from collections.abc import Sequence
from pathlib import Path

from watcher import __version__
from watcher.cli.common import BAD_ARGS, PIPE, PROG, Subparsers, exit_codes

__all__ = ["PrintVersion", "add_parser", "version_text"]

VERSION_EXIT_CODES = exit_codes((0, "printed"), BAD_ARGS, PIPE)


def version_text() -> str:
    """`pod-resources-watcher 0.1.0`, with ` (git abc1234)` when the package runs from a git
    checkout, so a report from a development tree names its commit. Only when the package's
    parent directory is the top of that work tree: a package installed into a virtualenv that
    sits inside some other checkout must not borrow its commit. Local and bounded: one git
    call, at most 2 s; no git, no checkout, or any failure gives the plain version."""
    plain = f"{PROG} {__version__}"
    source = Path(__file__).resolve().parents[2]  # watcher/cli/version.py: above the package
    try:
        answer = subprocess.run(
            ["git", "-C", str(source), "rev-parse", "--show-toplevel", "--short", "HEAD"],
            capture_output=True,
            text=True,
            timeout=2,
            check=False,
        )
    except (OSError, subprocess.SubprocessError):
        return plain
    lines = answer.stdout.split()
    if answer.returncode != 0 or len(lines) != 2 or Path(lines[0]).resolve() != source:
        return plain
    return f"{plain} (git {lines[1]})"


class PrintVersion(argparse.Action):
    """--version, asking git only when given (every other run of the command must not)."""

    def __init__(self, option_strings: Sequence[str], dest: str, **kwargs: object) -> None:
        super().__init__(
            option_strings,
            dest=argparse.SUPPRESS,
            default=argparse.SUPPRESS,
            nargs=0,
            help="print the version",
        )

    def __call__(self, parser: argparse.ArgumentParser, *args: object, **kwargs: object) -> None:
        print(version_text())
        parser.exit()


def _version(args: argparse.Namespace) -> int:
    print(version_text())
    return 0


def add_parser(subparsers: Subparsers) -> None:
    command = subparsers.add_parser(
        "version",
        help="print the version",
        description="Print the version, and the commit when the package runs from a git checkout "
        "(e.g. `pod-resources-watcher 0.1.0 (git abc1234)`).",
        epilog=VERSION_EXIT_CODES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    command.set_defaults(handler=_version)
