"""What every command of the command line shares: its name, exit-code epilogs, number types
for options, the one-line error, and the settings a `--config` gives."""

from __future__ import annotations

import argparse
import math
import signal
import sys
from collections.abc import Callable
from pathlib import Path
from typing import TypeAlias

from watcher.settings import Settings
from watcher.settings_file import load_settings

__all__ = [
    "BAD_ARGS",
    "INTERRUPTED",
    "PIPE",
    "PIPE_CLOSED",
    "PROG",
    "Handler",
    "Subparsers",
    "exit_codes",
    "fail",
    "positive",
    "positive_float",
    "positive_int",
    "settings_from",
]

PROG = "pod-resources-watcher"

# What a command's registration gets to add its parser to (argparse names no public type).
Subparsers: TypeAlias = "argparse._SubParsersAction[argparse.ArgumentParser]"
# What a command sets as its `handler` default: the parsed arguments in, the exit status out.
Handler: TypeAlias = Callable[[argparse.Namespace], int]


def exit_codes(*codes: tuple[int, str]) -> str:
    """A command's --help epilog: the exit codes that command returns, each with its meaning."""
    return "exit codes:\n" + "".join(f"  {code:<3} {meaning}\n" for code, meaning in codes)


BAD_ARGS = (2, "bad command line")
PIPE_CLOSED = 128 + signal.SIGPIPE
PIPE = (PIPE_CLOSED, "the reader of its output went away (e.g. `| head -1`); stopped quietly")
INTERRUPTED = (130, "interrupted (Ctrl-C)")


def positive(kind: type[float] | type[int], expected: str) -> Callable[[str], float]:
    """An argparse type: a number of `kind`, greater than 0."""

    def parse(text: str) -> float:
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected {expected}, got {text!r}") from None
        # nan passes `value <= 0` and inf means no deadline or no limit: neither is a number of
        # seconds (`--timeout nan` reported "List did not answer within nan s").
        if not math.isfinite(value):
            raise argparse.ArgumentTypeError(f"expected a finite number, got {text!r}")
        if value <= 0:
            raise argparse.ArgumentTypeError(f"must be greater than 0, got {text!r}")
        return value

    return parse


positive_float = positive(float, "a number of seconds")
positive_int = positive(int, "a whole number")


def fail(message: str, code: int = 1) -> int:
    """Say on one stderr line why the command failed; the status to return."""
    print(f"{PROG}: error: {message}", file=sys.stderr)
    return code


def settings_from(path: Path | None) -> Settings:
    """The settings `--config PATH` gives; without one, the built-in defaults."""
    return load_settings(path) if path is not None else Settings()
