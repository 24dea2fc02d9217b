"""Test hooks into the outbox database, for fault tests that must act at an exact point.

A test process installs them with `install_hooks(StoreHooks(...))` before it starts the
agent (testkit/store_kill_point.py SIGKILLs the process inside a commit this way), and puts the
previous ones back with the value `install_hooks` returned. Nothing else sets them: no
setting, environment variable or command-line flag reaches this module, so a deployed
agent always runs with `NO_HOOKS`. Unset, a hook costs the database one `is None` check.

The hooks run on the database thread, inside the database's own calls:

- `connected(db)`: a connection was opened, configured and its schema made; e.g. set a
  pragma (`PRAGMA cache_size`) there. An error closes the connection and fails the open.
- `committing(path, events)`: inside a commit's transaction, once its events, queue rows
  and state are written and before COMMIT. An error rolls the commit back and fails it.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from watcher.model.events import Event

__all__ = ["StoreHooks", "NO_HOOKS", "install_hooks", "installed_hooks"]


@dataclass(frozen=True)
class StoreHooks:
    connected: Callable[[sqlite3.Connection], None] | None = None
    committing: Callable[[Path, Sequence[Event]], None] | None = None


NO_HOOKS = StoreHooks()
_installed = NO_HOOKS


def install_hooks(hooks: StoreHooks) -> StoreHooks:
    """Make `hooks` the ones every outbox database of this process calls; return the previous ones."""
    global _installed
    previous, _installed = _installed, hooks
    return previous


def installed_hooks() -> StoreHooks:
    return _installed
