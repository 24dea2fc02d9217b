"""The `pod-resources-watcher` command line: the top-level parser and `main`. Each command
lives in its own module and adds its own subparser, with a `handler` default that runs it."""

from __future__ import annotations

import argparse
import contextlib
import os
import signal
import sys
from collections.abc import Sequence

from watcher import errors
from watcher.cli import (
    audit,
    check_config,
    demo,
    fake_kubelet,
    kubernetes,
    outbox,
    run,
    send_test,
    snapshot,
    version,
)
from watcher.cli.common import INTERRUPTED, PIPE, PIPE_CLOSED, PROG, Handler, exit_codes, fail
from watcher.cli.version import PrintVersion, version_text
from watcher.config import ConfigError

__all__ = ["COMMANDS", "EXIT_CODES", "PIPE_CLOSED", "PROG", "build_parser", "main", "version_text"]

# In the order `--help` lists them. A new command is a module with an `add_parser(subparsers)`.
COMMANDS = (snapshot, fake_kubelet, run, send_test, check_config, outbox, kubernetes, audit, demo, version)

# The program's: each command's own --help says which of these it returns and what they mean there.
EXIT_CODES = exit_codes(
    (0, "success"),
    (1, "the command could not do its work (one line on stderr says why and what to do)"),
    (2, "bad command line or configuration"),
    (3, "audit verify: the log is intact but has gaps"),
    INTERRUPTED,
    PIPE,
)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog=PROG,
        description="Watch the kubelet's pod-resources API and report every device, CPU, memory "
        "and allocation change on this node.",
        epilog=EXIT_CODES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--version", action=PrintVersion)
    parser.set_defaults(keeps_sighup_ignored=False)
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for command in COMMANDS:
        command.add_parser(sub)
    return parser


def _stdout_to_devnull() -> None:
    """Point fd 1 at /dev/null, so the interpreter's last flush of stdout at exit has nowhere
    to fail (a failed flush there prints a traceback-like warning and exits 120)."""
    with contextlib.suppress(OSError, ValueError):  # stdout without a descriptor (in-process callers)
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)


def main(argv: Sequence[str] | None = None, *, hup_ignored: bool = False) -> int:
    """Run the command line. `hup_ignored`: the entry point ignored SIGHUP before importing
    us; `run` keeps it ignored until the agent can reload, the other commands restore the
    default (a closed terminal ends them)."""
    parser = build_parser()
    args = parser.parse_args(argv)
    if hup_ignored and not args.keeps_sighup_ignored:
        signal.signal(signal.SIGHUP, signal.SIG_DFL)
    handler: Handler = args.handler
    try:
        code = handler(args)
        # Flushed here, not at exit: a reader that went away must reach the handler below.
        sys.stdout.flush()
        return code
    except BrokenPipeError:
        # The reader of our output went away (`check-config FILE | head -1`): stop quietly
        # with the status of a command that SIGPIPE ended, as other Unix tools do.
        _stdout_to_devnull()
        return PIPE_CLOSED
    except ConfigError as err:
        return fail(str(err), 2)
    except errors.WatcherError as err:
        return fail(str(err))
    except KeyboardInterrupt:
        return 130
    except OSError as err:
        return fail(f"{err.strerror or err}: {err.filename or ''}".rstrip(": "))
