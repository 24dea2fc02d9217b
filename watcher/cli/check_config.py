"""`check-config`: load a config file as `run` would and print the settings it gives."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from watcher.cli.common import PIPE, PROG, Subparsers, exit_codes
from watcher.secrets import redact
from watcher.settings_file import config_warnings, load_settings, printable

__all__ = ["add_parser"]

CHECK_CONFIG_EXIT_CODES = exit_codes(
    (0, "the file is valid (its settings are printed)"),
    (2, "bad command line, or the file is unreadable or invalid (one line names the key)"),
    PIPE,
)


def _check_config(path: Path) -> int:
    settings = load_settings(path)
    for warning in config_warnings(settings):
        print(f"{PROG}: WARNING: {warning}", file=sys.stderr)
    print(f"{path}: OK")
    # Secrets print as where they come from, header values and URL credentials as ***; the
    # last redact() catches a known secret that reached any other value.
    print(redact(json.dumps(printable(settings), indent=2)))
    return 0


def add_parser(subparsers: Subparsers) -> None:
    check = subparsers.add_parser(
        "check-config",
        help="validate a config file and print the settings it gives",
        description="Load FILE as `run` would and print the resulting settings; exit 2 with one line "
        "naming the bad key if it is invalid.",
        epilog=CHECK_CONFIG_EXIT_CODES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    check.add_argument("file", type=Path, metavar="FILE")
    check.set_defaults(handler=lambda args: _check_config(args.file))
